// Package policy is what the pager (engine/uffd) decides on a page fault
// beyond placing the faulting page: the range a fault is served, whether
// it is part of a scan (then the memory that follows comes with it and
// the prefetcher follows the reader), the rest of an access that crossed
// a page boundary, a stride (then the next strides come ahead of it),
// and how much zero memory a fault outside every extent is served.
//
// It is a pure function of the faults it has seen: a Planner holds no
// descriptor, takes no lock and reads no clock. The pager asks it on its
// serving goroutine, tells it what it has done, and carries the plan out
// (reads, copies, stats). The pending set and the prefetcher's cursor are
// the pager's: what the planner needs of them comes in a Fault.
package policy

import (
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// PageSize is the page size every address here is aligned to.
const PageSize = uffdio.PageSize

// Config is what a Planner needs of the pager's options.
type Config struct {
	// Prefetch: a prefetcher streams the pending memory, PrefetchChunk
	// bytes at a time, on Workers threads (0: on the serving thread).
	Prefetch      bool
	Workers       int
	PrefetchChunk uint64
	// MaxFaultBytes caps the range a fault is served, clipped to the
	// MaxFaultBytes-aligned window around it; Unit, if set, gives the
	// source's own unit around a snapshot address (see Range).
	MaxFaultBytes uint64
	Unit          func(addr uint64) (lo, hi uint64, ok bool)
	// ZeroReadChunk is how much zero memory a read fault outside every
	// extent is served first (see ZeroRead).
	ZeroReadChunk uint64
}

// Range returns the range a fault on page is served, inside the pending
// range [cur, end) whose bytes are at src in the snapshot: the pending
// range clipped to the MaxFaultBytes window around the page and to the
// source's unit (Unit).
func (c *Config) Range(cur, end, src, page uint64) (lo, hi uint64) {
	lo, hi = cur, end
	if w := c.MaxFaultBytes; hi-lo > w {
		lo = max(lo, page-page%w)
		hi = min(hi, lo+w)
	}
	if c.Unit != nil {
		// The source reads at the snapshot's addresses: ask it there.
		at := src + (page - cur)
		if ulo, uhi, ok := c.Unit(at); ok && ulo <= at && at < uhi {
			lo = max(lo, page-(at-ulo))
			hi = min(hi, page+(uhi-at))
		}
	}
	return lo, hi
}

// Fault is a data fault (one on a pending page) as the planner is told
// of it.
type Fault struct {
	Page uint64 // the faulting page
	// Onward is the first pending address at or after the end of the
	// range the last data fault was served (LastEnd), OnwardOK whether
	// there is one. Only looked at for a fault more than a page past
	// that end.
	Onward   uint64
	OnwardOK bool
	// Cursor is where the prefetcher plans next.
	Cursor uint64
}

// Plan is how a data fault is served beyond its own range.
type Plan struct {
	// Scan: the fault goes on through memory in order. It is served the
	// pending memory that follows too (Options.FaultAhead), and the
	// prefetcher follows the scan, which started at RunStart.
	Scan     bool
	RunStart uint64
	// Rest: the fault is the rest of an access whose first page faulted
	// at Start (just before, or ahead of a stride): it says how far each
	// access reaches, and is not a stride of its own.
	Rest  bool
	Start uint64
}

// Hold reports whether the prefetch workers but one hold back after the
// fault (see LatencyHold): a thread that does not read in order waits on
// the latency of each of its faults.
func (p Plan) Hold() bool { return !p.Scan }

// LatencyHold is how long after a fault that does not continue the one
// before (a thread touching pages here and there, or at a stride) every
// prefetch worker but one holds back (Plan.Hold). Such a thread waits on
// each fault's latency, and with a worker per CPU its faults waited for a
// CPU (the figures: test/bench/BENCHMARKS.md, First answer after restore
// --lazy). A thread reading in order waits on streaming instead, which
// every worker speeds up.
const LatencyHold = 10 * time.Millisecond

// Planner classifies the data faults of one userfaultfd, in the order
// they are served, and remembers what it needs of them: the last fault,
// the run of faults each on the page after the one before, the stride,
// the reads ahead of it, the zeros the last read fault outside every
// extent was served. The zero value with a Config is ready.
type Planner struct {
	Config

	lastLo, lastEnd uint64 // the range the last data fault was served
	lastPage        uint64 // the page of the last data fault
	adjacent        int    // data faults in a row on the page after the one before
	runStart        uint64 // the first page of the current run of data faults
	stride          stride
	reaches         []reach // the accesses the last strides read ahead reach
	zeroLo, zeroLen uint64  // what the last read fault outside every extent zero-filled
	zeroChunk       uint64  // the chunk it asked for
}

// reach is one read ahead of a stride: the access at the page at reaches
// end.
type reach struct{ at, end uint64 }

// LastEnd returns the end of the range the last data fault was served,
// ok false before the first.
func (pl *Planner) LastEnd() (end uint64, ok bool) {
	return pl.lastEnd, pl.lastEnd > pl.lastLo
}

// Classify returns the plan of the data fault f and counts it in the run
// of faults it continues or starts.
//
// A fault on the page right after what the previous one was served is
// the rest of the access that faulted there (an access that crosses a
// page boundary faults on both pages: a reader of an array that starts
// 16 bytes into its mapping) or the start of a scan. The second such
// fault in a row is a scan, and so is a fault at the prefetcher's front
// (a thread reading on through memory the prefetcher placed, faster than
// it). The test is on the faulting page, not on the start of its extent:
// a thread touching one page every few blocks faults in the extent after
// the previous one too, and reading ahead for it would bring in all of
// memory at fault speed. A fault past memory already in place that
// follows the last one's counts as on the page after it: a thread
// reading on through what the prefetcher or a stride placed.
func (pl *Planner) Classify(f Fault) Plan {
	page, end := f.Page, pl.lastEnd
	adjacent := page >= end && page <= end+PageSize
	onward := adjacent
	if !adjacent && page > end && pl.lastEnd > pl.lastLo {
		onward = f.OnwardOK && max(f.Onward, end)+PageSize >= page
	}
	if onward {
		pl.adjacent++
	} else {
		pl.adjacent = 0
		pl.runStart = page
	}
	p := Plan{Scan: pl.adjacent >= 2, RunStart: pl.runStart}
	// The rest of an access whose first page was placed ahead of a
	// stride: it says how far each access reaches (see Strides).
	strided := pl.stride.continues(page)
	p.Start, p.Rest = pl.restOf(page, adjacent && pl.adjacent == 1)
	p.Rest = p.Rest && !strided
	if !p.Scan && !p.Rest && !strided && pl.Prefetch {
		ahead := uint64(max(1, pl.Workers)) * pl.PrefetchChunk
		p.Scan = page+ahead >= f.Cursor && page < f.Cursor+pl.PrefetchChunk
	}
	return p
}

// restOf tells whether a fault on page is the rest of an access whose
// first page faulted just before (adjacent, and the fault before was not
// itself the continuation of another) or was placed ahead of a stride
// (page follows one of the last reads ahead of it), and where that
// access started.
func (pl *Planner) restOf(page uint64, adjacent bool) (start uint64, ok bool) {
	if adjacent {
		return pl.lastPage, true
	}
	for _, r := range pl.reaches {
		if page == r.end {
			return r.at, true
		}
	}
	return 0, false
}

// Served records that the data fault on page was served [lo, end): its
// own range and, for a scan, the memory that follows.
func (pl *Planner) Served(page, lo, end uint64) {
	pl.lastLo, pl.lastEnd, pl.lastPage = lo, end, page
}
