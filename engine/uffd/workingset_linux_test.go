package uffd

import (
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// TestPagerFirst: the prefetcher fetches Options.First before anything
// else, in the given order (not address order), then the rest; the
// memory is right.
func TestPagerFirst(t *testing.T) {
	forWorkers(t, func(t *testing.T, workers int) {
		const size = 16 * mib
		f, fd, base, ext, src := setup(t, size)
		src.keep = true
		m := newMem(base, size, ext, src)
		first := []units.Range{
			{Start: base + 12*mib, End: base + 12*mib + 2*block},
			{Start: base + 2*mib, End: base + 2*mib + block},
			{Start: base + 14*mib, End: base + 14*mib + 3*block},
		}
		var firstBytes uint64 // what First holds of the extents
		for _, r := range first {
			for _, e := range ext {
				firstBytes += r.Intersect(units.Range{Start: e.Addr, End: e.End()}).Len()
			}
		}
		p := New(fd, src, ext, Options{Prefetch: true, PrefetchChunk: block, Workers: workers, First: first, Logger: testLogger(t)})
		errc := runPager(t, p, fd, base, size, time.Minute)
		if err := waitRun(t, errc, 30*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
		f.checkSum(m, "all", base, size)
		src.mu.Lock()
		log := append([]Extent(nil), src.log...)
		src.mu.Unlock()
		// The reads until First's bytes are read are inside First (with
		// workers, the first ranges' reads may interleave: only the
		// membership is checked then; without, the order too).
		var got uint64
		ri := 0
		for _, rd := range log {
			if got >= firstBytes {
				break
			}
			in := -1
			for i, r := range first {
				if r.Contains(rd.Addr) {
					in = i
				}
			}
			if in < 0 {
				t.Fatalf("read %#x+%#x before First was fetched (%d of %d bytes read); reads %v", rd.Addr, rd.Len, got, firstBytes, log[:min(len(log), 12)])
			}
			if workers == 0 && in < ri {
				t.Fatalf("read of First[%d] after First[%d]", in, ri)
			}
			ri = max(ri, in)
			got += rd.Len
		}
	})
}

// TestPagerRecord: with the prefetcher held, every page the process
// touches comes by a fault, which the recorder keeps in order; released,
// the prefetcher brings in the rest.
func TestPagerRecord(t *testing.T) {
	forWorkers(t, func(t *testing.T, workers int) {
		const size = 16 * mib
		f, fd, base, ext, src := setup(t, size)
		m := newMem(base, size, ext, src)
		rec := NewRecorder(time.Now(), 0)
		p := New(fd, src, ext, Options{Prefetch: true, Workers: workers, HoldPrefetch: true, OnFault: rec.Observe, Logger: testLogger(t)})
		errc := runPager(t, p, fd, base, size, time.Minute)
		touched := []uint64{base + 9*mib + 5*PageSize, base + PageSize, base + 15*mib}
		for _, a := range touched {
			f.checkSum(m, "touch", a, PageSize)
		}
		time.Sleep(50 * time.Millisecond)
		if st := p.Stats(); st.PrefetchBytes != 0 {
			t.Fatalf("prefetched %d bytes while held", st.PrefetchBytes)
		}
		rec.Stop("test")
		p.ReleasePrefetch()
		if err := waitRun(t, errc, 30*time.Second); err != nil {
			t.Fatalf("Run: %v", err)
		}
		f.checkSum(m, "all", base, size)
		touches, reason, span := rec.Result()
		if reason != "test" || span <= 0 {
			t.Fatalf("reason %q span %v", reason, span)
		}
		if len(touches) != len(touched) {
			t.Fatalf("recorded %+v, touched %x", touches, touched)
		}
		for i, tc := range touches {
			if a := touched[i]; a < tc.Addr || a >= tc.Addr+tc.Len {
				t.Errorf("touch %d: recorded %#x+%#x, touched %#x", i, tc.Addr, tc.Len, a)
			}
			if i > 0 && tc.At < touches[i-1].At {
				t.Errorf("touch %d at %v before the one before (%v)", i, tc.At, touches[i-1].At)
			}
		}
		// After Stop nothing more is kept.
		rec.Observe(base, PageSize, time.Now())
		if got, _, _ := rec.Result(); len(got) != len(touched) {
			t.Fatalf("recorded after Stop: %d", len(got))
		}
	})
}

// TestRecorderMaxFaults: the recorder stops by itself after its count.
func TestRecorderMaxFaults(t *testing.T) {
	rec := NewRecorder(time.Now(), 2)
	rec.Observe(0x1000, PageSize, time.Now())
	rec.Observe(0x1000, PageSize, time.Now()) // a child's fault on the same page
	select {
	case <-rec.Done():
		t.Fatal("stopped after one distinct fault")
	default:
	}
	rec.Observe(0x3000, PageSize, time.Now())
	<-rec.Done()
	rec.Observe(0x5000, PageSize, time.Now())
	if got, reason, _ := rec.Result(); len(got) != 2 || reason != "faults" {
		t.Fatalf("got %+v, %q", got, reason)
	}
}

// TestPagerFirstAhead: a thread touching its working set (a page every
// 100 KiB, in the recorded order) faster than anything prefetches it: a
// fault on a page of the working set brings in the ranges that follow it
// in the recorded order, so the thread faults a few times, not once per
// page. Strides are off, so that only the working set can read ahead.
func TestPagerFirstAhead(t *testing.T) {
	const size = 64 * mib
	const step = 100 << 10
	var first []units.Range
	f, base, m, p, errc := servePattern(t, size, func(base uint64) Options {
		for a := base; a+PageSize <= base+size; a += step {
			first = append(first, units.Range{Start: a &^ (PageSize - 1), End: a&^(PageSize-1) + PageSize})
		}
		return Options{First: first, NoStrideAhead: true, MaxFaultBytes: PageSize}
	})
	r := f.do("touch %x %x %x", base, uint64(size), uint64(step))
	st := p.Stats()
	t.Logf("%d pages of the working set touched: %d faults, %d bytes brought in ahead", r[0], st.DataFaults, st.FirstAheadBytes)
	if st.DataFaults > r[0]/16 {
		t.Errorf("%d faults for %d pages of the working set touched in its order: nothing brought in ahead", st.DataFaults, r[0])
	}
	if st.FirstAheadBytes > uint64(len(first))*PageSize {
		t.Errorf("%d bytes brought in ahead, more than the working set's %d", st.FirstAheadBytes, len(first)*PageSize)
	}
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestPagerFirstAheadBounded: a working set of one large range (the blocks
// of a scan, merged) brings in at most firstAheadMax ahead of one fault,
// not the whole range while the serving goroutine serves nothing else.
func TestPagerFirstAheadBounded(t *testing.T) {
	const size = 32 * mib
	f, base, m, p, errc := servePattern(t, size, func(base uint64) Options {
		return Options{First: []units.Range{{Start: base, End: base + 16*mib}}, NoStrideAhead: true, MaxFaultBytes: PageSize, FaultAhead: PageSize}
	})
	f.do("touch %x %x %x", base+4*mib, uint64(PageSize), uint64(PageSize))
	// The thread goes on once its page is in; what comes ahead of it is
	// placed after.
	st := p.Stats()
	for deadline := time.Now().Add(5 * time.Second); st.FirstAheadBytes == 0 && time.Now().Before(deadline); st = p.Stats() {
		time.Sleep(time.Millisecond)
	}
	t.Logf("one fault in a 16 MiB working set: %d bytes brought in ahead", st.FirstAheadBytes)
	if st.FirstAheadBytes == 0 || st.FirstAheadBytes > firstAheadMax {
		t.Errorf("one fault brought in %d bytes of the working set ahead, want 1..%d", st.FirstAheadBytes, firstAheadMax)
	}
	f.checkSum(m, "all", base, size)
	if err := waitRun(t, errc, 30*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
