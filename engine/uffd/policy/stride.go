package policy

// StrideMin is how many equal distances in a row make a stride;
// StrideMaxAhead the most pages a fault on it brings in ahead.
const (
	StrideMin      = 2
	StrideMaxAhead = 64
)

// strideMaxSpan bounds stride.span.
const strideMaxSpan = 16 * PageSize

// stride tells a thread that touches memory at a constant stride (a page
// every 400 KiB, a column of a matrix) from the other faults: after
// StrideMin distances in a row alike (three faults), the next are
// predicted.
type stride struct {
	prev uint64 // page of the last data fault
	seen bool   // prev is set
	d    int64  // distance between the last two
	run  int    // distances d in a row
	// span is how far (bytes from its first page) one access of the
	// thread reaches: PageSize, or more for an access that crosses into
	// the next page (see restOf). 0 counts as PageSize.
	span  uint64
	start uint64 // the page the run at d started from
	// The stride seen before the last jump, kept: a thread that reads
	// array after array at one stride (every 100th page of each of many
	// weight arrays) jumps to the next array and goes on there at the
	// same stride, at the same pace. kept is 0 when there is none; the
	// run, span and the memory walked (from, to: page addresses, up to
	// the last stride read ahead) are those it had.
	kept           int64
	keptRun        int
	keptSpan       uint64
	walkLo, walkHi uint64
}

// Strides records the data fault on page, served as p says, and returns
// how many strides ahead of it to serve now: 0 unless it continues a
// stride (see stride.next). The rest of an access is not a stride of its
// own: it says how far the access that faulted at p.Start reaches.
func (pl *Planner) Strides(page uint64, p Plan) int {
	if p.Rest {
		pl.stride.reach(p.Start, page)
		return 0
	}
	return pl.stride.next(page, p.Scan)
}

// StrideAt returns the page i strides after page, ok false where the
// strides ahead stop: where they enter the memory the run before the
// last jump walked (a run resumed after a jump that runs into it has
// reached the end of its own array: arrays laid out at descending
// addresses, each read upwards, as mmap places them).
func (pl *Planner) StrideAt(page uint64, i int) (at uint64, ok bool) {
	at = page + uint64(int64(i)*pl.stride.d)
	return at, !pl.stride.walked(at) || pl.stride.walked(page)
}

// StrideSpan is how far (bytes from its first page) one access of the
// strided thread was seen to reach: the pages read ahead for each stride.
func (pl *Planner) StrideSpan() uint64 { return pl.stride.span }

// StrideReads forgets the reads ahead of the last stride: new ones are
// planned (Reached).
func (pl *Planner) StrideReads() { pl.reaches = pl.reaches[:0] }

// Reached records a read ahead of the stride: the access at the page at
// reaches end, so a fault at end is the rest of it.
func (pl *Planner) Reached(at, end uint64) {
	pl.reaches = append(pl.reaches, reach{at, end})
}

// StrideFrom records that the strides up to last were read ahead: the
// thread's next fault continues the stride from there.
func (pl *Planner) StrideFrom(last uint64) { pl.stride.prev = last }

// continues reports whether a fault on page continues the stride seen.
func (st *stride) continues(page uint64) bool {
	return st.seen && st.run >= StrideMin && int64(page-st.prev) == st.d
}

// reach records that the access that faulted on start reached page.
func (st *stride) reach(start, page uint64) {
	if page >= start {
		st.span = max(st.span, min(page-start+PageSize, strideMaxSpan))
	}
}

// walked reports whether page lies in the memory the stride kept from
// before the last jump walked.
func (st *stride) walked(page uint64) bool {
	return st.walkHi > st.walkLo && page >= st.walkLo && page <= st.walkHi
}

// next records a data fault on page and returns how many strides ahead to
// serve: 0 unless the fault continues a stride, then doubling with each
// fault that does, as readahead grows its window. A sequential reader is
// FaultAhead's, not a stride. A fault at the stride kept from before a
// jump, one fault after it, resumes that stride where it was, with its
// window: the thread goes on at the same pace in the memory it jumped to.
func (st *stride) next(page uint64, sequential bool) int {
	prev := st.prev
	d := int64(page - prev)
	seen := st.seen
	st.prev, st.seen = page, true
	if !seen || sequential || d == 0 {
		st.run = 0
		return 0
	}
	if d != st.d {
		if st.kept != 0 && d == st.kept && st.run == 1 {
			// prev was the jump's target: the run goes on from there.
			st.d, st.run, st.span, st.start = d, st.keptRun, st.keptSpan, prev
			st.kept = 0
		} else {
			if st.run >= StrideMin {
				st.kept, st.keptRun, st.keptSpan = st.d, st.run, st.span
				st.walkLo, st.walkHi = min(st.start, prev), max(st.start, prev)
			}
			st.d, st.run, st.span, st.start = d, 1, 0, prev
			return 0
		}
	}
	st.run++
	if st.run < StrideMin {
		return 0
	}
	return min(StrideMaxAhead, 4<<min(st.run-StrideMin, 4))
}
