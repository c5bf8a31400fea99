package uffd

import "github.com/lazyfs/lazyfs/engine/uffd/pending"

// Extent is one unit of service: normally one image block clipped to its
// VMA. Addr is the snapshot address, which is both where the source is read
// and (until the process mremaps it) where the bytes go.
type Extent struct {
	Addr, Len uint64
}

// End returns Addr+Len.
func (e Extent) End() uint64 { return e.Addr + e.Len }

// newPending returns the pending set of extents (valid: validExtents).
func newPending(ext []Extent) *pending.Set {
	ps := make([]pending.Piece, 0, len(ext))
	for _, e := range ext {
		ps = append(ps, pending.Piece{Cur: e.Addr, Src: e.Addr, Len: e.Len})
	}
	return pending.New(ps)
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
