package uffd

import (
	"errors"
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// Why bytes were placed, for the stats.
const (
	whyFault = iota
	whyPrefetch
)

// serveFaults serves the queued faults in order. again reports that a copy
// was refused until the pending events are read (the rest stay queued).
func (s *server) serveFaults() (again bool, err error) {
	for len(s.faults) > 0 {
		f := s.faults[0]
		err := s.serveFault(f)
		switch {
		case errors.Is(err, errAgain):
			return true, nil
		case errors.Is(err, errGone):
			s.exited()
			return false, nil
		case err != nil:
			return false, err
		}
		s.faults = s.faults[1:]
		if len(s.faults) == 0 {
			s.faults = s.faults[:0:0]
		}
		if s.opts.Spin > 0 {
			s.spinUntil = time.Now().Add(s.opts.Spin)
		}
	}
	return false, nil
}

func (s *server) serveFault(f fault) error {
	if f.m.Flags&(uffdio.PagefaultFlagWP|uffdio.PagefaultFlagMinor) != 0 {
		return &ServeError{Op: "fault", Addr: f.m.Addr, Len: PageSize, Err: fmt.Errorf("%v: %w", f.m, ErrUnexpected)}
	}
	page := f.m.Addr &^ (PageSize - 1)
	s.setMu.Lock()
	p, ok := s.pend.find(page)
	s.setMu.Unlock()
	if !ok {
		zeroed, err := s.serveZero(page, f.m.Flags&uffdio.PagefaultFlagWrite != 0)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.st.Faults++
		s.st.ZeroFaults++
		s.st.ZeroBytes += zeroed
		s.h.add(time.Since(f.at))
		s.mu.Unlock()
		return nil
	}
	lo, hi := s.faultRange(p, page)
	src := p.src + (lo - p.cur)
	// A fault on the page right after what the previous one was served
	// is the rest of the access that faulted there (an access that
	// crosses a page boundary faults on both pages: a reader of an array
	// that starts 16 bytes into its mapping) or the start of a scan. The
	// second such fault in a row is a scan, and so is a fault at the
	// prefetcher's front (a thread reading on through memory the
	// prefetcher placed, faster than it): a scan is served the pending
	// memory that follows too, up to FaultAhead, one fault per FaultAhead
	// bytes instead of one per block. The test is on the faulting page,
	// not on the start of its extent: a thread touching one page every
	// few blocks faults in the extent after the previous one too, and
	// reading ahead for it would bring in all of memory at fault speed
	// (a 1 GiB "touch 1" took as long as reading everything).
	// A fault past memory already in place that follows the last one's
	// counts as on the page after it: a thread reading on through what
	// the prefetcher or a stride placed.
	end := s.lastFault.end()
	adjacent := page >= end && page <= end+PageSize
	onward := adjacent
	if !adjacent && page > end && s.lastFault.len > 0 {
		s.setMu.Lock()
		n, _, ok := s.pend.next(end)
		s.setMu.Unlock()
		onward = ok && max(n.cur, end)+PageSize >= page
	}
	if onward {
		s.adjacent++
	} else {
		s.adjacent = 0
		s.runStart = page
	}
	sequential := s.adjacent >= 2
	// The rest of an access whose first page was placed ahead of a
	// stride: it says how far each access reaches (see strideAhead).
	strided := s.stride.continues(page)
	start, rest := s.restOf(page, adjacent && s.adjacent == 1)
	rest = rest && !strided
	if !sequential && !rest && !strided && s.opts.Prefetch {
		ahead := uint64(max(1, s.opts.Workers)) * s.opts.PrefetchChunk
		s.setMu.Lock()
		sequential = page+ahead >= s.cursor && page < s.cursor+s.opts.PrefetchChunk
		s.setMu.Unlock()
	}
	// A scan that starts is followed above its front and below its start
	// (see plan) until another scan starts: a thread going through a
	// model's arrays touches other memory between two of them.
	if sequential {
		s.setMu.Lock()
		if !s.scan.on || s.scan.lo != s.runStart {
			s.scan.start(s.runStart)
		}
		s.scan.front = hi
		s.setMu.Unlock()
	}
	parts := append(s.faultParts[:0], piece{lo, src, hi - lo})
	if s.opts.FaultAhead > hi-lo && sequential {
		// The pending memory up to FaultAhead on, past memory already in
		// place too: a scan after a stride finds a window in place every
		// stride, and would otherwise fault past each.
		s.setMu.Lock()
		s.pend.overlapping(hi, lo+s.opts.FaultAhead, func(p piece) {
			last := &parts[len(parts)-1]
			if last.end() == p.cur && last.src+last.len == p.src {
				last.len += p.len
				return
			}
			parts = append(parts, p)
		})
		// The prefetcher streams on from there, ahead of the reader,
		// rather than wherever its cursor was: a full read then costs
		// about the longer of streaming and the reader's own work, not
		// their sum.
		s.cursor = parts[len(parts)-1].end()
		s.scan.front = s.cursor
		s.setMu.Unlock()
	}
	s.faultParts = parts
	var total uint64
	for _, p := range parts {
		total += p.len
	}
	s.lastFault = piece{cur: lo, len: parts[len(parts)-1].end() - lo}
	if uint64(cap(s.faultBuf)) < total {
		s.faultBuf = make([]byte, total)
	}
	var skipped bool
	off := uint64(0)
	for _, p := range parts {
		buf := s.faultBuf[off : off+p.len]
		off += p.len
		src := s.src
		if s.opts.FaultSrc != nil {
			src = s.opts.FaultSrc
		}
		if err := readFull(src, buf, p.src); err != nil {
			return &ServeError{Op: "read", Addr: p.cur, Len: p.len, Src: p.src, Err: err}
		}
		s.mu.Lock()
		s.st.ReadBytes += p.len
		s.mu.Unlock()
		// A prefetch worker may have placed some of it meanwhile (the
		// fault then finds the page present: it is woken), never an
		// event: events are applied by this goroutine only.
		sk, err := s.placeRange(p, buf, whyFault)
		if err != nil {
			return err
		}
		skipped = skipped || sk
		if s.opts.OnFault != nil {
			s.opts.OnFault(p.src, p.len, f.at)
		}
	}
	if skipped {
		if err := s.wakePage(page); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.st.Faults++
	s.st.DataFaults++
	s.h.add(time.Since(f.at))
	s.mu.Unlock()
	if !sequential {
		s.latencyUntil.Store(time.Now().Add(latencyBound).UnixNano())
	} else if s.latencyUntil.Swap(0) > time.Now().UnixNano() {
		// The thread reads on in order: it waits on streaming now, which
		// every worker speeds up (the first fault of each array it goes
		// on to is not yet known as part of a scan).
		s.setMu.Lock()
		s.setCond.Broadcast()
		s.setMu.Unlock()
	}
	s.lastPage = page
	// In the working set still to fetch: what follows it in the recorded
	// order comes with it (it is what the thread touches next, better
	// known than any stride).
	if len(s.opts.First) > 0 {
		s.setMu.Lock()
		pendingFirst := s.first.i < len(s.opts.First)
		s.setMu.Unlock()
		if pendingFirst {
			ahead, err := s.firstAhead(src + (page - lo))
			if err != nil {
				return err
			}
			if ahead {
				s.report()
				return nil
			}
		}
	}
	if rest {
		// Not a stride of its own: the access at start reaches here.
		s.stride.reach(start, page)
	} else if n := s.stride.next(page, sequential); n > 0 && !s.opts.NoStrideAhead {
		if err := s.strideAhead(page, n); err != nil {
			return err
		}
	}
	s.report()
	return nil
}

// zeroReadMax bounds what a read fault zero-fills as it doubles (see
// serveZero): 64 MiB of zero pages is 16,384 page table entries.
const zeroReadMax = 64 << 20

// latencyBound is how long after a fault that does not continue the one
// before (a thread touching pages here and there, or at a stride) every
// prefetch worker but one holds back. Such a thread waits on each fault's
// latency, and with a worker per CPU its faults waited for a CPU (the
// figures: test/bench/BENCHMARKS.md, First answer after restore --lazy).
// A thread reading in order waits on streaming instead, which every
// worker speeds up.
const latencyBound = 10 * time.Millisecond

// faultRange returns the range a fault on page, inside pending piece p,
// is served: p clipped to the MaxFaultBytes window around the page and
// to the source's unit (Options.Unit).
func (s *server) faultRange(p piece, page uint64) (lo, hi uint64) {
	lo, hi = p.cur, p.end()
	if w := s.opts.MaxFaultBytes; hi-lo > w {
		lo = max(lo, page-page%w)
		hi = min(hi, lo+w)
	}
	if s.opts.Unit != nil {
		// The source reads at the snapshot's addresses: ask it there.
		at := p.src + (page - p.cur)
		if ulo, uhi, ok := s.opts.Unit(at); ok && ulo <= at && at < uhi {
			lo = max(lo, page-(at-ulo))
			hi = min(hi, page+(uhi-at))
		}
	}
	return lo, hi
}

// stride tells a thread that touches memory at a constant stride (a page
// every 400 KiB, a column of a matrix) from the other faults: after
// strideMin distances in a row alike (three faults), the next are
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

// strideMaxSpan bounds stride.span.
const strideMaxSpan = 16 * PageSize

// continues reports whether a fault on page continues the stride seen.
func (st *stride) continues(page uint64) bool {
	return st.seen && st.run >= strideMin && int64(page-st.prev) == st.d
}

// reach records that the access that faulted on start reached page.
func (st *stride) reach(start, page uint64) {
	if page >= start {
		st.span = max(st.span, min(page-start+PageSize, strideMaxSpan))
	}
}

// walked reports whether page lies in the memory the stride kept from
// before the last jump walked: a run resumed after a jump that runs into
// it has reached the end of its own array (arrays laid out at descending
// addresses, each read upwards, as mmap places them), and the pages at
// its stride there are not what the thread reads next.
func (st *stride) walked(page uint64) bool {
	return st.walkHi > st.walkLo && page >= st.walkLo && page <= st.walkHi
}

// restOf tells whether a fault on page is the rest of an access whose
// first page faulted just before (adjacent, and the fault before was not
// itself the continuation of another) or was placed ahead of a stride
// (page follows one of the last strideAhead's reads), and where that
// access started.
func (s *server) restOf(page uint64, adjacent bool) (start uint64, ok bool) {
	if adjacent {
		return s.lastPage, true
	}
	for _, r := range s.strideReads {
		if page == r.lo+r.n {
			return r.at, true
		}
	}
	return 0, false
}

// strideMin is how many equal distances in a row make a stride;
// strideMaxAhead the most pages a fault on it brings in ahead.
const (
	strideMin      = 2
	strideMaxAhead = 64
)

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
			if st.run >= strideMin {
				st.kept, st.keptRun, st.keptSpan = st.d, st.run, st.span
				st.walkLo, st.walkHi = min(st.start, prev), max(st.start, prev)
			}
			st.d, st.run, st.span, st.start = d, 1, 0, prev
			return 0
		}
	}
	st.run++
	if st.run < strideMin {
		return 0
	}
	return min(strideMaxAhead, 4<<min(st.run-strideMin, 4))
}

// strideAhead places the pages at n strides after page that are still
// pending, each as a fault on it would be served, while the thread that
// faulted works on page: it then finds them present instead of faulting
// on each. Everything pending is placed sooner or later, so a wrong guess
// costs only the order. Strides that are not pending (served, or a hole)
// are skipped. The reads go to the source at once, up to strideReaders at
// a time (through a mount each is a round trip to its server, which
// serves them in parallel), and are placed in order as they come.
func (s *server) strideAhead(page uint64, n int) error {
	d := s.stride.d
	reads := s.strideReads[:0]
	var total uint64
	last := page // the last stride looked at
	s.setMu.Lock()
	for i := 1; i <= n && total < strideMaxBytes; i++ {
		at := page + uint64(int64(i)*d)
		if s.stride.walked(at) && !s.stride.walked(page) {
			break
		}
		last = at
		p, ok := s.pend.find(at)
		if !ok {
			continue
		}
		lo, hi := s.faultRange(p, at)
		reads = append(reads, strideRead{at: at, lo: lo, src: p.src + (lo - p.cur), n: hi - lo, off: total})
		total += hi - lo
		// The pages the access at at reaches, past the window.
		for q := hi; q < at+s.stride.span; {
			p, ok := s.pend.find(q)
			if !ok {
				break
			}
			lo, hi := s.faultRange(p, q)
			if hi <= q {
				break
			}
			reads = append(reads, strideRead{at: at, lo: lo, src: p.src + (lo - p.cur), n: hi - lo, off: total})
			total += hi - lo
			q = hi
		}
	}
	s.setMu.Unlock()
	s.strideReads = reads
	if len(reads) == 0 {
		s.stride.prev = last
		return nil
	}
	if uint64(cap(s.strideBuf)) < total {
		s.strideBuf = make([]byte, total)
	}
	done := make([]chan error, len(reads))
	for i := range done {
		done[i] = make(chan error, 1)
	}
	workers := min(len(reads), strideReaders)
	for w := range workers {
		go func() {
			for i := w; i < len(reads); i += workers {
				r := reads[i]
				done[i] <- readFull(s.src, s.strideBuf[r.off:r.off+r.n], r.src)
			}
		}()
	}
	var firstErr error
	for i, r := range reads {
		err := <-done[i]
		if firstErr != nil {
			continue // drain: the readers write into strideBuf
		}
		if err != nil {
			firstErr = &ServeError{Op: "read", Addr: r.lo, Len: r.n, Src: r.src, Err: err}
			continue
		}
		s.mu.Lock()
		s.st.ReadBytes += r.n
		s.st.StrideBytes += r.n
		s.mu.Unlock()
		if _, err := s.placeRange(piece{r.lo, r.src, r.n}, s.strideBuf[r.off:r.off+r.n], whyFault); err != nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		s.stride.prev = last // the thread's next fault continues the stride from there
	}
	return firstErr
}

// strideRead is one read of strideAhead: n bytes at src for lo, into
// strideBuf at off, for the access at the page at.
type strideRead struct {
	at, lo, src, n, off uint64
}

// strideReaders is how many reads strideAhead has at the source at once;
// strideMaxBytes the most it reads for one fault.
const (
	strideReaders  = 8
	strideMaxBytes = 4 << 20
)

// serveZero serves a fault outside every pending extent with zeros, from
// the faulting page up to ZeroReadChunk (a read: the zero page) or
// ZeroChunk (a write: a copy of zeros, so that no copy-on-write fault
// follows), or the next pending extent. A present page (the fault raced a
// copy) or a vanished VMA (it raced munmap or mremap) only needs the
// waiting thread woken.
func (s *server) serveZero(page uint64, write bool) (uint64, error) {
	// Under evMu: no event may move pending pages into the range between
	// the look at the pending set and the fill.
	s.evMu.RLock()
	defer s.evMu.RUnlock()
	end := page + s.opts.ZeroChunk
	if !write {
		// A read fault within a chunk past the last read fault's zeros
		// (a thread reading on through zero memory, or at a stride) is
		// served twice as much, up to zeroReadMax: zero pages cost only
		// their page table entries, and each fault a round trip.
		chunk := s.opts.ZeroReadChunk
		if z := s.lastZero; z.len > 0 && page >= z.end() && page < z.end()+s.zeroChunk {
			chunk = max(chunk, min(2*s.zeroChunk, zeroReadMax))
		}
		s.zeroChunk = chunk
		end = page + chunk
	}
	s.setMu.Lock()
	if q, _, ok := s.pend.next(page); ok && q.cur < end {
		end = q.cur
	}
	s.setMu.Unlock()
	for {
		var n int64
		var err error
		if write {
			if uint64(len(s.zeros)) < end-page {
				s.zeros = make([]byte, s.opts.ZeroChunk)
			}
			n, err = uffdio.Copy(s.fd, page, s.zeros[:end-page], 0)
		} else {
			n, err = uffdio.ZeroPage(s.fd, page, end-page, 0)
		}
		switch {
		case err == nil, errors.Is(err, uffdio.ErrShort):
			if !write {
				s.lastZero = piece{cur: page, len: uint64(n)}
			}
			return uint64(n), nil
		case errors.Is(err, uffdio.ErrExist):
			return 0, s.wakePage(page)
		case errors.Is(err, uffdio.ErrNoVMA):
			// The range crosses the end of the VMA: halve it.
			if end-page > PageSize {
				end = page + max(PageSize, (end-page)/2&^(PageSize-1))
				continue
			}
			return 0, s.wakePage(page)
		case errors.Is(err, uffdio.ErrAgain):
			s.retried()
			return 0, errAgain
		case errors.Is(err, uffdio.ErrGone):
			return 0, errGone
		}
		op := "zeropage"
		if write {
			op = "copy zeros"
		}
		return 0, &ServeError{Op: op, Addr: page, Len: end - page, Err: err}
	}
}

func (s *server) wakePage(page uint64) error {
	s.mu.Lock()
	s.st.Wakes++
	s.mu.Unlock()
	if err := uffdio.Wake(s.fd, page, PageSize); err != nil {
		return &ServeError{Op: "wake", Addr: page, Len: PageSize, Err: err}
	}
	return nil
}

func (s *server) retried() {
	s.mu.Lock()
	s.st.Retries++
	s.mu.Unlock()
}

// exited drops everything pending: the address space is gone. Serving
// goroutine only (it owns the fault queue).
func (s *server) exited() {
	s.markGone()
	s.faults = nil
}

// markGone records that the address space is gone and drops the pending
// set.
func (s *server) markGone() {
	s.setMu.Lock()
	if s.gone.Load() {
		s.setMu.Unlock()
		return
	}
	s.gone.Store(true)
	s.pend = newPieceSet(nil)
	s.setCond.Broadcast()
	s.setMu.Unlock()
	s.mu.Lock()
	s.st.Exited = true
	s.mu.Unlock()
	s.report()
	s.wake()
	s.log.Debug("uffd: process address space gone")
}

// placeRange places the parts of c (the snapshot bytes at c.src, in buf,
// for [c.cur, c.end())) that are still pending where c expects them:
// events since c was planned may have placed, dropped or moved some
// (moved pages are planned again later). It holds evMu for reading, so
// that no event is read, and acted on by the process, between the look at
// the pending set and the copies. skipped reports pages found present.
func (s *server) placeRange(c piece, buf []byte, why int) (skipped bool, err error) {
	s.evMu.RLock()
	defer s.evMu.RUnlock()
	var parts []piece
	s.setMu.Lock()
	if s.gone.Load() {
		s.setMu.Unlock()
		return false, errGone
	}
	s.pend.overlapping(c.cur, c.end(), func(p piece) {
		if p.src != c.src+(p.cur-c.cur) {
			return
		}
		// Pieces that follow each other are placed with one copy (small
		// blocks make many small pieces).
		if n := len(parts); n > 0 && parts[n-1].end() == p.cur && parts[n-1].src+parts[n-1].len == p.src {
			parts[n-1].len += p.len
			return
		}
		parts = append(parts, p)
	})
	s.setMu.Unlock()
	for _, p := range parts {
		off := p.cur - c.cur
		sk, err := s.place(p.cur, p.src, buf[off:off+p.len], why)
		skipped = skipped || sk
		if err != nil {
			return skipped, err
		}
	}
	return skipped, nil
}

// place copies buf (the snapshot bytes at src) to dst and takes what it
// placed out of the pending set; the caller holds evMu for reading.
// Present pages are skipped one by one; a range the kernel refuses as not
// in one registered VMA is halved until the boundary is found. A page with
// no VMA at all is dropped in a forked child (MADV_DONTFORK memory) and an
// error in the root, where events keep the pending set inside registered
// VMAs.
func (s *server) place(dst, src uint64, buf []byte, why int) (skipped bool, err error) {
	for len(buf) > 0 {
		n, err := uffdio.Copy(s.fd, dst, buf, 0)
		if n > 0 {
			s.placed(dst, uint64(n), why)
			dst, src, buf = dst+uint64(n), src+uint64(n), buf[n:]
		}
		switch {
		case err == nil, errors.Is(err, uffdio.ErrShort):
			continue
		case errors.Is(err, uffdio.ErrExist):
			s.setMu.Lock()
			s.pend.remove(dst, dst+PageSize, nil)
			s.setMu.Unlock()
			s.mu.Lock()
			s.st.ExistingBytes += PageSize
			s.mu.Unlock()
			skipped = true
			dst, src, buf = dst+PageSize, src+PageSize, buf[PageSize:]
			continue
		case errors.Is(err, uffdio.ErrNoVMA):
			if len(buf) > PageSize {
				h := len(buf) / PageSize / 2 * PageSize
				sk, err := s.place(dst, src, buf[:h], why)
				skipped = skipped || sk
				if err != nil {
					return skipped, err
				}
				dst, src, buf = dst+uint64(h), src+uint64(h), buf[h:]
				continue
			}
			if !s.child {
				return skipped, &ServeError{Op: "copy", Addr: dst, Len: PageSize, Src: src, Err: err}
			}
			s.setMu.Lock()
			s.pend.remove(dst, dst+PageSize, nil)
			s.setMu.Unlock()
			s.mu.Lock()
			s.st.DroppedBytes += PageSize
			s.mu.Unlock()
			dst, src, buf = dst+PageSize, src+PageSize, buf[PageSize:]
			continue
		case errors.Is(err, uffdio.ErrAgain):
			s.retried()
			return skipped, errAgain
		case errors.Is(err, uffdio.ErrGone):
			return skipped, errGone
		}
		return skipped, &ServeError{Op: "copy", Addr: dst, Len: uint64(len(buf)), Src: src, Err: err}
	}
	return skipped, nil
}

func (s *server) placed(dst, n uint64, why int) {
	s.setMu.Lock()
	s.pend.remove(dst, dst+n, nil)
	s.setMu.Unlock()
	s.mu.Lock()
	if why == whyFault {
		s.st.FaultBytes += n
	} else {
		s.st.PrefetchBytes += n
	}
	s.mu.Unlock()
}
