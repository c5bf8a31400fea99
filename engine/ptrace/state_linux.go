package ptrace

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// maxRegSet bounds a register set read (XSAVE with AMX is about 11 KiB).
const maxRegSet = 64 << 10

// on runs fn on the tracer thread after checking that th is stopped.
func (th *Thread) on(fn func() error) error {
	return th.p.t.Do(func() error {
		if err := th.stopped(); err != nil {
			return err
		}
		return fn()
	})
}

// Regs returns the general registers. With an open Injector they are the
// registers of the last stop, not the saved ones (see Injector.SavedRegs).
func (th *Thread) Regs() (Regs, error) {
	var r Regs
	err := th.on(func() error { return th.check("PTRACE_GETREGS", raw.GetRegs(th.tid, &r)) })
	return r, err
}

// SetRegs sets the general registers. With an open Injector use
// Injector.SetRegs, or set them after Close.
func (th *Thread) SetRegs(r *Regs) error {
	return th.on(func() error { return th.check("PTRACE_SETREGS", raw.SetRegs(th.tid, r)) })
}

// RegSet reads register set note (NTX86XState, NTPRFPReg...) and returns
// it at the size the kernel reports.
func (th *Thread) RegSet(note int) ([]byte, error) {
	var out []byte
	err := th.on(func() error {
		if th.p.t.regBuf == nil {
			th.p.t.regBuf = make([]byte, maxRegSet)
		}
		n, err := raw.GetRegSet(th.tid, note, th.p.t.regBuf)
		if err != nil {
			return th.check(fmt.Sprintf("PTRACE_GETREGSET %#x", note), err)
		}
		out = append([]byte(nil), th.p.t.regBuf[:n]...)
		return nil
	})
	return out, err
}

// SetRegSet writes register set note; b must have the size RegSet
// returned.
func (th *Thread) SetRegSet(note int, b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("PTRACE_SETREGSET %#x: empty", note)
	}
	return th.on(func() error {
		return th.check(fmt.Sprintf("PTRACE_SETREGSET %#x", note), raw.SetRegSet(th.tid, note, b))
	})
}

// SigMask returns the blocked-signal mask (bit n-1 = signal n). For a
// thread inside ppoll, pselect, epoll_pwait or rt_sigsuspend the kernel
// reports the thread's own mask (its saved_sigmask), not the call's
// temporary one.
func (th *Thread) SigMask() (uint64, error) {
	var m uint64
	err := th.on(func() error {
		var err error
		m, err = raw.GetSigMask(th.tid)
		return th.check("PTRACE_GETSIGMASK", err)
	})
	return m, err
}

// SetSigMask sets the blocked-signal mask (the thread's own: for a thread
// inside ppoll/pselect/sigsuspend the kernel drops the call's saved mask,
// and the restarted call installs its temporary mask again).
func (th *Thread) SetSigMask(m uint64) error {
	return th.on(func() error { return th.check("PTRACE_SETSIGMASK", raw.SetSigMask(th.tid, m)) })
}

// Rseq returns the thread's rseq registration (Ptr 0 if none).
func (th *Thread) Rseq() (RseqConfig, error) {
	var c RseqConfig
	err := th.on(func() error {
		var err error
		c, err = raw.GetRseq(th.tid)
		return th.check("PTRACE_GET_RSEQ_CONFIGURATION", err)
	})
	return c, err
}

// SetOptions changes the PTRACE_O_* options of this thread.
func (th *Thread) SetOptions(opts int) error {
	return th.on(func() error { return th.check("PTRACE_SETOPTIONS", raw.SetOptions(th.tid, opts)) })
}

// RobustList returns the robust futex list head and its length of thread
// tid (get_robust_list). It is a plain system call: no tracer needed.
func RobustList(tid int) (head uint64, size uint64, err error) {
	_, _, e := unix.Syscall(unix.SYS_GET_ROBUST_LIST, uintptr(tid), uintptr(unsafe.Pointer(&head)), uintptr(unsafe.Pointer(&size)))
	if e != 0 {
		if e == unix.ESRCH {
			return 0, 0, fmt.Errorf("get_robust_list %d: %w", tid, ErrExited)
		}
		return 0, 0, fmt.Errorf("get_robust_list %d: %w", tid, e)
	}
	return head, size, nil
}

// RseqConfig is a thread's rseq registration, as Rseq returns it.
type RseqConfig = raw.RseqConfig
