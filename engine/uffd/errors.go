package uffd

import (
	"errors"
	"fmt"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// Errors of the Pager.
var (
	// ErrShortRead: the source returned fewer bytes than the extent holds.
	ErrShortRead = errors.New("short read from source")
	// ErrFeatures: the userfaultfd lacks uffdio.RequiredFeatures. It matches
	// errors.ErrUnsupported: the kernel lacks what the pager needs.
	ErrFeatures error = unsupported("userfaultfd lacks required event features")
	// ErrExtents: the extents are not sorted, page aligned and disjoint.
	ErrExtents = errors.New("invalid extents")
	// ErrUnexpected: a message the pager did not register for.
	ErrUnexpected = uffdio.ErrUnexpected
)

// unsupported is a sentinel that also matches errors.ErrUnsupported.
type unsupported string

func (e unsupported) Error() string        { return string(e) }
func (e unsupported) Is(target error) bool { return target == errors.ErrUnsupported }

// ServeError is the error that ends Run: what failed, where.
type ServeError struct {
	Op   string // "read", "copy", "zeropage", "wake", "event"
	Addr uint64 // the address in the process
	Len  uint64
	Src  uint64 // the source (snapshot) address, for reads and copies
	Err  error
}

func (e *ServeError) Error() string {
	if e.Src != 0 && e.Src != e.Addr {
		return fmt.Sprintf("uffd %s %#x+%#x (snapshot %#x): %v", e.Op, e.Addr, e.Len, e.Src, e.Err)
	}
	return fmt.Sprintf("uffd %s %#x+%#x: %v", e.Op, e.Addr, e.Len, e.Err)
}

func (e *ServeError) Unwrap() error { return e.Err }
