package uffd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd/policy"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

const (
	mib   = 1 << 20
	block = 256 << 10
)

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() && os.Getenv("UFFD_TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// setup starts a fixture with one registered region of size bytes, cut
// into test extents.
func setup(t *testing.T, size uint64) (*target, int, uint64, []Extent, *patternSrc) {
	t.Helper()
	f, fd, base := startRegistered(t, size)
	ext := testExtents(base, size, block)
	return f, fd, base, ext, newPatternSrc(ext)
}

// TestPagerFaultsAndEvents serves a process by faults only, through
// reads, writes, madvise(DONTNEED), munmap, mremap and mprotect.
func TestPagerFaultsAndEvents(t *testing.T) {
	const size = 8 * mib
	f, fd, base, ext, src := setup(t, size)
	m := newMem(base, size, ext, src)
	spare := f.do("map %x", 2*mib)[0] // mremap destination, not registered
	p := New(fd, src, ext, Options{Logger: testLogger(t)})
	errc := runPager(t, p, fd, base, size, time.Minute)

	blk := func(i uint64) uint64 { return base + i*block }
	// munmap: pending extents and a part of one (first: a scan of the
	// blocks before them would bring them in ahead of it)
	f.do("munmap %x %x", blk(14), 2*block)
	m.unmap(blk(14), 2*block)
	f.do("munmap %x %x", blk(16)+block/2, block/2)
	m.unmap(blk(16)+block/2, block/2)

	// reads: inside an extent, a hole block (3), a short extent and its tail (2), across
	f.checkSum(m, "read in extent", blk(0)+5*PageSize, 3*PageSize)
	f.checkSum(m, "read hole", blk(3), block)
	f.checkSum(m, "read short extent", blk(2), block)
	f.checkSum(m, "read across", blk(4)-PageSize, 2*PageSize+block)
	// writes: into a hole, into a pending extent
	f.do("fill %x %x %x", blk(8)+PageSize, 2*PageSize, 0x5a) // 8 is a hole
	m.fill(blk(8)+PageSize, 2*PageSize, 0x5a)
	f.do("fill %x %x %x", blk(10)+PageSize, PageSize, 0xa5)
	m.fill(blk(10)+PageSize, PageSize, 0xa5)
	f.checkSum(m, "after writes", blk(8), 3*block)

	// DONTNEED: a served extent, a pending one, a hole punched in a pending one
	f.do("dontneed %x %x", blk(0), block)
	m.zero(blk(0), block)
	f.do("dontneed %x %x", blk(11), block)
	m.zero(blk(11), block)
	f.do("dontneed %x %x", blk(12)+8*PageSize, 4*PageSize)
	m.zero(blk(12)+8*PageSize, 4*PageSize)
	f.checkSum(m, "after dontneed", blk(0), 13*block)

	// mremap a pending 1 MiB, partly served first, partly dropped
	from := blk(20)
	f.checkSum(m, "before mremap", from+PageSize, PageSize)
	f.do("dontneed %x %x", from+2*PageSize, PageSize)
	m.zero(from+2*PageSize, PageSize)
	if got := f.do("mremap %x %x %x", from, mib, spare)[0]; got != spare {
		t.Fatalf("mremap to %#x landed at %#x", spare, got)
	}
	m.move(from, spare, mib)
	f.checkSum(m, "after mremap", spare, mib)

	// mprotect splits a pending extent's VMA: a copy across must still work
	f.do("mprotect %x %x %x", blk(25)+4*PageSize, 4*PageSize, 1) // PROT_READ
	f.checkSum(m, "across split VMA", blk(25), block)

	// read everything left: Run must then end
	for a := base; a < base+size; a += block {
		if _, ok := m[a]; ok && a != blk(16) {
			f.checkSum(m, "all", a, block)
		}
	}
	f.checkSum(m, "all", blk(16), block/2)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := p.Stats()
	t.Logf("stats: %+v", st)
	if st.Pending != 0 || st.DataFaults == 0 || st.ZeroFaults == 0 || st.Removes < 4 || st.Unmaps < 2 || st.Remaps != 1 || st.RemappedBytes == 0 || st.UnmappedBytes == 0 || st.RemovedBytes == 0 {
		t.Errorf("stats do not show the work: %+v", st)
	}
	// after Run (and unregistering) holes fill from the kernel
	f.checkSum(m, "hole after unregister", blk(13)-0, block)
	f.checkSum(m, "everything after unregister", base, blk(14)-base)
}

// TestPagerPrefetch lets the prefetcher bring everything in untouched.
func TestPagerPrefetch(t *testing.T) {
	forWorkers(t, func(t *testing.T, workers int) {
		const size = 16 * mib
		f, fd, base, ext, src := setup(t, size)
		m := newMem(base, size, ext, src)
		p := New(fd, src, ext, Options{Prefetch: true, Workers: workers, Logger: testLogger(t)})
		errc := runPager(t, p, fd, base, size, time.Minute)
		if err := waitRun(t, errc, 30*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
		st := p.Stats()
		if st.Pending != 0 || st.PrefetchBytes+st.FaultBytes != st.Total {
			t.Fatalf("stats: %+v", st)
		}
		f.checkSum(m, "all", base, size)
	})
}

// slowSrc delays every read, so that a prefetch takes long.
type slowSrc struct {
	io.ReaderAt
	delay time.Duration
}

func (s slowSrc) ReadAt(b []byte, off int64) (int, error) {
	time.Sleep(s.delay)
	return s.ReaderAt.ReadAt(b, off)
}

// TestPagerFaultDuringPrefetch touches the far end of a region while a
// slow prefetch is at its start: faults are served first, and right.
func TestPagerFaultDuringPrefetch(t *testing.T) {
	forWorkers(t, func(t *testing.T, workers int) {
		const size = 32 * mib
		f, fd, base, ext, src := setup(t, size)
		m := newMem(base, size, ext, src)
		p := New(fd, slowSrc{src, 3 * time.Millisecond}, ext, Options{Prefetch: true, PrefetchChunk: block, Workers: workers, Logger: testLogger(t)})
		errc := runPager(t, p, fd, base, size, time.Minute)
		f.checkSum(m, "far end", base+size-mib, mib)
		f.checkSum(m, "middle", base+size/2, 2*PageSize)
		during := p.Stats()
		if err := waitRun(t, errc, 45*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
		st := p.Stats()
		t.Logf("at the touch: faults %d prefetched %d of %d; at the end: %+v", during.Faults, during.PrefetchBytes, st.Total, st)
		if st.PrefetchBytes+st.FaultBytes != st.Total {
			t.Fatalf("placed %d+%d bytes, want %d", st.PrefetchBytes, st.FaultBytes, st.Total)
		}
		f.checkSum(m, "all", base, size)
	})
}

// TestPagerChurn runs a prefetch while the process faults from several
// threads at once, drops pages and moves ranges: events land while copies
// and read-ahead chunks are in flight.
func TestPagerChurn(t *testing.T) {
	forWorkers(t, func(t *testing.T, workers int) {
		const size = 16 * mib
		f, fd, base, ext, src := setup(t, size)
		m := newMem(base, size, ext, src)
		spare1, spare2 := f.do("map %x", mib)[0], f.do("map %x", 2*mib)[0]
		// Reads of [8, 10) MiB, which nothing below touches, wait until the
		// churn is over: the pager must still run (holes are served only
		// while it does).
		// No stride-ahead: psum's four threads fault first at 12, 13, 14
		// and 15 MiB in whatever order the scheduler runs them; in
		// descending order that is a stride of -1 MiB, whose reads ahead
		// (on the serving goroutine, which waits for them) reach the
		// gated range, and the pager then serves nothing until the gate
		// opens after psum: a deadlock of the test's making, seen on a
		// loaded machine.
		gate := &gatedSrc{patternSrc: src, from: base + 8*mib, to: base + 10*mib, open: make(chan struct{})}
		p := New(fd, slowSrc{gate, time.Millisecond}, ext, Options{Prefetch: true, PrefetchChunk: block, Workers: workers, NoStrideAhead: true, Logger: testLogger(t)})
		errc := runPager(t, p, fd, base, size, time.Minute)
		defer func() {
			select {
			case <-gate.open:
			default:
				close(gate.open)
			}
		}()

		f.do("churn %x %x %x", base+4*mib, 4*mib, 64<<10)
		for a := base + 4*mib; a < base+8*mib; a += 64 << 10 {
			m.zero(a, PageSize)
		}
		if got := f.do("mremap %x %x %x", base+10*mib, 2*mib, spare2)[0]; got != spare2 {
			t.Fatalf("mremap landed at %#x", got)
		}
		m.move(base+10*mib, spare2, 2*mib)
		r := f.do("psum %x %x %x", base+12*mib, 4*mib, 4)
		for i, h := range r {
			a := base + 12*mib + uint64(i)*mib
			if want := m.hash(t, a, mib); h != want {
				t.Fatalf("thread %d: sum of %#x+1MiB = %016x, want %016x", i, a, h, want)
			}
		}
		if got := f.do("mremap %x %x %x", base+mib, mib, spare1)[0]; got != spare1 {
			t.Fatalf("mremap landed at %#x", got)
		}
		m.move(base+mib, spare1, mib)
		f.do("churn %x %x %x", spare2, 2*mib, 128<<10)
		for a := spare2; a < spare2+2*mib; a += 128 << 10 {
			m.zero(a, PageSize)
		}
		close(gate.open)
		if err := waitRun(t, errc, 45*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
		st := p.Stats()
		t.Logf("stats: %+v", st)
		// Unregister the moved ranges as well before reading their holes.
		if err := uffdio.Unregister(fd, spare1, mib); err != nil {
			t.Fatal(err)
		}
		if err := uffdio.Unregister(fd, spare2, 2*mib); err != nil {
			t.Fatal(err)
		}
		f.checkSum(m, "start", base, mib)
		f.checkSum(m, "moved 1", spare1, mib)
		f.checkSum(m, "middle", base+2*mib, 8*mib)
		f.checkSum(m, "moved 2", spare2, 2*mib)
		f.checkSum(m, "end", base+12*mib, 4*mib)
	})
}

// TestPagerFork forks children while pages are pending: a child gets
// what its parent had not received, from its own pager; the second child
// exits without touching most of its memory.
func TestPagerFork(t *testing.T) {
	for _, mode := range []struct {
		name     string
		prefetch bool
		workers  int
	}{{"faults", false, 0}, {"prefetch", true, 0}, {"workers", true, 2}} {
		prefetch, workers := mode.prefetch, mode.workers
		t.Run(mode.name, func(t *testing.T) {
			const size = 8 * mib
			f, fd, base, ext, src := setup(t, size)
			m := newMem(base, size, ext, src)
			// With prefetch, reads of the last 2 MiB wait for the gate, so
			// that the parent cannot be done before the first fork.
			gate := &gatedSrc{patternSrc: src, from: base + size - 2*mib, open: make(chan struct{})}
			if !prefetch {
				close(gate.open)
			}
			p := New(fd, gate, ext, Options{Prefetch: prefetch, PrefetchChunk: block, Workers: workers, Logger: testLogger(t)})
			errc := runPager(t, p, fd, base, size, time.Minute)
			// the parent takes some, drops some, writes some
			f.checkSum(m, "parent part", base, 2*mib)
			f.do("dontneed %x %x", base+3*mib, mib)
			m.zero(base+3*mib, mib)
			f.do("fill %x %x %x", base+5*mib, PageSize, 0x77)
			m.fill(base+5*mib, PageSize, 0x77)
			f.send("fork %x %x", base, size)
			if prefetch {
				waitFor(t, "fork event", func() bool { return p.Stats().Forks == 1 })
				close(gate.open)
			}
			r := f.answer("fork", 20*time.Second)
			if want := m.hash(t, base, size); r[0] != want || r[1] != 0 {
				t.Fatalf("child sum %016x status %#x, want %016x 0", r[0], r[1], want)
			}
			// a second child, that reads part of its memory and exits
			r = f.do("fork %x %x", base+mib, 4*mib)
			if want := m.hash(t, base+mib, 4*mib); r[0] != want {
				t.Fatalf("second child sum %016x, want %016x", r[0], want)
			}
			f.checkSum(m, "parent all", base, size)
			if err := waitRun(t, errc, 30*time.Second); err != nil {
				t.Fatalf("Run: %v", err)
			}
			st := p.Stats()
			t.Logf("stats: %+v", st)
			if st.Forks < 1 || len(st.Children) != int(st.Forks) || (!prefetch && st.Forks != 2) {
				t.Fatalf("forks %d children %d", st.Forks, len(st.Children))
			}
			if c := st.Children[0]; c.Pending != 0 || c.FaultBytes+c.PrefetchBytes == 0 {
				t.Fatalf("first child: %+v", c)
			}
			if !prefetch && !st.Children[1].Exited {
				t.Fatalf("second child's exit not seen: %+v", st.Children[1])
			}
		})
	}
}

// gatedSrc holds reads that reach [from, to) (to 0: no end) until open is
// closed.
type gatedSrc struct {
	*patternSrc
	from, to uint64
	open     chan struct{}
}

func (g *gatedSrc) ReadAt(b []byte, off int64) (int, error) {
	if uint64(off)+uint64(len(b)) > g.from && (g.to == 0 || uint64(off) < g.to) {
		<-g.open
	}
	return g.patternSrc.ReadAt(b, off)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// ReaderAtFunc adapts a function to io.ReaderAt.
type ReaderAtFunc func([]byte, int64) (int, error)

func (f ReaderAtFunc) ReadAt(b []byte, off int64) (int, error) { return f(b, off) }

// TestPagerReadError: a fault on an extent the source cannot read ends
// Run with an error naming the address, and nothing is placed there.
func TestPagerReadError(t *testing.T) {
	const size = 4 * mib
	f, fd, base, ext, src := setup(t, size)
	bad := ext[6].Addr + 2*PageSize
	p := New(fd, &faultySrc{ReaderAt: src, bad: bad}, ext, Options{Logger: testLogger(t)})
	errc := runPager(t, p, fd, base, size, time.Minute)
	f.send("sum %x %x", bad, 8)
	err := waitRun(t, errc, 30*time.Second)
	var se *ServeError
	if !errors.As(err, &se) || se.Op != "read" || bad < se.Addr || bad >= se.Addr+se.Len || !errors.Is(err, errSrc) {
		t.Fatalf("Run: %v, want a read ServeError covering %#x", err, bad)
	}
	// the page is still missing: the process is blocked, not fed zeros
	if _, err := uffdio.Copy(fd, bad+PageSize, make([]byte, PageSize), uffdio.CopyModeDontWake); err != nil {
		t.Fatalf("extent placed in part despite the read error: %v", err)
	}
	f.p.ExpectQuiet(t, 50*time.Millisecond) // the sum is not answered
}

// TestPagerProcessExit: the process exits with pages pending; Run ends
// without error and says so.
func TestPagerProcessExit(t *testing.T) {
	forWorkers(t, func(t *testing.T, workers int) {
		const size = 16 * mib
		f, fd, base, ext, src := setup(t, size)
		m := newMem(base, size, ext, src)
		p := New(fd, slowSrc{src, 2 * time.Millisecond}, ext, Options{Prefetch: true, PrefetchChunk: block, Workers: workers})
		errc := runPager(t, p, fd, base, size, time.Minute)
		f.checkSum(m, "some", base+size-block, block)
		f.do("exit")
		if err := waitRun(t, errc, 30*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if st := p.Stats(); !st.Exited {
			t.Fatalf("stats do not say exited: %+v", st)
		}
	})
}

// forWorkers runs f with the prefetch on the serving thread (0 workers)
// and with two prefetch workers.
func forWorkers(t *testing.T, f func(t *testing.T, workers int)) {
	for _, w := range []int{0, 2} {
		t.Run(fmt.Sprintf("workers=%d", w), func(t *testing.T) { f(t, w) })
	}
}

// TestPagerFaultAhead: a thread reading through memory of 4 KiB extents,
// with no prefetch, faults about once per FaultAhead, not once per page,
// and reads the right bytes; with FaultAhead a page, once per page.
func TestPagerFaultAhead(t *testing.T) {
	const size = 8 * mib
	for _, ahead := range []uint64{0, PageSize} {
		t.Run(fmt.Sprintf("ahead=%d", ahead), func(t *testing.T) {
			f, fd, base := startRegistered(t, uint64(size))
			ext := cut(base, PageSize, size/PageSize)
			src := newPatternSrc(ext)
			m := newMem(base, size, ext, src)
			p := New(fd, src, ext, Options{FaultAhead: ahead, Logger: testLogger(t)})
			errc := runPager(t, p, fd, base, size, time.Minute)
			f.checkSum(m, "all", base, size)
			if err := waitRun(t, errc, 30*time.Second); err != nil {
				t.Fatalf("Run: %v", err)
			}
			st := p.Stats()
			t.Logf("faults %d for %d pages", st.Faults, size/PageSize)
			if ahead == 0 && st.Faults > 4*size/DefaultFaultAhead {
				t.Errorf("%d faults for a sequential read of %d MiB: no fault-ahead", st.Faults, size/mib)
			}
			if ahead == PageSize && st.Faults < size/PageSize {
				t.Errorf("%d faults for %d pages with FaultAhead a page", st.Faults, size/PageSize)
			}
		})
	}
}

// TestPagerStride: a thread touching one page every 400 KiB of 256 KiB
// extents (a request reading 1% of a model's memory) faults in the extent
// after the previous one half the time; each fault must still bring in its
// own extent only, not FaultAhead of memory nobody asked for. Once its
// stride is seen, the extents of the next strides come in ahead of it: it
// faults a few times, not once per page, and nothing but the extents it
// touches is read.
func TestPagerStride(t *testing.T) {
	const size = 32 * mib
	f, base, m, p, errc := servePattern(t, size, func(uint64) Options { return Options{} })
	const stride = 400 << 10
	touched := uint64(size/stride + 1)
	if r := f.do("touch %x %x %x", base, uint64(size), uint64(stride)); r[0] != touched {
		t.Fatalf("touched %d pages, want %d", r[0], touched)
	}
	st := p.Stats()
	t.Logf("after the touch of %d pages: %d faults, %d bytes, %d of them ahead of the stride", touched, st.DataFaults, st.FaultBytes, st.StrideBytes)
	if st.DataFaults == 0 || st.FaultBytes-st.StrideBytes > st.DataFaults*block {
		t.Errorf("%d faults brought in %d bytes (%d ahead of the stride): more than an extent each", st.DataFaults, st.FaultBytes, st.StrideBytes)
	}
	if st.DataFaults > touched/2 {
		t.Errorf("%d faults for %d pages touched at a stride: nothing read ahead of it", st.DataFaults, touched)
	}
	if st.FaultBytes > touched*block {
		t.Errorf("%d bytes brought in for %d pages touched: more than their extents", st.FaultBytes, touched)
	}
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerStrideSpan: a thread touching 8 bytes every 400 KiB across a
// page boundary (a reader of arrays that start 16 bytes into their
// mappings, as glibc lays out a large malloc), with the source read in
// 16 KiB units (page checksums) and every access crossing from one unit
// into the next: each faults on two pages in a row. That pair is one
// access, not the start of a scan: no fault may bring in FaultAhead of
// memory nobody asked for, and once the stride is seen, the strides ahead
// come in with the page each access reaches past its first.
func TestPagerStrideSpan(t *testing.T) {
	const size = 32 * mib
	const unit = 16 << 10
	f, base, m, p, errc := servePattern(t, size, func(uint64) Options {
		return Options{Unit: func(at uint64) (uint64, uint64, bool) {
			lo := at &^ (unit - 1)
			return lo, lo + unit, true
		}}
	})
	const stride = 400 << 10
	start := base + unit - PageSize // each access: the unit's last page, then the next unit's first
	touched := (uint64(size) - (start - base) - PageSize) / stride
	if r := f.do("span %x %x %x", start, uint64(size)-(start-base), uint64(stride)); r[0] < touched {
		t.Fatalf("touched %d pages, want %d", r[0], touched)
	}
	st := p.Stats()
	t.Logf("after %d accesses: %d faults, %d bytes, %d of them ahead of the stride", touched, st.DataFaults, st.FaultBytes, st.StrideBytes)
	if st.FaultBytes-st.StrideBytes > st.DataFaults*unit {
		t.Errorf("%d faults brought in %d bytes (%d ahead of the stride): more than a unit each", st.DataFaults, st.FaultBytes, st.StrideBytes)
	}
	if st.DataFaults > touched/2 {
		t.Errorf("%d faults for %d accesses at a stride: nothing read ahead of it", st.DataFaults, touched)
	}
	// The strides read ahead of the last access are read too.
	if st.FaultBytes > (touched+policy.StrideMaxAhead)*2*unit {
		t.Errorf("%d bytes brought in for %d accesses: more than their two units each", st.FaultBytes, touched)
	}
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerScanAfterStride: a thread that read memory at a stride (the
// windows around its pages now in place every 400 KiB) then reads all of
// it in order, as a request that touches 1% of a model's weights followed
// by one that reads them all. The scan must be served FaultAhead at a time
// through the windows in place, not fault past every one of them.
func TestPagerScanAfterStride(t *testing.T) {
	const size = 32 * mib
	f, base, m, p, errc := servePattern(t, size, func(uint64) Options {
		return Options{MaxFaultBytes: 16 << 10, NoStrideAhead: true}
	})
	f.do("touch %x %x %x", base, uint64(size), uint64(400<<10))
	before := p.Stats().DataFaults
	f.checkSum(m, "all", base, size)
	scan := p.Stats().DataFaults - before
	t.Logf("the stride: %d faults; the scan after it: %d faults", before, scan)
	if max := 2 * uint64(size) / DefaultFaultAhead; scan > max {
		t.Errorf("the scan of %d MiB faulted %d times, more than %d: it faults past the windows in place", size/mib, scan, max)
	}
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerZeroAhead: a thread reading at a stride through memory the
// snapshot holds none of (zeros): each read fault past the zeros the last
// one mapped maps twice as many, so it faults a few times, not once per
// ZeroReadChunk; the memory reads zeros.
func TestPagerZeroAhead(t *testing.T) {
	const size = 128 * mib
	f, fd, base := startRegistered(t, uint64(size))
	ext := cut(base+size-block, block, 1) // pending until the end: Run serves until then
	src := newPatternSrc(ext)
	m := newMem(base, size, ext, src)
	p := New(fd, src, ext, Options{Logger: testLogger(t)})
	errc := runPager(t, p, fd, base, size, time.Minute)
	zeros := uint64(size - block)
	r := f.do("touch %x %x %x", base, zeros, uint64(400<<10))
	st := p.Stats()
	t.Logf("%d pages read at a stride through %d MiB of zeros: %d faults", r[0], zeros/mib, st.ZeroFaults)
	if max := uint64(12); st.ZeroFaults > max {
		t.Errorf("%d zero faults for %d MiB read at a stride, more than %d: the zeros mapped do not grow", st.ZeroFaults, zeros/mib, max)
	}
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerStrideArrays: a thread reading every 100th page of each of
// many arrays, the arrays at descending addresses (as mmap lays out one
// malloc after another) and each read upwards, as a request reads a
// model's weight arrays in order. Each array starts with a jump; the
// stride must go on in the next array at once, as far ahead as before
// (two faults an array, not the three it takes to see a stride anew and
// one more per doubling of its window), and must not read ahead into the
// array it just walked, whose pages at its stride nobody touches next.
func TestPagerStrideArrays(t *testing.T) {
	const (
		arrays = 8
		array  = 8 * mib
		size   = arrays * array
		stride = 400 << 10
		unit   = 16 << 10 // page checksums: strides read a window each
	)
	f, base, m, p, errc := servePattern(t, size, func(uint64) Options {
		return Options{Unit: func(at uint64) (uint64, uint64, bool) {
			lo := at &^ (unit - 1)
			return lo, lo + unit, true
		}}
	})
	var touched uint64
	for i := range uint64(arrays) {
		a := base + size - (i+1)*array
		touched += f.do("touch %x %x %x", a, uint64(array), uint64(stride))[0]
	}
	st := p.Stats()
	t.Logf("%d pages touched in %d arrays: %d faults, %d bytes, %d of them ahead of the stride", touched, arrays, st.DataFaults, st.FaultBytes, st.StrideBytes)
	// The first array: three faults to see the stride, then one per
	// doubling of the window (4, 8, 16... ahead) until its end.
	if max := uint64(8 + 3*(arrays-1)); st.DataFaults > max {
		t.Errorf("%d faults for %d arrays read at one stride, more than %d: the stride is seen anew in each array", st.DataFaults, arrays, max)
	}
	// Each touched page's unit, and one window of strides ahead past
	// the first array's end (the pages at the stride of the memory above
	// it are pending too: nobody can tell).
	if max := (touched + policy.StrideMaxAhead) * unit; st.FaultBytes > max {
		t.Errorf("%d bytes brought in for %d pages touched, more than %d: the strides are read ahead into the array walked before", st.FaultBytes, touched, max)
	}
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerScanReleasesHold: a fault that is not part of a scan holds the
// prefetch workers but one back (policy.LatencyHold); once the thread goes on
// reading in order, the hold ends, as it waits on streaming, not on the
// latency of single faults (arrays read one after another each start
// with such a fault).
func TestPagerScanReleasesHold(t *testing.T) {
	const size = 8 * mib
	f, fd, base := startRegistered(t, uint64(size))
	ext := cut(base, 64*PageSize, size/(64*PageSize))
	src := newPatternSrc(ext)
	m := newMem(base, size, ext, src)
	// The workers wait meanwhile: every page comes by a fault.
	p := New(fd, src, ext, Options{Prefetch: true, Workers: 2, PrefetchDelay: time.Hour, Logger: testLogger(t)})
	errc := runPager(t, p, fd, base, size, time.Minute)
	// The serving goroutine sets or ends the hold after the copy that
	// lets the thread go on: wait for it.
	settles := func(ok func(int64) bool) (int64, bool) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			v := p.root.latencyUntil.Load()
			if ok(v) || time.Now().After(deadline) {
				return v, ok(v)
			}
			time.Sleep(time.Millisecond)
		}
	}
	f.checkSum(m, "a page", base+size/2, PageSize)
	if _, ok := settles(func(v int64) bool { return v != 0 }); !ok {
		t.Fatal("a single fault set no hold")
	}
	f.checkSum(m, "the rest", base, size)
	if until, ok := settles(func(v int64) bool { return v == 0 }); !ok {
		t.Errorf("after a scan through %d MiB the workers are held until %v", size/mib, time.Unix(0, until))
	}
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerFaultSrc: with Options.FaultSrc, faults read from it and
// nothing else reads the pager's source (no prefetch, no strides here).
func TestPagerFaultSrc(t *testing.T) {
	const size = 4 * mib
	f, fd, base := startRegistered(t, uint64(size))
	ext := cut(base, PageSize, size/PageSize)
	src, faults := newPatternSrc(ext), newPatternSrc(ext)
	m := newMem(base, size, ext, faults)
	p := New(fd, src, ext, Options{FaultSrc: faults, NoStrideAhead: true, Logger: testLogger(t)})
	errc := runPager(t, p, fd, base, size, time.Minute)
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n, k := src.reads.Load(), faults.reads.Load(); n != 0 || k == 0 {
		t.Errorf("%d reads of the source and %d of FaultSrc; want none and some", n, k)
	}
}
