package testutil

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Userfaultfd opens a userfaultfd on this process (non-blocking, closed
// at cleanup), before any UFFDIO_API: the caller negotiates its features.
// It skips or fails as RequireUserfaultfd does when there is none.
func Userfaultfd(t testing.TB) int {
	t.Helper()
	RequireUserfaultfd(t)
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		t.Fatalf("userfaultfd: %v", e)
	}
	t.Cleanup(func() { unix.Close(int(fd)) })
	return int(fd)
}

// AnonPages maps n bytes of private anonymous memory in this process,
// unmapped at cleanup. Memory registered with a userfaultfd must be
// unregistered, or the userfaultfd closed, before it is unmapped, else
// munmap waits for someone to read the UNMAP event: map it before opening
// the userfaultfd (Userfaultfd), so that the cleanups close that first.
func AnonPages(t testing.TB, n int) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}
