package uffd

import (
	"sync"
	"time"
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
// Pages of a range that faults or events have taken are skipped. The
// caller holds setMu.
func (s *server) planFirst() (piece, bool) {
	q := &s.first
	for q.i < len(s.opts.First) {
		r := s.opts.First[q.i]
		at := max(q.next, r.Start)
		if at < r.End {
			if c, ok := s.pend.chunk(at, min(s.opts.PrefetchChunk, r.End-at)); ok && c.cur < r.End {
				c.len = min(c.len, r.End-c.cur)
				q.next = c.end()
				return c, true
			}
		}
		q.i++
		q.next = 0
	}
	return piece{}, false
}

// ReleasePrefetch lets the prefetcher start (Options.HoldPrefetch), in the
// process and in every child it forked. Safe at any time, more than once.
func (p *Pager) ReleasePrefetch() {
	if !p.tree.prefetchHeld.Swap(false) {
		return
	}
	for _, s := range append([]*server{p.root}, p.tree.all()...) {
		s.setMu.Lock()
		s.setCond.Broadcast()
		s.setMu.Unlock()
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

	mu      sync.Mutex
	touches []Touch
	seen    map[uint64]bool // addresses recorded (a forked child faults the same pages)
	reason  string
	span    time.Duration
	done    chan struct{}
}

// NewRecorder returns a recorder started at start that stops by itself
// after maxFaults faults (0: no limit).
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
