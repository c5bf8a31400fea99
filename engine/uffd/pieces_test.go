package uffd

import (
	"math/rand/v2"
	"testing"
)

// model is the page-level reference for pieceSet: pending cur page -> src page.
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

func (s *pieceSet) pages() model {
	m := model{}
	for _, p := range s.ps {
		for a := p.cur; a < p.end(); a += PageSize {
			m[a] = p.src + (a - p.cur)
		}
	}
	return m
}

func checkSet(t *testing.T, s *pieceSet, want model, step int) {
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
		if i > 0 && p.cur <= prev {
			t.Fatalf("step %d: entries not strictly sorted at %d: %#x after %#x", step, i, p.cur, prev)
		}
		prev = p.cur
		if p.len != 0 {
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
				if got, want := s.remove(a, a+l, nil), m.remove(a, a+l); got != want {
					t.Fatalf("seed %d step %d: remove %#x+%#x removed %d, want %d", seed, step, a, l, got, want)
				}
			case 2:
				to := (16 + r.Uint64N(2*space)) * PageSize
				if to < a+l && a < to+l {
					continue // mremap refuses overlapping ranges
				}
				if got, want := s.remap(a, to, l), m.remap(a, to, l); got != want {
					t.Fatalf("seed %d step %d: remap moved %d, want %d", seed, step, got, want)
				}
			case 3:
				p, ok := s.find(a + 17)
				_, want := m[a]
				if ok != want || (ok && (p.src+(a-p.cur) != m[a] || a < p.cur || a >= p.end())) {
					t.Fatalf("seed %d step %d: find %#x = %+v %v, want %v", seed, step, a, p, ok, want)
				}
			case 4:
				c, ok := s.chunk(a, l)
				if !ok {
					for k := range m {
						if k >= a {
							t.Fatalf("seed %d step %d: chunk(%#x) none, but %#x pending", seed, step, a, k)
						}
					}
					continue
				}
				if c.len == 0 || c.len > l || c.cur < a {
					t.Fatalf("seed %d step %d: chunk(%#x, %#x) = %+v", seed, step, a, l, c)
				}
				for x := c.cur; x < c.end(); x += PageSize {
					if src, ok := m[x]; !ok || src != c.src+(x-c.cur) {
						t.Fatalf("seed %d step %d: chunk %+v covers %#x not pending as such", seed, step, c, x)
					}
				}
				for k := range m {
					if k >= a && k < c.cur {
						t.Fatalf("seed %d step %d: chunk(%#x) starts at %#x, skipping pending %#x", seed, step, a, c.cur, k)
					}
				}
			case 5:
				c := s.clone()
				checkSet(t, c, m, step)
				c.remove(0, 1<<40, nil)
				if !c.empty() {
					t.Fatal("clone not emptied")
				}
			}
			checkSet(t, s, m, step)
		}
		s.remove(0, 1<<40, nil)
		if !s.empty() || s.bytes != 0 {
			t.Fatalf("seed %d: not empty after removing all: %+v", seed, s)
		}
	}
}

func TestPieceSetOverlapping(t *testing.T) {
	s := newPieceSet([]Extent{{0x10000, 0x3000}, {0x13000, 0x1000}, {0x20000, 0x2000}})
	s.remove(0x11000, 0x12000, nil) // punch a hole in the first
	var got []piece
	s.overlapping(0x10800, 0x21000, func(p piece) { got = append(got, p) })
	want := []piece{{0x10800, 0x10800, 0x800}, {0x12000, 0x12000, 0x1000}, {0x13000, 0x13000, 0x1000}, {0x20000, 0x20000, 0x1000}}
	if len(got) != len(want) {
		t.Fatalf("overlapping = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("overlapping[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	// a chunk merges pieces contiguous in process and source
	if c, _ := s.chunk(0x12000, 1<<20); c != (piece{0x12000, 0x12000, 0x2000}) {
		t.Fatalf("chunk = %+v", c)
	}
	// ... but not across a remap that broke source contiguity
	s.remap(0x20000, 0x14000, 0x2000)
	if c, _ := s.chunk(0x12000, 1<<20); c != (piece{0x12000, 0x12000, 0x2000}) {
		t.Fatalf("chunk after remap = %+v", c)
	}
	if p, ok := s.find(0x15000); !ok || p.src != 0x20000 || p.cur != 0x14000 {
		t.Fatalf("find remapped = %+v %v", p, ok)
	}
}

func TestValidExtents(t *testing.T) {
	for _, tc := range []struct {
		ext  []Extent
		want bool
	}{
		{nil, true},
		{[]Extent{{0x1000, 0x1000}, {0x2000, 0x3000}}, true},
		{[]Extent{{0x1000, 0}}, false},
		{[]Extent{{0x1001, 0x1000}}, false},
		{[]Extent{{0x1000, 0x1001}}, false},
		{[]Extent{{0x2000, 0x1000}, {0x1000, 0x1000}}, false},
		{[]Extent{{0x1000, 0x2000}, {0x2000, 0x1000}}, false},
		{[]Extent{{^uint64(0) &^ 0xfff, 0x2000}}, false},
	} {
		if got := validExtents(tc.ext); got != tc.want {
			t.Errorf("validExtents(%v) = %v, want %v", tc.ext, got, tc.want)
		}
	}
}

// TestPieceSetChunkBelow: the pending memory right below an address, cut
// there, grown downwards over contiguous pieces up to the limit, not over
// a gap in memory or in the source.
func TestPieceSetChunkBelow(t *testing.T) {
	const P = PageSize
	s := newPieceSet([]Extent{{0x10 * P, 4 * P}, {0x14 * P, 4 * P}, {0x20 * P, 8 * P}})
	s.remove(0x22*P, 0x23*P, nil) // a hole inside the last extent
	for _, tc := range []struct {
		addr, limit uint64
		want        piece
		ok          bool
	}{
		{0x10 * P, 64 * P, piece{}, false},                         // nothing below
		{0x30 * P, 64 * P, piece{0x23 * P, 0x23 * P, 5 * P}, true}, // stops at the hole
		{0x30 * P, 2 * P, piece{0x26 * P, 0x26 * P, 2 * P}, true},  // the limit, end fixed
		{0x25 * P, 64 * P, piece{0x23 * P, 0x23 * P, 2 * P}, true}, // cut at addr
		{0x22 * P, 64 * P, piece{0x20 * P, 0x20 * P, 2 * P}, true},
		{0x1c * P, 64 * P, piece{0x10 * P, 0x10 * P, 8 * P}, true}, // two extents, contiguous
		{0x1c * P, 6 * P, piece{0x12 * P, 0x12 * P, 6 * P}, true},
		{0x13 * P, 64 * P, piece{0x10 * P, 0x10 * P, 3 * P}, true},
	} {
		got, ok := s.chunkBelow(tc.addr, tc.limit)
		if ok != tc.ok || got != tc.want {
			t.Errorf("chunkBelow(%#x, %#x) = %+v, %v; want %+v, %v", tc.addr, tc.limit, got, ok, tc.want, tc.ok)
		}
	}
	// Not across a jump in the source (pieces moved by mremap).
	s.remap(0x14*P, 0x3e*P, 2*P)
	s.remap(0x10*P, 0x40*P, 2*P)
	if got, _ := s.chunkBelow(0x42*P, 64*P); got != (piece{0x40 * P, 0x10 * P, 2 * P}) {
		t.Errorf("after two remaps: chunkBelow = %+v, want only the upper of two pieces that follow in memory, not in the source", got)
	}
}
