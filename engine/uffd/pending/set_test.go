package pending

import (
	"math/rand/v2"
	"testing"
)

// model is the page-level reference for Set: pending cur page -> src page.
type model map[uint64]uint64

func (m model) remove(s, e uint64) uint64 {
	var n uint64
	for a := s; a < e; a += PageSize {
		if _, ok := m[a]; ok {
			delete(m, a)
			n += PageSize
		}
	}
	return n
}

func (m model) remap(from, to, length uint64) uint64 {
	moved := model{}
	for a := from; a < from+length; a += PageSize {
		if src, ok := m[a]; ok {
			moved[a-from+to] = src
			delete(m, a)
		}
	}
	m.remove(to, to+length)
	for k, v := range moved {
		m[k] = v
	}
	return uint64(len(moved)) * PageSize
}

func (s *Set) pages() model {
	m := model{}
	for _, p := range s.ps {
		for a := p.Cur; a < p.End(); a += PageSize {
			m[a] = p.Src + (a - p.Cur)
		}
	}
	return m
}

func checkSet(t *testing.T, s *Set, want model, step int) {
	t.Helper()
	got := s.pages()
	if len(got) != len(want) {
		t.Fatalf("step %d: %d pending pages, want %d", step, len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("step %d: page %#x -> src %#x, want %#x (present %v)", step, k, got[k], v, got[k] != 0)
		}
	}
	if s.bytes != uint64(len(want))*PageSize {
		t.Fatalf("step %d: bytes %d, want %d", step, s.bytes, len(want)*PageSize)
	}
	live := 0
	var prev uint64
	for i, p := range s.ps {
		if i > 0 && p.Cur <= prev {
			t.Fatalf("step %d: entries not strictly sorted at %d: %#x after %#x", step, i, p.Cur, prev)
		}
		prev = p.Cur
		if p.Len != 0 {
			live++
		}
	}
	if live != s.live {
		t.Fatalf("step %d: live %d, counted %d", step, s.live, live)
	}
}

func TestPieceSetRandom(t *testing.T) {
	const space = 256 // pages
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		var ext []Extent
		for a := uint64(0); a < space; {
			n := 1 + r.Uint64N(12)
			if r.IntN(4) > 0 && a+n <= space {
				ext = append(ext, Extent{(a + 16) * PageSize, n * PageSize})
			}
			a += n + r.Uint64N(3)
		}
		s := newPieceSet(ext)
		m := model{}
		for _, e := range ext {
			for a := e.Addr; a < e.End(); a += PageSize {
				m[a] = a
			}
		}
		checkSet(t, s, m, -1)
		for step := range 300 {
			a := (16 + r.Uint64N(space)) * PageSize
			l := (1 + r.Uint64N(20)) * PageSize
			switch r.IntN(6) {
			case 0, 1:
				if got, want := s.Remove(a, a+l, nil), m.remove(a, a+l); got != want {
					t.Fatalf("seed %d step %d: remove %#x+%#x removed %d, want %d", seed, step, a, l, got, want)
				}
			case 2:
				to := (16 + r.Uint64N(2*space)) * PageSize
				if to < a+l && a < to+l {
					continue // mremap refuses overlapping ranges
				}
				if got, want := s.Remap(a, to, l), m.remap(a, to, l); got != want {
					t.Fatalf("seed %d step %d: remap moved %d, want %d", seed, step, got, want)
				}
			case 3:
				p, ok := s.Find(a + 17)
				_, want := m[a]
				if ok != want || (ok && (p.Src+(a-p.Cur) != m[a] || a < p.Cur || a >= p.End())) {
					t.Fatalf("seed %d step %d: find %#x = %+v %v, want %v", seed, step, a, p, ok, want)
				}
			case 4:
				c, ok := s.Chunk(a, l)
				if !ok {
					for k := range m {
						if k >= a {
							t.Fatalf("seed %d step %d: chunk(%#x) none, but %#x pending", seed, step, a, k)
						}
					}
					continue
				}
				if c.Len == 0 || c.Len > l || c.Cur < a {
					t.Fatalf("seed %d step %d: chunk(%#x, %#x) = %+v", seed, step, a, l, c)
				}
				for x := c.Cur; x < c.End(); x += PageSize {
					if src, ok := m[x]; !ok || src != c.Src+(x-c.Cur) {
						t.Fatalf("seed %d step %d: chunk %+v covers %#x not pending as such", seed, step, c, x)
					}
				}
				for k := range m {
					if k >= a && k < c.Cur {
						t.Fatalf("seed %d step %d: chunk(%#x) starts at %#x, skipping pending %#x", seed, step, a, c.Cur, k)
					}
				}
			case 5:
				c := s.Clone()
				checkSet(t, c, m, step)
				c.Remove(0, 1<<40, nil)
				if !c.Empty() {
					t.Fatal("clone not emptied")
				}
			}
			checkSet(t, s, m, step)
		}
		s.Remove(0, 1<<40, nil)
		if !s.Empty() || s.bytes != 0 {
			t.Fatalf("seed %d: not empty after removing all: %+v", seed, s)
		}
	}
}

func TestPieceSetOverlapping(t *testing.T) {
	s := newPieceSet([]Extent{{0x10000, 0x3000}, {0x13000, 0x1000}, {0x20000, 0x2000}})
	s.Remove(0x11000, 0x12000, nil) // punch a hole in the first
	var got []Piece
	s.Overlapping(0x10800, 0x21000, func(p Piece) { got = append(got, p) })
	want := []Piece{{0x10800, 0x10800, 0x800}, {0x12000, 0x12000, 0x1000}, {0x13000, 0x13000, 0x1000}, {0x20000, 0x20000, 0x1000}}
	if len(got) != len(want) {
		t.Fatalf("overlapping = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("overlapping[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	// a chunk merges pieces contiguous in process and source
	if c, _ := s.Chunk(0x12000, 1<<20); c != (Piece{0x12000, 0x12000, 0x2000}) {
		t.Fatalf("chunk = %+v", c)
	}
	// ... but not across a remap that broke source contiguity
	s.Remap(0x20000, 0x14000, 0x2000)
	if c, _ := s.Chunk(0x12000, 1<<20); c != (Piece{0x12000, 0x12000, 0x2000}) {
		t.Fatalf("chunk after remap = %+v", c)
	}
	if p, ok := s.Find(0x15000); !ok || p.Src != 0x20000 || p.Cur != 0x14000 {
		t.Fatalf("find remapped = %+v %v", p, ok)
	}
}

// TestPieceSetChunkBelow: the pending memory right below an address, cut
// there, grown downwards over contiguous pieces up to the limit, not over
// a gap in memory or in the source.
func TestPieceSetChunkBelow(t *testing.T) {
	const P = PageSize
	s := newPieceSet([]Extent{{0x10 * P, 4 * P}, {0x14 * P, 4 * P}, {0x20 * P, 8 * P}})
	s.Remove(0x22*P, 0x23*P, nil) // a hole inside the last extent
	for _, tc := range []struct {
		addr, limit uint64
		want        Piece
		ok          bool
	}{
		{0x10 * P, 64 * P, Piece{}, false},                         // nothing below
		{0x30 * P, 64 * P, Piece{0x23 * P, 0x23 * P, 5 * P}, true}, // stops at the hole
		{0x30 * P, 2 * P, Piece{0x26 * P, 0x26 * P, 2 * P}, true},  // the limit, end fixed
		{0x25 * P, 64 * P, Piece{0x23 * P, 0x23 * P, 2 * P}, true}, // cut at addr
		{0x22 * P, 64 * P, Piece{0x20 * P, 0x20 * P, 2 * P}, true},
		{0x1c * P, 64 * P, Piece{0x10 * P, 0x10 * P, 8 * P}, true}, // two extents, contiguous
		{0x1c * P, 6 * P, Piece{0x12 * P, 0x12 * P, 6 * P}, true},
		{0x13 * P, 64 * P, Piece{0x10 * P, 0x10 * P, 3 * P}, true},
	} {
		got, ok := s.ChunkBelow(tc.addr, tc.limit)
		if ok != tc.ok || got != tc.want {
			t.Errorf("chunkBelow(%#x, %#x) = %+v, %v; want %+v, %v", tc.addr, tc.limit, got, ok, tc.want, tc.ok)
		}
	}
	// Not across a jump in the source (pieces moved by mremap).
	s.Remap(0x14*P, 0x3e*P, 2*P)
	s.Remap(0x10*P, 0x40*P, 2*P)
	if got, _ := s.ChunkBelow(0x42*P, 64*P); got != (Piece{0x40 * P, 0x10 * P, 2 * P}) {
		t.Errorf("after two remaps: chunkBelow = %+v, want only the upper of two pieces that follow in memory, not in the source", got)
	}
}

// Extent and newPieceSet build a set the way the pager does.
type Extent struct{ Addr, Len uint64 }

func (e Extent) End() uint64 { return e.Addr + e.Len }

func newPieceSet(ext []Extent) *Set {
	ps := make([]Piece, 0, len(ext))
	for _, e := range ext {
		ps = append(ps, Piece{e.Addr, e.Addr, e.Len})
	}
	return New(ps)
}

// PageSize is the pager's page size.
const PageSize = 4096
