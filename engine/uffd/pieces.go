package uffd

import (
	"slices"
	"sort"
)

// Extent is one unit of service: normally one image block clipped to its
// VMA. Addr is the snapshot address, which is both where the source is read
// and (until the process mremaps it) where the bytes go.
type Extent struct {
	Addr, Len uint64
}

// End returns Addr+Len.
func (e Extent) End() uint64 { return e.Addr + e.Len }

// piece is a pending (not yet placed, not dropped) part of an extent: the
// bytes at src in the snapshot go to [cur, cur+len) in the process. len 0
// marks a tombstone, kept in place (with its cur) until compaction.
type piece struct {
	cur, src, len uint64
}

func (p piece) end() uint64 { return p.cur + p.len }

// pieceSet is the pending set: pieces sorted by cur, strictly increasing
// cur, live pieces disjoint. Placing or dropping whole pieces or their
// prefixes and suffixes is O(log n) in place; punching a hole inside one
// piece inserts one entry; a remap rebuilds the slice. Tombstones are
// compacted away once they outnumber the live pieces.
type pieceSet struct {
	ps    []piece
	live  int
	dead  int
	bytes uint64
}

func newPieceSet(ext []Extent) *pieceSet {
	s := &pieceSet{ps: make([]piece, 0, len(ext))}
	for _, e := range ext {
		s.ps = append(s.ps, piece{e.Addr, e.Addr, e.Len})
		s.bytes += e.Len
	}
	s.live = len(s.ps)
	return s
}

// validExtents reports whether ext is sorted, disjoint, page aligned, with
// no empty extent and no overflow.
func validExtents(ext []Extent) bool {
	var prevEnd uint64
	for i, e := range ext {
		if e.Len == 0 || e.Addr%PageSize != 0 || e.Len%PageSize != 0 || e.Addr+e.Len < e.Addr {
			return false
		}
		if i > 0 && e.Addr < prevEnd {
			return false
		}
		prevEnd = e.End()
	}
	return true
}

func (s *pieceSet) empty() bool { return s.live == 0 }

// search returns the index of the first entry with cur >= addr.
func (s *pieceSet) search(addr uint64) int {
	return sort.Search(len(s.ps), func(i int) bool { return s.ps[i].cur >= addr })
}

// find returns the live piece containing addr.
func (s *pieceSet) find(addr uint64) (piece, bool) {
	i := s.search(addr + 1)
	if i == 0 {
		return piece{}, false
	}
	p := s.ps[i-1]
	if p.len != 0 && addr >= p.cur && addr < p.end() {
		return p, true
	}
	return piece{}, false
}

// next returns the first live piece ending after addr (which may contain
// addr).
func (s *pieceSet) next(addr uint64) (piece, int, bool) {
	i := s.search(addr)
	if i > 0 && s.ps[i-1].len != 0 && s.ps[i-1].end() > addr {
		i--
	}
	for ; i < len(s.ps); i++ {
		if s.ps[i].len != 0 {
			return s.ps[i], i, true
		}
	}
	return piece{}, 0, false
}

// remove takes [start, end) out of the pending set, calling fn (if not
// nil) for every removed part with its source address, in address order.
// It returns the bytes removed.
func (s *pieceSet) remove(start, end uint64, fn func(piece)) uint64 {
	if start >= end {
		return 0
	}
	var removed uint64
	i := s.search(start)
	if i > 0 && s.ps[i-1].len != 0 && s.ps[i-1].end() > start {
		i--
	}
	for ; i < len(s.ps) && s.ps[i].cur < end; i++ {
		p := &s.ps[i]
		if p.len == 0 {
			continue
		}
		pc, pe := p.cur, p.end()
		lo, hi := max(pc, start), min(pe, end)
		if lo >= hi {
			continue
		}
		if fn != nil {
			fn(piece{lo, p.src + (lo - pc), hi - lo})
		}
		removed += hi - lo
		switch {
		case lo == pc && hi == pe:
			p.len = 0
			s.live--
			s.dead++
		case lo == pc:
			p.src += hi - pc
			p.cur = hi
			p.len = pe - hi
		case hi == pe:
			p.len = lo - pc
		default:
			right := piece{hi, p.src + (hi - pc), pe - hi}
			p.len = lo - pc
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
func (s *pieceSet) compact() {
	s.ps = slices.DeleteFunc(s.ps, func(p piece) bool { return p.len == 0 })
	s.dead = 0
}

// remap moves the pending pages of [from, from+length) to [to, to+length)
// (mremap), dropping whatever was pending at the destination first. It
// returns the bytes moved.
func (s *pieceSet) remap(from, to, length uint64) uint64 {
	var moved []piece
	n := s.remove(from, from+length, func(p piece) { moved = append(moved, p) })
	s.remove(to, to+length, nil)
	if len(moved) == 0 {
		return 0
	}
	s.compact()
	for _, p := range moved {
		p.cur = p.cur - from + to
		s.ps = append(s.ps, p)
	}
	slices.SortFunc(s.ps, func(a, b piece) int {
		switch {
		case a.cur < b.cur:
			return -1
		case a.cur > b.cur:
			return 1
		}
		return 0
	})
	s.live += len(moved)
	s.bytes += n
	return n
}

// clone copies the live pieces (for a forked child).
func (s *pieceSet) clone() *pieceSet {
	c := &pieceSet{ps: make([]piece, 0, s.live), live: s.live, bytes: s.bytes}
	for _, p := range s.ps {
		if p.len != 0 {
			c.ps = append(c.ps, p)
		}
	}
	return c
}

// chunkBelow returns the pending memory right below addr: the highest live
// piece that starts below it, cut at addr, grown downwards over the pieces
// that precede it contiguously (in memory and in the source) up to limit
// bytes, its end fixed.
func (s *pieceSet) chunkBelow(addr, limit uint64) (piece, bool) {
	i := s.search(addr) - 1
	for ; i >= 0 && s.ps[i].len == 0; i-- {
	}
	if i < 0 {
		return piece{}, false
	}
	p := s.ps[i]
	p.len = min(p.end(), addr) - p.cur
	end := p.end()
	for end-p.cur < limit {
		for i--; i >= 0 && s.ps[i].len == 0; i-- {
		}
		if i < 0 || s.ps[i].end() != p.cur || s.ps[i].src+s.ps[i].len != p.src {
			return p, true
		}
		p = piece{s.ps[i].cur, s.ps[i].src, end - s.ps[i].cur}
	}
	cut := end - p.cur - limit
	return piece{p.cur + cut, p.src + cut, limit}, true
}

// chunk returns the next run to prefetch at or after addr: consecutive live
// pieces contiguous both in the process and in the source, at most limit
// bytes, starting inside the first piece if addr falls in it.
func (s *pieceSet) chunk(addr, limit uint64) (piece, bool) {
	p, i, ok := s.next(addr)
	if !ok {
		return piece{}, false
	}
	if addr > p.cur {
		p = piece{addr, p.src + (addr - p.cur), p.end() - addr}
	}
	if p.len >= limit {
		p.len = limit
		return p, true
	}
	for i++; i < len(s.ps); i++ {
		q := s.ps[i]
		if q.len == 0 {
			continue
		}
		if q.cur != p.end() || q.src != p.src+p.len {
			break
		}
		p.len += min(q.len, limit-p.len)
		if p.len == limit {
			break
		}
	}
	return p, true
}

// overlapping calls fn for the live pieces overlapping [start, end),
// clipped to it, in order. fn must not change the set.
func (s *pieceSet) overlapping(start, end uint64, fn func(piece)) {
	_, i, ok := s.next(start)
	if !ok {
		return
	}
	for ; i < len(s.ps) && s.ps[i].cur < end; i++ {
		q := s.ps[i]
		if q.len == 0 {
			continue
		}
		lo, hi := max(q.cur, start), min(q.end(), end)
		if lo < hi {
			fn(piece{lo, q.src + (lo - q.cur), hi - lo})
		}
	}
}
