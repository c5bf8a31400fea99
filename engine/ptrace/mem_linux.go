package ptrace

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// memChunk is the most one system call moves.
const memChunk = 64 << 20

// Remote memory access does not need the tracer thread: these methods run
// on the caller's goroutine and may be used concurrently.
//
// Reads use process_vm_readv (one copy, no FOLL_FORCE) and fall back to
// pread on /proc/PID/mem. Writes use pwrite on /proc/PID/mem, which writes
// through read-only mappings (FOLL_FORCE); process_vm_writev cannot.
// Pages registered with userfaultfd MISSING and not yet populated fail with
// EIO through /proc/PID/mem.

var (
	_ io.ReaderAt = (*Process)(nil)
	_ io.WriterAt = (*Process)(nil)
)

// ReadMem fills b from the process's memory at addr.
func (p *Process) ReadMem(addr uint64, b []byte) error {
	_, err := p.ReadAt(b, int64(addr))
	return err
}

// WriteMem writes b into the process's memory at addr.
func (p *Process) WriteMem(addr uint64, b []byte) error { return p.writeMem(addr, b) }

// ReadAt implements io.ReaderAt with off = virtual address.
func (p *Process) ReadAt(b []byte, off int64) (int, error) {
	done := 0
	for done < len(b) {
		n := min(len(b)-done, memChunk)
		got, err := p.readv(uint64(off)+uint64(done), b[done:done+n])
		done += got
		if err != nil {
			return done, fmt.Errorf("read memory of %d at %#x: %w", p.pid, uint64(off)+uint64(done), err)
		}
	}
	return done, nil
}

// readv reads one chunk: process_vm_readv as far as it goes, /proc/PID/mem
// for the rest.
func (p *Process) readv(addr uint64, b []byte) (int, error) {
	local := []unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(len(b))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	n, err := unix.ProcessVMReadv(p.pid, local, remote, 0)
	if n == len(b) {
		return n, nil
	}
	if n < 0 {
		n = 0
	}
	if err == unix.ESRCH {
		return n, ErrExited
	}
	if p.mem == nil {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return n, err
	}
	m, err := p.mem.ReadAt(b[n:], int64(addr)+int64(n))
	return n + m, memErr(err)
}

// AddressSpaceGone reports whether the address space the process had
// when it was attached is gone: it exec'd (or exited). Reads by pid then
// reach the new program's memory, and writes and anything set up in the
// old one are lost. It asks /proc/PID/mem, which stays bound to the
// address space it was opened on: a read there gives end of file once
// that is gone, an error (nothing is mapped at 0) while it lives.
func (p *Process) AddressSpaceGone() bool {
	if p.mem == nil {
		return false
	}
	var b [1]byte
	n, err := p.mem.ReadAt(b[:], 0)
	return n == 0 && errors.Is(err, io.EOF)
}

// WriteAt implements io.WriterAt with off = virtual address.
func (p *Process) WriteAt(b []byte, off int64) (int, error) {
	if p.mem == nil {
		return 0, fmt.Errorf("write memory of %d: /proc/PID/mem not open", p.pid)
	}
	done := 0
	for done < len(b) {
		n := min(len(b)-done, memChunk)
		m, err := p.mem.WriteAt(b[done:done+n], off+int64(done))
		done += m
		if err != nil {
			return done, fmt.Errorf("write memory of %d at %#x: %w", p.pid, uint64(off)+uint64(done), memErr(err))
		}
	}
	return done, nil
}

func (p *Process) writeMem(addr uint64, b []byte) error {
	_, err := p.WriteAt(b, int64(addr))
	return err
}

// memErr unwraps the *PathError of /proc/PID/mem to its errno.
func memErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
