package engine

import (
	"context"
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// sigaltstack flags (not in x/sys/unix).
const (
	ssOnStack = 1
	ssDisable = 2
)

// threadFlags are the clone flags of a pthread.
const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM

// createThreads recreates every thread but the leader with its original
// tid.
func (r *restorer) createThreads(ctx context.Context) error {
	for _, t := range r.st.Threads[1:] {
		th, err := r.in.Clone3(ptrace.CloneArgs{Flags: threadFlags, SetTID: []int{t.TID}})
		if err != nil {
			return fmt.Errorf("clone3 thread %d: %w", t.TID, err)
		}
		if th.Tid() != t.TID {
			return fmt.Errorf("clone3 made thread %d, wanted %d", th.Tid(), t.TID)
		}
		r.threads = append(r.threads, th)
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
		err := r.oneThread(in, &t)
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

func (r *restorer) oneThread(in *ptrace.Injector, t *image.Thread) error {
	scratch := r.area + pageSize
	name := t.Comm
	if len(name) > 15 {
		name = name[:15]
	}
	if err := r.child.WriteMem(scratch, append([]byte(name), 0)); err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_PRCTL, unix.PR_SET_NAME, scratch); err != nil {
		return fmt.Errorf("prctl(PR_SET_NAME): %w", err)
	}
	if _, err := in.Call(unix.SYS_SET_TID_ADDRESS, t.ClearChildTID); err != nil {
		return fmt.Errorf("set_tid_address: %w", err)
	}
	if t.RobustList != 0 {
		if _, err := in.Call(unix.SYS_SET_ROBUST_LIST, t.RobustList, t.RobustListLen); err != nil {
			return fmt.Errorf("set_robust_list: %w", err)
		}
	}
	if t.AltStack.Flags&ssDisable == 0 && t.AltStack.Size != 0 {
		ss := make([]byte, 24) // stack_t: sp, flags (int + pad), size
		binary.LittleEndian.PutUint64(ss[0:], t.AltStack.SP)
		binary.LittleEndian.PutUint32(ss[8:], uint32(t.AltStack.Flags&^ssOnStack))
		binary.LittleEndian.PutUint64(ss[16:], t.AltStack.Size)
		if err := r.child.WriteMem(scratch+64, ss); err != nil {
			return err
		}
		if _, err := in.Call(unix.SYS_SIGALTSTACK, scratch+64, 0); err != nil {
			return fmt.Errorf("sigaltstack: %w", err)
		}
	}
	if t.Rseq != nil {
		if _, err := in.Call(unix.SYS_RSEQ, t.Rseq.Addr, uint64(t.Rseq.Len), 0, uint64(t.Rseq.Sig)); err != nil {
			return fmt.Errorf("rseq register at %#x: %w", t.Rseq.Addr, err)
		}
	}
	return nil
}

// setThreadRegs sets each thread's registers, FP state and signal mask:
// the last thing before the process runs. A thread that was inside a
// system call (orig_rax >= 0, rax = -ERESTART*) has it restarted by the
// kernel when it resumes from this stop; -ERESTART_RESTARTBLOCK becomes
// -EINTR, since the restart block stayed with the dumped process.
func (r *restorer) setThreadRegs() error {
	for i, t := range r.st.Threads {
		th := r.threads[i]
		regs := fromImageRegs(&t.Regs)
		if err := th.SetRegs(&regs); err != nil {
			return fmt.Errorf("thread %d: set registers: %w", t.TID, err)
		}
		fp := ptrace.FPState{Note: ptrace.NTX86XState, Data: t.XState}
		if len(t.XState) == 0 {
			fp = ptrace.FPState{Note: ptrace.NTPRFPReg, Data: t.FPRegs}
		}
		if err := th.SetFPState(fp); err != nil {
			return fmt.Errorf("thread %d: set FP state (%d bytes; this CPU may differ from the dump's): %w", t.TID, len(fp.Data), err)
		}
		if err := th.SetSigMask(t.SigMask); err != nil {
			return fmt.Errorf("thread %d: set signal mask: %w", t.TID, err)
		}
	}
	return nil
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
				err = unix.Kill(r.st.PID, s)
			} else {
				err = unix.Tgkill(r.st.PID, tid, s)
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
	for _, t := range r.st.Threads {
		if err := send(t.SigPending, t.TID); err != nil {
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
	for _, t := range r.st.Threads {
		if err := unix.Tgkill(r.st.PID, t.TID, unix.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP thread %d: %w", t.TID, err)
		}
	}
	return nil
}
