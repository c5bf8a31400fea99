package fs

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/test/testutil"
)

const (
	pidA = 4242
	pidB = 77
	// base is where the synthetic address spaces start: not block aligned,
	// high as a real mmap area is.
	base = 0x7f0000000000 + 5*imagetest.PageSize
)

const (
	protR   = unix.PROT_READ
	protRW  = unix.PROT_READ | unix.PROT_WRITE
	protRX  = unix.PROT_READ | unix.PROT_EXEC
	pageMiB = 256 // pages in a MiB
)

// pages returns n pages in bytes.
func pages(n uint64) uint64 { return n * imagetest.PageSize }

// layout returns the VMAs of a synthetic process: every content kind,
// holes inside VMAs, touching VMAs, a VMA that is not dumped, and names
// that need sanitizing.
func layout() []imagetest.VMA {
	a := uint64(base)
	next := func(n uint64, gap uint64) (uint64, uint64) {
		s := a
		a += pages(n) + pages(gap)
		return s, s + pages(n)
	}
	var v []imagetest.VMA
	add := func(n, gap uint64, vma imagetest.VMA) {
		vma.Start, vma.End = next(n, gap)
		v = append(v, vma)
	}
	add(3, 0, imagetest.VMA{Prot: protR, Kind: image.VMAFile, Name: "/usr/lib/x86_64-linux-gnu/libfoo.so.1", Content: imagetest.Text})
	add(200, 7, imagetest.VMA{Prot: protRW, Name: "[heap]", Content: imagetest.Patchwork, Holes: [][2]uint64{{pages(10), pages(13)}, {pages(100), pages(150)}}})
	add(64, 0, imagetest.VMA{Prot: protRX, Kind: image.VMAFile, Name: "/opt/app/bin/server (deleted)", NotDumped: true})
	add(300, 0, imagetest.VMA{Prot: protRW, Content: imagetest.Random})
	add(257, 3, imagetest.VMA{Prot: protRW, Name: "[anon:weights arena]", Content: imagetest.BF16})
	add(90, 1, imagetest.VMA{Prot: protRW, Content: imagetest.Zero})
	add(33, 11, imagetest.VMA{Prot: protRW, Shared: true, Kind: image.VMAShmem, Name: "/memfd:cache (deleted)", Content: imagetest.Text})
	add(129, 0, imagetest.VMA{Prot: protRW, Name: "[stack]", Content: imagetest.Patchwork, Holes: [][2]uint64{{0, pages(100)}}})
	return v
}

// smallLayout is a second process, to check processes are kept apart.
func smallLayout() []imagetest.VMA {
	return []imagetest.VMA{
		{Start: 0x400000, End: 0x400000 + pages(8), Prot: protRX, Content: imagetest.Text, Name: "/bin/small"},
		{Start: 0x600000, End: 0x600000 + pages(16), Prot: protRW, Content: imagetest.Patchwork, Name: "[heap]"},
	}
}

// writeSnapshot writes the standard two-process test snapshot.
func writeSnapshot(t testing.TB, blockSize int) *imagetest.Snapshot {
	t.Helper()
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: blockSize, Mode: codec.Compress},
		imagetest.Process{PID: pidA, Seed: 1, VMAs: layout()},
		imagetest.Process{PID: pidB, Seed: 2, VMAs: smallLayout()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mount mounts dir on a fresh mountpoint and unmounts it at the end of
// the test, checking that the mount is gone from /proc/mounts.
func mount(t testing.TB, dir string, opts Options) (*Server, *testutil.Buffer) {
	t.Helper()
	testutil.RequireFUSE(t)
	logs := &testutil.Buffer{}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	srv, err := Mount(dir, mnt, opts)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		if mounted(t, srv.Mountpoint()) {
			t.Errorf("%s still in /proc/mounts after Unmount", srv.Mountpoint())
		}
	})
	return srv, logs
}

// mounted reports whether mnt is a mount point in /proc/mounts.
func mounted(t testing.TB, mnt string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 2 && unescapeMount(f[1]) == mnt {
			return true
		}
	}
	return false
}
