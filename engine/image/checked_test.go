package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// memSource is memory served by someone else: the dumped ranges at their
// addresses, zeros elsewhere, with one byte changed at flip if set.
type memSource struct {
	ranges []memRange
	flip   uint64
}

func (m memSource) ReadAt(p []byte, off int64) (int, error) {
	copy(p, expected(m.ranges, uint64(off), uint64(off)+uint64(len(p))))
	if m.flip != 0 && m.flip >= uint64(off) && m.flip < uint64(off)+uint64(len(p)) {
		p[m.flip-uint64(off)] ^= 0x40
	}
	return len(p), nil
}

// TestChecked: reads through Checked of a source serving the dumped bytes
// equal them, for whole blocks, parts of blocks and holes; a source that
// changes one byte, in a block of any kind or in a hole, fails the reads
// that touch it, naming the block, and no other.
func TestChecked(t *testing.T) {
	ranges := uncachedRanges()
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	good := r.Checked(memSource{ranges: ranges})
	rng := rand.New(rand.NewPCG(3, 3))
	for range 200 {
		a := (0x0fff0000 + rng.Uint64N(0x10400000)) &^ 511
		n := 512 * (1 + rng.Uint64N(1000))
		got := make([]byte, n)
		if _, err := good.ReadAt(got, int64(a)); err != nil {
			t.Fatalf("ReadAt %#x+%#x: %v", a, n, err)
		}
		if !bytes.Equal(got, expected(ranges, a, a+n)) {
			t.Fatalf("ReadAt %#x+%#x differs from the memory dumped", a, n)
		}
	}
	for _, tc := range []struct {
		name string
		flip uint64
	}{
		{"raw block", 0x10000000 + 1000},
		{"zero block", 0x10000000 + 300<<10 + 5000},
		{"lz4 block", 0x20000000 + 100},
		{"hole", 0x18000000},
	} {
		bad := r.Checked(memSource{ranges: ranges, flip: tc.flip})
		page := tc.flip &^ 4095
		_, err := bad.ReadAt(make([]byte, 4096), int64(page))
		if !errors.Is(err, ErrSourceMismatch) || errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: a changed byte read as %v, want ErrSourceMismatch (and not ErrCorrupt)", tc.name, err)
		}
		// A read that does not touch its block is served.
		far := page + 1<<20
		if _, err := bad.ReadAt(make([]byte, 4096), int64(far)); err != nil {
			t.Errorf("%s: a read 1 MiB away failed: %v", tc.name, err)
		}
	}
}

// countingSource counts the reads that reach a source.
type countingSource struct {
	memSource
	mu    sync.Mutex
	reads int
}

func (c *countingSource) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.memSource.ReadAt(p, off)
}

// textRanges are uncachedRanges plus 256 KiB of text at 0x30000000:
// blocks stored LZ4, which have no page checksums.
func textRanges() []memRange {
	text := make([]byte, 256<<10)
	for i := range text {
		text[i] = "lazyfs-"[i%7]
	}
	return append(uncachedRanges(), memRange{addr: 0x30000000, data: text, brk: true})
}

// TestCheckedReadsOnce: a read of many small whole blocks is one read of
// the source; a big block read a piece at a time is read from the source
// once.
func TestCheckedReadsOnce(t *testing.T) {
	ranges := textRanges()
	for _, tc := range []struct {
		bs          int
		addr, n     uint64
		piece       uint64
		wantReads   int
		description string
	}{
		{4 << 10, 0x10000000, 256 << 10, 256 << 10, 1, "64 whole 4 KiB blocks in one read"},
		{64 << 10, 0x30000000, 256 << 10, 16 << 10, 4, "four 64 KiB LZ4 blocks read 16 KiB at a time"},
	} {
		dir := filepath.Join(t.TempDir(), "snap")
		writeSnapshot(t, dir, 42, ranges, Options{BlockSize: tc.bs})
		r := openReader(t, dir, 42, ReaderOptions{})
		src := &countingSource{memSource: memSource{ranges: ranges}}
		c := r.Checked(src)
		for a := tc.addr; a < tc.addr+tc.n; a += tc.piece {
			got := make([]byte, tc.piece)
			if _, err := c.ReadAt(got, int64(a)); err != nil {
				t.Fatalf("%s: ReadAt %#x: %v", tc.description, a, err)
			}
			if !bytes.Equal(got, expected(ranges, a, a+tc.piece)) {
				t.Fatalf("%s: ReadAt %#x differs", tc.description, a)
			}
		}
		if src.reads != tc.wantReads {
			t.Errorf("%s: %d reads of the source, want %d", tc.description, src.reads, tc.wantReads)
		}
	}
}

// slowSource holds every read a moment, so that reads overlap.
type slowSource struct{ *countingSource }

func (s slowSource) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(20 * time.Millisecond)
	return s.countingSource.ReadAt(p, off)
}

// TestCheckedConcurrentParts: readers of the parts of one block at once
// (prefetch workers) read it from the source once between them.
func TestCheckedConcurrentParts(t *testing.T) {
	ranges := textRanges()
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	src := &countingSource{memSource: memSource{ranges: ranges}}
	c := r.Checked(slowSource{src})
	var wg sync.WaitGroup
	for i := range uint64(4) {
		wg.Go(func() {
			a := 0x30000000 + i*16<<10
			got := make([]byte, 16<<10)
			if _, err := c.ReadAt(got, int64(a)); err != nil {
				t.Errorf("ReadAt %#x: %v", a, err)
			} else if !bytes.Equal(got, expected(ranges, a, a+16<<10)) {
				t.Errorf("ReadAt %#x differs", a)
			}
		})
	}
	wg.Wait()
	if src.reads != 1 {
		t.Errorf("%d reads of the source for four parts of one block read at once, want 1", src.reads)
	}
}

// TestCheckedPages: a part of a Raw block, whose pages have checksums of
// their own, is read from the source alone (the pages that hold it) and
// checked page by page: a changed byte fails the reads of its page and no
// other page of the block.
func TestCheckedPages(t *testing.T) {
	ranges := uncachedRanges()
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	b, _ := r.BlockAt(0x10000000)
	if !r.PageChecked(b) {
		t.Fatalf("block %+v of random bytes is not checked page by page", b)
	}
	src := &bytesSource{countingSource: countingSource{memSource: memSource{ranges: ranges}}}
	c := r.Checked(src)
	for _, rd := range []struct{ a, n uint64 }{{0x10000000, 4096}, {0x10000000 + 8192, 16 << 10}, {0x10000000 + 100, 10}, {0x10000000 + 60<<10 + 7, 4096}} {
		src.bytes = 0
		got := make([]byte, rd.n)
		if _, err := c.ReadAt(got, int64(rd.a)); err != nil {
			t.Fatalf("ReadAt %#x+%d: %v", rd.a, rd.n, err)
		}
		if !bytes.Equal(got, expected(ranges, rd.a, rd.a+rd.n)) {
			t.Fatalf("ReadAt %#x+%d differs", rd.a, rd.n)
		}
		if want := int((rd.a+rd.n+4095)&^4095 - rd.a&^4095); src.bytes != want {
			t.Errorf("ReadAt %#x+%d read %d bytes of the source, want %d (its pages)", rd.a, rd.n, src.bytes, want)
		}
	}
	bad := r.Checked(memSource{ranges: ranges, flip: 0x10000000 + 3*4096 + 17})
	if _, err := bad.ReadAt(make([]byte, 100), 0x10000000+3*4096+1000); !errors.Is(err, ErrSourceMismatch) {
		t.Errorf("a changed byte in the page read: %v, want ErrSourceMismatch", err)
	}
	if _, err := bad.ReadAt(make([]byte, 3*4096), 0x10000000); err != nil {
		t.Errorf("the pages before the changed one: %v", err)
	}
}

// bytesSource counts the bytes read from a source.
type bytesSource struct {
	countingSource
	bytes int
}

func (b *bytesSource) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	b.bytes += len(p)
	b.mu.Unlock()
	return b.countingSource.ReadAt(p, off)
}
