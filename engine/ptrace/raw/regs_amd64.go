package raw

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// GetRegs reads tid's general registers (PTRACE_GETREGS).
func GetRegs(tid int, r *unix.PtraceRegs) error {
	_, err := ptracePtr(unix.PTRACE_GETREGS, tid, 0, unsafe.Pointer(r))
	return err
}

// SetRegs writes tid's general registers (PTRACE_SETREGS).
func SetRegs(tid int, r *unix.PtraceRegs) error {
	_, err := ptracePtr(unix.PTRACE_SETREGS, tid, 0, unsafe.Pointer(r))
	return err
}
