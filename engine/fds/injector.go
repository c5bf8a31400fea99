package fds

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// injector is what the restore of descriptors asks of the process under
// restore: system calls run in it (one, or a batch in one resume) and
// its scratch memory to pass their arguments through. A
// *syscalls.Injector is one; the package's tests give a fake that records
// the calls and answers them.
type injector interface {
	Opener
	Call(nr int, args ...uint64) (uint64, error)
	Syscall(nr int, args ...uint64) (int64, error)
	Batch(off int, calls []ptrace.BatchCall) error
	Put(off int, b []byte) (uint64, error)
	PutString(off int, s string) (uint64, error)
	Get(off int, b []byte) error
	Scratch() (addr uint64, n int)
}

// Opener opens files in a process and says what it opened: what
// OpenVerified asks of a *syscalls.Injector.
type Opener interface {
	OpenAt2(path string, flags int, mode uint32, resolve uint64) (int, error)
	Fstat(fd int) (unix.Stat_t, error)
	CloseFD(fd int) error
}

// calls is a batch of system calls to run in one resume of the process
// (fdCreator.run), with what each is for, to name the one that fails.
type calls struct {
	calls []ptrace.BatchCall
	what  []string
}

// add appends system call nr with args; what names it in an error.
func (c *calls) add(what string, nr int, args ...uint64) {
	bc := ptrace.BatchCall{Nr: nr}
	copy(bc.Args[:], args)
	c.calls = append(c.calls, bc)
	c.what = append(c.what, what)
}

// result returns the raw result of call i once run.
func (c *calls) result(i int) int64 { return c.calls[i].Result }

// run runs the calls of c in order, every one whatever the ones before
// it returned, and returns the first that failed as an error naming it.
// The batches here are a few calls: their table fits the scratch memory.
func (fc *fdCreator) run(c *calls) error {
	if len(c.calls) == 0 {
		return nil
	}
	if err := fc.in.Batch(0, c.calls); err != nil {
		return err
	}
	for i := range c.calls {
		if err := ptrace.Errno(c.calls[i].Result); err != nil {
			return fmt.Errorf("%s: %w", c.what[i], err)
		}
	}
	return nil
}
