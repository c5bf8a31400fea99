package ptrace

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// CallNewTask runs system call nr, one that creates a task (clone3 for the
// Clone3 of engine/ptrace/syscalls), and returns the new task stopped at
// its first stop, auto-attached: the tracing options the kernel needs to
// attach it (PTRACE_O_TRACECLONE/FORK/VFORK) are added to the calling
// thread for the call. The Thread has the tracer's id of the task, not the
// caller's when the caller is in a pid namespace below the tracer's.
func (in *Injector) CallNewTask(nr int, args ...uint64) (*Thread, error) {
	var child *Thread
	err := in.th.p.t.Do(func() error {
		var err error
		child, err = in.callNewTask(nr, args)
		return err
	})
	return child, err
}

func (in *Injector) callNewTask(nr int, args []uint64) (*Thread, error) {
	p := in.th.p
	const need = unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK
	tid := in.th.tid
	if p.opts&need != need {
		if err := raw.SetOptions(tid, p.opts|need); err != nil {
			return nil, in.th.check("PTRACE_SETOPTIONS", err)
		}
		defer func() { _ = raw.SetOptions(tid, p.opts) }()
	}
	r, err := in.call(nr, args...)
	if err != nil {
		return nil, err
	}
	var child *Thread
	for _, c := range in.children {
		if c.tid == int(r) {
			child = c
		}
	}
	if child == nil && len(in.children) == 1 && r > 0 {
		// The caller is in a pid namespace below ours: r is the new task's
		// id there, the event's is ours.
		child = in.children[0]
	}
	if child == nil {
		return nil, fmt.Errorf("new task %d was not auto-attached", r)
	}
	if err := child.waitFirstStop(time.Now().Add(in.timeout)); err != nil {
		return nil, err
	}
	return child, nil
}

// waitFirstStop waits for the first stop of an auto-attached task (an
// event stop).
func (th *Thread) waitFirstStop(deadline time.Time) error {
	for th.state == stRunning {
		st, err := th.p.t.waitStop(th.tid, th.reap(), deadline)
		if err != nil {
			return err
		}
		th.apply(st)
		switch {
		case th.state == stExited:
			return fmt.Errorf("new task %d: %v: %w", th.tid, st, ErrExited)
		case th.state == stSignal:
			// A signal before the first stop: hold it.
			if si, err := raw.GetSigInfo(th.tid); err == nil {
				th.held = append(th.held, si)
			}
			if err := raw.Cont(th.tid, 0); err != nil {
				return th.check("PTRACE_CONT", err)
			}
			th.state = stRunning
		}
	}
	th.fresh = false
	return nil
}
