package engine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
)

// blockSource is the pager's source for --source direct: the snapshot's
// memory at its virtual addresses, read block by block straight from the
// pages file into the pager's buffer (Raw blocks: one pread, then their
// CRC32C; LZ4 blocks: read and decoded into it, then checked). It is
// image.Reader.ReadAt without the block cache, which a pager that reads
// every block once has no use for: the cache's copy and its fresh buffers
// (page faults of ours) made image.Reader.ReadAt take twice the time of a
// pread and a checksum (806 MiB, warm page cache: 270-310 ms against
// 140-190 ms).
type blockSource struct {
	r       *image.Reader // the block index
	f       *os.File      // the pages file
	scratch sync.Pool     // *[]byte: LZ4 payloads, partly read blocks
}

var _ io.ReaderAt = (*blockSource)(nil)

// newBlockSource opens the pages file of r, in snapshot directory dir.
func newBlockSource(dir string, r *image.Reader) (*blockSource, error) {
	f, err := os.Open(filepath.Join(dir, r.Name()))
	if err != nil {
		return nil, fmt.Errorf("open pages: %w", err)
	}
	return &blockSource{r: r, f: f}, nil
}

func (s *blockSource) Close() error { return s.f.Close() }

// ReadAt reads the memory at address off into p; what was not dumped
// reads as zeros. Safe for concurrent use.
func (s *blockSource) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read at %d: negative address", off)
	}
	addr := uint64(off)
	end := addr + uint64(len(p))
	for a := addr; a < end; {
		b, ok := s.r.BlockAt(a)
		if !ok {
			hi := end
			if next, ok := s.r.NextData(a); ok && next < end {
				hi = next
			}
			if hi <= a {
				return 0, fmt.Errorf("read at %#x: no block, yet data", a)
			}
			clear(p[a-addr : hi-addr])
			a = hi
			continue
		}
		hi := min(end, b.End())
		dst := p[a-addr : hi-addr]
		switch {
		case b.Kind == codec.Zero:
			clear(dst)
		case b.Kind == codec.Raw && a == b.Addr && hi == b.End():
			// Whole Raw blocks that follow each other both in memory and
			// in the pages file are read with one pread (small blocks:
			// --compress makes them 4 KiB).
			n, err := s.loadRaw(b, p[a-addr:])
			if err != nil {
				return 0, err
			}
			hi = a + n
		case a == b.Addr && hi == b.End():
			if err := s.load(b, dst); err != nil {
				return 0, err
			}
		default:
			buf := s.buf(int(b.Len))
			err := s.load(b, *buf)
			copy(dst, (*buf)[a-b.Addr:])
			s.scratch.Put(buf)
			if err != nil {
				return 0, err
			}
		}
		a = hi
	}
	return len(p), nil
}

// maxRawBatch bounds the blocks one pread of loadRaw covers.
const maxRawBatch = 1024

// loadRaw reads Raw block b, and the whole Raw blocks after it that
// follow it both in memory and in the pages file and fit in dst, with one
// pread into dst, checks each, and returns the bytes read.
func (s *blockSource) loadRaw(b image.Block, dst []byte) (uint64, error) {
	batch := []image.Block{b}
	n := uint64(b.Len)
	for len(batch) < maxRawBatch {
		last := batch[len(batch)-1]
		next, ok := s.r.BlockAt(last.End())
		if !ok || next.Kind != codec.Raw || next.Addr != last.End() || next.Off != last.Off+uint64(last.StoredLen) || n+uint64(next.Len) > uint64(len(dst)) {
			break
		}
		batch = append(batch, next)
		n += uint64(next.Len)
	}
	if _, err := s.f.ReadAt(dst[:n], int64(b.Off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, &image.BlockError{File: s.r.Name(), Block: b.Index, Addr: b.Addr, Err: err}
	}
	for _, c := range batch {
		d := dst[c.Addr-b.Addr : c.End()-b.Addr]
		if got := codec.Checksum(d); got != c.CRC {
			return 0, &image.BlockError{File: s.r.Name(), Block: c.Index, Addr: c.Addr,
				Err: fmt.Errorf("%w: crc32c %08x, want %08x", codec.ErrChecksum, got, c.CRC)}
		}
	}
	return n, nil
}

// buf returns a scratch buffer of n bytes.
func (s *blockSource) buf(n int) *[]byte {
	b, _ := s.scratch.Get().(*[]byte)
	if b == nil || cap(*b) < n {
		nb := make([]byte, n)
		b = &nb
	}
	*b = (*b)[:n]
	return b
}

// load reads and decodes block b into dst (len(dst) == b.Len) and checks
// its CRC32C.
func (s *blockSource) load(b image.Block, dst []byte) error {
	var err error
	if b.Kind == codec.Raw {
		if _, err = s.f.ReadAt(dst, int64(b.Off)); err == nil {
			if got := codec.Checksum(dst); got != b.CRC {
				err = fmt.Errorf("%w: crc32c %08x, want %08x", codec.ErrChecksum, got, b.CRC)
			}
		}
	} else {
		stored := s.buf(int(b.StoredLen))
		if _, err = s.f.ReadAt(*stored, int64(b.Off)); err == nil {
			err = codec.DecodeChecked(dst, b.Kind, *stored, b.CRC)
		}
		s.scratch.Put(stored)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return &image.BlockError{File: s.r.Name(), Block: b.Index, Addr: b.Addr, Err: err}
	}
	return nil
}
