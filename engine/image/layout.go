package image

import (
	"fmt"
	"sort"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// Block describes one block of a page index, with everything derived from
// the stored record: its address, decoded length and pages-file offset.
type Block struct {
	Index     uint64
	Addr      uint64
	Len       uint32 // decoded length
	Kind      codec.Kind
	StoredLen uint32
	Off       uint64 // offset of the payload in the pages file
	CRC       uint32
}

// End returns the address after the block.
func (b Block) End() uint64 { return b.Addr + uint64(b.Len) }

// layout holds the derived geometry of an index: the pages-file offset of
// every block, checked against the block records and the pages file size.
type layout struct {
	ix  *Index
	off []uint64
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// newLayout derives and validates every block's length and offset.
func newLayout(ix *Index) (*layout, error) {
	l := &layout{ix: ix, off: make([]uint64, len(ix.Blocks))}
	var off uint64
	for ri, r := range ix.Runs {
		n := blocksInRange(r.Addr, r.End(), ix.BlockSize)
		for j := uint64(0); j < n; j++ {
			i := r.FirstBlock + j
			addr, length := blockSpan(r, j, ix.BlockSize)
			rec := ix.Blocks[i]
			switch rec.Kind {
			case codec.Zero:
				if rec.StoredLen != 0 {
					return nil, fmt.Errorf("%w: zero block %d (run %d) stores %d bytes", ErrCorrupt, i, ri, rec.StoredLen)
				}
			case codec.Raw:
				if uint64(rec.StoredLen) != length {
					return nil, fmt.Errorf("%w: raw block %d at %#x stores %d bytes, want %d", ErrCorrupt, i, addr, rec.StoredLen, length)
				}
				off = alignUp(off, rawAlign)
			case codec.Parent, codec.Forked:
				// In the parent snapshot or process (parent.go,
				// forked.go): nothing stored here.
				if rec.StoredLen != 0 {
					return nil, fmt.Errorf("%w: %s block %d at %#x stores %d bytes", ErrCorrupt, rec.Kind, i, addr, rec.StoredLen)
				}
			case codec.LZ4, codec.Shuffle:
				if rec.StoredLen == 0 || uint64(rec.StoredLen) >= length {
					return nil, fmt.Errorf("%w: %s block %d at %#x stores %d bytes for %d", ErrCorrupt, rec.Kind, i, addr, rec.StoredLen, length)
				}
			default:
				return nil, fmt.Errorf("%w: block %d at %#x has unknown kind %d", ErrCorrupt, i, addr, rec.Kind)
			}
			l.off[i] = off
			off += uint64(rec.StoredLen)
		}
	}
	if off != ix.PagesSize {
		return nil, fmt.Errorf("%w: blocks hold %d bytes, pages file has %d", ErrCorrupt, off, ix.PagesSize)
	}
	return l, nil
}

// blockSpan returns the address and length of the j-th block of run r.
func blockSpan(r Run, j, bs uint64) (addr, length uint64) {
	start := (r.Addr/bs + j) * bs
	end := start + bs
	addr = max(start, r.Addr)
	end = min(end, r.End())
	return addr, end - addr
}

// block returns block i of run ri.
func (l *layout) block(ri int, i uint64) Block {
	r := l.ix.Runs[ri]
	addr, length := blockSpan(r, i-r.FirstBlock, l.ix.BlockSize)
	rec := l.ix.Blocks[i]
	return Block{Index: i, Addr: addr, Len: uint32(length), Kind: rec.Kind, StoredLen: rec.StoredLen, Off: l.off[i], CRC: rec.CRC}
}

// findRun returns the index of the run holding addr, or of the first run
// after addr (len(Runs) if none) and false.
func (l *layout) findRun(addr uint64) (int, bool) {
	runs := l.ix.Runs
	i := sort.Search(len(runs), func(i int) bool { return runs[i].End() > addr })
	return i, i < len(runs) && runs[i].Addr <= addr
}

// blockAt returns the block holding addr.
func (l *layout) blockAt(addr uint64) (Block, bool) {
	ri, ok := l.findRun(addr)
	if !ok {
		return Block{}, false
	}
	r := l.ix.Runs[ri]
	i := r.FirstBlock + (addr/l.ix.BlockSize - r.Addr/l.ix.BlockSize)
	return l.block(ri, i), true
}

// runOfBlock returns the run holding block i.
func (l *layout) runOfBlock(i uint64) int {
	runs := l.ix.Runs
	return sort.Search(len(runs), func(k int) bool { return runs[k].FirstBlock > i }) - 1
}

// span is one piece of a read, as walk cuts it: a hole (in false: what
// was not dumped, [lo, hi)) or the part [lo, hi) of block b of run ri.
type span struct {
	lo, hi uint64
	in     bool
	ri     int
	b      Block
}

// walk cuts [addr, end) into holes and parts of blocks, in order, and
// calls fn with each. fn returns where the next span starts: s.hi, or
// further if it consumed more (several blocks at once).
func (l *layout) walk(addr, end uint64, fn func(s span) (uint64, error)) error {
	for a := addr; a < end; {
		ri, in := l.findRun(a)
		s := span{lo: a, ri: ri, in: in}
		if !in {
			s.hi = end
			if ri < len(l.ix.Runs) {
				s.hi = min(end, l.ix.Runs[ri].Addr)
			}
		} else {
			run, bs := l.ix.Runs[ri], l.ix.BlockSize
			s.b = l.block(ri, run.FirstBlock+a/bs-run.Addr/bs)
			s.hi = min(end, s.b.End())
		}
		next, err := fn(s)
		if err != nil {
			return err
		}
		a = next
	}
	return nil
}

// checkRead checks a read of n bytes at off and returns its address
// range.
func checkRead(off int64, n int) (addr, end uint64, err error) {
	if off < 0 {
		return 0, 0, fmt.Errorf("read at %d: negative address", off)
	}
	addr = uint64(off)
	end = addr + uint64(n)
	if end < addr || end > maxAddr {
		return 0, 0, fmt.Errorf("read at %#x+%d: outside the address space", addr, n)
	}
	return addr, end, nil
}
