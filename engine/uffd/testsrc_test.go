package uffd

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// patternWord is the content of the 8-byte word at addr in test
// snapshots: never zero, different for every address.
func patternWord(addr uint64) uint64 {
	z := addr + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31) | 1
}

// patternSrc is a source whose bytes at addr are the pattern. It refuses
// (with an error) reads outside the extents it was built with, so a pager
// reading at the wrong address - a remapped one, a hole - fails the test.
type patternSrc struct {
	ext   []Extent
	reads atomic.Int64
	mu    sync.Mutex
	log   []Extent // reads, for tests that look
	keep  bool
}

func newPatternSrc(ext []Extent) *patternSrc { return &patternSrc{ext: ext} }

func (s *patternSrc) fill(b []byte, addr uint64) {
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], patternWord(addr+uint64(i)))
	}
}

func (s *patternSrc) covered(addr, n uint64) bool {
	i := sort.Search(len(s.ext), func(i int) bool { return s.ext[i].End() > addr })
	for end := addr + n; addr < end; i++ {
		if i >= len(s.ext) || s.ext[i].Addr > addr {
			return false
		}
		addr = s.ext[i].End()
	}
	return true
}

func (s *patternSrc) ReadAt(b []byte, off int64) (int, error) {
	addr := uint64(off)
	if addr%8 != 0 || len(b)%8 != 0 {
		return 0, fmt.Errorf("pattern source: unaligned read %#x+%#x", addr, len(b))
	}
	if !s.covered(addr, uint64(len(b))) {
		return 0, fmt.Errorf("pattern source: read %#x+%#x outside the extents", addr, len(b))
	}
	s.reads.Add(1)
	if s.keep {
		s.mu.Lock()
		s.log = append(s.log, Extent{addr, uint64(len(b))})
		s.mu.Unlock()
	}
	s.fill(b, addr)
	return len(b), nil
}

// testExtents cuts [base, base+size) into blocks of block bytes with holes
// and short extents: every 5th block is a hole, every 7th holds 3 pages.
func testExtents(base, size, block uint64) []Extent {
	var ext []Extent
	for i, a := 0, base; a < base+size; i, a = i+1, a+block {
		n := min(block, base+size-a)
		switch {
		case i%5 == 3:
			continue
		case i%7 == 2:
			n = min(n, 3*PageSize)
		}
		ext = append(ext, Extent{a, n})
	}
	return ext
}
