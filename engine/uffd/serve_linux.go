package uffd

import (
	"errors"
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd/pending"
	"github.com/lazyfs/lazyfs/engine/uffd/policy"
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
	for len(s.own.faults) > 0 {
		f := s.own.faults[0]
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
		s.own.faults = s.own.faults[1:]
		if len(s.own.faults) == 0 {
			s.own.faults = s.own.faults[:0:0]
		}
		if s.opts.Spin > 0 {
			s.own.spinUntil = time.Now().Add(s.opts.Spin)
		}
	}
	return false, nil
}

// serveFault serves one fault: outside every pending extent with zeros;
// inside one, in four steps: classify (the planner's pure decision of
// what comes with it), read, place, record; then what its plan brings in
// ahead of the thread.
func (s *server) serveFault(f fault) error {
	if f.m.Flags&(uffdio.PagefaultFlagWP|uffdio.PagefaultFlagMinor) != 0 {
		return &ServeError{Op: "fault", Addr: f.m.Addr, Len: PageSize, Err: fmt.Errorf("%v: %w", f.m, ErrUnexpected)}
	}
	page := f.m.Addr &^ (PageSize - 1)
	s.pend.mu.Lock()
	p, ok := s.pend.set.Find(page)
	seen := s.faultSeen(page)
	s.pend.mu.Unlock()
	if !ok {
		return s.serveZeroFault(f, page)
	}
	lo, hi := s.own.pl.Range(p.Cur, p.End(), p.Src, page)
	src := p.Src + (lo - p.Cur)
	plan := s.own.pl.Classify(seen)
	parts := s.faultParts(plan, page, lo, hi, src)
	if err := s.readPlace(f, page, parts); err != nil {
		return err
	}
	s.recordFault(f, plan)
	return s.serveAhead(page, src+(page-lo), plan)
}

// faultSeen returns what the planner is told of a data fault on page: the
// prefetcher's cursor and the pending memory after the last fault's.
//
// +checklocks:s.pend.mu
func (s *server) faultSeen(page uint64) policy.Fault {
	f := policy.Fault{Page: page, Cursor: s.pend.cursor}
	if end, ok := s.own.pl.LastEnd(); ok && page > end+PageSize {
		n, has := s.pend.set.Next(end)
		f.Onward, f.OnwardOK = n.Cur, has
	}
	return f
}

// faultParts returns the parts a data fault on page, served [lo, hi)
// (snapshot bytes at src), brings in: that range, and for a scan the
// pending memory up to FaultAhead on, past memory already in place too
// (a scan after a stride finds a window in place every stride, and would
// otherwise fault past each). The prefetcher follows a scan: it streams
// on from where the fault's memory ends, ahead of the reader, rather than
// wherever its cursor was, so that a full read costs about the longer of
// streaming and the reader's own work, not their sum.
func (s *server) faultParts(plan policy.Plan, page, lo, hi, src uint64) []pending.Piece {
	parts := append(s.own.faultParts[:0], pending.Piece{Cur: lo, Src: src, Len: hi - lo})
	if plan.Scan {
		s.pend.mu.Lock()
		s.pend.scan.Follow(plan.RunStart, hi)
		if s.opts.FaultAhead > hi-lo {
			s.pend.set.Overlapping(hi, lo+s.opts.FaultAhead, func(p pending.Piece) {
				last := &parts[len(parts)-1]
				if last.End() == p.Cur && last.Src+last.Len == p.Src {
					last.Len += p.Len
					return
				}
				parts = append(parts, p)
			})
			s.pend.cursor = parts[len(parts)-1].End()
			s.pend.scan.Front = s.pend.cursor
		}
		s.pend.mu.Unlock()
	}
	s.own.faultParts = parts
	s.own.pl.Served(page, lo, parts[len(parts)-1].End())
	return parts
}

// readPlace reads a data fault's parts from the source (Options.FaultSrc
// if set) and places them. A prefetch worker may have placed some of
// them meanwhile (the fault then finds the page present: it is woken),
// never an event: events are applied by this goroutine only.
func (s *server) readPlace(f fault, page uint64, parts []pending.Piece) error {
	var total uint64
	for _, p := range parts {
		total += p.Len
	}
	if uint64(cap(s.own.faultBuf)) < total {
		s.own.faultBuf = make([]byte, total)
	}
	src := s.src
	if s.opts.FaultSrc != nil {
		src = s.opts.FaultSrc
	}
	var skipped bool
	off := uint64(0)
	for _, p := range parts {
		buf := s.own.faultBuf[off : off+p.Len]
		off += p.Len
		if err := readFull(src, buf, p.Src); err != nil {
			return &ServeError{Op: "read", Addr: p.Cur, Len: p.Len, Src: p.Src, Err: err}
		}
		s.stat.add(func(st *Stats) { st.ReadBytes += p.Len })
		sk, err := s.placeRange(p, buf, whyFault)
		if err != nil {
			return err
		}
		skipped = skipped || sk
		if s.opts.OnFault != nil {
			s.opts.OnFault(p.Src, p.Len, f.at)
		}
	}
	if skipped {
		return s.wakePage(page)
	}
	return nil
}

// recordFault counts a data fault served and holds the prefetch workers
// back after one that is not part of a scan (policy.LatencyHold).
func (s *server) recordFault(f fault, plan policy.Plan) {
	s.stat.mu.Lock()
	s.stat.st.Faults++
	s.stat.st.DataFaults++
	s.stat.h.add(time.Since(f.at))
	s.stat.mu.Unlock()
	if plan.Hold() {
		s.latencyUntil.Store(time.Now().Add(policy.LatencyHold).UnixNano())
	} else if s.latencyUntil.Swap(0) > time.Now().UnixNano() {
		// The thread reads on in order: it waits on streaming now, which
		// every worker speeds up (the first fault of each array it goes
		// on to is not yet known as part of a scan).
		s.pend.mu.Lock()
		s.pend.cond.Broadcast()
		s.pend.mu.Unlock()
	}
}

// serveAhead brings in what a data fault on page (snapshot address at)
// is followed by: in the working set still to fetch, what follows it in
// the recorded order (it is what the thread touches next, better known
// than any stride); else, for a thread at a stride, its next strides.
func (s *server) serveAhead(page, at uint64, plan policy.Plan) error {
	if len(s.opts.First) > 0 {
		s.pend.mu.Lock()
		pendingFirst := s.pend.first.i < len(s.opts.First)
		s.pend.mu.Unlock()
		if pendingFirst {
			ahead, err := s.firstAhead(at)
			if err != nil {
				return err
			}
			if ahead {
				s.report()
				return nil
			}
		}
	}
	if n := s.own.pl.Strides(page, plan); n > 0 && !s.opts.NoStrideAhead {
		if err := s.strideAhead(page, n); err != nil {
			return err
		}
	}
	s.report()
	return nil
}

// serveZeroFault serves a fault outside every pending extent (serveZero)
// and counts it.
func (s *server) serveZeroFault(f fault, page uint64) error {
	zeroed, err := s.serveZero(page, f.m.Flags&uffdio.PagefaultFlagWrite != 0)
	if err != nil {
		return err
	}
	s.stat.mu.Lock()
	s.stat.st.Faults++
	s.stat.st.ZeroFaults++
	s.stat.st.ZeroBytes += zeroed
	s.stat.h.add(time.Since(f.at))
	s.stat.mu.Unlock()
	return nil
}

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
		end = page + s.own.pl.ZeroRead(page)
	}
	s.pend.mu.Lock()
	if q, ok := s.pend.set.Next(page); ok && q.Cur < end {
		end = q.Cur
	}
	s.pend.mu.Unlock()
	for {
		var n int64
		var err error
		if write {
			if uint64(len(s.own.zeros)) < end-page {
				s.own.zeros = make([]byte, s.opts.ZeroChunk)
			}
			n, err = uffdio.Copy(s.fd, page, s.own.zeros[:end-page], 0)
		} else {
			n, err = uffdio.ZeroPage(s.fd, page, end-page, 0)
		}
		switch {
		case err == nil, errors.Is(err, uffdio.ErrShort):
			if !write {
				s.own.pl.Zeroed(page, uint64(n))
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
	s.stat.add(func(st *Stats) { st.Wakes++ })
	if err := uffdio.Wake(s.fd, page, PageSize); err != nil {
		return &ServeError{Op: "wake", Addr: page, Len: PageSize, Err: err}
	}
	return nil
}

func (s *server) retried() {
	s.stat.add(func(st *Stats) { st.Retries++ })
}

// exited drops everything pending: the address space is gone. Serving
// goroutine only (it owns the fault queue).
func (s *server) exited() {
	s.markGone()
	s.own.faults = nil
}

// markGone records that the address space is gone and drops the pending
// set.
func (s *server) markGone() {
	s.pend.mu.Lock()
	if s.gone.Load() {
		s.pend.mu.Unlock()
		return
	}
	s.gone.Store(true)
	s.pend.set = newPending(nil)
	s.pend.cond.Broadcast()
	s.pend.mu.Unlock()
	s.stat.add(func(st *Stats) { st.Exited = true })
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
func (s *server) placeRange(c pending.Piece, buf []byte, why int) (skipped bool, err error) {
	s.evMu.RLock()
	defer s.evMu.RUnlock()
	var parts []pending.Piece
	s.pend.mu.Lock()
	if s.gone.Load() {
		s.pend.mu.Unlock()
		return false, errGone
	}
	s.pend.set.Overlapping(c.Cur, c.End(), func(p pending.Piece) {
		if p.Src != c.Src+(p.Cur-c.Cur) {
			return
		}
		// Pieces that follow each other are placed with one copy (small
		// blocks make many small pieces).
		if n := len(parts); n > 0 && parts[n-1].End() == p.Cur && parts[n-1].Src+parts[n-1].Len == p.Src {
			parts[n-1].Len += p.Len
			return
		}
		parts = append(parts, p)
	})
	s.pend.mu.Unlock()
	for _, p := range parts {
		off := p.Cur - c.Cur
		sk, err := s.place(p.Cur, p.Src, buf[off:off+p.Len], why)
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
//
// +checklocks:s.evMu
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
			s.pend.mu.Lock()
			s.pend.set.Remove(dst, dst+PageSize, nil)
			s.pend.mu.Unlock()
			s.stat.add(func(st *Stats) { st.ExistingBytes += PageSize })
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
			s.pend.mu.Lock()
			s.pend.set.Remove(dst, dst+PageSize, nil)
			s.pend.mu.Unlock()
			s.stat.add(func(st *Stats) { st.DroppedBytes += PageSize })
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
	s.pend.mu.Lock()
	s.pend.set.Remove(dst, dst+n, nil)
	s.pend.mu.Unlock()
	s.stat.mu.Lock()
	if why == whyFault {
		s.stat.st.FaultBytes += n
	} else {
		s.stat.st.PrefetchBytes += n
	}
	s.stat.mu.Unlock()
}
