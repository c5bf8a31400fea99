package units

import "fmt"

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
