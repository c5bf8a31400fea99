package sock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// nobody is a uid that is neither root nor the test's.
const nobody = 65534

// staleTree lays out, under root, the directories a/b/c each shaped by
// one byte of shape, with the socket path root/a/b/c/s, and a directory
// "outside" holding a file and a socket that no removal may touch. A
// component is, by its byte's low bits: a plain directory; a symbolic
// link to outside; a directory owned by nobody; one writable by all
// (sticky if the next bit is set). The stale file at the end is a socket,
// a regular file, a link to outside's socket, or missing.
func staleTree(t *testing.T, root string, shape []byte) (string, []string) {
	t.Helper()
	outside := filepath.Join(root, "outside")
	must(t, os.Mkdir(outside, 0o700))
	canaryFile := filepath.Join(outside, "s")
	must(t, os.WriteFile(canaryFile, []byte("root's"), 0o600))
	canarySock := filepath.Join(outside, "sock")
	mkSocket(t, canarySock)
	at := root
	for i, c := range []string{"a", "b", "c"} {
		var b byte
		if i < len(shape) {
			b = shape[i]
		}
		at = filepath.Join(at, c)
		switch b % 4 {
		case 0:
			must(t, os.Mkdir(at, 0o755))
		case 1:
			must(t, os.Symlink(outside, at))
			return filepath.Join(at, "s"), []string{canaryFile, canarySock}
		case 2:
			must(t, os.Mkdir(at, 0o755))
			must(t, os.Chown(at, nobody, nobody))
		case 3:
			mode := os.FileMode(0o777)
			if b&4 != 0 {
				mode |= os.ModeSticky
			}
			must(t, os.Mkdir(at, 0o700))
			must(t, os.Chmod(at, mode))
		}
	}
	path := filepath.Join(at, "s")
	var b byte
	if len(shape) > 3 {
		b = shape[3]
	}
	switch b % 4 {
	case 0:
		mkSocket(t, path)
	case 1:
		must(t, os.WriteFile(path, []byte("a file"), 0o600))
	case 2:
		must(t, os.Symlink(canarySock, path))
	}
	return path, []string{canaryFile, canarySock}
}

func mkSocket(t *testing.T, path string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, unix.Bind(fd, &unix.SockaddrUnix{Name: path}))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzRemoveStaleSocket: whatever the shape of the path (links, other
// owners, writable directories) and whatever is at its end, removing a
// stale socket removes nothing but a socket at that very path, reached
// through directories nobody else could change, and never a file outside.
func FuzzRemoveStaleSocket(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root to give directories to another user")
	}
	for _, s := range [][]byte{{0, 0, 0, 0}, {0, 1}, {2, 0, 0, 0}, {0, 3, 0, 0}, {0, 7, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 2}, {0, 0, 0, 3}} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, shape []byte) {
		root := t.TempDir()
		path, canaries := staleTree(t, root, shape)
		var before unix.Stat_t
		hadSocket := unix.Lstat(path, &before) == nil && before.Mode&unix.S_IFMT == unix.S_IFSOCK
		err := removeStaleSocket(path, unix.SOCK_STREAM, 0)
		for _, c := range canaries {
			if _, serr := os.Lstat(c); serr != nil {
				t.Fatalf("shape %v: %s outside was removed (err %v)", shape, c, err)
			}
		}
		trusted := true
		for _, dir := range []string{filepath.Join(root, "a"), filepath.Join(root, "a", "b"), filepath.Join(root, "a", "b", "c")} {
			var st unix.Stat_t
			if unix.Lstat(dir, &st) != nil {
				break
			}
			if st.Mode&unix.S_IFMT == unix.S_IFLNK || st.Uid != 0 || (st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0) {
				trusted = false
			}
		}
		var after unix.Stat_t
		exists := unix.Lstat(path, &after) == nil
		switch {
		case err == nil && exists:
			t.Errorf("shape %v: no error, yet something is still at %s", shape, path)
		case err == nil && !trusted:
			t.Errorf("shape %v: removed through an untrusted directory", shape)
		case err != nil && !errors.Is(err, ErrUntrustedPath):
			t.Errorf("shape %v: %v, want nil or ErrUntrustedPath", shape, err)
		case err != nil && hadSocket && trusted:
			t.Errorf("shape %v: a socket in a trusted directory was not removed: %v", shape, err)
		}
	})
}

// TestRemoveStaleSocketLeavesLiveOne: a socket another program listens on
// is never removed; one nobody listens on is.
func TestRemoveStaleSocketLeavesLiveOne(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "live.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, unix.Bind(fd, &unix.SockaddrUnix{Name: path}))
	must(t, unix.Listen(fd, 1))
	if err := removeStaleSocket(path, unix.SOCK_STREAM, uint32(os.Geteuid())); !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("removing a live socket: %v, want EADDRINUSE", err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("the live socket is gone: %v", err)
	}
	stale := filepath.Join(dir, "stale.sock")
	mkSocket(t, stale)
	if err := removeStaleSocket(stale, unix.SOCK_STREAM, uint32(os.Geteuid())); err != nil {
		t.Errorf("removing a stale socket: %v", err)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale socket is still there: %v", err)
	}
}
