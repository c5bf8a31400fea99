package seal

import (
	"github.com/lazyfs/lazyfs/engine/image/store"
)

var (
	// ErrUntrusted: a snapshot, or a path a dump or restore would act on
	// (a key file here), can be changed by a user other than the caller
	// and root; the error wrapping it names the file or directory and its
	// owner or mode. It is the store's (store.ErrUntrusted), which
	// engine/image.ErrUntrusted is too: one sentinel for every path not
	// to trust, whichever layer refuses it.
	ErrUntrusted = store.ErrUntrusted
	// ErrAuth: part of a sealed snapshot fails its authentication: it is
	// not what the dump wrote (changed, damaged, or moved from elsewhere).
	// It matches ErrUntrusted (exit status 8); the error wrapping it names
	// the file, and the block and address for memory.
	ErrAuth error = &untrusted{"authentication failed"}
	// ErrNoIdentity: a sealed snapshot and no identity that opens it, or
	// an identity given for a snapshot that is not sealed. It matches
	// ErrUntrusted.
	ErrNoIdentity error = &untrusted{"no identity for the snapshot"}
)

// untrusted is a sentinel for one way a path is not the caller's to
// trust: it also matches ErrUntrusted.
type untrusted struct{ msg string }

func (e *untrusted) Error() string        { return e.msg }
func (e *untrusted) Is(target error) bool { return target == ErrUntrusted }

// Untrusted returns a sentinel that matches ErrUntrusted, with its own
// message, for another package's kind of untrusted path.
func Untrusted(msg string) error { return &untrusted{msg} }
