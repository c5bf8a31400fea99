package fds

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
)

func TestSharedFiles(t *testing.T) {
	e1, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(e1)
	e2, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(e2)
	dup, err := unix.FcntlInt(uintptr(e1), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	all, err := proc.ReadFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	fx := &fdDumper{pid: os.Getpid(), all: all}
	dups := fx.sharedFiles()
	lo, hi := min(e1, dup), max(e1, dup)
	if first, ok := dups[hi]; !ok || first != lo {
		t.Errorf("fds %d and %d are one eventfd: shared %v, want %d -> %d", e1, dup, dups, hi, lo)
	}
	if _, ok := dups[lo]; ok {
		t.Errorf("the lower fd %d counted as a dup: %v", lo, dups)
	}
	if _, ok := dups[e2]; ok {
		t.Errorf("a second eventfd %d counted as shared: %v", e2, dups)
	}
}
