// Package pending is the pager's set of pages still to place: which
// ranges of a process are pending, and where in the snapshot their bytes
// are. It is a plain data structure; the pager (engine/uffd) guards it
// with its lock.
package pending

import (
	"slices"
	"sort"
)

// Piece is a pending (not yet placed, not dropped) part of an extent: the
// bytes at Src in the snapshot go to [Cur, Cur+Len) in the process. Len 0
// marks a tombstone, kept in place (with its Cur) until compaction.
type Piece struct {
	Cur, Src, Len uint64
}

// End returns Cur+Len.
func (p Piece) End() uint64 { return p.Cur + p.Len }

// Set is the pending set: pieces sorted by Cur, strictly increasing
// Cur, live pieces disjoint. Placing or dropping whole pieces or their
// prefixes and suffixes is O(log n) in place; punching a hole inside one
// piece inserts one entry; a remap rebuilds the slice. Tombstones are
// compacted away once they outnumber the live pieces.
type Set struct {
	ps    []Piece
	live  int
	dead  int
	bytes uint64
}

// Empty reports whether nothing is pending.
func (s *Set) Empty() bool { return s.live == 0 }

// search returns the index of the first entry with Cur >= addr.
func (s *Set) search(addr uint64) int {
	return sort.Search(len(s.ps), func(i int) bool { return s.ps[i].Cur >= addr })
}

// Find returns the live piece containing addr.
func (s *Set) Find(addr uint64) (Piece, bool) {
	i := s.search(addr + 1)
	if i == 0 {
		return Piece{}, false
	}
	p := s.ps[i-1]
	if p.Len != 0 && addr >= p.Cur && addr < p.End() {
		return p, true
	}
	return Piece{}, false
}

// Next returns the first live piece ending after addr (which may contain
// addr).
func (s *Set) Next(addr uint64) (Piece, bool) {
	p, _, ok := s.next(addr)
	return p, ok
}

// next is Next, with the index of the piece.
func (s *Set) next(addr uint64) (Piece, int, bool) {
	i := s.search(addr)
	if i > 0 && s.ps[i-1].Len != 0 && s.ps[i-1].End() > addr {
		i--
	}
	for ; i < len(s.ps); i++ {
		if s.ps[i].Len != 0 {
			return s.ps[i], i, true
		}
	}
	return Piece{}, 0, false
}

// Remove takes [start, end) out of the pending set, calling fn (if not
// nil) for every removed part with its source address, in address order.
// It returns the bytes removed.
func (s *Set) Remove(start, end uint64, fn func(Piece)) uint64 {
	if start >= end {
		return 0
	}
	var removed uint64
	i := s.search(start)
	if i > 0 && s.ps[i-1].Len != 0 && s.ps[i-1].End() > start {
		i--
	}
	for ; i < len(s.ps) && s.ps[i].Cur < end; i++ {
		p := &s.ps[i]
		if p.Len == 0 {
			continue
		}
		pc, pe := p.Cur, p.End()
		lo, hi := max(pc, start), min(pe, end)
		if lo >= hi {
			continue
		}
		if fn != nil {
			fn(Piece{lo, p.Src + (lo - pc), hi - lo})
		}
		removed += hi - lo
		switch {
		case lo == pc && hi == pe:
			p.Len = 0
			s.live--
			s.dead++
		case lo == pc:
			p.Src += hi - pc
			p.Cur = hi
			p.Len = pe - hi
		case hi == pe:
			p.Len = lo - pc
		default:
			right := Piece{hi, p.Src + (hi - pc), pe - hi}
			p.Len = lo - pc
			s.ps = slices.Insert(s.ps, i+1, right)
			s.live++
			i++
		}
	}
	s.bytes -= removed
	if s.dead > 64 && s.dead > s.live {
		s.compact()
	}
	return removed
}

// compact drops the tombstones.
func (s *Set) compact() {
	s.ps = slices.DeleteFunc(s.ps, func(p Piece) bool { return p.Len == 0 })
	s.dead = 0
}

// Remap moves the pending pages of [from, from+length) to [to, to+length)
// (mremap), dropping whatever was pending at the destination first. It
// returns the bytes moved.
func (s *Set) Remap(from, to, length uint64) uint64 {
	var moved []Piece
	n := s.Remove(from, from+length, func(p Piece) { moved = append(moved, p) })
	s.Remove(to, to+length, nil)
	if len(moved) == 0 {
		return 0
	}
	s.compact()
	for _, p := range moved {
		p.Cur = p.Cur - from + to
		s.ps = append(s.ps, p)
	}
	slices.SortFunc(s.ps, func(a, b Piece) int {
		switch {
		case a.Cur < b.Cur:
			return -1
		case a.Cur > b.Cur:
			return 1
		}
		return 0
	})
	s.live += len(moved)
	s.bytes += n
	return n
}

// Clone copies the live pieces (for a forked child).
func (s *Set) Clone() *Set {
	c := &Set{ps: make([]Piece, 0, s.live), live: s.live, bytes: s.bytes}
	for _, p := range s.ps {
		if p.Len != 0 {
			c.ps = append(c.ps, p)
		}
	}
	return c
}

// ChunkBelow returns the pending memory right below addr: the highest live
// piece that starts below it, cut at addr, grown downwards over the pieces
// that precede it contiguously (in memory and in the source) up to limit
// bytes, its end fixed.
func (s *Set) ChunkBelow(addr, limit uint64) (Piece, bool) {
	i := s.search(addr) - 1
	for ; i >= 0 && s.ps[i].Len == 0; i-- {
	}
	if i < 0 {
		return Piece{}, false
	}
	p := s.ps[i]
	p.Len = min(p.End(), addr) - p.Cur
	end := p.End()
	for end-p.Cur < limit {
		for i--; i >= 0 && s.ps[i].Len == 0; i-- {
		}
		if i < 0 || s.ps[i].End() != p.Cur || s.ps[i].Src+s.ps[i].Len != p.Src {
			return p, true
		}
		p = Piece{s.ps[i].Cur, s.ps[i].Src, end - s.ps[i].Cur}
	}
	cut := end - p.Cur - limit
	return Piece{p.Cur + cut, p.Src + cut, limit}, true
}

// Chunk returns the next run to prefetch at or after addr: consecutive live
// pieces contiguous both in the process and in the source, at most limit
// bytes, starting inside the first piece if addr falls in it.
func (s *Set) Chunk(addr, limit uint64) (Piece, bool) {
	p, i, ok := s.next(addr)
	if !ok {
		return Piece{}, false
	}
	if addr > p.Cur {
		p = Piece{addr, p.Src + (addr - p.Cur), p.End() - addr}
	}
	if p.Len >= limit {
		p.Len = limit
		return p, true
	}
	for i++; i < len(s.ps); i++ {
		q := s.ps[i]
		if q.Len == 0 {
			continue
		}
		if q.Cur != p.End() || q.Src != p.Src+p.Len {
			break
		}
		p.Len += min(q.Len, limit-p.Len)
		if p.Len == limit {
			break
		}
	}
	return p, true
}

// Overlapping calls fn for the live pieces overlapping [start, end),
// clipped to it, in order. fn must not change the set.
func (s *Set) Overlapping(start, end uint64, fn func(Piece)) {
	_, i, ok := s.next(start)
	if !ok {
		return
	}
	for ; i < len(s.ps) && s.ps[i].Cur < end; i++ {
		q := s.ps[i]
		if q.Len == 0 {
			continue
		}
		lo, hi := max(q.Cur, start), min(q.End(), end)
		if lo < hi {
			fn(Piece{lo, q.Src + (lo - q.Cur), hi - lo})
		}
	}
}

// New returns the set of ps (sorted by Cur, disjoint, none empty), which
// it takes.
func New(ps []Piece) *Set {
	s := &Set{ps: ps, live: len(ps)}
	for _, p := range ps {
		s.bytes += p.Len
	}
	return s
}

// Bytes returns the bytes pending.
func (s *Set) Bytes() uint64 { return s.bytes }
