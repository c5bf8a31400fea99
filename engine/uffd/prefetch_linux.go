package uffd

import (
	"errors"
	"fmt"
)

// plan returns the next chunk to prefetch, wrapping to the lowest address
// once the cursor has passed the last pending piece and nothing is in
// flight (pieces moved behind the cursor by mremap are found that way).
func (s *server) plan(inflight int) (piece, bool) {
	c, ok := s.pend.chunk(s.cursor, s.opts.PrefetchChunk)
	if !ok && inflight == 0 && s.cursor != 0 {
		s.cursor = 0
		c, ok = s.pend.chunk(0, s.opts.PrefetchChunk)
	}
	if ok {
		s.cursor = c.end()
	}
	return c, ok
}

// prefetch places at most one chunk. progressed reports that it did work
// (the loop then checks for faults again before the next chunk).
func (s *server) prefetch() (progressed, again bool, err error) {
	if s.ra == nil {
		c, ok := s.plan(0)
		if !ok {
			return false, false, nil
		}
		if uint64(cap(s.syncBuf)) < c.len {
			s.syncBuf = make([]byte, s.opts.PrefetchChunk)
		}
		r := &raReq{c: c, buf: s.syncBuf[:c.len]}
		r.err = readFull(s.src, r.buf, c.src)
		again, err = s.placeChunk(r)
		if again {
			s.cursor = c.cur // replan it after the events
		}
		return true, again, err
	}
	for !s.ra.full() {
		c, ok := s.plan(len(s.ra.inflight))
		if !ok {
			break
		}
		s.ra.issue(c)
	}
	r := s.ra.ready()
	if r == nil {
		return false, false, nil
	}
	again, err = s.placeChunk(r)
	if again || err != nil {
		return true, again, err // keep the chunk: retried after the events
	}
	s.ra.pop()
	return true, false, nil
}

// placeChunk places the parts of a chunk that are still pending where the
// chunk expects them: events since it was planned may have placed,
// dropped or moved some (moved pages are found again by a later plan).
func (s *server) placeChunk(r *raReq) (again bool, err error) {
	c := r.c
	s.parts = s.parts[:0]
	s.pend.overlapping(c.cur, c.end(), func(p piece) {
		if p.src == c.src+(p.cur-c.cur) {
			s.parts = append(s.parts, p)
		}
	})
	if len(s.parts) == 0 {
		return false, nil
	}
	if r.err != nil {
		p := s.parts[0]
		return false, &ServeError{Op: "read", Addr: c.cur, Len: c.len, Src: c.src, Err: fmt.Errorf("prefetch (first pending page %#x): %w", p.cur, r.err)}
	}
	if !r.counted {
		r.counted = true
		s.mu.Lock()
		s.st.ReadBytes += c.len
		s.mu.Unlock()
	}
	for _, p := range s.parts {
		off := p.cur - c.cur
		err := s.place(p.cur, p.src, r.buf[off:off+p.len], whyPrefetch)
		switch {
		case errors.Is(err, errAgain):
			s.report()
			return true, nil
		case errors.Is(err, errGone):
			s.exited()
			return false, nil
		case err != nil:
			return false, err
		}
	}
	s.report()
	return false, nil
}
