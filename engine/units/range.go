package units

import (
	"cmp"
	"fmt"
	"slices"
)

// Range is the half-open address range [Start, End) of a process's
// memory.
type Range struct {
	Start, End uint64
}

// Len is the number of bytes in r (0 for an empty or inverted range).
func (r Range) Len() uint64 {
	if r.End <= r.Start {
		return 0
	}
	return r.End - r.Start
}

// Contains reports whether addr is in r.
func (r Range) Contains(addr uint64) bool { return r.Start <= addr && addr < r.End }

// Overlaps reports whether r and o share a byte.
func (r Range) Overlaps(o Range) bool { return r.Start < o.End && o.Start < r.End }

// Intersect is the bytes r and o share (empty, with Len 0, if none).
func (r Range) Intersect(o Range) Range {
	return Range{max(r.Start, o.Start), min(r.End, o.End)}
}

func (r Range) String() string { return fmt.Sprintf("%x-%x", r.Start, r.End) }

// Union returns the bytes of rs as sorted ranges that neither overlap
// nor touch.
func Union(rs []Range) []Range {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(a.Start, b.Start) })
	var out []Range
	for _, r := range rs {
		if r.Len() == 0 {
			continue
		}
		if n := len(out); n > 0 && r.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, r.End)
			continue
		}
		out = append(out, r)
	}
	return out
}
