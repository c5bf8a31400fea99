package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

var blockSizes = []int{4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dM", n>>20)
	}
	return fmt.Sprintf("%dK", n>>10)
}

// segmented returns zero, random, bf16 and records memory, each segment a
// whole number of blocks of bs bytes, so every block is of one data kind.
func segmented(bs int) []byte {
	seg := max(bs, 256<<10)
	kinds := []dataKind{dataZero, dataRandom, dataBF16, dataRecords, dataZero, dataRecords}
	data := make([]byte, 0, len(kinds)*seg)
	for i, k := range kinds {
		data = append(data, genData(k, seg, uint64(i+1))...)
	}
	return data
}

func TestRoundTrip(t *testing.T) {
	for _, bs := range blockSizes {
		t.Run(sizeName(bs), func(t *testing.T) {
			data := segmented(bs)
			e := encodeAll(t, data, bs, 4, Compress)
			if want := len(data) / bs; len(e.blocks) != want {
				t.Fatalf("%d blocks, want %d", len(e.blocks), want)
			}
			if e.kinds[Zero] == 0 || e.kinds[Raw] == 0 || e.kinds[LZ4] == 0 {
				t.Errorf("kinds zero/raw/lz4 = %v, want each present", e.kinds)
			}
			for _, opts := range []DecodeOptions{
				{Threads: 1},
				{Threads: 0},
				{Threads: 2, BatchBytes: 3 * bs}, // many batches
				{Threads: 8, BatchBytes: 1},      // one block per batch
			} {
				got, err := decodeAll(t, e.pages, e.blocks, opts)
				if err != nil {
					t.Fatalf("%+v: decode: %v", opts, err)
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("%+v: decoded bytes differ from the input", opts)
				}
			}
		})
	}
}

func TestKinds(t *testing.T) {
	const bs = DefaultBlockSize
	for _, tc := range []struct {
		data dataKind
		mode Mode
		want Kind
	}{
		{dataZero, Compress, Zero},
		{dataRandom, Compress, Raw},
		{dataBF16, Compress, Raw},
		{dataRecords, Compress, LZ4},
		{dataZero, NoCompress, Zero},
		{dataRecords, NoCompress, Raw},
	} {
		data := genData(tc.data, 4*bs, 7)
		e := encodeAll(t, data, bs, 2, tc.mode)
		for i, b := range e.blocks {
			if b.Kind != tc.want {
				t.Errorf("%s mode %d: block %d is %v, want %v", tc.data, tc.mode, i, b.Kind, tc.want)
			}
			if b.Kind == LZ4 && 8*b.StoredLen >= 7*b.Len {
				t.Errorf("%s: lz4 block %d keeps %d of %d bytes", tc.data, i, b.StoredLen, b.Len)
			}
		}
	}
}

// TestPipelineOrder submits many small blocks of very different encoding
// cost to many workers and checks that emit sees them in order.
func TestPipelineOrder(t *testing.T) {
	kinds := []dataKind{dataZero, dataRecords, dataRandom, dataRecords, dataBF16}
	var data []byte
	for i := range 400 {
		data = append(data, genData(kinds[i%len(kinds)], PageSize*(1+i%3), uint64(i))...)
	}
	next, off := 0, 0
	emit := func(b *Encoded) error {
		i := b.Tag.(int)
		if i != next {
			return fmt.Errorf("emitted block %d, want %d", i, next)
		}
		n := PageSize * (1 + i%3)
		if &b.Src[0] != &data[off] || len(b.Src) != n {
			return fmt.Errorf("block %d: Src is not the submitted slice", i)
		}
		if b.CRC != Checksum(b.Src) {
			return fmt.Errorf("block %d: crc %08x, want %08x", i, b.CRC, Checksum(b.Src))
		}
		dst := make([]byte, n)
		if err := DecodeChecked(dst, b.Kind, b.Stored, b.CRC); err != nil {
			return fmt.Errorf("block %d: %w", i, err)
		}
		next++
		off += n
		return nil
	}
	p := NewPipeline(context.Background(), PipelineOptions{Workers: 8}, emit)
	pos := 0
	for i := range 400 {
		n := PageSize * (1 + i%3)
		if err := p.Submit(data[pos:pos+n], i); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		pos += n
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if next != 400 {
		t.Fatalf("emitted %d blocks, want 400", next)
	}
	if err := p.Submit(data[:PageSize], 0); !errors.Is(err, ErrClosed) {
		t.Errorf("submit after close: %v, want ErrClosed", err)
	}
}

func TestPipelineEmitError(t *testing.T) {
	boom := errors.New("boom")
	emitted := 0
	p := NewPipeline(context.Background(), PipelineOptions{Workers: 2}, func(b *Encoded) error {
		emitted++
		if b.Tag.(int) == 5 {
			return boom
		}
		return nil
	})
	data := genData(dataRecords, 64*PageSize, 1)
	var submitErr error
	for i := range 64 {
		if submitErr = p.Submit(data[i*PageSize:(i+1)*PageSize], i); submitErr != nil {
			break
		}
	}
	if err := p.Close(); !errors.Is(err, boom) {
		t.Errorf("close: %v, want %v", err, boom)
	}
	if submitErr != nil && !errors.Is(submitErr, boom) {
		t.Errorf("submit: %v, want %v", submitErr, boom)
	}
	if emitted != 6 {
		t.Errorf("emit called %d times, want 6 (none after the error)", emitted)
	}
}

// TestPipelineBackpressure checks that Submit blocks once 2*Workers+2
// blocks are in flight, and that cancelling the context unblocks it.
func TestPipelineBackpressure(t *testing.T) {
	const workers = 3
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	p := NewPipeline(ctx, PipelineOptions{Workers: workers}, func(*Encoded) error {
		<-release
		return nil
	})
	data := genData(dataRecords, PageSize, 1)
	submitted := make(chan int, 100)
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := p.Submit(data, i); err != nil {
				done <- err
				return
			}
			submitted <- i
		}
	}()
	n := 0
	deadline := time.After(5 * time.Second)
	for n < 2*workers+2 {
		select {
		case <-submitted:
			n++
		case <-deadline:
			t.Fatalf("only %d blocks submitted, want %d", n, 2*workers+2)
		}
	}
	select {
	case i := <-submitted:
		t.Fatalf("block %d submitted with %d in flight and emit blocked", i, n)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("submit after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("submit still blocked after cancel")
	}
	close(release)
	if err := p.Close(); !errors.Is(err, context.Canceled) {
		t.Errorf("close: %v, want context.Canceled", err)
	}
}

func TestPipelineSubmitSize(t *testing.T) {
	p := NewPipeline(context.Background(), PipelineOptions{Workers: 1}, func(*Encoded) error { return nil })
	defer p.Close()
	for _, n := range []int{0, 100, PageSize + 1, MaxBlockSize + PageSize} {
		if err := p.Submit(make([]byte, n), nil); err == nil {
			t.Errorf("submit of %d bytes accepted", n)
		}
	}
}

// TestPipelineBufferReuse checks that an LZ4 buffer is not overwritten while
// emit still holds it: emit copies Stored after a pause, during which the
// workers encode further blocks.
func TestPipelineBufferReuse(t *testing.T) {
	data := genData(dataRecords, 64*PageSize, 3)
	p := NewPipeline(context.Background(), PipelineOptions{Workers: 2}, func(b *Encoded) error {
		if b.Kind != LZ4 {
			return fmt.Errorf("kind %v", b.Kind)
		}
		before := bytes.Clone(b.Stored)
		time.Sleep(time.Millisecond)
		if !bytes.Equal(before, b.Stored) {
			return errors.New("stored bytes changed during emit")
		}
		dst := make([]byte, len(b.Src))
		return DecodeChecked(dst, b.Kind, b.Stored, b.CRC)
	})
	for i := range 64 {
		if err := p.Submit(data[i*PageSize:(i+1)*PageSize], i); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
