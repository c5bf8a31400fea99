package uffd

import (
	"sync"
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd/pending"
	"github.com/lazyfs/lazyfs/engine/uffd/policy"
)

// Working sets: what a lazily restored process touched first, recorded on
// one restore (Recorder, fed by Options.OnFault, with the prefetcher held
// back by Options.HoldPrefetch so that every page the process needs comes
// by a fault) and fetched first on the next ones (Options.First).

// firstQueue is the prefetcher's position in Options.First: the range
// being fetched and the address reached in it.
type firstQueue struct {
	i    int    // index of the range being fetched
	next uint64 // the address reached in it; 0: its start
}

// planFirst returns the next chunk of Options.First still pending: at
// most PrefetchChunk bytes, inside one range, the ranges in their order.
// Pages of a range that faults or events have taken are skipped.
//
// +checklocks:s.pend.mu
func (s *server) planFirst() (pending.Piece, bool) {
	q := &s.pend.first
	for q.i < len(s.opts.First) {
		r := s.opts.First[q.i]
		at := max(q.next, r.Start)
		if at < r.End {
			if c, ok := s.pend.set.Chunk(at, min(s.opts.PrefetchChunk, r.End-at)); ok && c.Cur < r.End {
				c.Len = min(c.Len, r.End-c.Cur)
				q.next = c.End()
				return c, true
			}
		}
		q.i++
		q.next = 0
	}
	return pending.Piece{}, false
}

// firstAhead serves a fault on page (snapshot address at) that falls in
// the working set still to fetch: the process is touching its working set
// faster than the prefetcher places it, in the recorded order, so the
// ranges that follow it in Options.First, up to firstAheadMax bytes, are
// placed now, while it waits, rather than each at a fault of its own; and
// the prefetcher's queue moves past them. It reports whether it placed
// anything (the fault's own range is placed already).
func (s *server) firstAhead(at uint64) (bool, error) {
	s.pend.mu.Lock()
	q := &s.pend.first
	j := policy.First(s.opts.First, q.i, at)
	if j < 0 {
		s.pend.mu.Unlock()
		return false, nil
	}
	// From the faulting page on, in the recorded order, up to
	// firstAheadMax bytes (a range of the working set may be large: the
	// blocks of a scan, merged); the prefetcher's queue goes on from where
	// this stops. The ranges before j, recorded before the page the
	// thread is at, are left to the prefetcher's ordinary order.
	parts := s.own.firstParts[:0]
	var total uint64
	k, next := j, at&^(PageSize-1)
	for k < len(s.opts.First) && total < firstAheadMax {
		r := s.opts.First[k]
		lo := max(r.Start, next)
		end := min(r.End, lo+(firstAheadMax-total))
		s.pend.set.Overlapping(lo, end, func(p pending.Piece) {
			parts = append(parts, p)
			total += p.Len
		})
		if end < r.End {
			next = end
			break
		}
		k, next = k+1, 0
	}
	q.i, q.next = k, next
	s.pend.mu.Unlock()
	s.own.firstParts = parts
	if total == 0 {
		return false, nil
	}
	if uint64(cap(s.own.firstBuf)) < total {
		s.own.firstBuf = make([]byte, total)
	}
	off := uint64(0)
	for _, p := range parts {
		buf := s.own.firstBuf[off : off+p.Len]
		off += p.Len
		if err := readFull(s.src, buf, p.Src); err != nil {
			return true, &ServeError{Op: "read", Addr: p.Cur, Len: p.Len, Src: p.Src, Err: err}
		}
		if _, err := s.placeRange(p, buf, whyFault); err != nil {
			return true, err
		}
	}
	s.stat.add(func(st *Stats) {
		st.ReadBytes += total
		st.FirstAheadBytes += total
	})
	return true, nil
}

// firstAheadMax is the most a fault on the working set still to fetch
// brings in ahead (placing 1 MiB of 4 KiB pieces takes about a
// millisecond).
const firstAheadMax = 1 << 20

// ReleasePrefetch lets the prefetcher start (Options.HoldPrefetch), in the
// process and in every child it forked. Safe at any time, more than once.
func (p *Pager) ReleasePrefetch() {
	if !p.tree.prefetchHeld.Swap(false) {
		return
	}
	for _, s := range append([]*server{p.root}, p.tree.all()...) {
		s.pend.mu.Lock()
		s.pend.cond.Broadcast()
		s.pend.mu.Unlock()
		s.wake()
	}
}

// Touch is one fault a Recorder saw: the snapshot range the pager brought
// in for it, and when, since the recording started.
type Touch struct {
	Addr, Len uint64
	At        time.Duration
}

// Recorder keeps the faults a pager serves from its source (its Observe
// is Options.OnFault) until it is stopped, by Stop or after a number of
// faults. It is safe for concurrent use.
type Recorder struct {
	start time.Time
	max   int

	done chan struct{} // closed under mu

	mu sync.Mutex
	// +checklocks:mu
	touches []Touch
	// +checklocks:mu
	seen map[uint64]bool // addresses recorded (a forked child faults the same pages)
	// +checklocks:mu
	reason string
	// +checklocks:mu
	span time.Duration
}

// NewRecorder returns a recorder started at start that stops by itself
// after maxFaults faults (0: no limit).
//
// +checklocksignore
// The recorder is not shared until NewRecorder returns.
func NewRecorder(start time.Time, maxFaults int) *Recorder {
	return &Recorder{start: start, max: maxFaults, seen: map[uint64]bool{}, done: make(chan struct{})}
}

// Observe records one fault; after Stop it does nothing.
func (r *Recorder) Observe(src, n uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reason != "" || r.seen[src] {
		return
	}
	r.seen[src] = true
	r.touches = append(r.touches, Touch{Addr: src, Len: n, At: max(at.Sub(r.start), 0)})
	if r.max > 0 && len(r.touches) >= r.max {
		r.stopLocked("faults")
	}
}

// Stop ends the recording, saying why (the first reason given wins).
func (r *Recorder) Stop(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked(reason)
}

// stopLocked is Stop, with r.mu held.
//
// +checklocks:r.mu
func (r *Recorder) stopLocked(reason string) {
	if r.reason != "" {
		return
	}
	r.reason = reason
	r.span = time.Since(r.start)
	close(r.done)
}

// Done is closed once the recording has stopped.
func (r *Recorder) Done() <-chan struct{} { return r.done }

// Result returns what was recorded, in the order of the faults, why it
// stopped and how long it ran; call it after Done.
func (r *Recorder) Result() (touches []Touch, reason string, span time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Touch(nil), r.touches...), r.reason, r.span
}
