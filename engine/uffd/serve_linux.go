package uffd

import (
	"errors"
	"fmt"
	"time"
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
	if f.m.Flags&(PagefaultFlagWP|PagefaultFlagMinor) != 0 {
		return &ServeError{Op: "fault", Addr: f.m.Addr, Len: PageSize, Err: fmt.Errorf("%v: %w", f.m, ErrUnexpected)}
	}
	page := f.m.Addr &^ (PageSize - 1)
	p, ok := s.pend.find(page)
	if !ok {
		zeroed, err := s.serveZero(page, f.m.Flags&PagefaultFlagWrite != 0)
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
	lo, hi := p.cur, p.end()
	if w := s.opts.MaxFaultBytes; hi-lo > w {
		lo = max(lo, page-page%w)
		hi = min(hi, lo+w)
	}
	src := p.src + (lo - p.cur)
	if uint64(cap(s.faultBuf)) < hi-lo {
		s.faultBuf = make([]byte, hi-lo)
	}
	buf := s.faultBuf[:hi-lo]
	if err := readFull(s.src, buf, src); err != nil {
		return &ServeError{Op: "read", Addr: lo, Len: hi - lo, Src: src, Err: err}
	}
	s.mu.Lock()
	s.st.ReadBytes += hi - lo
	s.mu.Unlock()
	s.skipped = false
	if err := s.place(lo, src, buf, whyFault); err != nil {
		return err
	}
	if s.skipped {
		if err := s.wakePage(page); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.st.Faults++
	s.st.DataFaults++
	s.h.add(time.Since(f.at))
	s.mu.Unlock()
	s.report()
	return nil
}

// serveZero serves a fault outside every pending extent with zeros, from
// the faulting page up to ZeroChunk or the next pending extent: the zero
// page for a read, a copy of zeros for a write (no copy-on-write fault to
// follow). A present page (the fault raced a copy) or a vanished VMA (it
// raced munmap or mremap) only needs the waiting thread woken.
func (s *server) serveZero(page uint64, write bool) (uint64, error) {
	end := page + s.opts.ZeroChunk
	if q, _, ok := s.pend.next(page); ok && q.cur < end {
		end = q.cur
	}
	for {
		var n int64
		var err error
		if write {
			if uint64(len(s.zeros)) < end-page {
				s.zeros = make([]byte, s.opts.ZeroChunk)
			}
			n, err = Copy(s.fd, page, s.zeros[:end-page], 0)
		} else {
			n, err = ZeroPage(s.fd, page, end-page, 0)
		}
		switch {
		case err == nil, errors.Is(err, ErrShort):
			return uint64(n), nil
		case errors.Is(err, ErrExist):
			return 0, s.wakePage(page)
		case errors.Is(err, ErrNoVMA):
			if end-page > PageSize {
				end = page + PageSize
				continue
			}
			return 0, s.wakePage(page)
		case errors.Is(err, ErrAgain):
			s.retried()
			return 0, errAgain
		case errors.Is(err, ErrGone):
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
	if err := Wake(s.fd, page, PageSize); err != nil {
		return &ServeError{Op: "wake", Addr: page, Len: PageSize, Err: err}
	}
	return nil
}

func (s *server) retried() {
	s.mu.Lock()
	s.st.Retries++
	s.mu.Unlock()
}

// exited drops everything pending: the address space is gone.
func (s *server) exited() {
	s.gone = true
	s.pend = newPieceSet(nil)
	s.faults = nil
	s.mu.Lock()
	s.st.Exited = true
	s.mu.Unlock()
	s.report()
	s.log.Debug("uffd: process address space gone")
}

// place copies buf (the snapshot bytes at src) to dst and takes what it
// placed out of the pending set. Present pages are skipped one by one; a
// range the kernel refuses as not in one registered VMA is halved until
// the boundary is found. A page with no VMA at all is dropped in a forked
// child (MADV_DONTFORK memory) and an error in the root, where events keep
// the pending set inside registered VMAs.
func (s *server) place(dst, src uint64, buf []byte, why int) error {
	for len(buf) > 0 {
		n, err := Copy(s.fd, dst, buf, 0)
		if n > 0 {
			s.placed(dst, uint64(n), why)
			dst, src, buf = dst+uint64(n), src+uint64(n), buf[n:]
		}
		switch {
		case err == nil, errors.Is(err, ErrShort):
			continue
		case errors.Is(err, ErrExist):
			s.pend.remove(dst, dst+PageSize, nil)
			s.mu.Lock()
			s.st.ExistingBytes += PageSize
			s.mu.Unlock()
			s.skipped = true
			dst, src, buf = dst+PageSize, src+PageSize, buf[PageSize:]
			continue
		case errors.Is(err, ErrNoVMA):
			if len(buf) > PageSize {
				h := len(buf) / PageSize / 2 * PageSize
				if err := s.place(dst, src, buf[:h], why); err != nil {
					return err
				}
				dst, src, buf = dst+uint64(h), src+uint64(h), buf[h:]
				continue
			}
			if !s.child {
				return &ServeError{Op: "copy", Addr: dst, Len: PageSize, Src: src, Err: err}
			}
			s.pend.remove(dst, dst+PageSize, nil)
			s.mu.Lock()
			s.st.DroppedBytes += PageSize
			s.mu.Unlock()
			dst, src, buf = dst+PageSize, src+PageSize, buf[PageSize:]
			continue
		case errors.Is(err, ErrAgain):
			s.retried()
			return errAgain
		case errors.Is(err, ErrGone):
			return errGone
		}
		return &ServeError{Op: "copy", Addr: dst, Len: uint64(len(buf)), Src: src, Err: err}
	}
	return nil
}

func (s *server) placed(dst, n uint64, why int) {
	s.pend.remove(dst, dst+n, nil)
	s.mu.Lock()
	if why == whyFault {
		s.st.FaultBytes += n
	} else {
		s.st.PrefetchBytes += n
	}
	s.mu.Unlock()
}
