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
	addr, end, err := checkRead(off, len(p))
	if err != nil {
		return 0, err
	}
	err = c.r.lay.walk(addr, end, func(s span) (uint64, error) {
		dst, b := p[s.lo-addr:s.hi-addr], s.b
		switch {
		case !s.in:
			return s.hi, c.readZeros(dst, s.lo)
		case s.lo == b.Addr && s.hi == b.End():
			return s.hi, c.readBlock(b, dst)
		default:
			buf := scratch(int(b.Len))
			err := c.readBlock(b, *buf)
			copy(dst, (*buf)[s.lo-b.Addr:])
			scratchPool.Put(buf)
			return s.hi, err
		}
	})
	if err != nil {
		return 0, err
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
