package engine

import (
	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/task"
)

// Sentinel errors, tested with errors.Is. Here and below: snapctl maps
// them to its exit statuses (cmd/internal/cli.ExitCode).
var (
	// ErrUnsupported: the process holds something the snapshot format
	// cannot describe; the error names it. (A kernel that lacks an
	// interface gives errors matching the standard library's
	// errors.ErrUnsupported instead, as ENOSYS does.)
	ErrUnsupported = image.ErrUnsupported
)

var (
	// ErrPIDInUse: the process's pid (or a thread's tid) is taken.
	ErrPIDInUse = task.ErrPIDInUse
	// ErrKernelMismatch: the snapshot was taken on another kernel, whose
	// vDSO this one does not provide.
	ErrKernelMismatch = image.ErrKernelMismatch
	// ErrFileChanged: a file the process mapped or opened is not the one
	// it was.
	ErrFileChanged = fds.ErrFileChanged
)
