package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/codec"
)

// synth fills b with one kind of synthetic memory.
func synth(kind string, b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	switch kind {
	case "zero":
		clear(b)
	case "random":
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], r.Uint64())
		}
	case "bf16":
		// 16-bit weights: high byte from a narrow range, low byte random.
		for i := 0; i+2 <= len(b); i += 2 {
			b[i] = byte(r.Uint32())
			b[i+1] = 0x3c + byte(r.IntN(4))
		}
	case "records":
		// heap-like: 64-byte records with pointers, small ints, strings.
		for i := 0; i+64 <= len(b); i += 64 {
			binary.LittleEndian.PutUint64(b[i:], 0x7f3a00000000+uint64(r.IntN(1<<20))*64)
			binary.LittleEndian.PutUint64(b[i+8:], uint64(r.IntN(1000)))
			copy(b[i+16:], fmt.Sprintf("key:%08d", r.IntN(100000)))
			clear(b[i+28 : i+64])
		}
	default:
		panic(kind)
	}
}

// memRange is a range of synthetic memory added to an image.
type memRange struct {
	addr uint64
	data []byte
	brk  bool // start a new run even if contiguous
}

// layoutRanges returns ranges with holes, touching runs and all kinds.
func layoutRanges(seed uint64) []memRange {
	kinds := []string{"zero", "random", "bf16", "records"}
	var out []memRange
	addr := uint64(0x7f0000000000) + 3*PageSize // not block aligned
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < 10; i++ {
		pages := 1 + r.IntN(160)
		b := make([]byte, pages*PageSize)
		// mix kinds inside a range, page-chunk by page-chunk
		for off := 0; off < len(b); {
			n := min(len(b)-off, (1+r.IntN(80))*PageSize)
			synth(kinds[r.IntN(len(kinds))], b[off:off+n], seed+uint64(i*1000+off))
			off += n
		}
		out = append(out, memRange{addr: addr, data: b, brk: i%4 == 3})
		addr += uint64(len(b))
		if i%4 != 2 { // every fourth range touches the next
			addr += uint64(1+r.IntN(50)) * PageSize
		}
	}
	return out
}

func writeSnapshot(t testing.TB, dir string, pid int, ranges []memRange, opts Options) Stats {
	t.Helper()
	w, err := Create(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	pw, err := w.Pages(context.Background(), pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, mr := range ranges {
		if mr.brk {
			pw.Break()
		}
		err := pw.Add(mr.addr, uint64(len(mr.data)), func(dst []byte, a uint64) error {
			copy(dst, mr.data[a-mr.addr:])
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteState(&Process{PID: pid, Comm: "synth", Threads: []Thread{{TID: pid}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return pw.Stats()
}

// expected returns the memory the image should read back in [lo, hi).
func expected(ranges []memRange, lo, hi uint64) []byte {
	out := make([]byte, hi-lo)
	for _, mr := range ranges {
		s, e := max(lo, mr.addr), min(hi, mr.addr+uint64(len(mr.data)))
		if s < e {
			copy(out[s-lo:e-lo], mr.data[s-mr.addr:e-mr.addr])
		}
	}
	return out
}

func openReader(t testing.TB, dir string, pid int, opts ReaderOptions) *Reader {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenPages(pid, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

var blockSizes = []int{4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}

func TestRoundTrip(t *testing.T) {
	ranges := layoutRanges(1)
	lo := ranges[0].addr - 2*PageSize
	last := ranges[len(ranges)-1]
	hi := last.addr + uint64(len(last.data)) + 2*PageSize
	want := expected(ranges, lo, hi)
	for _, bs := range blockSizes {
		for _, mode := range []codec.Mode{codec.Compress, codec.NoCompress} {
			t.Run(fmt.Sprintf("bs=%d/mode=%d", bs, mode), func(t *testing.T) {
				dir := t.TempDir()
				ws := writeSnapshot(t, dir, 42, ranges, Options{BlockSize: bs, Mode: mode, Workers: 3})
				for _, threads := range []int{1, 0} {
					r := openReader(t, dir, 42, ReaderOptions{Cache: cache.New(8 << 20), Threads: threads, Readahead: threads == 0})
					if rs := r.Stats(); rs != ws {
						t.Fatalf("reader stats %+v, writer stats %+v", rs, ws)
					}
					if mode == codec.NoCompress && r.Stats().LZ4.Blocks != 0 {
						t.Fatalf("--no-compress image holds %d LZ4 blocks", r.Stats().LZ4.Blocks)
					}
					got := make([]byte, hi-lo)
					if _, err := r.ReadAt(got, int64(lo)); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("whole read differs at %d", firstDiff(got, want))
					}
					// reads at every alignment, many lengths, straddling blocks and runs
					rnd := rand.New(rand.NewPCG(uint64(bs), 3))
					for i := 0; i < 250; i++ {
						off := uint64(rnd.IntN(len(want)))
						n := rnd.IntN(min(len(want)-int(off), 3*bs+PageSize)) + 1
						if i%5 == 0 { // straddle a block boundary
							b := ((lo+off)/uint64(bs) + 1) * uint64(bs)
							if b > lo+7 && b-7 < hi {
								off = b - 7 - lo
								n = min(len(want)-int(off), 14+rnd.IntN(bs))
							}
						}
						buf := make([]byte, n)
						if _, err := r.ReadAt(buf, int64(lo+off)); err != nil {
							t.Fatal(err)
						}
						if !bytes.Equal(buf, want[off:off+uint64(n)]) {
							t.Fatalf("read %#x+%d differs at %d", lo+off, n, firstDiff(buf, want[off:]))
						}
					}
					// Stream hands back every block in order
					var streamed uint64
					err := r.Stream(context.Background(), 0, ^uint64(0), false, func(c []Chunk) error {
						for _, x := range c {
							if !bytes.Equal(x.Data, expected(ranges, x.Addr, x.Addr+uint64(len(x.Data)))) {
								return fmt.Errorf("streamed block at %#x differs", x.Addr)
							}
							streamed += uint64(len(x.Data))
						}
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					if streamed != r.Stats().Total.Bytes {
						t.Fatalf("streamed %d bytes, image holds %d", streamed, r.Stats().Total.Bytes)
					}
					if err := r.Verify(context.Background(), nil); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestKindsFollowTheRule(t *testing.T) {
	mk := func(kind string) memRange {
		b := make([]byte, 64*PageSize)
		synth(kind, b, 9)
		return memRange{data: b}
	}
	for kind, want := range map[string]codec.Kind{"zero": codec.Zero, "random": codec.Raw, "bf16": codec.Raw, "records": codec.LZ4} {
		mr := mk(kind)
		mr.addr = 1 << 30
		dir := t.TempDir()
		s := writeSnapshot(t, dir, 1, []memRange{mr}, Options{BlockSize: 64 << 10})
		var k KindStats
		switch want {
		case codec.Zero:
			k = s.Zero
		case codec.Raw:
			k = s.Raw
		case codec.LZ4:
			k = s.LZ4
		}
		if k.Blocks != s.Total.Blocks {
			t.Errorf("%s memory: %+v, want every block %v", kind, s, want)
		}
	}
}

func TestSeekDataHole(t *testing.T) {
	ranges := layoutRanges(2)
	dir := t.TempDir()
	writeSnapshot(t, dir, 7, ranges, Options{BlockSize: 64 << 10})
	r := openReader(t, dir, 7, ReaderOptions{})
	// merge touching ranges: the data/hole view ignores run boundaries
	type ext struct{ lo, hi uint64 }
	var want []ext
	for _, mr := range ranges {
		e := ext{mr.addr, mr.addr + uint64(len(mr.data))}
		if n := len(want); n > 0 && want[n-1].hi == e.lo {
			want[n-1].hi = e.hi
		} else {
			want = append(want, e)
		}
	}
	var got []ext
	for a := uint64(0); ; {
		d, ok := r.NextData(a)
		if !ok {
			break
		}
		h := r.NextHole(d)
		got = append(got, ext{d, h})
		a = h
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("data extents %x, want %x", got, want)
	}
}

// TestCorruptBlock flips one bit in every stored block in turn: the read of
// that block fails with a BlockError naming it, and never returns bytes.
func TestCorruptBlock(t *testing.T) {
	ranges := layoutRanges(3)[:5]
	for _, bs := range []int{4 << 10, 256 << 10} {
		dir := t.TempDir()
		writeSnapshot(t, dir, 9, ranges, Options{BlockSize: bs})
		pages := filepath.Join(dir, pagesName(9))
		orig, err := os.ReadFile(pages)
		if err != nil {
			t.Fatal(err)
		}
		r0 := openReader(t, dir, 9, ReaderOptions{})
		var blocks []Block
		for b := range r0.Blocks() {
			if b.Kind != codec.Zero {
				blocks = append(blocks, b)
			}
		}
		step := max(1, len(blocks)/40)
		var tried, detected int
		for i := 0; i < len(blocks); i += step {
			b := blocks[i]
			bad := bytes.Clone(orig)
			bit := uint64(i*7919) % (uint64(b.StoredLen) * 8)
			bad[b.Off+bit/8] ^= 1 << (bit % 8)
			if err := os.WriteFile(pages, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			tried++
			r := openReader(t, dir, 9, ReaderOptions{Cache: cache.New(1 << 20)})
			buf := make([]byte, b.Len)
			n, err := r.ReadAt(buf, int64(b.Addr))
			if err == nil {
				// A flip that decodes to the same bytes (an LZ4 match
				// offset moved to identical data) is harmless; any
				// other must be caught.
				if !bytes.Equal(buf, expected(ranges, b.Addr, b.End())) {
					t.Fatalf("block %d (%v): corrupt block read back wrong bytes without an error", b.Index, b.Kind)
				}
				r.Close()
				continue
			}
			detected++
			var be *BlockError
			if !errors.As(err, &be) || be.Block != b.Index || be.Addr != b.Addr || be.File != pagesName(9) {
				t.Fatalf("block %d (%v): read = %d, %v; want a BlockError naming it", b.Index, b.Kind, n, err)
			}
			if !errors.Is(err, codec.ErrChecksum) && !errors.Is(err, codec.ErrUndecodable) {
				t.Fatalf("block %d: %v is neither ErrChecksum nor ErrCorrupt", b.Index, err)
			}
			if err := r.Verify(context.Background(), nil); !errors.As(err, &be) || be.Block != b.Index {
				t.Fatalf("verify with block %d corrupt: %v", b.Index, err)
			}
			r.Close()
		}
		if detected < tried*3/4 || detected == 0 {
			t.Fatalf("bs %d: %d of %d flipped bits detected", bs, detected, tried)
		}
		os.WriteFile(pages, orig, 0o600)
	}
}

func TestOpenErrors(t *testing.T) {
	ranges := layoutRanges(4)[:3]
	good := t.TempDir()
	writeSnapshot(t, good, 5, ranges, Options{})
	clone := func(t *testing.T) string {
		d := t.TempDir()
		ents, _ := os.ReadDir(good)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(good, e.Name()))
			os.WriteFile(filepath.Join(d, e.Name()), b, 0o600)
		}
		return d
	}
	open := func(dir string) error {
		s, err := Open(dir)
		if err != nil {
			return err
		}
		if _, err := s.State(5); err != nil {
			return err
		}
		r, err := s.OpenPages(5, ReaderOptions{})
		if err != nil {
			return err
		}
		return r.Close()
	}
	edit := func(name string, f func([]byte) []byte) func(string) {
		return func(dir string) {
			p := filepath.Join(dir, name)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, f(b), 0o600)
		}
	}
	// rewrite the index with a fresh CRC and manifest sum, so the check
	// under test is the one that fires
	reindex := func(f func([]byte)) func(string) {
		return func(dir string) {
			p := filepath.Join(dir, indexName(5))
			b, _ := os.ReadFile(p)
			f(b)
			binary.LittleEndian.PutUint32(b[60:], codec.Checksum(b[:60]))
			os.WriteFile(p, b, 0o600)
			fixSum(t, dir, indexName(5), b)
		}
	}
	cases := []struct {
		name string
		mod  func(string)
		want error
	}{
		{"no manifest", func(d string) { os.Remove(filepath.Join(d, ManifestName)) }, ErrIncomplete},
		{"manifest garbage", edit(ManifestName, func(b []byte) []byte { return b[:len(b)/2] }), ErrCorrupt},
		{"manifest version", edit(ManifestName, func(b []byte) []byte { return bytes.Replace(b, []byte(`"version": 1`), []byte(`"version": 99`), 1) }), ErrVersion},
		{"manifest format", edit(ManifestName, func(b []byte) []byte { return bytes.Replace(b, []byte(`lazyfs-snapshot`), []byte(`criu-snapshot`), 1) }), ErrBadMagic},
		{"pages truncated", edit(pagesName(5), func(b []byte) []byte { return b[:len(b)-1] }), ErrManifestMismatch},
		{"state edited", edit(stateName(5), func(b []byte) []byte { return bytes.Replace(b, []byte("synth"), []byte("sYnth"), 1) }), ErrManifestMismatch},
		{"index bad magic", reindex(func(b []byte) { b[0] = 'X' }), ErrBadMagic},
		{"index version", reindex(func(b []byte) { b[8] = 2 }), ErrVersion},
		{"index header crc", func(d string) {
			edit(indexName(5), func(b []byte) []byte { b[20] = 1; return b })(d)
			b, _ := os.ReadFile(filepath.Join(d, indexName(5)))
			fixSum(t, d, indexName(5), b)
		}, ErrHeaderChecksum},
		{"index tables crc", func(d string) {
			edit(indexName(5), func(b []byte) []byte { b[len(b)-1] ^= 1; return b })(d)
			b, _ := os.ReadFile(filepath.Join(d, indexName(5)))
			fixSum(t, d, indexName(5), b)
		}, ErrHeaderChecksum},
		{"index truncated", func(d string) {
			edit(indexName(5), func(b []byte) []byte { return b[:len(b)-8] })(d)
			b, _ := os.ReadFile(filepath.Join(d, indexName(5)))
			fixSum(t, d, indexName(5), b)
		}, ErrTruncated},
		{"pages size vs index", func(d string) {
			p := filepath.Join(d, pagesName(5))
			b, _ := os.ReadFile(p)
			b = b[:len(b)-4096]
			os.WriteFile(p, b, 0o600)
			fixSum(t, d, pagesName(5), b)
		}, ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := clone(t)
			c.mod(d)
			err := open(d)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if err := open(good); err != nil {
		t.Fatalf("unmodified snapshot: %v", err)
	}
}

// fixSum updates the manifest's size and checksum of one file.
func fixSum(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	m, err := readManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Files[name] = FileSum{Size: int64(len(b)), CRC32C: crcHex(codec.Checksum(b))}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestName), append(mb, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCreateRefusesExisting(t *testing.T) {
	dir := t.TempDir()
	writeSnapshot(t, dir, 3, layoutRanges(5)[:1], Options{})
	if _, err := Create(dir, Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("Create on a snapshot: %v, want ErrExists", err)
	}
	if _, err := Create(t.TempDir(), Options{BlockSize: 3 << 10}); err == nil {
		t.Fatal("block size 3 KiB accepted")
	}
}

func TestAbortLeavesNoManifest(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pw, err := w.Pages(context.Background(), 4)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("process vanished")
	err = pw.Add(1<<30, 64*PageSize, func(dst []byte, a uint64) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("Add: %v", err)
	}
	pw.Close()
	w.Abort()
	if _, err := Open(dir); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("Open after abort: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("abort left %d files", len(ents))
	}
}

func TestAddOrder(t *testing.T) {
	w, _ := Create(t.TempDir(), Options{})
	pw, _ := w.Pages(context.Background(), 4)
	defer pw.Close()
	fill := func(dst []byte, a uint64) error { return nil }
	if err := pw.Add(1<<30, PageSize, fill); err != nil {
		t.Fatal(err)
	}
	if err := pw.Add(1<<29, PageSize, fill); err == nil {
		t.Fatal("range before the previous one accepted")
	}
	if err := pw.Add(1<<31+1, PageSize, fill); err == nil {
		t.Fatal("unaligned range accepted")
	}
}

var _ = io.EOF
