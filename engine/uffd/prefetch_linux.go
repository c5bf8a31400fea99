package uffd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd/pending"
	"github.com/lazyfs/lazyfs/engine/uffd/policy"
)

// plan returns the next chunk to prefetch, wrapping to the lowest address
// once the cursor has passed the last pending piece (pieces moved behind
// the cursor by mremap are found that way). Serving a thread that reads
// through memory in order, it takes the memory that follows the thread's
// front, and once there is none, the memory right below where the thread's
// scan started (see policy.Scan).
//
// +checklocks:s.pend.mu
func (s *server) plan(inflight int) (pending.Piece, bool) {
	if c, ok := s.planFirst(); ok {
		return c, true
	}
	c, ok := s.nextChunk(s.pend.cursor)
	if s.pend.scan.On && (!ok || c.Cur >= s.pend.cursor+s.opts.PrefetchChunk || c.Cur >= s.pend.scan.Front+policy.ScanAhead) {
		if d, ok := s.chunkBelow(s.pend.scan.Down); ok && d.End()+s.pend.scan.Below >= s.pend.scan.Lo {
			s.pend.scan.Down = d.Cur
			return d, true
		}
	}
	// Workers skip each other's chunks (claimed); the serving
	// goroutine's read-ahead wraps only once it has none in flight.
	if !ok && s.pend.cursor != 0 && (inflight == 0 || s.opts.Workers > 0) {
		s.pend.cursor = 0
		c, ok = s.nextChunk(0)
	}
	if ok {
		s.pend.cursor = c.End()
	}
	return c, ok
}

// nextChunk returns the chunk to prefetch from addr up, past the chunks
// workers have claimed.
//
// +checklocks:s.pend.mu
func (s *server) nextChunk(addr uint64) (pending.Piece, bool) {
	for {
		c, ok := s.pend.set.Chunk(addr, s.opts.PrefetchChunk)
		if !ok {
			return c, false
		}
		cl, hit := s.claimedIn(c)
		if !hit {
			return c, true
		}
		if cl.Cur > c.Cur {
			c.Len = cl.Cur - c.Cur
			return c, true
		}
		addr = cl.End()
	}
}

// chunkBelow returns the chunk to prefetch right below addr, past the
// chunks workers have claimed.
//
// +checklocks:s.pend.mu
func (s *server) chunkBelow(addr uint64) (pending.Piece, bool) {
	for {
		d, ok := s.pend.set.ChunkBelow(addr, s.opts.PrefetchChunk)
		if !ok {
			return d, false
		}
		cl, hit := s.claimedIn(d)
		if !hit {
			return d, true
		}
		if cl.End() < d.End() {
			return pending.Piece{Cur: cl.End(), Src: d.Src + (cl.End() - d.Cur), Len: d.End() - cl.End()}, true
		}
		addr = cl.Cur
	}
}

// claimedIn returns a chunk claimed by a worker that overlaps c (pending
// until the worker has placed it).
//
// +checklocks:s.pend.mu
func (s *server) claimedIn(c pending.Piece) (pending.Piece, bool) {
	for _, cl := range s.pend.claimed {
		if cl.Cur < c.End() && c.Cur < cl.End() {
			return cl, true
		}
	}
	return pending.Piece{}, false
}

// prefetch places at most one chunk, on the serving goroutine (Workers
// 0). progressed reports that it did work (the loop then checks for
// faults again before the next chunk).
func (s *server) prefetch() (progressed, again bool, err error) {
	if s.own.ra == nil {
		s.pend.mu.Lock()
		c, ok := s.plan(0)
		s.pend.mu.Unlock()
		if !ok {
			return false, false, nil
		}
		if uint64(cap(s.own.syncBuf)) < c.Len {
			s.own.syncBuf = make([]byte, s.opts.PrefetchChunk)
		}
		r := &raReq{c: c, buf: s.own.syncBuf[:c.Len]}
		r.err = readFull(s.src, r.buf, c.Src)
		again, err = s.placeChunk(r)
		if again {
			s.pend.mu.Lock()
			s.pend.cursor = c.Cur // replan it after the events
			s.pend.mu.Unlock()
		}
		return true, again, err
	}
	for !s.own.ra.full() {
		s.pend.mu.Lock()
		c, ok := s.plan(len(s.own.ra.inflight))
		s.pend.mu.Unlock()
		if !ok {
			break
		}
		s.own.ra.issue(c)
	}
	r := s.own.ra.ready()
	if r == nil {
		return false, false, nil
	}
	again, err = s.placeChunk(r)
	if again || err != nil {
		return true, again, err // keep the chunk: retried after the events
	}
	s.own.ra.pop()
	return true, false, nil
}

// placeChunk places the parts of a prefetched chunk that are still
// pending. again: a copy was refused until events are read (the chunk is
// to be placed again after them).
func (s *server) placeChunk(r *raReq) (again bool, err error) {
	c := r.c
	if r.err != nil {
		// Only an error if something of it is still wanted.
		var first pending.Piece
		var any bool
		s.pend.mu.Lock()
		s.pend.set.Overlapping(c.Cur, c.End(), func(p pending.Piece) {
			if !any && p.Src == c.Src+(p.Cur-c.Cur) {
				first, any = p, true
			}
		})
		s.pend.mu.Unlock()
		if !any {
			return false, nil
		}
		return false, &ServeError{Op: "read", Addr: c.Cur, Len: c.Len, Src: c.Src, Err: fmt.Errorf("prefetch (first pending page %#x): %w", first.Cur, r.err)}
	}
	if !r.counted {
		r.counted = true
		s.stat.add(func(st *Stats) { st.ReadBytes += c.Len })
	}
	_, err = s.placeRange(c, r.buf, whyPrefetch)
	switch {
	case errors.Is(err, errAgain):
		s.report()
		return true, nil
	case errors.Is(err, errGone):
		s.markGone()
		return false, nil
	case err != nil:
		return false, err
	}
	s.report()
	return false, nil
}

// Prefetch workers (Options.Workers > 0): each claims the next chunk from
// the cursor, reads it from the source and places it, on its own thread,
// while the serving goroutine serves faults and events. UFFDIO_COPY from
// several threads at once is safe; what must not happen is a copy based
// on a look at the pending set taken before an event that the process has
// since acted on (a MADV_DONTNEED range must read zeros, not snapshot
// data). The kernel refuses copies while an event is queued and unread;
// once the serving goroutine has read it, the process goes on (zaps the
// range, say) before the event is applied here. So every copy is made
// under evMu held for reading, with the pending set looked at under it,
// and the serving goroutine reads and applies events under evMu held for
// writing: a copy either precedes the read (and the process's change
// follows it) or sees the event applied.

// startWorkers starts n prefetch workers; Run waits for them.
func (s *server) startWorkers(ctx context.Context, n int) {
	for id := range n {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			lockThread()
			if err := s.work(ctx, id); err != nil {
				s.pend.mu.Lock()
				if s.pend.werr == nil {
					s.pend.werr = err
				}
				s.pend.mu.Unlock()
			}
			s.wake()
		}()
	}
}

// stopWorkers makes the workers return and waits for them.
func (s *server) stopWorkers() {
	s.pend.mu.Lock()
	s.pend.stop = true
	s.pend.cond.Broadcast()
	s.pend.mu.Unlock()
	s.workers.Wait()
}

// work is one worker's loop; id numbers the workers from 0.
func (s *server) work(ctx context.Context, id int) error {
	buf := make([]byte, s.opts.PrefetchChunk)
	for {
		c, ok := s.claim(ctx, id)
		if !ok {
			return nil
		}
		r := &raReq{c: c, buf: buf[:c.Len]}
		r.err = readFull(s.src, r.buf, c.Src)
		err := s.placeClaimed(ctx, r)
		s.pend.mu.Lock()
		s.pend.inflight--
		s.pend.claimed = slices.DeleteFunc(s.pend.claimed, func(cl pending.Piece) bool { return cl == c })
		empty := s.pend.set.Empty() && s.pend.inflight == 0
		s.pend.cond.Broadcast()
		s.pend.mu.Unlock()
		if empty {
			s.wake() // the serving goroutine decides whether Run is done
		}
		if err != nil {
			return err
		}
	}
}

// claim waits for the next chunk to prefetch and takes it (counted in
// inflight), or returns false when there is nothing left or the pager
// stops. Every worker but the first holds back while the process waits
// on the latency of faults (see policy.LatencyHold).
func (s *server) claim(ctx context.Context, id int) (pending.Piece, bool) {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	for {
		if s.pend.stop || s.gone.Load() || s.pend.werr != nil || ctx.Err() != nil || s.pend.set.Empty() {
			return pending.Piece{}, false
		}
		if s.tree.prefetchHeld.Load() {
			s.pend.cond.Wait() // ReleasePrefetch broadcasts
			continue
		}
		if d := time.Until(s.prefetchAt); d > 0 {
			s.wakeIn(d)
			s.pend.cond.Wait()
			continue
		}
		// A working set (Options.First) is fetched by every worker: it is
		// what the process is about to touch.
		if d := time.Until(time.Unix(0, s.latencyUntil.Load())); id > 0 && d > 0 && s.pend.first.i >= len(s.opts.First) {
			s.wakeIn(d)
			s.pend.cond.Wait()
			continue
		}
		if c, ok := s.plan(s.pend.inflight); ok {
			s.pend.inflight++
			s.pend.claimed = append(s.pend.claimed, c)
			return c, true
		}
		// Everything left is in other workers' hands (or moved behind
		// the cursor while they have chunks in flight).
		s.pend.cond.Wait()
	}
}

// placeClaimed places a worker's chunk, waiting for the serving goroutine
// to read the events that make the kernel refuse copies.
func (s *server) placeClaimed(ctx context.Context, r *raReq) error {
	if r.err != nil {
		_, err := s.placeChunk(r)
		return err
	}
	// In steps of at most workerStep: the serving goroutine waits for the
	// copy in progress before it reads a fault.
	for off := uint64(0); off < r.c.Len; off += workerStep {
		n := min(workerStep, r.c.Len-off)
		step := &raReq{c: pending.Piece{Cur: r.c.Cur + off, Src: r.c.Src + off, Len: n}, buf: r.buf[off : off+n], counted: true}
		if err := s.placeStep(ctx, step); err != nil {
			return err
		}
	}
	s.stat.add(func(st *Stats) { st.ReadBytes += r.c.Len })
	return nil
}

// workerStep is the most a worker copies under one hold of evMu: 256 KiB
// take 60-100 µs to copy, the longest a fault then waits for it.
const workerStep = 256 << 10

// placeStep places one step of a worker's chunk, waiting for the serving
// goroutine to read the events that make the kernel refuse copies.
func (s *server) placeStep(ctx context.Context, r *raReq) error {
	backoff := 50 * time.Microsecond
	for {
		again, err := s.placeChunk(r)
		if err != nil || !again {
			return err
		}
		s.wake()
		// The events may never come: a failed mremap lowers the kernel's
		// flag without a message. Retry after a growing timeout too.
		deadline := time.Now().Add(backoff)
		s.pend.mu.Lock()
		gen := s.pend.evGen
		s.wakeIn(backoff)
		for s.pend.evGen == gen && !s.pend.stop && !s.gone.Load() && ctx.Err() == nil && time.Now().Before(deadline) {
			s.pend.cond.Wait()
		}
		stop := s.pend.stop || s.gone.Load() || ctx.Err() != nil
		s.pend.mu.Unlock()
		if stop {
			return ctx.Err()
		}
		backoff = min(2*backoff, 10*time.Millisecond)
	}
}

// wakeIn broadcasts pend.cond after d.
func (s *server) wakeIn(d time.Duration) {
	time.AfterFunc(d, func() {
		s.pend.mu.Lock()
		s.pend.cond.Broadcast()
		s.pend.mu.Unlock()
	})
}
