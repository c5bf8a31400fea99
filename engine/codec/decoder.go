package codec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
)

// Block describes one stored block for DecodeBlocks.
type Block struct {
	Kind      Kind
	Off       int64  // offset of the stored bytes in the source (ignored for Zero)
	StoredLen int    // stored length: 0 for Zero, Len for Raw, 1..Len for LZ4
	Len       int    // decoded length: a multiple of PageSize, at most MaxBlockSize
	CRC       uint32 // CRC32C of the decoded bytes
}

// MaxBatchBytes is the largest amount of decoded output in one batch.
const MaxBatchBytes = 32 << 20

// maxGap is the largest hole between two stored ranges that DecodeBlocks
// reads through to make one ReadAt of both. Raw payloads start on a page
// boundary, so the padding before them is always smaller than this.
const maxGap = PageSize

// maxRead is the largest single ReadAt, so that a cancellation is noticed
// between reads of a large batch.
const maxRead = 8 << 20

// DecodeOptions configure DecodeBlocks.
type DecodeOptions struct {
	// Threads: 1 decodes serially; 0 chooses per batch from the CPU
	// affinity mask and the work in the batch; N > 1 is a maximum. See
	// Threads.
	Threads int
	// BatchBytes is the most decoded bytes per batch; 0 or more than
	// MaxBatchBytes means MaxBatchBytes.
	BatchBytes int
}

// BlockError reports a block that could not be read or decoded, or whose
// decoded bytes do not match its CRC32C. Err wraps ErrChecksum, ErrCorrupt
// or the error of the read.
type BlockError struct {
	Index int   // index of the block in the slice given to DecodeBlocks
	Off   int64 // its stored offset
	Err   error
}

func (e *BlockError) Error() string {
	return fmt.Sprintf("block %d at offset %d: %v", e.Index, e.Off, e.Err)
}

func (e *BlockError) Unwrap() error { return e.Err }

// check validates the sizes of a block read from an index before anything
// is read or allocated for it.
func (b *Block) check() error {
	if !b.Kind.Valid() {
		return fmt.Errorf("%w: unknown kind %d", ErrCorrupt, b.Kind)
	}
	if b.Len <= 0 || b.Len > MaxBlockSize || b.Len%PageSize != 0 {
		return fmt.Errorf("%w: decoded length %d", ErrCorrupt, b.Len)
	}
	switch b.Kind {
	case Zero:
		if b.StoredLen != 0 {
			return fmt.Errorf("%w: zero block with %d stored bytes", ErrCorrupt, b.StoredLen)
		}
		return nil
	case Raw:
		if b.StoredLen != b.Len {
			return fmt.Errorf("%w: raw block of %d stored bytes, length %d", ErrCorrupt, b.StoredLen, b.Len)
		}
	case LZ4:
		if b.StoredLen <= 0 || b.StoredLen > b.Len {
			return fmt.Errorf("%w: lz4 block of %d stored bytes, length %d", ErrCorrupt, b.StoredLen, b.Len)
		}
	}
	if b.Off < 0 || b.Off > math.MaxInt64-int64(b.StoredLen) {
		return fmt.Errorf("%w: stored offset %d", ErrCorrupt, b.Off)
	}
	return nil
}

// DecodeBlocks decodes blocks, read from src, in order and in batches of at
// most opts.BatchBytes decoded bytes (a single block larger than that is a
// batch of its own). At most two batches are in flight: the stored bytes of
// batch i+1 are read while batch i is decoded and handed to fn. Adjacent
// stored ranges (and the padding between them, up to a page) are read with
// one ReadAt.
//
// fn is called from the calling goroutine, in order, once per batch, with
// the index of the batch's first block and the decoded bytes of each of its
// blocks. The slices of one batch are consecutive parts of one buffer; they
// are valid only until fn returns. An error from fn stops DecodeBlocks and
// is returned as it is.
//
// Every block's sizes are checked before anything is read or allocated for
// it, and every block is checked against its CRC32C before fn sees it. A
// block that fails either check, or whose stored bytes cannot be read,
// stops the stream with a *BlockError: the blocks before it are still handed
// to fn (possibly in a shorter batch), none at or after it. A cancelled ctx
// stops DecodeBlocks with ctx.Err().
func DecodeBlocks(ctx context.Context, src io.ReaderAt, blocks []Block, opts DecodeOptions,
	fn func(first int, out [][]byte) error) error {
	if len(blocks) == 0 {
		return ctx.Err()
	}
	d := &decoder{
		src:        src,
		blocks:     blocks,
		threads:    opts.Threads,
		batchBytes: opts.BatchBytes,
		zeroCRCs:   make(map[int]uint32),
	}
	if d.batchBytes <= 0 || d.batchBytes > MaxBatchBytes {
		d.batchBytes = MaxBatchBytes
	}
	if d.threads == 0 {
		d.cpus = affinityCPUs()
	}

	rctx, cancel := context.WithCancel(ctx)
	free := make(chan *batch, 2)
	full := make(chan *batch, 2)
	free <- new(batch)
	free <- new(batch)
	var reader sync.WaitGroup
	reader.Go(func() { d.readLoop(rctx, free, full) })
	defer func() {
		cancel()
		reader.Wait()
	}()

	next := 0
	for b := range full {
		if n := len(b.blocks); n > 0 {
			good, err := d.decode(ctx, b)
			if good > 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := fn(b.first, b.out[:good]); err != nil {
					return err
				}
			}
			if err != nil {
				return err
			}
			next = b.first + n
		}
		if b.err != nil {
			return b.err
		}
		free <- b
	}
	if next < len(blocks) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return errors.New("codec: decode blocks: reader stopped early") // not reached
	}
	return ctx.Err()
}

type decoder struct {
	src        io.ReaderAt
	blocks     []Block
	threads    int
	cpus       int
	batchBytes int
	zeroCRCs   map[int]uint32 // CRC32C of Len zero bytes; reader goroutine only
}

// batch is one batch of blocks and the buffers it is read and decoded into.
type batch struct {
	first   int
	blocks  []Block // sub-slice of decoder.blocks
	pos     []int   // where each block's stored bytes start in stored
	ranges  []span
	stored  []byte
	decoded []byte
	out     [][]byte
	lz4     int   // number of LZ4 blocks
	lz4Len  int64 // decoded bytes of LZ4 blocks
	err     error // ends the stream after this batch
}

// span is one ReadAt: stored bytes [off, off+n) go to stored[at:].
type span struct {
	off   int64
	n     int
	at    int
	first int // first block (index in batch) in the span
}

// readLoop forms batches and reads their stored bytes, one batch ahead of
// the decoding.
func (d *decoder) readLoop(ctx context.Context, free <-chan *batch, full chan<- *batch) {
	defer close(full)
	for i := 0; i < len(d.blocks); {
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
// returns the index of the first block after the batch.
func (d *decoder) fill(ctx context.Context, b *batch, i int) int {
	b.first, b.err = i, nil
	b.lz4, b.lz4Len = 0, 0
	b.pos = b.pos[:0]
	b.ranges = b.ranges[:0]
	total, stored := 0, 0
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
		if blk.Kind == Zero {
			if crc := d.zeroCRC(blk.Len); crc != blk.CRC {
				b.err = &BlockError{Index: j, Off: blk.Off,
					Err: fmt.Errorf("%w: crc32c %08x, want %08x", ErrChecksum, crc, blk.CRC)}
				break
			}
			b.pos = append(b.pos, 0)
		} else {
			stored = b.place(blk, j-i, stored)
			if blk.Kind == LZ4 {
				b.lz4++
				b.lz4Len += int64(blk.Len)
			}
		}
		total += blk.Len
	}
	b.blocks = d.blocks[i:j]
	if cap(b.stored) < stored {
		b.stored = make([]byte, stored)
	}
	b.stored = b.stored[:stored]
	if cap(b.decoded) < total {
		b.decoded = make([]byte, total)
	}
	b.decoded = b.decoded[:total]

	for _, r := range b.ranges {
		if err := d.readSpan(ctx, b, r); err != nil {
			if ctx.Err() != nil {
				return j
			}
			// Keep the blocks read before the failing one.
			var be *BlockError
			if errors.As(err, &be) {
				b.blocks = b.blocks[:be.Index-i]
			} else {
				b.blocks = b.blocks[:0]
			}
			b.err = err
			break
		}
	}
	return j
}

// place assigns a position in the stored buffer to the k-th block of the
// batch, extending the last span when the block follows it closely.
func (b *batch) place(blk *Block, k, stored int) int {
	if n := len(b.ranges); n > 0 {
		r := &b.ranges[n-1]
		end := r.off + int64(r.n)
		if blk.Off >= end && blk.Off-end <= maxGap {
			at := r.at + int(blk.Off-r.off)
			r.n = int(blk.Off-r.off) + blk.StoredLen
			b.pos = append(b.pos, at)
			return r.at + r.n
		}
	}
	b.ranges = append(b.ranges, span{off: blk.Off, n: blk.StoredLen, at: stored, first: k})
	b.pos = append(b.pos, stored)
	return stored + blk.StoredLen
}

// readSpan reads one span in pieces of at most maxRead bytes. A short read
// is a *BlockError naming the first block not fully read.
func (d *decoder) readSpan(ctx context.Context, b *batch, r span) error {
	done := 0
	for done < r.n {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(r.n-done, maxRead)
		got, err := d.src.ReadAt(b.stored[r.at+done:r.at+done+n], r.off+int64(done))
		done += got
		if got == n {
			continue
		}
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		// The first block of the span whose stored bytes end past what was read.
		k := r.first
		for ; k < len(b.blocks); k++ {
			blk := &b.blocks[k]
			if blk.Kind != Zero && b.pos[k] >= r.at && b.pos[k]+blk.StoredLen > r.at+done {
				break
			}
		}
		if k == len(b.blocks) { // not reached: some block of the span is short
			k = r.first
		}
		return &BlockError{Index: b.first + k, Off: b.blocks[k].Off,
			Err: fmt.Errorf("read stored bytes: %w", err)}
	}
	return nil
}

func (d *decoder) zeroCRC(n int) uint32 {
	crc, ok := d.zeroCRCs[n]
	if !ok {
		crc = Checksum(make([]byte, n))
		d.zeroCRCs[n] = crc
	}
	return crc
}

// decode decodes and checks every block of b into b.out, on as many
// goroutines as Threads allows. It returns how many leading blocks are good
// and, if that is not all of them, the error of the first bad one.
func (d *decoder) decode(ctx context.Context, b *batch) (int, error) {
	n := len(b.blocks)
	if cap(b.out) < n {
		b.out = make([][]byte, n)
	}
	b.out = b.out[:n]
	o := 0
	for k := range b.blocks {
		l := b.blocks[k].Len
		b.out[k] = b.decoded[o : o+l : o+l]
		o += l
	}

	t := threads(d.threads, d.cpus, b.lz4Len, b.lz4)
	var (
		next    atomic.Int64 // next block to take
		failAt  atomic.Int64 // lowest failed block so far, n if none
		mu      sync.Mutex
		failErr error
	)
	failAt.Store(int64(n))
	work := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= n || int64(k) > failAt.Load() {
				return
			}
			if ctx.Err() != nil {
				failAt.Store(-1)
				return
			}
			blk := &b.blocks[k]
			var err error
			if blk.Kind == Zero {
				clear(b.out[k]) // CRC checked when the batch was formed
			} else {
				err = DecodeChecked(b.out[k], blk.Kind, b.stored[b.pos[k]:b.pos[k]+blk.StoredLen], blk.CRC)
			}
			if err != nil {
				mu.Lock()
				if int64(k) < failAt.Load() {
					failAt.Store(int64(k))
					failErr = &BlockError{Index: b.first + k, Off: blk.Off, Err: err}
				}
				mu.Unlock()
			}
		}
	}
	if t <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range t - 1 {
			wg.Go(work)
		}
		work()
		wg.Wait()
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	good := int(failAt.Load())
	return good, failErr
}
