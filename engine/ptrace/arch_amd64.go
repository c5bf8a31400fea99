package ptrace

import "golang.org/x/sys/unix"

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

func syscallResult(r *Regs) int64 { return int64(r.Rax) }

func pc(r *Regs) uint64 { return r.Rip }

// is64 reports whether the thread runs 64-bit code (syscall injection
// uses the 64-bit ABI).
func is64(r *Regs) bool { return r.Cs == userCS }

// patchWord puts the stub into the low bytes of a text word.
func patchWord(w uint64) uint64 {
	return w&^0xffffff | uint64(stubCode[0]) | uint64(stubCode[1])<<8 | uint64(stubCode[2])<<16
}
