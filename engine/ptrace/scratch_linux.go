package ptrace

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// The helpers below pass arguments to injected calls through the
// Injector's scratch memory: Put writes bytes there and returns their
// address in the tracee, Get reads them back after the call.

// AtFDCWD is AT_FDCWD as a system call argument.
var AtFDCWD = func() uint64 { v := int64(unix.AT_FDCWD); return uint64(v) }()

// Put writes b into the scratch memory at offset off and returns its
// address in the tracee.
func (in *Injector) Put(off int, b []byte) (uint64, error) {
	if off < 0 || off+len(b) > in.scratchLen || in.scratch == 0 {
		return 0, fmt.Errorf("injector of thread %d: %d bytes at scratch offset %d do not fit its %d bytes", in.th.tid, len(b), off, in.scratchLen)
	}
	a := in.scratch + uint64(off)
	return a, in.th.p.WriteMem(a, b)
}

// PutString writes s NUL-terminated into the scratch memory at off and
// returns its address.
func (in *Injector) PutString(off int, s string) (uint64, error) {
	if off+len(s)+1 > in.scratchLen {
		return 0, fmt.Errorf("string of %d bytes does not fit the scratch area", len(s))
	}
	return in.Put(off, append([]byte(s), 0))
}

// Get reads len(b) bytes of the scratch memory at off.
func (in *Injector) Get(off int, b []byte) error {
	if off < 0 || off+len(b) > in.scratchLen || in.scratch == 0 {
		return fmt.Errorf("injector of thread %d: %d bytes at scratch offset %d are outside its %d bytes", in.th.tid, len(b), off, in.scratchLen)
	}
	return in.th.p.ReadMem(in.scratch+uint64(off), b)
}

// OpenAt injects openat(AT_FDCWD, path, flags, mode) and returns the
// descriptor the tracee got.
func (in *Injector) OpenAt(path string, flags int, mode uint32) (int, error) {
	a, err := in.PutString(0, path)
	if err != nil {
		return -1, err
	}
	fd, err := in.Call(unix.SYS_OPENAT, AtFDCWD, a, uint64(flags), uint64(mode))
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return int(fd), nil
}

// CloseFD injects close(fd).
func (in *Injector) CloseFD(fd int) error {
	_, err := in.Call(unix.SYS_CLOSE, uint64(fd))
	return err
}

// WriteStub writes the injection stub ("syscall; int3") at addr of p, for
// an Injector made with InjectorAt to run its calls through.
func (p *Process) WriteStub(addr uint64) error { return p.WriteMem(addr, stubCode[:]) }
