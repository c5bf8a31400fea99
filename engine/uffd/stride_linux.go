package uffd

import "github.com/lazyfs/lazyfs/engine/uffd/pending"

// strideAhead places the pages at n strides after page that are still
// pending, each as a fault on it would be served, while the thread that
// faulted works on page: it then finds them present instead of faulting
// on each. Everything pending is placed sooner or later, so a wrong guess
// costs only the order. Strides that are not pending (served, or a hole)
// are skipped. The reads go to the source at once, up to strideReaders at
// a time (through a mount each is a round trip to its server, which
// serves them in parallel), and are placed in order as they come.
func (s *server) strideAhead(page uint64, n int) error {
	s.pend.mu.Lock()
	reads, total, last := s.planStrides(page, n)
	s.pend.mu.Unlock()
	s.own.strideReads = reads
	if len(reads) == 0 {
		s.own.pl.StrideFrom(last)
		return nil
	}
	if uint64(cap(s.own.strideBuf)) < total {
		s.own.strideBuf = make([]byte, total)
	}
	if err := s.readStrides(reads); err != nil {
		return err
	}
	s.own.pl.StrideFrom(last) // the thread's next fault continues the stride from there
	return nil
}

// planStrides returns the reads of strideAhead, their bytes, and the last
// stride looked at; the planner learns how far each access they serve
// reaches.
//
// +checklocks:s.pend.mu
func (s *server) planStrides(page uint64, n int) (reads []strideRead, total, last uint64) {
	reads = s.own.strideReads[:0]
	last = page
	s.own.pl.StrideReads()
	for i := 1; i <= n && total < strideMaxBytes; i++ {
		at, ok := s.own.pl.StrideAt(page, i)
		if !ok {
			break
		}
		last = at
		// The window at the stride, then the pages the access at at
		// reaches past it.
		for q := at; q == at || q < at+s.own.pl.StrideSpan(); {
			p, ok := s.pend.set.Find(q)
			if !ok {
				break
			}
			lo, hi := s.own.pl.Range(p.Cur, p.End(), p.Src, q)
			if hi <= q {
				break
			}
			reads = append(reads, strideRead{at: at, lo: lo, src: p.Src + (lo - p.Cur), n: hi - lo, off: total})
			s.own.pl.Reached(at, hi)
			total += hi - lo
			q = hi
		}
	}
	return reads, total, last
}

// readStrides reads the strides' bytes, strideReaders at a time, and
// places each as its read comes.
func (s *server) readStrides(reads []strideRead) error {
	done := make([]chan error, len(reads))
	for i := range done {
		done[i] = make(chan error, 1)
	}
	workers := min(len(reads), strideReaders)
	for w := range workers {
		go func() {
			for i := w; i < len(reads); i += workers {
				r := reads[i]
				done[i] <- readFull(s.src, s.own.strideBuf[r.off:r.off+r.n], r.src)
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
		s.stat.add(func(st *Stats) {
			st.ReadBytes += r.n
			st.StrideBytes += r.n
		})
		if _, err := s.placeRange(pending.Piece{Cur: r.lo, Src: r.src, Len: r.n}, s.own.strideBuf[r.off:r.off+r.n], whyFault); err != nil {
			firstErr = err
		}
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
