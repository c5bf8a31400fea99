package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// badPage returns the address of a page whose read sees the byte corrupt
// changed in block b: the page holding it in a Raw block, whose pages are
// checked one by one; any page of a block that is decoded whole.
func badPage(b image.Block) uint64 {
	if b.Kind == codec.Raw {
		return (b.Addr + uint64(b.StoredLen)/2) &^ 4095
	}
	return b.Addr
}

// corrupt flips a byte in the middle of the payload of the first block of
// kind k and returns the block.
func corrupt(t testing.TB, dir string, pid int, k codec.Kind) image.Block {
	t.Helper()
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := snap.OpenPages(pid, image.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for b := range r.Blocks() {
		if b.Kind != k {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("pages-%d.img", pid)), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		off := int64(b.Off) + int64(b.StoredLen)/2
		var c [1]byte
		if _, err := f.ReadAt(c[:], off); err != nil {
			t.Fatal(err)
		}
		c[0] ^= 0x5a
		if _, err := f.WriteAt(c[:], off); err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatalf("no %v block", k)
	return image.Block{}
}

func TestCorruptBlockIsEIO(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	bad := []image.Block{corrupt(t, s.Dir, pidA, codec.Raw), corrupt(t, s.Dir, pidA, codec.LZ4)}
	srv, logs := mount(t, s.Dir, Options{})
	f, err := os.Open(srv.MemPath(pidA))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, b := range bad {
		buf := make([]byte, 4096)
		// twice: the failure is not cached, and the page cache holds no page of it
		for i := 0; i < 2; i++ {
			if _, err := f.ReadAt(buf, int64(badPage(b))); !errors.Is(err, syscall.EIO) {
				t.Errorf("read of corrupt %v block %d at %#x: %v, want EIO", b.Kind, b.Index, badPage(b), err)
			}
		}
		if badPage(b) != b.Addr {
			// The other pages of a Raw block are checked on their own.
			if _, err := f.ReadAt(buf, int64(b.Addr)); err != nil || !bytes.Equal(buf, s.Memory(pidA, b.Addr, len(buf))) {
				t.Errorf("read of a sound page of corrupt Raw block %d: %v", b.Index, err)
			}
		}
		want := []string{"pages-4242.img", fmt.Sprintf("block=%d", b.Index), fmt.Sprintf("addr=%#x", b.Addr)}
		for _, w := range want {
			if !strings.Contains(logs.String(), w) {
				t.Errorf("log lacks %q:\n%s", w, logs)
			}
		}
		// the blocks around it read fine
		for _, addr := range []uint64{b.Addr - 64<<10, b.End()} {
			if !inBad(addr, bad) && addr >= base {
				if _, err := f.ReadAt(buf, int64(addr)); err != nil {
					t.Errorf("read at %#x beside the corrupt block: %v", addr, err)
				} else if !bytes.Equal(buf, s.Memory(pidA, addr, len(buf))) {
					t.Errorf("read at %#x beside the corrupt block differs", addr)
				}
			}
		}
	}
	// every other region reads whole
	for _, v := range dumpedVMAs(layout()) {
		p := filepath.Join(srv.Mountpoint(), strconv.Itoa(pidA), "regions", regionName(imageVMA(v)))
		got, err := os.ReadFile(p)
		if touches(v.Start, v.End, bad) {
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("%s holds a corrupt block, read gives %v", p, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, s.Memory(pidA, v.Start, int(v.End-v.Start))) {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func inBad(addr uint64, bad []image.Block) bool { return touches(addr, addr+1, bad) }

func touches(lo, hi uint64, bad []image.Block) bool {
	for _, b := range bad {
		if lo < b.End() && b.Addr < hi {
			return true
		}
	}
	return false
}

func TestMountRefuses(t *testing.T) {
	testutil.RequireFUSE(t)
	s := writeSnapshot(t, 64<<10)
	dirMnt := func() string {
		d := filepath.Join(t.TempDir(), "mnt")
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}

	t.Run("incomplete snapshot", func(t *testing.T) {
		inc := filepath.Join(t.TempDir(), "inc")
		os.Mkdir(inc, 0o700)
		os.WriteFile(filepath.Join(inc, "pages-1.img"), []byte("x"), 0o600)
		_, err := Mount(inc, dirMnt(), Options{})
		if !errors.Is(err, image.ErrIncomplete) {
			t.Errorf("mount of a snapshot without manifest: %v, want ErrIncomplete", err)
		}
	})
	t.Run("corrupt index", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad")
		copyDir(t, s.Dir, bad)
		p := filepath.Join(bad, fmt.Sprintf("pagemap-%d.img", pidA))
		b, _ := os.ReadFile(p)
		b[70] ^= 1
		os.WriteFile(p, b, 0o600)
		if _, err := Mount(bad, dirMnt(), Options{}); err == nil {
			t.Errorf("mounted a snapshot with a corrupt index")
		}
	})
	t.Run("mountpoint is a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o600)
		if _, err := Mount(s.Dir, f, Options{}); !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("mount on a file: %v, want ENOTDIR", err)
		}
	})
	t.Run("mountpoint missing", func(t *testing.T) {
		if _, err := Mount(s.Dir, filepath.Join(t.TempDir(), "nope"), Options{}); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("mount on a missing directory: %v, want ErrNotExist", err)
		}
	})
	t.Run("mountpoint of the kernel's", func(t *testing.T) {
		// /proc/self is this process's own /proc/PID: a mount there would
		// hide it from itself.
		for _, mnt := range []string{"/proc/self", "/sys/kernel"} {
			srv, err := Mount(s.Dir, mnt, Options{})
			if err == nil {
				srv.Unmount()
				t.Errorf("mounted on %s", mnt)
			} else if !errors.Is(err, ErrKernelFS) {
				t.Errorf("mount on %s: %v, want a refusal naming the kernel's filesystem", mnt, err)
			}
		}
	})
	t.Run("mountpoint already a mount", func(t *testing.T) {
		srv, _ := mount(t, s.Dir, Options{})
		if _, err := Mount(s.Dir, srv.Mountpoint(), Options{}); !errors.Is(err, ErrBusy) {
			t.Errorf("mount on a mount point: %v, want ErrBusy", err)
		}
	})
}

func copyDir(t testing.TB, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

func TestUnmount(t *testing.T) {
	s := writeSnapshot(t, 64<<10)

	t.Run("external", func(t *testing.T) {
		srv, _ := mount(t, s.Dir, Options{})
		if err := Unmount(srv.Mountpoint()); err != nil {
			t.Fatal(err)
		}
		srv.Wait() // returns: the serve loop saw the unmount
		if err := srv.Unmount(); err != nil {
			t.Errorf("Unmount after an external unmount: %v", err)
		}
	})
	t.Run("busy", func(t *testing.T) {
		srv, _ := mount(t, s.Dir, Options{})
		f, err := os.Open(srv.MemPath(pidA))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := Unmount(srv.Mountpoint()); !errors.Is(err, ErrBusy) {
			t.Errorf("external unmount with a file open: %v, want ErrBusy", err)
		}
		// the server's own Unmount detaches a busy mount
		if err := srv.Unmount(); err != nil && os.Geteuid() == 0 {
			t.Errorf("Unmount of a busy mount: %v", err)
		}
		if mounted(t, srv.Mountpoint()) {
			t.Errorf("busy mount still in /proc/mounts")
		}
		// the open file is served (or aborted) until closed; then the
		// server is done
		buf := make([]byte, 100)
		if _, err := f.ReadAt(buf, base); err != nil && !errors.Is(err, syscall.ENOTCONN) {
			t.Errorf("read of a file open on the detached mount: %v", err)
		}
		f.Close()
		select {
		case <-srv.Done():
		case <-time.After(10 * time.Second):
			t.Errorf("server still serving 10s after the last file on the detached mount closed")
		}
	})
	t.Run("force", func(t *testing.T) {
		srv, _ := mount(t, s.Dir, Options{})
		f, err := os.Open(srv.MemPath(pidA))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := ForceUnmount(srv.Mountpoint()); err != nil {
			t.Fatal(err)
		}
		if mounted(t, srv.Mountpoint()) {
			t.Errorf("mount still in /proc/mounts after ForceUnmount")
		}
		if os.Geteuid() == 0 { // MNT_FORCE aborted the connection
			if _, err := f.ReadAt(make([]byte, 10), base); !errors.Is(err, syscall.ENOTCONN) {
				t.Errorf("read of a file open on an aborted mount: %v, want ENOTCONN", err)
			}
			select {
			case <-srv.Done():
			case <-time.After(10 * time.Second):
				t.Errorf("server still serving 10s after its connection was aborted")
			}
		}
	})
	t.Run("not a lazyfs mount", func(t *testing.T) {
		if err := Unmount(t.TempDir()); !errors.Is(err, ErrNotMounted) {
			t.Errorf("unmount of a plain directory: %v, want ErrNotMounted", err)
		}
		if err := Unmount("/proc"); !errors.Is(err, ErrNotMounted) {
			t.Errorf("unmount of /proc: %v, want ErrNotMounted", err)
		}
		if err := ForceUnmount("/proc"); !errors.Is(err, ErrNotMounted) {
			t.Errorf("force unmount of /proc: %v, want ErrNotMounted", err)
		}
	})
}

func TestCheckFUSE(t *testing.T) {
	missing := func(string) (string, error) { return "", os.ErrNotExist }
	found := func(name string) (string, error) { return "/usr/bin/" + name, nil }
	dir := t.TempDir()
	dev := filepath.Join(dir, "fuse")
	os.WriteFile(dev, nil, 0o666)
	for _, tc := range []struct {
		name string
		dev  string
		euid int
		look func(string) (string, error)
		ok   bool
	}{
		{"no /dev/fuse, root", filepath.Join(dir, "none"), 0, found, false},
		{"no /dev/fuse, user", filepath.Join(dir, "none"), 1000, found, false},
		{"no fusermount3, user", dev, 1000, missing, false},
		{"no fusermount3, root", "/dev/null", 0, missing, false},
		{"fusermount3, root", "/dev/null", 0, found, true},
		{"fusermount3, user", dev, 1000, found, true},
	} {
		seen, err := checkFUSEWith(tc.dev, tc.euid, tc.look, dir) // dir holds no helper
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrNoFUSE)) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.ok && !strings.HasSuffix(seen, "; /usr/bin/fusermount3") {
			t.Errorf("%s: found %q, want the fusermount3 path last", tc.name, seen)
		}
	}
}

// TestOpenMount: a lazyfs mount of the snapshot passes and its memory
// files open through it, even once its path names something else; a plain
// directory holding the same manifest, and a lazyfs mount of another
// snapshot, do not pass.
func TestOpenMount(t *testing.T) {
	testutil.RequireFUSE(t)
	s := writeSnapshot(t, 64<<10)
	manifest, err := os.ReadFile(filepath.Join(s.Dir, image.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := mount(t, s.Dir, Options{})
	// The mount reached through a symbolic link, as a path given by a
	// user may be.
	link := filepath.Join(t.TempDir(), "mnt")
	if err := os.Symlink(srv.Mountpoint(), link); err != nil {
		t.Fatal(err)
	}
	m, err := OpenMount(link, manifest)
	if err != nil {
		t.Fatalf("a lazyfs mount of the snapshot: %v", err)
	}
	defer m.Close()
	fake := t.TempDir()
	if err := os.WriteFile(filepath.Join(fake, image.ManifestName), manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenMount(fake, manifest); !errors.Is(err, ErrNotMounted) {
		t.Errorf("a plain directory with the manifest: %v, want ErrNotMounted", err)
	}
	other := writeSnapshot(t, 128<<10)
	srv2, _ := mount(t, other.Dir, Options{})
	if _, err := OpenMount(srv2.Mountpoint(), manifest); !errors.Is(err, ErrNotMounted) {
		t.Errorf("a lazyfs mount of another snapshot: %v, want ErrNotMounted", err)
	}

	// The link retargeted after the check, at a directory that looks
	// like the mount: the memory is still the checked mount's.
	pid := s.Procs[0].PID
	if err := os.MkdirAll(filepath.Join(fake, strconv.Itoa(pid)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, strconv.Itoa(pid), "mem"), []byte("planted"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fake, link); err != nil {
		t.Fatal(err)
	}
	f, err := m.OpenMem(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st, want unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(srv.Mountpoint(), &want); err != nil {
		t.Fatal(err)
	}
	if st.Dev != want.Dev {
		t.Errorf("memory file opened on device %#x, the checked mount is %#x: the retargeted link was followed", st.Dev, want.Dev)
	}
	// A path that leaves the mount is refused.
	if _, err := m.open("..", image.ManifestName); err == nil {
		t.Error("opened a file above the mount's root")
	}
}
