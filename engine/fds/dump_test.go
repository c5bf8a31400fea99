package fds

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
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

// dumpOwn describes descriptor num of the test's own process, as a dump
// of a frozen process would: what /proc and copies of the descriptor
// (pidfd_getfd) tell, without ptrace.
func dumpOwn(t *testing.T, num int) (image.FD, error) {
	t.Helper()
	all, err := proc.ReadFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	fx, err := newFDDumper(os.Getpid(), nil, all, nil, DumpOptions{}, map[string]bool{})
	if err != nil {
		t.Fatal(err)
	}
	defer fx.close()
	for i := range all {
		if all[i].Num == num {
			return fx.fd(&all[i])
		}
	}
	t.Fatalf("fd %d not in /proc/self/fd", num)
	return image.FD{}, nil
}

// A pipe whose ends are both in the process is recorded with the bytes
// in flight, with its read end; they are in it again after a restore.
func TestDumpPipePair(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.Write(p[1], []byte("in flight")); err != nil {
		t.Fatal(err)
	}
	r, err := dumpOwn(t, p[0])
	if err != nil {
		t.Fatal(err)
	}
	w, err := dumpOwn(t, p[1])
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != image.FDPipe || r.Pipe == nil || string(r.Pipe.Buffered) != "in flight" || w.Pipe == nil || w.Pipe.ID != r.Pipe.ID || len(w.Pipe.Buffered) != 0 {
		t.Fatalf("read end %+v, write end %+v: want one pipe, its bytes with the read end", r, w)
	}
	if b := make([]byte, 16); readNow(p[0], b) != "in flight" {
		t.Error("the dump consumed the bytes in flight")
	}
	fp := newFakeProc(t)
	if err := fp.restore(&image.Process{PID: 10, FDs: []image.FD{r, w}}, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := string(fp.fd(w.FD).written); got != "in flight" {
		t.Errorf("restored pipe holds %q", got)
	}
}

// readNow reads what fd has to read, without waiting.
func readNow(fd int, b []byte) string {
	unix.SetNonblock(fd, true)
	n, _ := unix.Read(fd, b)
	return string(b[:max(n, 0)])
}

// A regular file is recorded by path, identity, offset and flags, and
// the file locks held through it; the restore opens that file again at
// that offset and takes the locks.
func TestDumpFileAtOffset(t *testing.T) {
	path := t.TempDir() + "/data"
	if err := os.WriteFile(path, make([]byte, 5000), 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_APPEND|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Seek(fd, 1234, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	f, err := dumpOwn(t, fd)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if f.Kind != image.FDFile || f.Path != path || f.Pos != 1234 || !f.CloExec || f.Flags&(unix.O_ACCMODE|unix.O_APPEND) != unix.O_RDWR|unix.O_APPEND ||
		f.File == nil || f.File.Ino != st.Ino || f.File.Size != 5000 {
		t.Errorf("dumped %+v (file %+v): want %s, inode %d, at 1234, read-write appending, close-on-exec", f, f.File, path, st.Ino)
	}
	if len(f.Locks) != 1 || f.Locks[0] != (image.Lock{Kind: image.LockFlock, Write: true, End: -1}) {
		t.Errorf("locks %+v, want one exclusive flock", f.Locks)
	}
	fp := newFakeProc(t)
	fp.files[path] = st
	if err := fp.restore(&image.Process{PID: 10, FDs: []image.FD{f}}, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	got := fp.fd(f.FD)
	if got.name != path || got.flags&unix.O_APPEND == 0 || strings.Join(got.locks, "") != "flock 0x6" { // LOCK_EX|LOCK_NB
		t.Errorf("restored %s, flags %#o, locks %v", got.name, got.flags, got.locks)
	}
}

// A socket of a family the format cannot describe is refused at the
// dump, naming the family.
func TestDumpSocketRefused(t *testing.T) {
	s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		t.Skip(err)
	}
	defer unix.Close(s)
	if _, err := dumpOwn(t, s); !errors.Is(err, image.ErrUnsupported) || !strings.Contains(err.Error(), "netlink socket") {
		t.Errorf("dump of a netlink socket: %v, want image.ErrUnsupported naming it", err)
	}
}
