package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
)

// uncachedRanges are runs with a hole between the first two and none
// between the last two (a VMA boundary: runs that touch): random (Raw),
// zero (Zero) and repetitive (LZ4) stretches.
func uncachedRanges() []memRange {
	mk := func(n int, kind string) []byte {
		b := make([]byte, n)
		switch kind {
		case "random":
			synth("random", b, uint64(n))
		case "text":
			for i := range b {
				b[i] = "lazyfs-"[i%7]
			}
		}
		return b
	}
	return []memRange{
		{addr: 0x10000000, data: append(append(mk(300<<10, "random"), mk(128<<10, "zero")...), mk(100<<10, "text")...)},
		{addr: 0x20000000, data: append(mk(64<<10, "text"), mk(200<<10, "random")...)},
		{addr: 0x20000000 + 264<<10, data: mk(64<<10, "random"), brk: true},
	}
}

// TestUncachedMatchesReadAt: the uncached reader reads what ReadAt reads,
// for whole blocks, batches of Raw blocks, parts of blocks and holes.
func TestUncachedMatchesReadAt(t *testing.T) {
	ranges := uncachedRanges()
	for _, bs := range []int{4 << 10, 64 << 10} {
		dir := filepath.Join(t.TempDir(), "snap")
		writeSnapshot(t, dir, 42, ranges, Options{BlockSize: bs})
		r := openReader(t, dir, 42, ReaderOptions{})
		kinds := map[codec.Kind]int{}
		for b := range r.Blocks() {
			kinds[b.Kind]++
		}
		if kinds[codec.Raw] < 2 || kinds[codec.Zero] == 0 || kinds[codec.LZ4] == 0 {
			t.Fatalf("block size %d: kinds %v, want every kind", bs, kinds)
		}
		u := r.Uncached()
		rng := rand.New(rand.NewPCG(7, 7))
		cases := [][2]uint64{
			{0x10000000, 300 << 10},             // Raw blocks, one batch
			{0x10000000, 528 << 10},             // the whole first run
			{0x10000000 + 5000, 100000},         // parts of blocks
			{0x10000000 + 500<<10, 0x100000},    // across the end of the run into the hole
			{0x0fff0000, 0x20000},               // a hole, then data
			{0x20000000, 264 << 10},             // LZ4 then Raw
			{0x20000000 + 64<<10 - 4096, 12288}, // the edge between them
			{0x20000000 + 200<<10, 128 << 10},   // Raw blocks of two runs that touch
			{0x20000000 + 328<<10, 4096},        // after the last run
		}
		for range 50 {
			a := 0x10000000 + rng.Uint64N(0x10100000)
			cases = append(cases, [2]uint64{a &^ 4095, 4096 * (1 + rng.Uint64N(200))})
		}
		for _, c := range cases {
			want := expected(ranges, c[0], c[0]+c[1])
			got := bytes.Repeat([]byte{0xa5}, int(c[1])) // holes must be cleared
			if n, err := u.ReadAt(got, int64(c[0])); err != nil || n != len(got) {
				t.Fatalf("block size %d: ReadAt %#x+%#x = %d, %v", bs, c[0], c[1], n, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("block size %d: uncached ReadAt %#x+%#x differs from the memory dumped", bs, c[0], c[1])
			}
			cached := make([]byte, c[1])
			if _, err := r.ReadAt(cached, int64(c[0])); err != nil || !bytes.Equal(cached, got) {
				t.Fatalf("block size %d: ReadAt %#x+%#x: %v, or the cached and uncached reads differ", bs, c[0], c[1], err)
			}
		}
		if _, err := u.ReadAt(make([]byte, 1), -1); err == nil {
			t.Errorf("ReadAt at a negative address: no error")
		}
	}
}

// TestUncachedConcurrent: concurrent readers of the same blocks (as the
// pager's workers) all read the memory dumped (run with -race).
func TestUncachedConcurrent(t *testing.T) {
	ranges := uncachedRanges()
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 4 << 10})
	u := openReader(t, dir, 42, ReaderOptions{}).Uncached()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			for range 100 {
				a := uint64(0x10000000) + rng.Uint64N(600<<10)
				n := 1 + rng.Uint64N(64<<10)
				got := make([]byte, n)
				if _, err := u.ReadAt(got, int64(a)); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, expected(ranges, a, a+n)) {
					errs <- errors.New("a concurrent read differs from the memory dumped")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestUncachedCorrupt: a flipped byte in a block is an error naming that
// block, never bytes: in a Raw block inside a batch, in a Raw block read
// in part, and in an LZ4 block; the cached ReadAt reports the same block.
func TestUncachedCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind codec.Kind
		nth  int    // the nth block of that kind
		off  uint64 // read from the block's address + off
	}{
		{"raw in a batch", codec.Raw, 3, 0},
		{"raw in part", codec.Raw, 3, 100},
		{"lz4", codec.LZ4, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			writeSnapshot(t, dir, 42, uncachedRanges(), Options{BlockSize: 4 << 10})
			r := openReader(t, dir, 42, ReaderOptions{})
			var bad Block
			n := 0
			for b := range r.Blocks() {
				if b.Kind == tc.kind {
					if n == tc.nth {
						bad = b
						break
					}
					n++
				}
			}
			if bad.Len == 0 {
				t.Fatalf("no %v block %d", tc.kind, tc.nth)
			}
			f, err := os.OpenFile(filepath.Join(dir, r.Name()), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			one := []byte{0}
			f.ReadAt(one, int64(bad.Off)+10)
			one[0] ^= 0xff
			f.WriteAt(one, int64(bad.Off)+10)
			f.Close()
			for name, ra := range map[string]interface {
				ReadAt([]byte, int64) (int, error)
			}{"uncached": r.Uncached(), "cached": r} {
				start := bad.Addr + tc.off
				if tc.kind == codec.Raw && tc.off == 0 {
					start = bad.Addr - 2*uint64(bad.Len) // the batch starts before it
				}
				buf := make([]byte, 64<<10)
				_, err := ra.ReadAt(buf, int64(start))
				var be *BlockError
				if !errors.As(err, &be) || be.Block != bad.Index || be.Addr != bad.Addr || be.File != r.Name() {
					t.Fatalf("%s ReadAt over a corrupt block: %v, want a BlockError naming block %d", name, err, bad.Index)
				}
				if want := (error)(codec.ErrChecksum); tc.kind == codec.Raw && !errors.Is(err, want) {
					t.Fatalf("%s ReadAt over a corrupt Raw block: %v, want %v", name, err, want)
				}
			}
		})
	}
}

// TestUncachedTruncated: a pages file cut short is an error naming the
// block, wrapping io.ErrUnexpectedEOF.
func TestUncachedTruncated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	ranges := uncachedRanges()
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	var last Block
	for b := range r.Blocks() {
		if b.Kind == codec.Raw {
			last = b
		}
	}
	if err := os.Truncate(filepath.Join(dir, r.Name()), int64(last.Off)+100); err != nil {
		t.Fatal(err)
	}
	_, err := r.Uncached().ReadAt(make([]byte, last.Len), int64(last.Addr))
	var be *BlockError
	if !errors.As(err, &be) || be.Block != last.Index {
		t.Fatalf("ReadAt of a truncated block: %v, want a BlockError naming block %d", err, last.Index)
	}
}

func TestDumpedIn(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, uncachedRanges(), Options{BlockSize: 4 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	for _, c := range []struct{ lo, hi, want uint64 }{
		{0, 1 << 40, 528<<10 + 328<<10},
		{0x10000000, 0x10000000 + 528<<10, 528 << 10},
		{0x10000000 + 4096, 0x20000000 + 4096, 528<<10 - 4096 + 4096},
		{0x10100000, 0x20000000, 0},
		{0x20000000 + 100, 0x20000000 + 200, 100},
		{0x20000000 + 200, 0x20000000 + 100, 0},
	} {
		if got := r.DumpedIn(c.lo, c.hi); got != c.want {
			t.Errorf("DumpedIn(%#x, %#x) = %d, want %d", c.lo, c.hi, got, c.want)
		}
	}
}

func TestManifestJSON(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, uncachedRanges(), Options{BlockSize: 4 << 10})
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.ManifestJSON(), want) {
		t.Errorf("ManifestJSON differs from %s", ManifestName)
	}
}

// BenchmarkReadAt reads 128 MiB of memory (¾ random, stored Raw; ¼
// repetitive, LZ4) in 1 MiB reads, as a lazy restore's prefetch does,
// through the cached ReadAt and through Uncached; the pages file is in the
// page cache.
func BenchmarkReadAt(b *testing.B) {
	const size = 128 << 20
	data := make([]byte, size)
	synth("random", data[:size*3/4], 1)
	for i := size * 3 / 4; i < size; i++ {
		data[i] = "lazyfs-"[i%7]
	}
	ranges := []memRange{{addr: 0x10000000, data: data}}
	for _, bs := range []struct {
		name string
		size int
	}{{"4K", 4 << 10}, {"256K", 256 << 10}} {
		dir := filepath.Join(b.TempDir(), "snap")
		writeSnapshot(b, dir, 42, ranges, Options{BlockSize: bs.size})
		r := openReader(b, dir, 42, ReaderOptions{})
		for _, mode := range []struct {
			name string
			ra   interface {
				ReadAt([]byte, int64) (int, error)
			}
		}{{"cached", r}, {"uncached", r.Uncached()}} {
			b.Run(bs.name+"/"+mode.name, func(b *testing.B) {
				buf := make([]byte, 1<<20)
				b.SetBytes(size)
				for range b.N {
					for off := uint64(0); off < size; off += uint64(len(buf)) {
						if _, err := mode.ra.ReadAt(buf, int64(0x10000000+off)); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// TestPageReads: with 64 KiB blocks, a part of a Raw block is read, by the
// uncached and the cached reader, from its pages alone and checked page by
// page: a changed byte in the pages file fails reads of its page, naming
// the block, and not reads of the block's other pages; whole-block reads
// still check the whole block. The page-checksum file itself is checked
// like every file of the snapshot.
func TestPageReads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	ranges := uncachedRanges()
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	b, _ := r.BlockAt(0x10000000 + 64<<10)
	if !r.PageChecked(b) {
		t.Fatalf("block %+v not checked page by page", b)
	}
	if lo, hi, ok := r.Unit(b.Addr+5000, 4096); !ok || lo != b.Addr+4096 || hi != b.Addr+8192 {
		t.Errorf("Unit in a page-checked block: %#x-%#x %v, want its page", lo, hi, ok)
	}
	if lz, _ := r.BlockAt(0x20000000); r.PageChecked(lz) {
		t.Errorf("LZ4 block %+v checked page by page", lz)
	} else if lo, hi, _ := r.Unit(lz.Addr+5000, 4096); lo != lz.Addr || hi != lz.End() {
		t.Errorf("Unit in an LZ4 block: %#x-%#x, want the block", lo, hi)
	}
	if lo, hi, _ := r.Unit(b.Addr+40<<10, 32<<10); lo != b.Addr+32<<10 || hi != b.Addr+64<<10 {
		t.Errorf("Unit of 32 KiB in a page-checked block: %#x-%#x, want the aligned window", lo-b.Addr, hi-b.Addr)
	}
	f, err := os.OpenFile(filepath.Join(dir, r.Name()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	one := []byte{0}
	f.ReadAt(one, int64(b.Off)+2*4096+10)
	one[0] ^= 0xff
	f.WriteAt(one, int64(b.Off)+2*4096+10)
	f.Close()
	for name, ra := range map[string]interface {
		ReadAt([]byte, int64) (int, error)
	}{"uncached": r.Uncached(), "cached": r} {
		got := make([]byte, 2*4096)
		if _, err := ra.ReadAt(got, int64(b.Addr)); err != nil {
			t.Errorf("%s: the pages before the corrupt one: %v", name, err)
		} else if !bytes.Equal(got, expected(ranges, b.Addr, b.Addr+8192)) {
			t.Errorf("%s: the pages before the corrupt one differ", name)
		}
		var be *BlockError
		if _, err := ra.ReadAt(make([]byte, 100), int64(b.Addr+2*4096+50)); !errors.As(err, &be) || be.Block != b.Index || !errors.Is(err, codec.ErrChecksum) {
			t.Errorf("%s: a read in the corrupt page: %v, want a checksum BlockError naming block %d", name, err, b.Index)
		}
		if _, err := ra.ReadAt(make([]byte, b.Len), int64(b.Addr)); !errors.Is(err, codec.ErrChecksum) {
			t.Errorf("%s: the whole corrupt block: %v, want a checksum error", name, err)
		}
	}
	// A changed page-checksum file is refused when the reader opens.
	crcFile := filepath.Join(dir, pageCRCName(42))
	data, err := os.ReadFile(crcFile)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 1
	if err := os.WriteFile(crcFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.OpenPages(42, ReaderOptions{}); !errors.Is(err, ErrManifestMismatch) {
		t.Errorf("open with a changed page-checksum file: %v, want ErrManifestMismatch", err)
	}
}

// TestMixed: Mixed reads what ReadAt reads, asking the decoded source only
// for the LZ4 blocks (in runs), never for Raw blocks, Zero blocks or holes.
func TestMixed(t *testing.T) {
	ranges := textRanges()
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 42, ReaderOptions{})
	var lz4 uint64
	for b := range r.Blocks() {
		if b.Kind == codec.LZ4 {
			lz4 += uint64(b.Len)
		}
	}
	src := &bytesSource{countingSource: countingSource{memSource: memSource{ranges: ranges}}}
	m := r.Mixed(r.Checked(src))
	var got, want []byte
	for _, rg := range []struct{ a, n uint64 }{{0x0fff0000, 0x00100000}, {0x10000000, 700 << 10}, {0x1ffff000, 2 << 20}, {0x30000000 + 5000, 200 << 10}, {0x10000000 + 100, 10}} {
		got = make([]byte, rg.n)
		if _, err := m.ReadAt(got, int64(rg.a)); err != nil {
			t.Fatalf("ReadAt %#x+%#x: %v", rg.a, rg.n, err)
		}
		if want = expected(ranges, rg.a, rg.a+rg.n); !bytes.Equal(got, want) {
			t.Fatalf("ReadAt %#x+%#x differs from the memory dumped", rg.a, rg.n)
		}
	}
	src.bytes, src.reads = 0, 0
	for b := range r.Blocks() {
		buf := make([]byte, b.Len)
		if _, err := m.ReadAt(buf, int64(b.Addr)); err != nil {
			t.Fatal(err)
		}
	}
	if uint64(src.bytes) != lz4 || lz4 == 0 {
		t.Errorf("read %d bytes from the decoded source block by block, want the %d of the LZ4 blocks", src.bytes, lz4)
	}
}
