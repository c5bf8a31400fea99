package engine

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/task"
)

// threadFlags are the clone flags of a pthread.
const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM

// createThreads recreates every thread but the leader with its original
// tid.
func (r *restorer) createThreads(ctx context.Context) error {
	for _, t := range r.st.Threads[1:] {
		own := t.OwnTID()
		th, err := r.in.Clone3(ptrace.CloneArgs{Flags: threadFlags, SetTID: []int{own}})
		if err != nil {
			return fmt.Errorf("clone3 thread %d: %w", own, err)
		}
		r.threads = append(r.threads, th)
		if r.opts.Namespaces.PID {
			if err := checkOwnPID(th.Tid(), own); err != nil {
				return err
			}
		} else if th.Tid() != own {
			return fmt.Errorf("clone3 made thread %d, wanted %d", th.Tid(), own)
		}
	}
	return nil
}

// threadState restores what each thread registers with the kernel: its
// name, clear_child_tid, robust list, alternate signal stack and rseq.
// Registers, FP state and signal mask are set last, in finish.
func (r *restorer) threadState(ctx context.Context) error {
	for i, t := range r.st.Threads {
		th := r.threads[i]
		in := r.in
		if i > 0 {
			var err error
			if in, err = th.InjectorAt(r.area, r.area+pageSize, scratchLen); err != nil {
				return fmt.Errorf("thread %d: %w", t.TID, err)
			}
		}
		err := task.RestoreThread(in, &t)
		if i > 0 {
			if cerr := in.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("thread %d: %w", t.TID, err)
		}
	}
	return nil
}

// setThreadRegs sets each thread's registers, FP state and signal mask
// (task.SetThreadRegs): the last thing before the process runs.
func (r *restorer) setThreadRegs() error {
	for i := range r.st.Threads {
		if err := task.SetThreadRegs(r.threads[i], &r.st.Threads[i]); err != nil {
			return err
		}
	}
	return nil
}

// processState restores the per-process state (task.RestoreProcess).
func (r *restorer) processState(ctx context.Context) error {
	return task.RestoreProcess(r.in, r.st, r.log)
}

// pendingSignals queues again the standard signals that were pending at
// the dump: those of the process with kill, a thread's own with tgkill,
// once every handler and signal mask is in place (so that a blocked
// signal stays pending rather than being dropped or delivered early).
// What the image does not hold is lost: the sender and other siginfo
// (the signals come from snapctl), and all but one instance of a queued
// real-time signal.
func (r *restorer) pendingSignals(ctx context.Context) error {
	pending := r.st.SigPending
	for _, t := range r.st.Threads {
		pending |= t.SigPending
	}
	if pending == 0 {
		return nil
	}
	for i, t := range r.st.Threads {
		if err := r.threads[i].SetSigMask(t.SigMask); err != nil {
			return fmt.Errorf("thread %d: set signal mask: %w", t.TID, err)
		}
	}
	send := func(mask uint64, tid int) error {
		for sig := 1; sig <= ptrace.NumSignals; sig++ {
			s := unix.Signal(sig)
			if mask&(1<<(sig-1)) == 0 || s == unix.SIGKILL || s == unix.SIGSTOP {
				continue
			}
			var err error
			if tid == 0 {
				err = unix.Kill(r.pid, s)
			} else {
				err = unix.Tgkill(r.pid, tid, s)
			}
			if err != nil {
				return fmt.Errorf("queue pending signal %d: %w", sig, err)
			}
		}
		return nil
	}
	if err := send(r.st.SigPending, 0); err != nil {
		return err
	}
	for i, t := range r.st.Threads {
		if err := send(t.SigPending, r.threads[i].Tid()); err != nil {
			return fmt.Errorf("thread %d: %w", t.TID, err)
		}
	}
	return nil
}

// leaveStopped queues SIGSTOP to every thread when the process is to be
// left stopped. Each thread dequeues its own when it is detached, before
// it returns to user space, so none runs an instruction whatever the
// order of the detaches.
func (r *restorer) leaveStopped(ctx context.Context) error {
	if !r.opts.LeaveStopped {
		return nil
	}
	for i, t := range r.st.Threads {
		if err := unix.Tgkill(r.pid, r.threads[i].Tid(), unix.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP thread %d: %w", t.TID, err)
		}
	}
	return nil
}
