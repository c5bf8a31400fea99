package codec

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// mixedImage is a small image of every kind of block at bs bytes.
func mixedImage(t *testing.T, bs int) ([]byte, *encoded) {
	t.Helper()
	data := segmented(bs)
	return data, encodeAll(t, data, bs, 2, Compress)
}

// checkPrefix decodes with fn checking every delivered block against data;
// it returns the number of blocks delivered and the error.
func checkPrefix(t *testing.T, src io.ReaderAt, blocks []Block, data []byte, opts DecodeOptions) (int, error) {
	t.Helper()
	delivered := 0
	err := DecodeBlocks(context.Background(), src, blocks, opts, func(first int, out [][]byte) error {
		for k, b := range out {
			i := first + k
			off := 0
			for _, blk := range blocks[:i] {
				off += blk.Len
			}
			if !bytes.Equal(b, data[off:off+len(b)]) {
				t.Errorf("block %d handed to fn with wrong bytes", i)
			}
			delivered = i + 1
		}
		return nil
	})
	return delivered, err
}

// TestDecodeBitFlip flips a bit in each stored block in turn: decoding must
// stop at that block with ErrChecksum or ErrUndecodable, after handing fn only
// correct bytes of the blocks before it.
func TestDecodeBitFlip(t *testing.T) {
	const bs = 64 << 10
	data, e := mixedImage(t, bs)
	for i, blk := range e.blocks {
		if blk.Kind == Zero {
			continue
		}
		for _, threads := range []int{1, 2} {
			pages := bytes.Clone(e.pages)
			bit := (i*7919 + threads) % (8 * blk.StoredLen)
			pages[blk.Off+int64(bit/8)] ^= 1 << (bit % 8)
			n, err := checkPrefix(t, bytes.NewReader(pages), e.blocks, data,
				DecodeOptions{Threads: threads, BatchBytes: 4 * bs})
			var be *BlockError
			if !errors.As(err, &be) || be.Index != i {
				t.Fatalf("flip in %v block %d: error %v, want a BlockError for block %d", blk.Kind, i, err, i)
			}
			if !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrUndecodable) {
				t.Errorf("flip in block %d: %v, want ErrChecksum or ErrUndecodable", i, err)
			}
			if n != i {
				t.Errorf("flip in block %d: %d blocks delivered, want %d", i, n, i)
			}
		}
	}
}

func TestDecodeBadIndex(t *testing.T) {
	const bs = 64 << 10
	data, e := mixedImage(t, bs)
	firstOf := func(k Kind) int {
		for i, b := range e.blocks {
			if b.Kind == k {
				return i
			}
		}
		t.Fatalf("no %v block", k)
		return 0
	}
	for _, tc := range []struct {
		name string
		kind Kind
		edit func(*Block)
		want error
	}{
		{"zero crc", Zero, func(b *Block) { b.CRC ^= 1 }, ErrChecksum},
		{"zero stored", Zero, func(b *Block) { b.StoredLen = 10 }, ErrUndecodable},
		{"raw crc", Raw, func(b *Block) { b.CRC ^= 1 }, ErrChecksum},
		{"raw short", Raw, func(b *Block) { b.StoredLen-- }, ErrUndecodable},
		{"lz4 crc", LZ4, func(b *Block) { b.CRC ^= 1 }, ErrChecksum},
		{"lz4 longer than len", LZ4, func(b *Block) { b.StoredLen = b.Len + 1 }, ErrUndecodable},
		{"lz4 empty", LZ4, func(b *Block) { b.StoredLen = 0 }, ErrUndecodable},
		{"lz4 short", LZ4, func(b *Block) { b.StoredLen -= 5 }, ErrUndecodable},
		{"lz4 wrong len", LZ4, func(b *Block) { b.Len -= PageSize }, ErrUndecodable},
		{"huge len", LZ4, func(b *Block) { b.Len = math.MaxInt }, ErrUndecodable},
		{"len over max", Raw, func(b *Block) { b.Len = MaxBlockSize + PageSize; b.StoredLen = b.Len }, ErrUndecodable},
		{"len not pages", Raw, func(b *Block) { b.Len = 100; b.StoredLen = 100 }, ErrUndecodable},
		{"negative len", Zero, func(b *Block) { b.Len = -PageSize }, ErrUndecodable},
		{"negative off", Raw, func(b *Block) { b.Off = -1 }, ErrUndecodable},
		{"off overflow", LZ4, func(b *Block) { b.Off = math.MaxInt64 - 10 }, ErrUndecodable},
		{"unknown kind", LZ4, func(b *Block) { b.Kind = 7 }, ErrUndecodable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := firstOf(tc.kind)
			blocks := append([]Block(nil), e.blocks...)
			tc.edit(&blocks[i])
			n, err := checkPrefix(t, bytes.NewReader(e.pages), blocks, data, DecodeOptions{Threads: 0})
			var be *BlockError
			if !errors.As(err, &be) || be.Index != i || !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want a BlockError for block %d wrapping %v", err, i, tc.want)
			}
			if n != i {
				t.Errorf("%d blocks delivered, want %d", n, i)
			}
		})
	}
}

func TestDecodeTruncated(t *testing.T) {
	const bs = 64 << 10
	data, e := mixedImage(t, bs)
	// Blocks 4 to 11 are Raw (random, then bf16), read with one ReadAt;
	// blocks 12 to 15 are LZ4.
	for _, i := range []int{len(e.blocks) - 1, 13, 12, 6, 4} {
		blk := e.blocks[i]
		if blk.Kind == Zero {
			t.Fatalf("block %d is Zero", i)
		}
		cut := blk.Off + int64(blk.StoredLen)/2
		n, err := checkPrefix(t, bytes.NewReader(e.pages[:cut]), e.blocks, data, DecodeOptions{Threads: 2})
		var be *BlockError
		if !errors.As(err, &be) || be.Index != i || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("cut in block %d: %v, want a BlockError for it wrapping io.ErrUnexpectedEOF", i, err)
		}
		if n != i {
			t.Errorf("cut in block %d: %d blocks delivered, want %d", i, n, i)
		}
	}
}

// countingReader counts ReadAt calls and can block or fail them.
type countingReader struct {
	r     io.ReaderAt
	calls atomic.Int64
	hook  func(n int64)
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n := c.calls.Add(1)
	if c.hook != nil {
		c.hook(n)
	}
	return c.r.ReadAt(p, off)
}

func TestDecodeCoalesce(t *testing.T) {
	const bs = 64 << 10
	data := genData(dataRecords, 32*bs, 5)
	e := encodeAll(t, data, bs, 2, Compress)
	cr := &countingReader{r: bytes.NewReader(e.pages)}
	got, err := decodeAll(t, nil, nil, DecodeOptions{}) // empty input: no calls
	if err != nil || len(got) != 0 {
		t.Fatalf("empty decode: %d bytes, %v", len(got), err)
	}
	err = DecodeBlocks(context.Background(), cr, e.blocks, DecodeOptions{BatchBytes: 8 * bs},
		func(int, [][]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if c := cr.calls.Load(); c != 4 {
		t.Errorf("%d ReadAt calls for 4 batches of contiguous LZ4 blocks, want 4", c)
	}

	// Raw blocks are read in place, a run of them with one ReadAt.
	raw := encodeAll(t, genData(dataRandom, 32*bs, 5), bs, 2, Compress)
	cr = &countingReader{r: bytes.NewReader(raw.pages)}
	err = DecodeBlocks(context.Background(), cr, raw.blocks, DecodeOptions{BatchBytes: 8 * bs},
		func(int, [][]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if c := cr.calls.Load(); c != 4 {
		t.Errorf("%d ReadAt calls for 4 batches of contiguous Raw blocks, want 4", c)
	}

	// Spread the blocks apart by more than maxGap: one read per block.
	blocks := append([]Block(nil), e.blocks...)
	spread := make([]byte, 0, len(e.pages)+len(blocks)*2*maxGap)
	for i := range blocks {
		b := &blocks[i]
		stored := e.pages[b.Off : b.Off+int64(b.StoredLen)]
		spread = append(spread, make([]byte, 2*maxGap)...)
		b.Off = int64(len(spread))
		spread = append(spread, stored...)
	}
	cr = &countingReader{r: bytes.NewReader(spread)}
	n, err := checkPrefix(t, cr, blocks, data, DecodeOptions{BatchBytes: 8 * bs})
	if err != nil || n != len(blocks) {
		t.Fatalf("spread blocks: %d delivered, %v", n, err)
	}
	if c := cr.calls.Load(); c != int64(len(blocks)) {
		t.Errorf("%d ReadAt calls for %d spread blocks", c, len(blocks))
	}
}

func TestDecodeFnError(t *testing.T) {
	_, e := mixedImage(t, 64<<10)
	boom := errors.New("boom")
	calls := 0
	err := DecodeBlocks(context.Background(), bytes.NewReader(e.pages), e.blocks,
		DecodeOptions{BatchBytes: 64 << 10}, func(int, [][]byte) error {
			calls++
			if calls == 2 {
				return boom
			}
			return nil
		})
	if err != boom || calls != 2 {
		t.Errorf("error %v after %d calls, want %v after 2", err, calls, boom)
	}
}

func TestDecodeCancel(t *testing.T) {
	_, e := mixedImage(t, 64<<10)
	opts := DecodeOptions{Threads: 2, BatchBytes: 64 << 10}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := DecodeBlocks(ctx, bytes.NewReader(e.pages), e.blocks, opts,
		func(int, [][]byte) error { t.Error("fn called after cancel"); return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled before start: %v", err)
	}

	// Cancel from fn: no further batch is handed over.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	err = DecodeBlocks(ctx, bytes.NewReader(e.pages), e.blocks, opts, func(int, [][]byte) error {
		calls++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("cancel in fn: %v after %d calls, want context.Canceled after 1", err, calls)
	}

	// Cancel while the reader is slow: DecodeBlocks returns after the read
	// in progress, not after the whole input.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	cr := &countingReader{r: bytes.NewReader(e.pages), hook: func(n int64) {
		if n == 2 {
			cancel()
		}
		time.Sleep(10 * time.Millisecond)
	}}
	start := time.Now()
	err = DecodeBlocks(ctx, cr, e.blocks, opts, func(int, [][]byte) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancel in read: %v", err)
	}
	if c := cr.calls.Load(); c > 3 {
		t.Errorf("%d reads after cancel, want at most 3", c)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("cancel took %v", d)
	}
}

func TestZeroChecksum(t *testing.T) {
	for _, n := range []int{0, 1, 100, PageSize, 3 * PageSize, 64 << 10, 100 << 10, MaxBlockSize, MaxBlockSize + 5} {
		for range 2 { // computed, then memoized
			if got, want := ZeroChecksum(n), Checksum(make([]byte, n)); got != want {
				t.Errorf("ZeroChecksum(%d) = %08x, want %08x", n, got, want)
			}
		}
	}
}

func TestThreads(t *testing.T) {
	const M = MinThreadBytes
	for _, tc := range []struct {
		opt, cpus int
		bytes     int64
		lz4       int
		want      int
	}{
		{1, 8, 32 * M, 32, 1},   // serial
		{-3, 8, 32 * M, 32, 1},  // negative: serial
		{0, 2, 32 * M, 32, 2},   // automatic: the CPUs
		{0, 8, 32 * M, 32, 8},   //
		{0, 1, 32 * M, 32, 1},   // one CPU
		{0, 8, 32 * M, 3, 3},    // no more than LZ4 blocks
		{0, 8, 3 * M, 32, 3},    // at least MinThreadBytes each
		{0, 8, M - 1, 32, 1},    // too little work
		{0, 8, 0, 0, 1},         // Zero and Raw only
		{4, 2, 32 * M, 32, 4},   // explicit maximum, above the CPUs
		{4, 2, 32 * M, 2, 2},    // still no more than LZ4 blocks
		{4, 2, 2 * M, 32, 2},    // nor than the work allows
		{64, 2, 32 * M, 32, 32}, //
		{2, 64, 32 * M, 32, 2},  // explicit maximum below the CPUs
		{16, 64, 4 * M, 1, 1},   // one big block
	} {
		if got := threads(tc.opt, tc.cpus, MinThreadBytes, tc.bytes, tc.lz4); got != tc.want {
			t.Errorf("threads(opt %d, cpus %d, %d bytes, %d lz4) = %d, want %d",
				tc.opt, tc.cpus, tc.bytes, tc.lz4, got, tc.want)
		}
	}
	if got := Threads(1, 32*M, 32); got != 1 {
		t.Errorf("Threads(1) = %d", got)
	}
	if got, cpus := Threads(0, 1<<40, 1<<20), affinityCPUs(); got != cpus {
		t.Errorf("Threads(0) with plenty of work = %d, want the %d CPUs", got, cpus)
	}
}
