package image

import (
	"fmt"
	"io"
	"sync"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// Checked returns src, an io.ReaderAt of the memory r describes served by
// someone else (a lazyfs mount's MNT/PID/mem), checked against r's index:
// every block a read touches is read whole from src and its bytes
// compared with the block's CRC32C (zeros for a Zero block, and for what
// was not dumped), so that a mount that serves wrong bytes, whoever runs
// it, fails the read with ErrSourceMismatch rather than hand them on. A
// read the source fails is returned as it failed: neither is the
// snapshot's fault, and neither matches ErrCorrupt.
//
// The whole blocks and holes of a read are read from src with one ReadAt,
// straight into the caller's buffer, and checked there: a pager's 1 MiB
// read of 4 KiB blocks is one request to the mount, not 256. A block read
// in part (its head or tail) is read whole and kept, checked, among the
// last few such blocks, so that reading a big block a piece at a time, by
// one reader or several at once, reads it from src once. Safe for concurrent use if src is; valid until
// r is closed.
func (r *Reader) Checked(src io.ReaderAt) io.ReaderAt {
	return &checked{r: r, src: src}
}

// checkedKeep is how many blocks read in part a checked reader keeps.
const checkedKeep = 4

type checked struct {
	r   *Reader
	src io.ReaderAt

	mu       sync.Mutex
	kept     []keptBlock           // most recent last
	inFlight map[uint64]*blockCall // blocks being read for a read in part
}

// blockCall is one read of a whole block that other reads of part of it
// wait for, rather than read it again (two prefetch workers reading the
// two halves of one big block).
type blockCall struct {
	done chan struct{}
	data []byte
	err  error
}

// keptBlock is a block read whole and checked for a read of part of it.
type keptBlock struct {
	index uint64
	data  []byte
}

func (c *checked) ReadAt(p []byte, off int64) (int, error) {
	addr, end, err := checkRead(off, len(p))
	if err != nil || len(p) == 0 {
		return 0, err
	}
	// The parts of blocks at either end come from whole blocks; what is
	// between, [mid, midEnd), is whole blocks and holes.
	mid, midEnd := addr, end
	if b, ok := c.r.lay.blockAt(addr); ok && b.Addr < addr {
		hi := min(end, b.End())
		if err := c.part(b, p[:hi-addr], addr); err != nil {
			return 0, err
		}
		mid = hi
	}
	if b, ok := c.r.lay.blockAt(end - 1); ok && mid < end && b.End() > end {
		lo := max(mid, b.Addr)
		if err := c.part(b, p[lo-addr:], lo); err != nil {
			return 0, err
		}
		midEnd = lo
	}
	if mid < midEnd {
		if err := c.whole(p[mid-addr:midEnd-addr], mid); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// whole reads [at, at+len(dst)), whole blocks and holes, with one ReadAt
// and checks every block and hole in it.
func (c *checked) whole(dst []byte, at uint64) error {
	if _, err := c.src.ReadAt(dst, int64(at)); err != nil && err != io.EOF {
		return fmt.Errorf("read %#x+%#x: %w", at, len(dst), err)
	}
	return c.r.lay.walk(at, at+uint64(len(dst)), func(s span) (uint64, error) {
		d := dst[s.lo-at : s.hi-at]
		if !s.in {
			if !allZero(d) {
				return 0, fmt.Errorf("read at %#x: %w: memory that was not dumped reads as data", s.lo, ErrSourceMismatch)
			}
			return s.hi, nil
		}
		return s.hi, c.check(s.b, d)
	})
}

// part copies into dst the bytes of block b from at on, from the block
// read whole and checked: kept from an earlier read, being read by
// another, or read now.
func (c *checked) part(b Block, dst []byte, at uint64) error {
	if c.r.pageCRCs(b) {
		return c.pages(b, dst, at)
	}
	data, err := c.wholeBlock(b)
	if err != nil {
		return err
	}
	copy(dst, data[at-b.Addr:])
	return nil
}

// pages reads into dst the bytes of block b from at on, whose pages are
// checked one by one: the pages that hold them alone, from src, checked
// against their checksums (straight into dst if they are whole pages).
func (c *checked) pages(b Block, dst []byte, at uint64) error {
	lo, hi := at&^(PageSize-1), alignUp(at+uint64(len(dst)), PageSize)
	buf := dst
	if lo != at || hi != at+uint64(len(dst)) {
		sb := scratch(int(hi - lo))
		defer scratchPool.Put(sb)
		buf = *sb
	}
	if _, err := c.src.ReadAt(buf, int64(lo)); err != nil && err != io.EOF {
		return fmt.Errorf("read %#x+%#x: %w", lo, len(buf), err)
	}
	if err := c.r.pcrc.check(b, lo, buf); err != nil {
		return fmt.Errorf("block %d at %#x: %w: %w", b.Index, b.Addr, ErrSourceMismatch, err)
	}
	copy(dst, buf[at-lo:])
	return nil
}

// wholeBlock returns block b read whole and checked.
func (c *checked) wholeBlock(b Block) ([]byte, error) {
	c.mu.Lock()
	for i, k := range c.kept {
		if k.index == b.Index {
			c.kept = append(append(c.kept[:i:i], c.kept[i+1:]...), k) // most recent last
			c.mu.Unlock()
			return k.data, nil
		}
	}
	if call, ok := c.inFlight[b.Index]; ok {
		c.mu.Unlock()
		<-call.done
		return call.data, call.err
	}
	call := &blockCall{done: make(chan struct{})}
	if c.inFlight == nil {
		c.inFlight = map[uint64]*blockCall{}
	}
	c.inFlight[b.Index] = call
	c.mu.Unlock()

	call.data = make([]byte, b.Len)
	if _, err := c.src.ReadAt(call.data, int64(b.Addr)); err != nil && err != io.EOF {
		call.err = fmt.Errorf("block %d at %#x: %w", b.Index, b.Addr, err)
	} else {
		call.err = c.check(b, call.data)
	}
	c.mu.Lock()
	delete(c.inFlight, b.Index)
	if call.err == nil {
		if len(c.kept) == checkedKeep {
			c.kept = c.kept[1:]
		}
		c.kept = append(c.kept, keptBlock{b.Index, call.data})
	}
	c.mu.Unlock()
	close(call.done)
	return call.data, call.err
}

// check compares block b, read whole into data, with its CRC32C.
func (c *checked) check(b Block, data []byte) error {
	if b.Kind == codec.Zero {
		if !allZero(data) {
			return fmt.Errorf("block %d at %#x: %w: a zero block reads as data", b.Index, b.Addr, ErrSourceMismatch)
		}
		return nil
	}
	if got := codec.Checksum(data); got != b.CRC {
		return fmt.Errorf("block %d at %#x: %w: crc32c %08x, want %08x", b.Index, b.Addr, ErrSourceMismatch, got, b.CRC)
	}
	return nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
