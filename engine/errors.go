package engine

import "errors"

// Sentinel errors, tested with errors.Is. Here and below: snapctl maps
// them to its exit statuses (cmd/internal/cli.ExitCode).
var (
	// ErrHasChildren: the process has child processes (process trees are
	// not supported yet).
	ErrHasChildren = errors.New("process has child processes")
	// ErrUnsupported: the process holds something the snapshot format
	// cannot describe; the error names it. (A kernel that lacks an
	// interface gives errors matching the standard library's
	// errors.ErrUnsupported instead, as ENOSYS does.)
	ErrUnsupported = errors.New("unsupported")
)

// StepError names the step of a dump or restore that failed.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

func step(name string, err error) error {
	if err == nil {
		return nil
	}
	var se *StepError
	if errors.As(err, &se) {
		return err
	}
	return &StepError{Step: name, Err: err}
}

var (
	// ErrPIDInUse: the process's pid (or a thread's tid) is taken.
	ErrPIDInUse = errors.New("pid in use")
	// ErrKernelMismatch: the snapshot was taken on another kernel, whose
	// vDSO this one does not provide.
	ErrKernelMismatch = errors.New("snapshot taken on a different kernel")
	// ErrFileChanged: a file the process mapped or opened is not the one
	// it was.
	ErrFileChanged = errors.New("file changed since the dump")
)
