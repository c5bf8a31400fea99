package image

import (
	"errors"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// Sentinel errors. Every way a snapshot's bytes can be damaged matches
// ErrCorrupt, so that one errors.Is answers "is the snapshot corrupt?";
// the narrower sentinels say how. ErrIncomplete (a dump that did not
// finish) and ErrVersion (a snapshot of another format version) are not
// corruption and match only themselves. ErrCorrupt, ErrExists and
// ErrUntrusted are package store's, which its stores return too.
var (
	// ErrCorrupt: the snapshot is damaged: a structure is inconsistent
	// (overlapping runs, bad lengths, counts past their bounds), or one of
	// the errors below that wrap it.
	ErrCorrupt = store.ErrCorrupt
	// ErrBadMagic: a file is not what its name says. It matches ErrCorrupt.
	ErrBadMagic error = &corruption{"bad magic"}
	// ErrHeaderChecksum: a header or table fails its CRC. It matches
	// ErrCorrupt.
	ErrHeaderChecksum error = &corruption{"checksum mismatch"}
	// ErrTruncated: a file is shorter than its header says. It matches
	// ErrCorrupt.
	ErrTruncated error = &corruption{"truncated file"}
	// ErrManifestMismatch: a file's size or checksum differs from what the
	// manifest recorded for it. It matches ErrCorrupt. (Not to be confused
	// with engine.ErrFileChanged: a file of the dumped process, outside
	// the snapshot, that changed since the dump.)
	ErrManifestMismatch error = &corruption{"snapshot file does not match the manifest"}

	// ErrVersion: a file was written by an incompatible format version.
	ErrVersion = errors.New("unsupported format version")
	// ErrIncomplete: the directory has no manifest (a dump did not finish).
	ErrIncomplete = errors.New("incomplete snapshot: no " + ManifestName)
	// ErrExists: a snapshot is already there.
	ErrExists = store.ErrExists
	// ErrNotEmpty: a dump's directory holds other files (a dump's that
	// did not finish, or files no dump wrote).
	ErrNotEmpty = errors.New("directory is not empty")

	// ErrSourceMismatch: memory read from a source other than the
	// snapshot's files (a lazyfs mount) fails the snapshot's checksum
	// (Reader.Checked). The snapshot may be fine: the source is not.
	ErrSourceMismatch = errors.New("the page source served bytes that fail the snapshot's checksum")

	// ErrKernelMismatch: the snapshot was taken on another kernel, whose
	// vDSO and special mappings this one does not provide.
	ErrKernelMismatch = errors.New("snapshot taken on a different kernel")

	// ErrUnsupported: the process holds something a snapshot cannot
	// describe, or a snapshot holds something this build cannot restore;
	// the error wrapping it names the thing.
	ErrUnsupported = errors.New("unsupported")

	// ErrUntrusted: a snapshot, or a path a dump or restore would act on,
	// can be changed by a user other than the caller and root; the error
	// wrapping it names the file or directory and its owner or mode.
	ErrUntrusted = store.ErrUntrusted
	// ErrUnsafeDir: the snapshot directory of a dump exists but is not
	// the caller's own (another owner, or writable by group or others), or
	// is a symbolic link. It matches ErrUntrusted.
	ErrUnsafeDir = seal.Untrusted("unsafe snapshot directory")
	// ErrStateRefused: a dump's process state is one Validate refuses
	// (a restore would): the dump fails rather than commit it.
	ErrStateRefused = errors.New("process state a restore would refuse")
	// ErrLocked: another dump is writing into the directory.
	ErrLocked = errors.New("locked by another dump")
)

// Untrusted returns a sentinel that matches ErrUntrusted, with its own
// message, for another package's kind of untrusted path.
func Untrusted(msg string) error { return seal.Untrusted(msg) }

// corruption is a sentinel for one way a snapshot can be damaged: it also
// matches ErrCorrupt.
type corruption struct{ msg string }

func (e *corruption) Error() string        { return e.msg }
func (e *corruption) Is(target error) bool { return target == ErrCorrupt }

// Is makes a block whose stored bytes fail their checksum or do not decode
// (codec.ErrChecksum, codec.ErrUndecodable) match ErrCorrupt. A block that
// could not be read (an I/O error, a mount gone) does not: the snapshot
// may be fine.
func (e *BlockError) Is(target error) bool {
	return target == ErrCorrupt && (errors.Is(e.Err, codec.ErrChecksum) || errors.Is(e.Err, codec.ErrUndecodable))
}
