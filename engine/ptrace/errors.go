package ptrace

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrExited reports that the traced process or thread is gone: it
	// exited or was killed while we held it.
	ErrExited = errors.New("tracee exited")
	// ErrNoProcess reports a pid that does not exist.
	ErrNoProcess = errors.New("no such process")
	// ErrAlreadyTraced reports a process that another tracer holds; the
	// error is an *AlreadyTracedError naming it.
	ErrAlreadyTraced = errors.New("already traced")
	// ErrTimeout reports a tracee that did not stop before the deadline.
	ErrTimeout = errors.New("timed out waiting for tracee")
	// ErrClosed reports a request made after Tracer.Close.
	ErrClosed = errors.New("tracer closed")
	// ErrNotStopped reports a request on a thread that is running.
	ErrNotStopped = errors.New("thread not stopped")
	// ErrUnexpectedStop reports a stop that an injected system call did not
	// explain (a fault, a foreign trap); the error is a *StopError.
	ErrUnexpectedStop = errors.New("unexpected stop")
)

// AlreadyTracedError reports that PTRACE_SEIZE was refused because the
// process already has a tracer.
type AlreadyTracedError struct {
	Pid       int // the process we tried to seize
	TracerPid int // from /proc/PID/status
}

func (e *AlreadyTracedError) Error() string {
	return fmt.Sprintf("pid %d is already traced by pid %d", e.Pid, e.TracerPid)
}

// Is makes errors.Is(err, ErrAlreadyTraced) true.
func (e *AlreadyTracedError) Is(target error) bool { return target == ErrAlreadyTraced }

// SyscallError is an injected system call that returned an error.
type SyscallError struct {
	Nr    int        // system call number
	Errno unix.Errno // the error it returned
}

func (e *SyscallError) Error() string {
	return fmt.Sprintf("injected syscall %d: %v", e.Nr, e.Errno)
}

// Unwrap returns the errno, so errors.Is(err, unix.EEXIST) works.
func (e *SyscallError) Unwrap() error { return e.Errno }

// StopError describes a stop an injected call did not expect.
type StopError struct {
	Tid    int
	Signal unix.Signal // the signal of the stop (SIGSEGV for a fault)
	Addr   uint64      // si_addr for faults
	Rip    uint64      // rip at the stop
}

func (e *StopError) Error() string {
	return fmt.Sprintf("thread %d: unexpected %v at rip %#x (addr %#x)", e.Tid, e.Signal, e.Rip, e.Addr)
}

// Is makes errors.Is(err, ErrUnexpectedStop) true.
func (e *StopError) Is(target error) bool { return target == ErrUnexpectedStop }

// Errno decodes the raw result of a system call: values in [-4095, -1] are
// errors, anything else (including large addresses returned by mmap) is
// success.
func Errno(r int64) error {
	if r < 0 && r >= -4095 {
		return unix.Errno(-r)
	}
	return nil
}

// gone maps ESRCH from a ptrace request to ErrExited.
func gone(err error) error {
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("%w (%w)", ErrExited, err)
	}
	return err
}
