package uffdio

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// localUffd opens a userfaultfd on this process, with API done.
func localUffd(t *testing.T, features uint64) int {
	t.Helper()
	fd := testutil.Userfaultfd(t)
	if _, _, err := API(fd, features); err != nil {
		t.Fatal(err)
	}
	return fd
}

// localRegion maps n anonymous pages in this process. Registered memory
// must be unregistered, or the uffd closed, before it is unmapped, else
// munmap would wait for someone to read the UNMAP event: call localRegion
// before localUffd, so that the cleanups close the uffd first.
func localRegion(t *testing.T, n int) []byte {
	t.Helper()
	return testutil.AnonPages(t, n*PageSize)
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func TestIoctls(t *testing.T) {
	mem := localRegion(t, 16)
	other := localRegion(t, 1)
	fd := localUffd(t, Features)

	// API twice on one fd is refused; a fresh fd reports what is supported.
	if _, _, err := API(fd, 0); err == nil {
		t.Error("second UFFDIO_API accepted")
	}
	base := addrOf(mem)
	ioctls, err := Register(fd, base, 16*PageSize, RegisterModeMissing)
	if err != nil {
		t.Fatal(err)
	}
	if ioctls&(IoctlCopy|IoctlZeroPage|IoctlWake) != IoctlCopy|IoctlZeroPage|IoctlWake {
		t.Fatalf("register ioctls %#x lack copy/zeropage/wake", ioctls)
	}
	t.Cleanup(func() { Unregister(fd, base, 16*PageSize) })

	pat := bytes.Repeat([]byte("0123456789abcdef"), 2*PageSize/16)
	if n, err := Copy(fd, base, pat, 0); err != nil || n != 2*PageSize {
		t.Fatalf("Copy 2 pages = %d, %v", n, err)
	}
	if !bytes.Equal(mem[:2*PageSize], pat) {
		t.Fatal("copied bytes differ")
	}
	if n, err := Copy(fd, base+PageSize, pat[:2*PageSize], 0); !errors.Is(err, ErrExist) || n != 0 {
		t.Fatalf("Copy onto present page = %d, %v; want 0, ErrExist", n, err)
	}
	// page 3 present, copy [2,5): page 2 placed then a stop at 3
	if _, err := Copy(fd, base+3*PageSize, pat[:PageSize], 0); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3*PageSize)
	if n, err := Copy(fd, base+2*PageSize, big, 0); !errors.Is(err, ErrShort) || n != PageSize {
		t.Fatalf("Copy over a present page = %d, %v; want %d, ErrShort", n, err, PageSize)
	}
	if n, err := ZeroPage(fd, base+5*PageSize, 2*PageSize, 0); err != nil || n != 2*PageSize {
		t.Fatalf("ZeroPage = %d, %v", n, err)
	}
	if !bytes.Equal(mem[5*PageSize:7*PageSize], make([]byte, 2*PageSize)) {
		t.Fatal("zero pages not zero")
	}
	if _, err := ZeroPage(fd, base+5*PageSize, PageSize, 0); !errors.Is(err, ErrExist) {
		t.Fatalf("ZeroPage onto present page: %v, want ErrExist", err)
	}
	// not registered, or crossing out of the registered VMA
	if _, err := Copy(fd, addrOf(other), pat[:PageSize], 0); !errors.Is(err, ErrNoVMA) {
		t.Fatalf("Copy to unregistered memory: %v, want ErrNoVMA", err)
	}
	if _, err := Copy(fd, base+15*PageSize, pat[:2*PageSize], 0); !errors.Is(err, ErrNoVMA) {
		t.Fatalf("Copy across the VMA end: %v, want ErrNoVMA", err)
	}
	// unaligned
	if _, err := Copy(fd, base+8*PageSize+1, pat[:PageSize], 0); err == nil || errors.Is(err, ErrNoVMA) {
		t.Fatalf("unaligned Copy: %v, want EINVAL", err)
	}
	if err := Wake(fd, base, 16*PageSize); err != nil {
		t.Fatal(err)
	}
	if err := Unregister(fd, base, 16*PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := Copy(fd, base+10*PageSize, pat[:PageSize], 0); !errors.Is(err, ErrNoVMA) {
		t.Fatalf("Copy after Unregister: %v, want ErrNoVMA", err)
	}
	// nothing pending: a nonblocking read finds no message
	if n, err := ReadMsgs(fd, make([]byte, 4*MsgSize)); n != 0 || err != nil {
		t.Fatalf("ReadMsgs = %d, %v", n, err)
	}
}
