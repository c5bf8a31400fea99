package task

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// The threads of a process at restore, once its leader is made.

// threadFlags are the clone flags of a pthread.
const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM

// CreateThreads recreates, by clone3 injected through in (into the
// leader), every thread of st but the leader with its original tid: its
// own, in a new pid namespace (pidns). It returns them in the order of
// st.Threads[1:].
func CreateThreads(in *syscalls.Injector, st *image.Process, pidns bool) ([]*ptrace.Thread, error) {
	var out []*ptrace.Thread
	for _, t := range st.Threads[1:] {
		own := t.OwnTID()
		th, err := in.Clone3(syscalls.CloneArgs{Flags: threadFlags, SetTID: []int{own}})
		if err != nil {
			return out, fmt.Errorf("clone3 thread %d: %w", own, err)
		}
		out = append(out, th)
		if pidns {
			if err := CheckOwnPID(th.Tid(), own); err != nil {
				return out, err
			}
		} else if th.Tid() != own {
			return out, fmt.Errorf("clone3 made thread %d, wanted %d", th.Tid(), own)
		}
	}
	return out, nil
}

// CheckOwnPID checks that task id (ours) has own as its id in its
// innermost pid namespace.
func CheckOwnPID(id, own int) error {
	s, err := proc.ReadStatus(id)
	if err != nil {
		return err
	}
	if n := len(s.NSpid); n == 0 || s.NSpid[n-1] != own {
		return fmt.Errorf("task %d has ids %v, wanted %d in its pid namespace", id, s.NSpid, own)
	}
	return nil
}

// RestoreThreads restores what each thread of st registers with the
// kernel (RestoreThread): the leader's through in, each other's through
// an injector of its own on the same area (scratch bytes after a page).
// Registers, FP state and signal mask are set last (SetRegs).
func RestoreThreads(in *syscalls.Injector, threads []*ptrace.Thread, st *image.Process, area uint64, scratch int) error {
	for i, t := range st.Threads {
		tin := in
		if i > 0 {
			var err error
			if tin, err = syscalls.At(threads[i], area, area+image.PageSize, scratch); err != nil {
				return fmt.Errorf("thread %d: %w", t.TID, err)
			}
		}
		err := RestoreThread(tin, &t)
		if i > 0 {
			if cerr := tin.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("thread %d: %w", t.TID, err)
		}
	}
	return nil
}

// SetRegs sets each thread's registers, FP state and signal mask
// (SetThreadRegs): the last thing before the process runs.
func SetRegs(threads []*ptrace.Thread, st *image.Process) error {
	for i := range st.Threads {
		if err := SetThreadRegs(threads[i], &st.Threads[i]); err != nil {
			return err
		}
	}
	return nil
}

// QueuePending queues again the standard signals that were pending at
// the dump: those of process pid (ours) with kill, a thread's own with tgkill,
// once every handler and signal mask is in place (so that a blocked
// signal stays pending rather than being dropped or delivered early).
// What the image does not hold is lost: the sender and other siginfo
// (the signals come from snapctl), and all but one instance of a queued
// real-time signal.
func QueuePending(pid int, threads []*ptrace.Thread, st *image.Process) error {
	pending := st.SigPending
	for _, t := range st.Threads {
		pending |= t.SigPending
	}
	if pending == 0 {
		return nil
	}
	for i, t := range st.Threads {
		if err := threads[i].SetSigMask(t.SigMask); err != nil {
			return fmt.Errorf("thread %d: set signal mask: %w", t.TID, err)
		}
	}
	send := func(mask uint64, tid int) error {
		for sig := 1; sig <= syscalls.NumSignals; sig++ {
			s := unix.Signal(sig)
			if mask&(1<<(sig-1)) == 0 || s == unix.SIGKILL || s == unix.SIGSTOP {
				continue
			}
			var err error
			if tid == 0 {
				err = unix.Kill(pid, s)
			} else {
				err = unix.Tgkill(pid, tid, s)
			}
			if err != nil {
				return fmt.Errorf("queue pending signal %d: %w", sig, err)
			}
		}
		return nil
	}
	if err := send(st.SigPending, 0); err != nil {
		return err
	}
	for i, t := range st.Threads {
		if err := send(t.SigPending, threads[i].Tid()); err != nil {
			return fmt.Errorf("thread %d: %w", t.TID, err)
		}
	}
	return nil
}

// StopAll queues SIGSTOP to every thread of process pid (ours), to leave
// it stopped. Each thread dequeues its own when it is detached, before
// it returns to user space, so none runs an instruction whatever the
// order of the detaches.
func StopAll(pid int, threads []*ptrace.Thread, st *image.Process) error {
	for i, t := range st.Threads {
		if err := unix.Tgkill(pid, threads[i].Tid(), unix.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP thread %d: %w", t.TID, err)
		}
	}
	return nil
}
