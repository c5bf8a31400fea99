package syscalls

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Helpers for the state only an injected system call can read. Each uses
// the start of the Injector's scratch memory.

// NumSignals is the number of signals (1..64).
const NumSignals = 64

// readVia runs call nr with args, where the argument index out is
// replaced by the scratch address, and returns the n bytes the call
// stored there.
func (in *Injector) readVia(n int, nr int, out int, args ...uint64) ([]byte, error) {
	var buf []byte
	err := in.p.Tracer().Do(func() error {
		if err := in.NeedScratch(n); err != nil {
			return err
		}
		b := make([]byte, n)
		if err := in.p.WriteMem(in.scratch, b); err != nil {
			return err
		}
		args[out] = in.scratch
		if _, err := in.Call(nr, args...); err != nil {
			return err
		}
		buf = b
		return in.p.ReadMem(in.scratch, buf)
	})
	return buf, err
}

// TidAddress returns the thread's clear_child_tid address
// (prctl(PR_GET_TID_ADDRESS)), as set by set_tid_address or CLONE_CHILD_CLEARTID.
func (in *Injector) TidAddress() (uint64, error) {
	b, err := in.readVia(8, unix.SYS_PRCTL, 1, unix.PR_GET_TID_ADDRESS, 0)
	if err != nil {
		return 0, fmt.Errorf("PR_GET_TID_ADDRESS: %w", err)
	}
	return le64(b), nil
}

// AltStack is stack_t as sigaltstack(2) returns it.
type AltStack struct {
	Sp    uint64
	Flags int32 // SS_ONSTACK, SS_DISABLE, SS_AUTODISARM
	_     int32
	Size  uint64
}

// SigAltStack reads the thread's alternate signal stack with injected
// sigaltstack(NULL, &old).
func (in *Injector) SigAltStack() (AltStack, error) {
	var s AltStack
	b, err := in.readVia(24, unix.SYS_SIGALTSTACK, 1, 0, 0)
	if err != nil {
		return s, fmt.Errorf("sigaltstack: %w", err)
	}
	copy(bytesOf(&s), b)
	return s, nil
}

// Brk returns the current program break (injected brk(0)).
func (in *Injector) Brk() (uint64, error) {
	r, err := in.Call(unix.SYS_BRK, 0)
	if err != nil {
		return 0, fmt.Errorf("brk: %w", err)
	}
	return r, nil
}

// Prctl runs prctl(op, args...) and returns its result: for the PR_GET_*
// operations that return their value (PR_GET_DUMPABLE,
// PR_GET_NO_NEW_PRIVS, PR_GET_TIMERSLACK, PR_GET_THP_DISABLE,
// PR_GET_KEEPCAPS, PR_GET_SECCOMP...).
func (in *Injector) Prctl(op int, args ...uint64) (uint64, error) {
	r, err := in.Call(unix.SYS_PRCTL, append([]uint64{uint64(op)}, args...)...)
	if err != nil {
		return 0, fmt.Errorf("prctl(%d): %w", op, err)
	}
	return r, nil
}

// Name returns the thread's comm (prctl(PR_GET_NAME)).
func (in *Injector) Name() (string, error) {
	b, err := in.readVia(16, unix.SYS_PRCTL, 1, unix.PR_GET_NAME, 0)
	if err != nil {
		return "", fmt.Errorf("PR_GET_NAME: %w", err)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b), nil
}

// CloneArgs is what Clone3 passes in struct clone_args. Addresses are in
// the target.
type CloneArgs struct {
	Flags      uint64 // CLONE_*
	PidFD      uint64 // where CLONE_PIDFD stores the pidfd
	ChildTID   uint64
	ParentTID  uint64
	ExitSignal uint64 // SIGCHLD for a process; 0 for a thread or with CLONE_PARENT
	Stack      uint64 // lowest address of the stack area
	StackSize  uint64
	TLS        uint64
	SetTID     []int // wanted tid, innermost pid namespace first; empty for any
	Cgroup     uint64
}

// cloneArgs is struct clone_args (CLONE_ARGS_SIZE_VER2, 88 bytes).
type cloneArgs struct {
	Flags, PidFD, ChildTID, ParentTID, ExitSignal, Stack, StackSize, TLS, SetTID, SetTIDSize, Cgroup uint64
}

// Clone3 injects clone3 into the thread and returns the new task, stopped
// at its first stop: a thread of the same process (CLONE_THREAD) or a new
// process (ptrace.Thread.Process). The tracing options the kernel needs to
// attach the child (PTRACE_O_TRACECLONE/FORK/VFORK) are added to the
// calling thread for the call; the child inherits them. The child's
// registers are the caller's at the stub (rip after the syscall, rax 0):
// open an Injector on it, or set its registers, before resuming it.
// The Thread has the tracer's id of the task, not the caller's when the
// caller is in a pid namespace below the tracer's.
// With SetTID, an occupied tid fails with a *ptrace.SyscallError matching
// unix.EEXIST.
func (in *Injector) Clone3(a CloneArgs) (*ptrace.Thread, error) {
	var child *ptrace.Thread
	err := in.p.Tracer().Do(func() error {
		var err error
		child, err = in.clone3(a)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("clone3: %w", err)
	}
	return child, nil
}

func (in *Injector) clone3(a CloneArgs) (*ptrace.Thread, error) {
	const argsAt, tidsAt = 0, 128
	if len(a.SetTID) > 32 {
		return nil, fmt.Errorf("set_tid: %d levels, at most 32", len(a.SetTID))
	}
	if err := in.NeedScratch(tidsAt + 8*len(a.SetTID)); err != nil {
		return nil, err
	}
	ca := cloneArgs{
		Flags: a.Flags, PidFD: a.PidFD, ChildTID: a.ChildTID, ParentTID: a.ParentTID,
		ExitSignal: a.ExitSignal, Stack: a.Stack, StackSize: a.StackSize, TLS: a.TLS, Cgroup: a.Cgroup,
	}
	p := in.p
	if len(a.SetTID) > 0 {
		tids := make([]byte, 0, 4*len(a.SetTID))
		for _, t := range a.SetTID {
			tids = binary.LittleEndian.AppendUint32(tids, uint32(t))
		}
		if err := p.WriteMem(in.scratch+tidsAt, tids); err != nil {
			return nil, err
		}
		ca.SetTID, ca.SetTIDSize = in.scratch+tidsAt, uint64(len(a.SetTID))
	}
	if err := p.WriteMem(in.scratch+argsAt, bytesOf(&ca)); err != nil {
		return nil, err
	}
	return in.CallNewTask(unix.SYS_CLONE3, in.scratch+argsAt, uint64(bytesLen(&ca)))
}

func bytesLen[T any](v *T) int { return len(bytesOf(v)) }
