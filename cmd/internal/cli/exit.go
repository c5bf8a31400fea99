package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/fs"
)

// Exit statuses of snapctl and lazyfs. They are a contract with scripts,
// documented in docs/cli.md (Exit status), summed up in README.md, and in every --help: a status is
// never renumbered, and a new one takes a free number.
const (
	ExitOK      = 0
	ExitFailure = 1 // anything without a status of its own
	ExitUsage   = 2 // a mistake in the command line
	// ExitUnsupported: the process holds something a snapshot cannot
	// describe (engine.ErrUnsupported: the message names it and its
	// process), or is traced by another tracer.
	ExitUnsupported = 3
	// ExitNoProcess: dump -t PID of a pid no process has.
	ExitNoProcess = 4
	// ExitPIDInUse: the snapshot's pid or one of its thread ids is taken.
	ExitPIDInUse = 5
	// ExitOtherKernel: the snapshot was taken on another kernel.
	ExitOtherKernel = 6
	// ExitBadSnapshot: the snapshot is incomplete (a dump that did not
	// finish), corrupt (a checksum, magic, size or structure is wrong), or of
	// a format version this build does not read.
	ExitBadSnapshot = 7
	// ExitUntrusted: a snapshot, or a path a dump or restore would act
	// on, can be changed by a user other than the caller and root (the
	// message names it and its owner or mode).
	ExitUntrusted = 8

	// ExitFileChanged: a file the process mapped or held open changed
	// since the dump, or the parent of an incremental snapshot is not the
	// one it was dumped against (image.ErrParentChanged).
	ExitFileChanged = 9
	// ExitNoPrivilege: an operation was refused for want of a privilege
	// (EPERM, EACCES: ptrace, clone3 with a pid, userfaultfd, mount, a
	// file), or the kernel lacks a facility (FUSE, userfaultfd features,
	// ENOSYS, EOPNOTSUPP). snapctl check says which.
	ExitNoPrivilege = 10
	// ExitLocked: another dump holds the snapshot's lock (image.ErrLocked),
	// or snapctl cleanup refused a lock whose dump may be running.
	ExitLocked = 11
	// ExitInterrupted: SIGINT or SIGTERM stopped the command before it
	// finished (128 + SIGINT, as restic and shells do).
	ExitInterrupted = 130
)

// Status is a documented exit status.
type Status struct {
	Code    int
	Meaning string
}

// Statuses is the table of exit statuses, in the order of their codes:
// docs/cli.md's Exit status section and every --help print it.
var Statuses = []Status{
	{ExitOK, "success"},
	{ExitFailure, "failure not listed below"},
	{ExitUsage, "usage: a mistake in the command line"},
	{ExitUnsupported, "unsupported: a process holds something a snapshot cannot describe (the message names it and the process), is a zombie child, or is traced by another tracer; or a dumped state is one a restore would refuse"},
	{ExitNoProcess, "no such process"},
	{ExitPIDInUse, "the snapshot's pid or a thread id is in use"},
	{ExitOtherKernel, "the snapshot was taken on another kernel"},
	{ExitBadSnapshot, "incomplete or corrupt snapshot, or another format version"},
	{ExitUntrusted, "untrusted: the snapshot, or a path it names, can be changed by another user; or a sealed or signed snapshot fails its authentication, or no identity given opens it"},
	{ExitFileChanged, "a file the process mapped or held open changed since the dump, or the parent of an incremental snapshot is not the one it was dumped against"},
	{ExitNoPrivilege, "missing privilege or kernel feature (EPERM, EACCES, no FUSE, no userfaultfd feature, ENOSYS); snapctl check says which"},
	{ExitLocked, "locked: another dump holds the snapshot's lock (the message says whose, and how to clear it if that dump is gone)"},
	{ExitInterrupted, "interrupted by SIGINT or SIGTERM"},
}

// ExitCode returns the exit status for the error a command returned: the
// one place that maps errors to statuses, by the sentinels errors.Is and
// errors.As find in err's chain (after restic's ComputeExitCode). The first
// case that matches wins: the more specific ones come first.
func ExitCode(err error) int {
	var ue *UsageError
	var ee *ExitError
	switch {
	case err == nil, errors.Is(err, ErrHelp):
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	case errors.As(err, &ee):
		return ee.Code
	case errors.Is(err, engine.ErrPIDInUse):
		return ExitPIDInUse
	case errors.Is(err, engine.ErrKernelMismatch):
		return ExitOtherKernel
	case errors.Is(err, image.ErrIncomplete), errors.Is(err, image.ErrCorrupt), errors.Is(err, image.ErrVersion),
		errors.Is(err, codec.ErrChecksum), errors.Is(err, codec.ErrUndecodable):
		return ExitBadSnapshot
	case errors.Is(err, image.ErrUntrusted):
		return ExitUntrusted
	case errors.Is(err, engine.ErrFileChanged), errors.Is(err, image.ErrParentChanged):
		return ExitFileChanged
	case errors.Is(err, engine.ErrUnsupported), errors.Is(err, ptrace.ErrAlreadyTraced), errors.Is(err, image.ErrStateRefused):
		return ExitUnsupported
	case errors.Is(err, ptrace.ErrNoProcess):
		return ExitNoProcess
	case errors.Is(err, fs.ErrNoFUSE), errors.Is(err, errors.ErrUnsupported), errors.Is(err, os.ErrPermission):
		return ExitNoPrivilege
	case errors.Is(err, image.ErrLocked), errors.Is(err, s3.ErrLockHeld):
		return ExitLocked
	}
	return ExitFailure
}

// ExitError gives an error the exit status a command chose for it, where
// no sentinel says it (snapctl check's missing features).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// WithExit returns err with the exit status code.
func WithExit(code int, err error) error { return &ExitError{Code: code, Err: err} }

// Report prints err, if it is one to print, as "prog: err" on w and
// returns its exit status. interrupted says that a signal stopped the
// command: a failure then exits ExitInterrupted.
func Report(w io.Writer, prog string, err error, interrupted bool) int {
	if err == nil || errors.Is(err, ErrHelp) {
		return ExitOK
	}
	code := ExitCode(err)
	msg := err.Error()
	if prog == "snapctl" && code == ExitNoPrivilege && errors.Is(err, os.ErrPermission) && geteuid() != 0 {
		// Tracing another user's process, clone3 with a pid, reading
		// page frames: snapctl's work is root's.
		msg += " (snapctl dumps and restores as root: run it as root, e.g. sudo snapctl ...)"
	}
	fmt.Fprintf(w, "%s: %s\n", prog, msg)
	if interrupted {
		return ExitInterrupted
	}
	return code
}

// geteuid is os.Geteuid, which a test replaces.
var geteuid = os.Geteuid

// StatusTable formats the statuses with codes in codes (all if codes is
// nil) as the "Exit status" section of a help text.
func StatusTable(codes []int) string {
	var b strings.Builder
	b.WriteString("Exit status:\n")
	for _, s := range Statuses {
		if codes != nil && !slices.Contains(codes, s.Code) {
			continue
		}
		b.WriteString(wrap(s.Meaning, fmt.Sprintf("  %-4d", s.Code), "      ", lineWidth))
	}
	return b.String()
}
