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
	StoredLen int    // stored length: 0 for Zero, Len for Raw, 1..Len for LZ4 and Shuffle
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
	// Authenticated says that src has authenticated every stored byte it
	// returns, and the block it belongs to (a sealed or signed snapshot's
	// payloads): blocks are decoded but not checked against their CRC32C,
	// which would catch nothing the authentication has not.
	Authenticated bool
}

// BlockError reports a block that could not be read or decoded, or whose
// decoded bytes do not match its CRC32C. Err wraps ErrChecksum, ErrUndecodable
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
		return fmt.Errorf("%w: unknown kind %d", ErrUndecodable, b.Kind)
	}
	if b.Len <= 0 || b.Len > MaxBlockSize || b.Len%PageSize != 0 {
		return fmt.Errorf("%w: decoded length %d", ErrUndecodable, b.Len)
	}
	switch b.Kind {
	case Zero:
		if b.StoredLen != 0 {
			return fmt.Errorf("%w: zero block with %d stored bytes", ErrUndecodable, b.StoredLen)
		}
		return nil
	case Raw:
		if b.StoredLen != b.Len {
			return fmt.Errorf("%w: raw block of %d stored bytes, length %d", ErrUndecodable, b.StoredLen, b.Len)
		}
	case LZ4, Shuffle:
		if b.StoredLen <= 0 || b.StoredLen > b.Len {
			return fmt.Errorf("%w: %s block of %d stored bytes, length %d", ErrUndecodable, b.Kind, b.StoredLen, b.Len)
		}
	}
	if b.Off < 0 || b.Off > math.MaxInt64-int64(b.StoredLen) {
		return fmt.Errorf("%w: stored offset %d", ErrUndecodable, b.Off)
	}
	return nil
}

// DecodeBlocks decodes blocks, read from src, in order and in batches of at
// most opts.BatchBytes decoded bytes (a single block larger than that is a
// batch of its own). At most two batches are in flight: the stored bytes of
// batch i+1 are read while batch i is decoded and handed to fn (a call
// that fits in one batch reads it on the calling goroutine). Adjacent LZ4
// payloads, with the padding between them up to a page, are read with one
// ReadAt; a run of Raw blocks is read with one ReadAt straight into the
// output buffer and then only checked. Buffers are pooled across calls.
//
// fn is called from the calling goroutine, in order, once per batch, with
// the index of the batch's first block and the decoded bytes of each of its
// blocks. The slices of one batch are consecutive parts of one buffer; they
// are valid only until fn returns. An error from fn stops DecodeBlocks and
// is returned as it is.
//
// Every block's sizes are checked before anything is read or allocated for
// it, and every block is checked against its CRC32C before fn sees it
// (unless opts.Authenticated: src has authenticated it already). A
// block that fails either check, or whose stored bytes cannot be read,
// stops the stream with a *BlockError: the blocks before it are still handed
// to fn (possibly in a shorter batch), none at or after it. A cancelled ctx
// stops DecodeBlocks with ctx.Err().
func DecodeBlocks(ctx context.Context, src io.ReaderAt, blocks []Block, opts DecodeOptions,
	fn func(first int, out [][]byte) error) error {
	return decodeBlocks(ctx, src, blocks, opts, MinThreadBytes, fn)
}

func decodeBlocks(ctx context.Context, src io.ReaderAt, blocks []Block, opts DecodeOptions,
	minThreadBytes int64, fn func(first int, out [][]byte) error) error {
	if len(blocks) == 0 {
		return ctx.Err()
	}
	d := &decoder{
		src:        src,
		blocks:     blocks,
		minThread:  minThreadBytes,
		threads:    opts.Threads,
		batchBytes: opts.BatchBytes,
		noCRC:      opts.Authenticated,
	}
	if d.batchBytes <= 0 || d.batchBytes > MaxBatchBytes {
		d.batchBytes = MaxBatchBytes
	}
	if d.threads == 0 {
		d.cpus = affinityCPUs()
	}

	// The first batch is read here: a call that fits in one batch (a 1 MiB
	// read through FUSE) then never wakes another thread to read ahead.
	first, second := batchPool.Get().(*batch), batchPool.Get().(*batch)
	defer func() {
		for _, b := range []*batch{first, second} {
			b.blocks = nil
			batchPool.Put(b)
		}
	}()
	next := d.fill(ctx, first, 0)
	if err := ctx.Err(); err != nil {
		return err
	}
	full := make(chan *batch, 2)
	full <- first
	free := make(chan *batch, 2)
	free <- second
	if next == len(blocks) || first.err != nil {
		close(full)
	} else {
		rctx, cancel := context.WithCancel(ctx)
		var reader sync.WaitGroup
		reader.Go(func() { d.readLoop(rctx, next, free, full) })
		// Deferred after the pool's return, so it runs first.
		defer func() {
			cancel()
			reader.Wait()
		}()
	}

	done := 0
	for b := range full {
		if err := d.deliver(ctx, b, fn); err != nil {
			return err
		}
		done = b.first + len(b.blocks)
		free <- b
	}
	if done < len(blocks) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return errors.New("codec: decode blocks: reader stopped early") // not reached
	}
	return ctx.Err()
}

// batchPool recycles batches and their buffers between calls, so that a
// stream of DecodeBlocks calls does not fault in fresh memory for each.
var batchPool = sync.Pool{New: func() any { return new(batch) }}

// deliver decodes a batch and hands its good blocks to fn. It returns the
// error that ends the stream, if any.
func (d *decoder) deliver(ctx context.Context, b *batch, fn func(int, [][]byte) error) error {
	if len(b.blocks) > 0 {
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
	}
	return b.err
}

type decoder struct {
	src        io.ReaderAt
	blocks     []Block
	threads    int
	cpus       int
	minThread  int64
	batchBytes int
	noCRC      bool // opts.Authenticated
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
	for k := range b.blocks {
		o, l := b.dpos[k], b.blocks[k].Len
		b.out[k] = b.decoded[o : o+l : o+l]
	}

	t := threads(d.threads, d.cpus, d.minThread, b.lz4Len, b.lz4)
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
			switch blk.Kind {
			case Zero:
				clear(b.out[k]) // CRC checked when the batch was formed
			case Raw: // read in place
				if d.noCRC {
					break
				}
				if crc := Checksum(b.out[k]); crc != blk.CRC {
					err = fmt.Errorf("%w: crc32c %08x, want %08x", ErrChecksum, crc, blk.CRC)
				}
			default:
				stored := b.stored[b.pos[k] : b.pos[k]+blk.StoredLen]
				if d.noCRC {
					err = Decode(b.out[k], blk.Kind, stored)
				} else {
					err = DecodeChecked(b.out[k], blk.Kind, stored, blk.CRC)
				}
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
