package e2e

// File locks: a daemon that guards itself and its data with a flock, a
// POSIX write lock on a range and an OFD read lock (test/fixtures/lockd.py)
// holds all three again after a restore, eager or lazy: another process
// is refused each. A restore whose lock someone else holds now is refused,
// naming the file, and leaves nothing running.

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// lockd is the daemon's three files.
type lockd struct{ lock, data, state string }

// tryLocks tries, from this process, to take a lock that conflicts with
// each of the daemon's, and releases what it got. It returns, for the
// flock, the POSIX range and the OFD range, whether it was refused.
func (l lockd) tryLocks(t *testing.T) (flock, posix, ofd bool) {
	t.Helper()
	open := func(p string) int {
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	busy := func(err error) bool {
		if err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			t.Fatalf("lock: %v", err)
		}
		return err != nil
	}
	fd := open(l.lock)
	flock = busy(unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB))
	unix.Close(fd) // releases it, if taken
	setlk := func(path string, cmd int, start, length int64) bool {
		fd := open(path)
		defer unix.Close(fd) // releases a POSIX lock of ours; an OFD one with its file
		var b [32]byte
		binary.LittleEndian.PutUint16(b[0:], unix.F_WRLCK)
		binary.LittleEndian.PutUint64(b[8:], uint64(start))
		binary.LittleEndian.PutUint64(b[16:], uint64(length))
		_, _, errno := unix.Syscall(unix.SYS_FCNTL, uintptr(fd), uintptr(cmd), uintptr(unsafe.Pointer(&b[0])))
		if errno != 0 {
			return busy(errno)
		}
		return false
	}
	posix = setlk(l.data, unix.F_SETLK, 150, 1)     // inside 100-199
	ofd = setlk(l.state, unix.F_OFD_SETLK, 4000, 8) // a write inside the read lock to EOF
	return flock, posix, ofd
}

// mustHold checks that every lock of the daemon is held against us.
func (l lockd) mustHold(t *testing.T, when string) {
	t.Helper()
	if f, p, o := l.tryLocks(t); !f || !p || !o {
		t.Errorf("%s: another process got the flock %v, the POSIX range %v, the OFD range %v; want none", when, !f, !p, !o)
	}
}

func TestRestoreFileLocks(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	buildTool(t, "snapctl")
	dir := t.TempDir()
	l := lockd{filepath.Join(dir, "lockd.lock"), filepath.Join(dir, "data"), filepath.Join(dir, "state")}
	p := fixture.StartPython(t, "lockd.py", l.lock, l.data, l.state)
	l.mustHold(t, "before the dump")
	snap, si := dumpForRestore(t, ctx, p)
	kinds := map[string]int{}
	for _, f := range si.State.FDs {
		for _, k := range f.Locks {
			kinds[k.Kind]++
		}
	}
	if kinds["flock"] != 1 || kinds["posix"] != 1 || kinds["ofd"] != 1 {
		t.Errorf("snapshot locks %v, want one of each kind", kinds)
	}
	if f, p, o := l.tryLocks(t); f || p || o {
		t.Fatalf("a lock outlived the dumped daemon: flock %v, POSIX %v, OFD %v", f, p, o)
	}
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			flags := []string{}
			if mode == "lazy" {
				flags = append(flags, "--lazy")
			}
			restoreAndAdopt(t, p, snap, flags...)
			l.mustHold(t, "after the restore")
			b, err := os.ReadFile("/proc/locks")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), " POSIX  ADVISORY  WRITE "+strconv.Itoa(p.PID)+" ") {
				t.Errorf("/proc/locks has no POSIX lock of pid %d:\n%s", p.PID, b)
			}
			r := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			t.Logf("%s", r.Text)
			lazyKill(t, ctx, p)
		})
	}
	t.Run("held by another", func(t *testing.T) {
		fd, err := unix.Open(l.lock, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		r := runSnapctl(t, "restore", "-D", snap)
		wantRefused(t, ctx, r, exitFileChanged, p.PID, "fd ", l.lock, "flock")
	})
}
