package image

import (
	"fmt"
	"io"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// Checked returns src, an io.ReaderAt of the memory r describes served by
// someone else (a lazyfs mount's MNT/PID/mem), checked against r's index:
// every block a read touches is read whole from src and its bytes
// compared with the block's CRC32C (zeros for a Zero block, and for what
// was not dumped), so that a mount that serves wrong bytes, whoever runs
// it, fails the read with ErrSourceMismatch rather than hand them on. A
// read the source fails is returned as it failed: neither is the
// snapshot's fault, and neither matches ErrCorrupt. A read of whole blocks goes straight into the
// caller's buffer; only a block read in part goes through a scratch
// buffer. Safe for concurrent use if src is; valid until r is closed.
func (r *Reader) Checked(src io.ReaderAt) io.ReaderAt { return checked{r, src} }

type checked struct {
	r   *Reader
	src io.ReaderAt
}

func (c checked) ReadAt(p []byte, off int64) (int, error) {
	r := c.r
	if off < 0 {
		return 0, fmt.Errorf("read at %d: negative address", off)
	}
	addr := uint64(off)
	end := addr + uint64(len(p))
	if end < addr || end > maxAddr {
		return 0, fmt.Errorf("read at %#x+%d: outside the address space", addr, len(p))
	}
	for a := addr; a < end; {
		ri, in := r.lay.findRun(a)
		if !in {
			next := end
			if ri < len(r.lay.ix.Runs) {
				next = min(end, r.lay.ix.Runs[ri].Addr)
			}
			if err := c.readZeros(p[a-addr:next-addr], a); err != nil {
				return 0, err
			}
			a = next
			continue
		}
		run, bs := r.lay.ix.Runs[ri], r.lay.ix.BlockSize
		b := r.lay.block(ri, run.FirstBlock+a/bs-run.Addr/bs)
		hi := min(end, b.End())
		if a == b.Addr && hi == b.End() {
			if err := c.readBlock(b, p[a-addr:hi-addr]); err != nil {
				return 0, err
			}
		} else {
			buf := scratch(int(b.Len))
			err := c.readBlock(b, *buf)
			copy(p[a-addr:hi-addr], (*buf)[a-b.Addr:])
			scratchPool.Put(buf)
			if err != nil {
				return 0, err
			}
		}
		a = hi
	}
	return len(p), nil
}

// readBlock reads block b whole from the source into dst and checks it.
func (c checked) readBlock(b Block, dst []byte) error {
	if _, err := c.src.ReadAt(dst, int64(b.Addr)); err != nil && err != io.EOF {
		return fmt.Errorf("block %d at %#x: %w", b.Index, b.Addr, err)
	}
	if b.Kind == codec.Zero {
		if !allZero(dst) {
			return fmt.Errorf("block %d at %#x: %w: a zero block reads as data", b.Index, b.Addr, ErrSourceMismatch)
		}
		return nil
	}
	if got := codec.Checksum(dst); got != b.CRC {
		return fmt.Errorf("block %d at %#x: %w: crc32c %08x, want %08x", b.Index, b.Addr, ErrSourceMismatch, got, b.CRC)
	}
	return nil
}

// readZeros reads what was not dumped, which must read as zeros.
func (c checked) readZeros(dst []byte, addr uint64) error {
	if _, err := c.src.ReadAt(dst, int64(addr)); err != nil && err != io.EOF {
		return fmt.Errorf("read at %#x: %w", addr, err)
	}
	if !allZero(dst) {
		return fmt.Errorf("read at %#x: %w: memory that was not dumped reads as data", addr, ErrSourceMismatch)
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
