package ptrace

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// What is x86-64 about the tracer: the general registers and how a system
// call is set up in them, the stub's instructions, the layout of struct
// kernel_sigaction, and the floating-point register sets.

// Regs are the general registers of an x86-64 thread.
type Regs = unix.PtraceRegs

// stubCode is "syscall; int3", padded with int3.
var stubCode = [8]byte{0x0f, 0x05, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc}

const (
	syscallLen = 2 // length of the syscall instruction
	stubTrapAt = 3 // rip after the int3 that ends an injected call
	userCS     = 0x33
)

// setSyscall turns r into "run syscall nr with args at stub".
func setSyscall(r *Regs, stub uint64, nr int, args []uint64) {
	var a [6]uint64
	copy(a[:], args)
	r.Rip = stub
	r.Rax = uint64(nr)
	r.Orig_rax = ^uint64(0) // -1: no restart logic on the way in
	r.Rdi, r.Rsi, r.Rdx, r.R10, r.R8, r.R9 = a[0], a[1], a[2], a[3], a[4], a[5]
}

// batchCode runs the table of system calls at rbx, r12 entries of
// BatchEntry (number, six arguments, result), storing each result in its
// entry, then stops on an int3:
//
//	loop: mov rax, [rbx]; mov rdi, [rbx+8]; mov rsi, [rbx+16]
//	      mov rdx, [rbx+24]; mov r10, [rbx+32]; mov r8, [rbx+40]
//	      mov r9, [rbx+48]; syscall; mov [rbx+56], rax
//	      add rbx, 64; dec r12; jnz loop; int3
var batchCode = [...]byte{
	0x48, 0x8b, 0x03,
	0x48, 0x8b, 0x7b, 0x08,
	0x48, 0x8b, 0x73, 0x10,
	0x48, 0x8b, 0x53, 0x18,
	0x4c, 0x8b, 0x53, 0x20,
	0x4c, 0x8b, 0x43, 0x28,
	0x4c, 0x8b, 0x4b, 0x30,
	0x0f, 0x05,
	0x48, 0x89, 0x43, 0x38,
	0x48, 0x83, 0xc3, 0x40,
	0x49, 0xff, 0xcc,
	0x75, 0xd6,
	0xcc,
}

// setBatch turns r into "run the n calls of the table at table with the
// batch code at code".
func setBatch(r *Regs, code, table uint64, n int) {
	r.Rip = code
	r.Rbx = table
	r.R12 = uint64(n)
	r.Orig_rax = ^uint64(0)
}

func syscallResult(r *Regs) int64 { return int64(r.Rax) }

func pc(r *Regs) uint64 { return r.Rip }

// checkABI refuses a thread that does not run 64-bit code (syscall
// injection uses the 64-bit ABI).
func checkABI(r *Regs) error {
	if r.Cs != userCS {
		return fmt.Errorf("runs 32-bit code (cs=%#x): not supported", r.Cs)
	}
	return nil
}

// patchWord puts the stub into the low bytes of a text word.
func patchWord(w uint64) uint64 {
	return w&^0xffffff | uint64(stubCode[0]) | uint64(stubCode[1])<<8 | uint64(stubCode[2])<<16
}

// Register sets for RegSet/SetRegSet.
const (
	NTPRFPReg   = unix.NT_PRFPREG    // 512-byte FXSAVE area
	NTX86XState = unix.NT_X86_XSTATE // XSAVE area, its size set by the CPU's features
)

// FPState is the floating-point and vector state of a thread.
type FPState struct {
	Note int    // NTX86XState, or NTPRFPReg where XSAVE is unavailable
	Data []byte // the regset as the kernel gives it
}

// FPState reads the XSAVE area (NT_X86_XSTATE), falling back to the
// FXSAVE area (NT_PRFPREG) on CPUs or kernels without XSAVE.
func (th *Thread) FPState() (FPState, error) {
	b, err := th.RegSet(NTX86XState)
	if err == nil {
		return FPState{Note: NTX86XState, Data: b}, nil
	}
	b, err2 := th.RegSet(NTPRFPReg)
	if err2 != nil {
		return FPState{}, fmt.Errorf("xstate: %w; fpregs: %w", err, err2)
	}
	return FPState{Note: NTPRFPReg, Data: b}, nil
}

// SetFPState writes back what FPState returned.
func (th *Thread) SetFPState(s FPState) error { return th.SetRegSet(s.Note, s.Data) }
