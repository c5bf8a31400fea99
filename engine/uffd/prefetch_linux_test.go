package uffd

import (
	"testing"

	"github.com/lazyfs/lazyfs/engine/uffd/pending"
	"github.com/lazyfs/lazyfs/engine/uffd/policy"
)

// planServer returns a server with ext pending, for plan's tests (no
// userfaultfd: plan only looks at the pending set and the cursor).
func planServer(ext []Extent, workers int) *server {
	o := Options{Prefetch: true, PrefetchChunk: 16 * PageSize, Workers: workers}.normalized()
	return newServer(-1, nil, newPending(ext), o, &tree{}, false)
}

// claimNext plans as a worker claims (under pend.mu, counted in flight).
func claimNext(s *server) (pending.Piece, bool) {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	c, ok := s.plan(s.pend.inflight)
	if ok {
		s.pend.inflight++
		s.pend.claimed = append(s.pend.claimed, c)
	}
	return c, ok
}

// TestPlanBelowScan: a thread that read one array from its start upwards
// (arrays at descending addresses) gets the memory right below that start
// next, downwards chunk by chunk, while nothing is pending after its
// front; not the lowest memory of the process, where the cursor would
// wrap to. Further than policy.ScanBelow down, address order again.
//
// +checklocksignore
// The servers here are not running: the test is their only goroutine.
func TestPlanBelowScan(t *testing.T) {
	const P = PageSize
	heap := Extent{0x10 * P, 32 * P}
	lo := uint64(0x100000 * P)          // far above the heap
	a3, a2, a1 := lo, lo+64*P, lo+128*P // three arrays of 64 pages, a1 on top
	s := planServer([]Extent{heap, {a3, 192 * P}}, 2)
	s.pend.set.Remove(a1, a1+64*P, nil) // a1 read and placed
	s.pend.cursor = a1 + 64*P
	s.pend.scan = policy.Scan{On: true, Lo: a1, Down: a1, Below: policy.ScanBelow}

	for i, want := range []pending.Piece{{Cur: a2 + 48*P, Src: a2 + 48*P, Len: 16 * P}, {Cur: a2 + 32*P, Src: a2 + 32*P, Len: 16 * P}} {
		if c, ok := claimNext(s); !ok || c != want {
			t.Fatalf("chunk %d: %+v, %v; want %+v below the scan's start", i, c, ok, want)
		}
	}
	// Everything below the scan within reach placed: the heap's turn, in
	// address order, with the two chunks above still in flight.
	s.pend.set.Remove(a3, a2+64*P, nil)
	if c, ok := claimNext(s); !ok || c != (pending.Piece{Cur: heap.Addr, Src: heap.Addr, Len: 16 * P}) {
		t.Fatalf("after the arrays: %+v, %v; want the heap's first chunk", c, ok)
	}

	// A scan that ended (a jump elsewhere): address order.
	s = planServer([]Extent{heap, {a3, 192 * P}}, 2)
	s.pend.set.Remove(a1, a1+64*P, nil)
	s.pend.cursor = a1 + 64*P
	s.pend.scan = policy.Scan{On: false, Lo: a1, Down: a1, Below: policy.ScanBelow}
	if c, ok := claimNext(s); !ok || c.Cur != heap.Addr {
		t.Fatalf("no scan: %+v, %v; want the heap (wrapped)", c, ok)
	}
}

// TestPlanSkipsClaimed: a worker that finds nothing past the cursor wraps
// to the lowest pending memory even while another worker's chunk is in
// flight, past that chunk (still pending until placed), rather than wait
// for it; the serving goroutine's read-ahead (no workers) waits as before.
//
// +checklocksignore
// The servers here are not running: the test is their only goroutine.
func TestPlanSkipsClaimed(t *testing.T) {
	const P = PageSize
	ext := []Extent{{0x10 * P, 32 * P}, {0x100 * P, 16 * P}}
	s := planServer(ext, 2)
	s.pend.cursor = 0x100 * P
	first, ok := claimNext(s)
	if !ok || first.Cur != 0x100*P {
		t.Fatalf("first chunk %+v, %v", first, ok)
	}
	s.pend.set.Remove(0x10*P, 0x10*P+4*P, nil) // placed by a fault
	s.pend.claimed = append(s.pend.claimed, pending.Piece{Cur: 0x14 * P, Src: 0x14 * P, Len: 16 * P})
	s.pend.inflight++
	if c, ok := claimNext(s); !ok || c != (pending.Piece{Cur: 0x24 * P, Src: 0x24 * P, Len: 12 * P}) {
		t.Fatalf("with chunks in flight: %+v, %v; want the memory past the claimed chunk", c, ok)
	}
	if c, ok := claimNext(s); ok {
		t.Fatalf("all claimed: got %+v", c)
	}

	r := planServer(ext, 0)
	r.pend.cursor = 0x200 * P
	r.pend.mu.Lock()
	c, ok := r.plan(1)
	r.pend.mu.Unlock()
	if ok {
		t.Fatalf("read-ahead with a chunk in flight wrapped to %+v", c)
	}
}

// TestPlanScanAhead: a scan whose front has pending memory above it far
// past policy.ScanAhead (the arrays the thread read first lie above, the
// ones it reads next below) is followed policy.ScanAhead past its front,
// then below its start, not on up through everything above.
//
// +checklocksignore
// The servers here are not running: the test is their only goroutine.
func TestPlanScanAhead(t *testing.T) {
	const P = PageSize
	lo := uint64(0x100000 * P)
	front := lo + 64*P
	below, above := uint64(64*P), uint64(2*policy.ScanAhead)
	s := planServer([]Extent{{lo - below, below + (front - lo) + above}}, 2)
	s.pend.set.Remove(lo, front, nil) // the scan read and placed this
	s.pend.cursor = front
	s.pend.scan = policy.Scan{On: true, Lo: lo, Front: front, Down: lo, Below: policy.ScanBelow}
	chunk := s.opts.PrefetchChunk
	for i := uint64(0); i < policy.ScanAhead/chunk; i++ {
		if c, ok := claimNext(s); !ok || c.Cur != front+i*chunk {
			t.Fatalf("chunk %d: %+v, %v; want %#x, above the front", i, c, ok, front+i*chunk)
		}
	}
	if c, ok := claimNext(s); !ok || c.Cur != lo-chunk {
		t.Fatalf("past policy.ScanAhead: %+v, %v; want %#x, right below the scan's start", c, ok, lo-chunk)
	}
}
