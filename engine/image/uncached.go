package image

import (
	"io"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// Uncached returns the memory of r as an io.ReaderAt that bypasses the
// block cache, for a reader that reads each block about once (a lazy
// restore's pager): as archive/zip's (*File).OpenRaw is to Open, it is
// the same file read with less in between. Blocks are read straight into
// the caller's buffer: whole Raw blocks with one pread (several that
// follow each other in memory and in the pages file with one pread
// together), then checked; LZ4 blocks read and decoded into it, then
// checked. Only a block read in part goes through a scratch buffer. The
// cached ReadAt decodes into the cache and copies out: for such a reader,
// that doubles the cost of a read (see test/bench/BENCHMARKS.md).
//
// Blocks are loaded and checked as by ReadAt (the CRC32C of an
// authenticated block is not checked: see Authenticated), and errors are
// the same *BlockError. Addresses that were not dumped read as zeros. Safe for
// concurrent use; valid until r is closed.
func (r *Reader) Uncached() io.ReaderAt { return uncached{r} }

type uncached struct{ r *Reader }

// maxRawBatch bounds the blocks one pread of an uncached read covers.
const maxRawBatch = 1024

func (u uncached) ReadAt(p []byte, off int64) (int, error) {
	r := u.r
	addr, end, err := checkRead(off, len(p))
	if err != nil {
		return 0, err
	}
	err = r.lay.walk(addr, end, func(s span) (uint64, error) {
		dst, b := p[s.lo-addr:s.hi-addr], s.b
		switch {
		case !s.in || b.Kind == codec.Zero:
			clear(dst)
		case s.lo == b.Addr && s.hi == b.End() && b.Kind == codec.Raw:
			n, err := u.loadRaw(s.ri, b, p[s.lo-addr:])
			return s.lo + n, err
		case s.lo == b.Addr && s.hi == b.End():
			return s.hi, r.load(b, dst)
		default:
			return s.hi, r.readPart(b, s.lo, s.hi, dst)
		}
		return s.hi, nil
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// loadRaw reads Raw block b, of run ri, and the whole Raw blocks after it
// that follow it both in memory and in the pages file and fit in dst,
// with one pread into dst, checks each, and returns the bytes read. Small
// blocks (--compress makes them 4 KiB) would otherwise cost a pread each.
func (u uncached) loadRaw(ri int, b Block, dst []byte) (uint64, error) {
	r := u.r
	last, n, count := b, uint64(b.Len), 1
	for ri, ok := ri, true; count < maxRawBatch; {
		var next Block
		if ri, next, ok = u.next(ri, last); !ok || next.Kind != codec.Raw || next.Off != last.Off+uint64(last.StoredLen) || n+uint64(next.Len) > uint64(len(dst)) {
			break
		}
		last, n, count = next, n+uint64(next.Len), count+1
	}
	batch := b
	batch.StoredLen = uint32(last.Off + uint64(last.StoredLen) - b.Off) // the bytes Forget drops
	err := r.refetching(batch, func() error {
		if err := r.pread(b, dst[:n]); err != nil {
			return err
		}
		for c, ci := b, ri; ; {
			if err := r.checkRaw(c, dst[c.Addr-b.Addr:c.End()-b.Addr]); err != nil {
				return err
			}
			if c.Index == last.Index {
				return nil
			}
			ci, c, _ = u.next(ci, c)
		}
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// next returns the block after b (of run ri) and its run, if it starts
// where b ends: in the same run, or in a run that touches it.
func (u uncached) next(ri int, b Block) (int, Block, bool) {
	runs := u.r.lay.ix.Runs
	if b.End() >= runs[ri].End() {
		if ri++; ri == len(runs) || runs[ri].Addr != b.End() {
			return ri, Block{}, false
		}
	}
	return ri, u.r.lay.block(ri, b.Index+1), true
}

// Mixed returns the memory of r as an io.ReaderAt that reads what is
// stored as is itself, as Uncached does (Raw blocks, checked, and zeros
// for Zero blocks and what was not dumped), and asks decoded, a lazyfs
// mount of the same snapshot, for the blocks that must be decoded. A
// block stored as is costs a mount a round trip to its server and two
// more copies, and gains nothing there: the pages file's page cache
// already holds it once for every reader on the host. A block that must
// be decoded is decoded once by the mount for every restore that shares
// it. The reads of one call go to each in runs of consecutive blocks.
func (r *Reader) Mixed(decoded io.ReaderAt) io.ReaderAt {
	return mixed{u: uncached{r}, decoded: decoded}
}

type mixed struct {
	u       uncached
	decoded io.ReaderAt
}

func (m mixed) ReadAt(p []byte, off int64) (int, error) {
	addr, end, err := checkRead(off, len(p))
	if err != nil {
		return 0, err
	}
	// seg is the run being gathered: [lo, hi), read by decoded or not.
	var lo, hi uint64
	var viaDecoded bool
	flush := func() error {
		if lo == hi {
			return nil
		}
		src := io.ReaderAt(m.u)
		if viaDecoded {
			src = m.decoded
		}
		if _, err := src.ReadAt(p[lo-addr:hi-addr], int64(lo)); err != nil && !(err == io.EOF && viaDecoded) {
			return err
		}
		return nil
	}
	lo, hi = addr, addr
	err = m.u.r.lay.walk(addr, end, func(s span) (uint64, error) {
		dec := s.in && s.b.Kind != codec.Zero && s.b.Kind != codec.Raw
		if dec != viaDecoded && lo != hi {
			if err := flush(); err != nil {
				return 0, err
			}
			lo = s.lo
		}
		viaDecoded, hi = dec, s.hi
		return s.hi, nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}
