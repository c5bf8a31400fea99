package policy

import (
	"testing"

	"github.com/lazyfs/lazyfs/engine/units"
)

const P = PageSize

// TestRange: a fault is served its whole pending range, clipped to the
// MaxFaultBytes window around it, or to the source's unit around it
// (Options.Unit: a thread that reads a page here and there waits for
// that page, not for its block).
func TestRange(t *testing.T) {
	c := Config{MaxFaultBytes: 16 * P}
	if lo, hi := c.Range(0x100*P, 0x108*P, 0x100*P, 0x104*P); lo != 0x100*P || hi != 0x108*P {
		t.Errorf("whole extent: %#x-%#x", lo, hi)
	}
	if lo, hi := c.Range(0x100*P, 0x140*P, 0x100*P, 0x125*P); lo != 0x120*P || hi != 0x130*P {
		t.Errorf("MaxFaultBytes window: %#x-%#x, want 0x120-0x130 pages", lo/P, hi/P)
	}
	// The unit is asked at the snapshot address (src): the range moved.
	c.Unit = func(addr uint64) (uint64, uint64, bool) { return addr &^ (4*P - 1), addr&^(4*P-1) + 4*P, true }
	if lo, hi := c.Range(0x900*P, 0x908*P, 0x100*P, 0x905*P); lo != 0x904*P || hi != 0x908*P {
		t.Errorf("unit: %#x-%#x, want 0x904-0x908 pages", lo/P, hi/P)
	}
	c.Unit = func(uint64) (uint64, uint64, bool) { return 0, 0, false }
	if lo, hi := c.Range(0x900*P, 0x908*P, 0x100*P, 0x905*P); lo != 0x900*P || hi != 0x908*P {
		t.Errorf("no unit: %#x-%#x, want the extent", lo/P, hi/P)
	}
}

// serve classifies a fault on page, served one page, the way the pager
// does: the memory from the last fault's end up to the page is pending,
// or (inPlace) already in place.
func serve(pl *Planner, page uint64, inPlace bool, cursor uint64) Plan {
	onward := pl.lastEnd
	if inPlace {
		onward = page
	}
	p := pl.Classify(Fault{Page: page, Onward: onward, OnwardOK: true, Cursor: cursor})
	pl.Served(page, page, page+P)
	return p
}

// TestClassifyScan: the second fault in a row on the page after the one
// before is a scan (the first is the rest of one access); so is a fault
// past memory in place that follows the last one's, and one at the
// prefetcher's front. A thread that touches a page every few blocks is
// not a scan; each such fault holds the prefetch workers back.
func TestClassifyScan(t *testing.T) {
	var pl Planner
	if p := serve(&pl, 0x100*P, false, 0); p.Scan || p.Rest || !p.Hold() {
		t.Fatalf("first fault: %+v", p)
	}
	if p := serve(&pl, 0x101*P, false, 0); p.Scan || !p.Rest || p.Start != 0x100*P {
		t.Fatalf("page after: %+v, want the rest of the access at 0x100", p)
	}
	if p := serve(&pl, 0x102*P, false, 0); !p.Scan || p.RunStart != 0x100*P || p.Hold() {
		t.Fatalf("second page after: %+v, want a scan from 0x100", p)
	}
	// Memory in place from 0x103 to 0x110 (a stride or the prefetcher
	// placed it): the fault at 0x110 reads on.
	if p := serve(&pl, 0x110*P, true, 0); !p.Scan {
		t.Fatalf("past memory in place: %+v, want a scan", p)
	}
	// Pending memory between: not onward.
	if p := serve(&pl, 0x120*P, false, 0); p.Scan || p.RunStart != 0x120*P {
		t.Fatalf("past pending memory: %+v, want a new run", p)
	}
	var touch Planner
	for i := range uint64(6) {
		if p := serve(&touch, 0x1000*P+i*6*P, false, 0); p.Scan {
			t.Fatalf("touch %d: %+v, want no scan", i, p)
		}
	}
	front := Planner{Config: Config{Prefetch: true, Workers: 2, PrefetchChunk: 16 * P}}
	if p := serve(&front, 0x500*P, false, 0x510*P); !p.Scan {
		t.Fatalf("fault at the prefetcher's front: %+v, want a scan", p)
	}
	if p := serve(&front, 0x900*P, false, 0x510*P); p.Scan {
		t.Fatalf("fault far past the prefetcher's front: %+v", p)
	}
}

// TestPlannerStride: three faults at one distance make a stride, served
// 4, then 8 strides ahead; a fault on the page after a stride read ahead
// is the rest of its access, which widens what each stride brings in;
// after a jump, the same stride resumes with its window at the first
// fault, and its strides ahead stop where they enter the memory the run
// before the jump walked.
func TestPlannerStride(t *testing.T) {
	var pl Planner
	const d = 100 * P
	var got []int
	page := uint64(0x10000 * P)
	for range 4 {
		p := serve(&pl, page, false, 0)
		got = append(got, pl.Strides(page, p))
		page += d
	}
	if got[0] != 0 || got[1] != 0 || got[2] != 4 || got[3] != 8 {
		t.Fatalf("strides ahead: %v, want 0 0 4 8", got)
	}
	last := page - d
	pl.StrideReads()
	for i := 1; i <= 8; i++ {
		at, ok := pl.StrideAt(last, i)
		if !ok || at != last+uint64(i)*d {
			t.Fatalf("stride %d: %#x, %v", i, at, ok)
		}
		pl.Reached(at, at+P)
	}
	pl.StrideFrom(last + 8*d)
	// The thread's access at the third stride reaches the page after it.
	rest := last + 3*d + P
	p := serve(&pl, rest, false, 0)
	if !p.Rest || p.Start != last+3*d {
		t.Fatalf("fault after a stride's page: %+v, want the rest of the access at it", p)
	}
	if pl.Strides(rest, p) != 0 || pl.StrideSpan() != 2*P {
		t.Fatalf("span %d, want two pages", pl.StrideSpan())
	}
	// A jump below (the next array down), then the same stride.
	jump := uint64(0x1000 * P)
	serve(&pl, jump, false, 0)
	pl.Strides(jump, Plan{})
	p = serve(&pl, jump+d, false, 0)
	if n := pl.Strides(jump+d, p); n == 0 {
		t.Fatal("the stride did not resume after the jump")
	}
	// Far enough up, the strides enter the memory walked before.
	stop := 0
	for i := 1; i < 10000; i++ {
		if _, ok := pl.StrideAt(jump+d, i); !ok {
			stop = i
			break
		}
	}
	if at := jump + d + uint64(stop)*d; stop == 0 || at < 0x10000*P {
		t.Fatalf("strides ahead stop at %d (%#x), want at the walked memory", stop, at)
	}
}

// TestFirst: a fault in the working set still to fetch, within
// FirstSearch ranges of the prefetcher's position, is found there.
func TestFirst(t *testing.T) {
	first := []units.Range{{Start: 0x10 * P, End: 0x20 * P}, {Start: 0x40 * P, End: 0x48 * P}, {Start: 0x30 * P, End: 0x31 * P}}
	for _, tc := range []struct {
		from int
		at   uint64
		want int
	}{{0, 0x15 * P, 0}, {0, 0x30 * P, 2}, {1, 0x15 * P, -1}, {0, 0x50 * P, -1}, {1, 0x47*P + 5, 1}} {
		if got := First(first, tc.from, tc.at); got != tc.want {
			t.Errorf("First(from %d, %#x) = %d, want %d", tc.from, tc.at, got, tc.want)
		}
	}
}

// TestZeroRead: a read fault outside every extent is served
// ZeroReadChunk; one within a chunk past the last one's zeros twice as
// much, up to ZeroReadMax; one elsewhere ZeroReadChunk again.
func TestZeroRead(t *testing.T) {
	pl := Planner{Config: Config{ZeroReadChunk: 2 << 20}}
	page := uint64(1 << 40)
	want := uint64(2 << 20)
	for range 8 {
		if got := pl.ZeroRead(page); got != want {
			t.Fatalf("at %#x: %d, want %d", page, got, want)
		}
		pl.Zeroed(page, want)
		page += want + 5*P // a stride through zero memory
		want = min(2*want, ZeroReadMax)
	}
	if got := pl.ZeroRead(page + 1<<30); got != 2<<20 {
		t.Fatalf("elsewhere: %d, want ZeroReadChunk", got)
	}
}
