package uffd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// localUffd opens a userfaultfd on this process, with API done.
func localUffd(t *testing.T, features uint64) int {
	t.Helper()
	fd := testutil.Userfaultfd(t)
	if _, _, err := uffdio.API(fd, features); err != nil {
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

func addrOf(b []byte) uint64 { return uint64(uintptrOf(b)) }

// localRegistered maps n pages in this process (localRegion) and registers
// them for missing faults on a new userfaultfd with Features; they are
// unregistered at cleanup, before the unmap.
func localRegistered(t *testing.T, n int) (mem []byte, fd int, base uint64) {
	t.Helper()
	mem = localRegion(t, n)
	fd = localUffd(t, uffdio.Features)
	base = addrOf(mem)
	if _, err := uffdio.Register(fd, base, uint64(n)*PageSize, uffdio.RegisterModeMissing); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uffdio.Unregister(fd, base, uint64(n)*PageSize) })
	return mem, fd, base
}

func TestCheckFeaturesRefuses(t *testing.T) {
	if err := checkFeatures(localUffd(t, uffdio.Features)); err != nil {
		t.Fatalf("checkFeatures with Features: %v", err)
	}
	fd := localUffd(t, uffdio.FeatureThreadID)
	if err := checkFeatures(fd); !errors.Is(err, ErrFeatures) {
		t.Fatalf("checkFeatures without events: %v, want ErrFeatures", err)
	}
	p := New(fd, bytes.NewReader(nil), []Extent{{0x100000, PageSize}}, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := p.Run(ctx); !errors.Is(err, ErrFeatures) {
		t.Fatalf("Run: %v, want ErrFeatures", err)
	}
}

func TestBadExtents(t *testing.T) {
	p := New(-1, bytes.NewReader(nil), []Extent{{0x2000, PageSize}, {0x1000, PageSize}}, Options{})
	if err := p.Run(t.Context()); !errors.Is(err, ErrExtents) {
		t.Fatalf("Run: %v, want ErrExtents", err)
	}
}

// TestPrefetchLocal prefetches into this process's own memory: no fault
// is ever taken (nothing reads the region before Run returns), so it needs
// no second process.
func TestPrefetchLocal(t *testing.T) {
	for _, ra := range []int{-1, 0, 3} {
		const pages = 1024
		mem, fd, base := localRegistered(t, pages)
		ext := testExtents(base, pages*PageSize, 64*PageSize)
		src := newPatternSrc(ext)
		var lastDone, lastTotal uint64
		p := New(fd, src, ext, Options{Prefetch: true, ReadAhead: ra, PrefetchChunk: 256 << 10,
			Progress: func(done, total uint64) { lastDone, lastTotal = done, total }})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		err := p.Run(ctx)
		cancel()
		if err != nil {
			t.Fatalf("readahead %d: Run: %v", ra, err)
		}
		st := p.Stats()
		var total uint64
		for _, e := range ext {
			total += e.Len
			want := make([]byte, e.Len)
			src.fill(want, e.Addr)
			if got := mem[e.Addr-base : e.End()-base]; !bytes.Equal(got, want) {
				t.Fatalf("readahead %d: extent %#x differs", ra, e.Addr)
			}
		}
		if st.PrefetchBytes != total || st.Pending != 0 || st.Total != total || lastDone != total || lastTotal != total {
			t.Fatalf("readahead %d: stats %+v, progress %d/%d, want %d prefetched", ra, st, lastDone, lastTotal, total)
		}
		if err := uffdio.Unregister(fd, base, pages*PageSize); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrefetchLocalReadError(t *testing.T) {
	for _, short := range []bool{false, true} {
		const pages = 256
		_, fd, base := localRegistered(t, pages)
		ext := testExtents(base, pages*PageSize, 16*PageSize)
		bad := ext[5].Addr + 3*PageSize
		src := &faultySrc{ReaderAt: newPatternSrc(ext), bad: bad, short: short}
		p := New(fd, src, ext, Options{Prefetch: true})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := p.Run(ctx)
		cancel()
		var se *ServeError
		if !errors.As(err, &se) || se.Op != "read" || bad < se.Addr || bad >= se.Addr+se.Len {
			t.Fatalf("short=%v: Run: %v, want a read ServeError covering %#x", short, err, bad)
		}
		if short && !errors.Is(err, ErrShortRead) {
			t.Fatalf("short read: %v, want ErrShortRead", err)
		}
		if !short && !errors.Is(err, errSrc) {
			t.Fatalf("read error: %v, want the source's error", err)
		}
		// the failed extent was never placed: copying it now still works
		if _, err := uffdio.Copy(fd, bad, make([]byte, PageSize), 0); err != nil {
			t.Fatalf("page %#x was placed despite the read error: %v", bad, err)
		}
		if err := uffdio.Unregister(fd, base, pages*PageSize); err != nil {
			t.Fatal(err)
		}
	}
}

var errSrc = errors.New("test source: injected failure")

// faultySrc fails reads that cover bad: with an error, or short.
type faultySrc struct {
	io.ReaderAt
	bad   uint64
	short bool
}

func (f *faultySrc) ReadAt(b []byte, off int64) (int, error) {
	if uint64(off) <= f.bad && f.bad < uint64(off)+uint64(len(b)) {
		if f.short {
			n, _ := f.ReaderAt.ReadAt(b[:f.bad-uint64(off)], off)
			return n, io.EOF
		}
		return 0, errSrc
	}
	return f.ReaderAt.ReadAt(b, off)
}

// TestPrefetchLocalSplitVMA places extents whose VMA the process split
// (mprotect): the kernel refuses a copy across VMAs, the pager halves it.
func TestPrefetchLocalSplitVMA(t *testing.T) {
	const pages = 64
	mem, fd, base := localRegistered(t, pages)
	for _, r := range [][3]int{{10, 13, unix.PROT_READ}, {40, 41, unix.PROT_NONE}, {41, 42, unix.PROT_READ}} {
		if err := unix.Mprotect(mem[r[0]*PageSize:r[1]*PageSize], r[2]); err != nil {
			t.Fatal(err)
		}
	}
	ext := []Extent{{base, pages * PageSize}}
	src := newPatternSrc(ext)
	p := New(fd, src, ext, Options{Prefetch: true, PrefetchChunk: pages * PageSize})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, pages*PageSize)
	src.fill(want, base)
	if !bytes.Equal(mem, want) {
		t.Fatal("contents differ")
	}
	if st := p.Stats(); st.PrefetchBytes != pages*PageSize {
		t.Fatalf("stats: %+v", st)
	}
}

// TestRunCancel: without prefetch nothing happens until a fault; Run ends
// with the context, having placed nothing (the idle probe places nothing
// either), and cannot be run again.
func TestRunCancel(t *testing.T) {
	const pages = 16
	_, fd, base := localRegistered(t, pages)
	ext := []Extent{{base, pages * PageSize}}
	p := New(fd, newPatternSrc(ext), ext, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 350*time.Millisecond) // several probes
	defer cancel()
	if err := p.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v, want the deadline", err)
	}
	if st := p.Stats(); st.Pending != pages*PageSize || st.Exited {
		t.Fatalf("stats after cancel: %+v", st)
	}
	for i := range pages {
		if _, err := uffdio.Copy(fd, base+uint64(i)*PageSize, make([]byte, PageSize), uffdio.CopyModeDontWake); err != nil {
			t.Fatalf("page %d was placed: %v", i, err)
		}
	}
	if err := p.Run(t.Context()); err == nil {
		t.Fatal("second Run accepted")
	}
}
