package codec

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// batch is one batch of blocks and the buffers it is read and decoded into.
//
// LZ4 and Shuffle payloads are read into stored and decoded from there
// into decoded.
// Raw payloads are read straight into their place in decoded and only
// checked, which saves a copy of the bulk of most snapshots (weights are
// Raw).
type batch struct {
	first   int
	blocks  []Block // sub-slice of decoder.blocks
	pos     []int   // LZ4: offset of the stored bytes in stored; Raw: dpos
	dpos    []int   // offset of the decoded bytes in decoded
	spans   []span
	stored  []byte
	decoded []byte
	out     [][]byte
	lz4     int   // number of compressed (LZ4 and Shuffle) blocks
	lz4Len  int64 // decoded bytes of compressed blocks
	err     error // ends the stream after this batch
}

// span is one ReadAt: stored bytes [off, off+n) go to buf(raw)[at:].
// Its blocks are those of its kind (Raw or not) among first..last.
type span struct {
	off         int64
	n, at       int
	raw         bool
	first, last int // indexes in the batch
}

func (b *batch) buf(raw bool) []byte {
	if raw {
		return b.decoded
	}
	return b.stored
}

// readLoop forms batches from block i on and reads their stored bytes, one
// batch ahead of the decoding.
func (d *decoder) readLoop(ctx context.Context, i int, free <-chan *batch, full chan<- *batch) {
	defer close(full)
	for i < len(d.blocks) {
		var b *batch
		select {
		case b = <-free:
		case <-ctx.Done():
			return
		}
		i = d.fill(ctx, b, i)
		if ctx.Err() != nil {
			return
		}
		full <- b // full has room for both batches
		if b.err != nil {
			return
		}
	}
}

// fill forms the batch starting at block i and reads its stored bytes. It
// returns the index of the first block after the batch. A block that fails
// its checks, or cannot be read, ends the batch and sets b.err.
func (d *decoder) fill(ctx context.Context, b *batch, i int) int {
	b.first, b.err = i, nil
	b.lz4, b.lz4Len = 0, 0
	b.pos, b.dpos, b.spans = b.pos[:0], b.dpos[:0], b.spans[:0]
	total, stored := 0, 0
	lastStored, lastRaw := -1, -1 // spans that may be extended
	j := i
	for ; j < len(d.blocks); j++ {
		blk := &d.blocks[j]
		if err := blk.check(); err != nil {
			b.err = &BlockError{Index: j, Off: blk.Off, Err: err}
			break
		}
		if j > i && total+blk.Len > d.batchBytes {
			break
		}
		k := j - i
		b.dpos = append(b.dpos, total)
		switch blk.Kind {
		case Zero:
			if crc := ZeroChecksum(blk.Len); crc != blk.CRC {
				b.err = &BlockError{Index: j, Off: blk.Off,
					Err: fmt.Errorf("%w: crc32c %08x, want %08x", ErrChecksum, crc, blk.CRC)}
			}
			b.pos = append(b.pos, 0)
		case Raw:
			// Consecutive Raw blocks are contiguous in the pages file and
			// in decoded: one read.
			if r := at(b.spans, lastRaw); r != nil && r.last == k-1 && blk.Off == r.off+int64(r.n) {
				r.n += blk.StoredLen
				r.last = k
			} else {
				lastRaw = len(b.spans)
				b.spans = append(b.spans, span{off: blk.Off, n: blk.StoredLen, at: total, raw: true, first: k, last: k})
			}
			b.pos = append(b.pos, total)
		case LZ4, Shuffle:
			// Compressed payloads are read with the padding between them.
			b.lz4++
			b.lz4Len += int64(blk.Len)
			if r := at(b.spans, lastStored); r != nil && blk.Off >= r.off+int64(r.n) &&
				blk.Off-(r.off+int64(r.n)) <= maxGap {
				b.pos = append(b.pos, r.at+int(blk.Off-r.off))
				r.n = int(blk.Off-r.off) + blk.StoredLen
				r.last = k
				stored = r.at + r.n
			} else {
				lastStored = len(b.spans)
				b.spans = append(b.spans, span{off: blk.Off, n: blk.StoredLen, at: stored, first: k, last: k})
				b.pos = append(b.pos, stored)
				stored += blk.StoredLen
			}
		}
		if b.err != nil {
			b.dpos = b.dpos[:k]
			b.pos = b.pos[:k]
			break
		}
		total += blk.Len
	}
	b.blocks = d.blocks[i:j]
	b.stored = grow(b.stored, stored)
	b.decoded = grow(b.decoded, total)

	for _, r := range b.spans {
		if err := d.readSpan(ctx, b, r); err != nil {
			if ctx.Err() != nil {
				return j
			}
			// Keep the blocks before the failing one.
			b.blocks = b.blocks[:err.Index-i]
			b.err = err
			break
		}
	}
	return j
}

func at(spans []span, i int) *span {
	if i < 0 {
		return nil
	}
	return &spans[i]
}

// grow returns b with length n, reallocated only if its capacity is short.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// readSpan reads one span in pieces of at most maxRead bytes. A failed or
// short read is a *BlockError naming the first block not fully read.
func (d *decoder) readSpan(ctx context.Context, b *batch, r span) *BlockError {
	buf := b.buf(r.raw)[r.at : r.at+r.n]
	done := 0
	for done < r.n {
		if ctx.Err() != nil {
			break // the caller sees ctx.Err()
		}
		n := min(r.n-done, maxRead)
		got, err := d.src.ReadAt(buf[done:done+n], r.off+int64(done))
		done += got
		if got == n {
			continue
		}
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		// The first block of the span whose stored bytes end past what was read.
		k := r.last
		for i := r.first; i <= r.last; i++ {
			blk := &b.blocks[i]
			if (blk.Kind == Raw) == r.raw && blk.Kind != Zero && b.pos[i]+blk.StoredLen > r.at+done {
				k = i
				break
			}
		}
		return &BlockError{Index: b.first + k, Off: b.blocks[k].Off,
			Err: fmt.Errorf("read stored bytes: %w", err)}
	}
	if ctx.Err() != nil {
		return &BlockError{Index: b.first + r.first, Off: r.off, Err: ctx.Err()}
	}
	return nil
}
