package engine

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
)

// lazySourceSnapshot writes a snapshot of two runs with a hole between:
// random (Raw), zero (Zero) and repetitive (LZ4) stretches, and returns its
// directory, reader and the memory it holds.
func lazySourceSnapshot(t *testing.T, blockSize int) (string, *image.Reader, map[uint64][]byte) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, uint64(blockSize)))
	mk := func(n int, kind string) []byte {
		b := make([]byte, n)
		switch kind {
		case "random":
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
		case "text":
			for i := range b {
				b[i] = "lazyfs-"[i%7]
			}
		}
		return b
	}
	runs := map[uint64][]byte{
		0x10000000: append(append(mk(300<<10, "random"), mk(128<<10, "zero")...), mk(100<<10, "text")...),
		0x20000000: append(mk(64<<10, "text"), mk(200<<10, "random")...),
	}
	dir := filepath.Join(t.TempDir(), "snap")
	w, err := image.Create(dir, image.Options{BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	pw, err := w.Pages(context.Background(), 42)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []uint64{0x10000000, 0x20000000} {
		data := runs[a]
		if err := pw.Add(a, uint64(len(data)), func(dst []byte, at uint64) error {
			copy(dst, data[at-a:])
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteState(&image.Process{PID: 42, Comm: "synth"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := snap.OpenPages(42, image.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return dir, r, runs
}

// TestBlockSourceMatchesReader: blockSource reads what image.Reader reads,
// for whole blocks, batches of Raw blocks, parts of blocks and holes.
func TestBlockSourceMatchesReader(t *testing.T) {
	for _, bs := range []int{4 << 10, 64 << 10} {
		dir, r, _ := lazySourceSnapshot(t, bs)
		kinds := map[codec.Kind]int{}
		for b := range r.Blocks() {
			kinds[b.Kind]++
		}
		if kinds[codec.Raw] < 2 || kinds[codec.Zero] == 0 || kinds[codec.LZ4] == 0 {
			t.Fatalf("block size %d: kinds %v, want every kind", bs, kinds)
		}
		s, err := newBlockSource(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rng := rand.New(rand.NewPCG(7, 7))
		cases := [][2]uint64{
			{0x10000000, 300 << 10},             // Raw blocks, one batch
			{0x10000000, 528 << 10},             // the whole first run
			{0x10000000 + 5000, 100000},         // parts of blocks
			{0x10000000 + 500<<10, 0x100000},    // across the end of the run into the hole
			{0x0fff0000, 0x20000},               // a hole, then data
			{0x20000000, 264 << 10},             // LZ4 then Raw
			{0x20000000 + 64<<10 - 4096, 12288}, // the edge between them
		}
		for range 50 {
			a := 0x10000000 + rng.Uint64N(0x10100000)
			cases = append(cases, [2]uint64{a &^ 4095, 4096 * (1 + rng.Uint64N(200))})
		}
		for _, c := range cases {
			want, got := make([]byte, c[1]), make([]byte, c[1])
			if _, err := r.ReadAt(want, int64(c[0])); err != nil {
				t.Fatal(err)
			}
			if n, err := s.ReadAt(got, int64(c[0])); err != nil || n != len(got) {
				t.Fatalf("block size %d: ReadAt %#x+%#x = %d, %v", bs, c[0], c[1], n, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("block size %d: ReadAt %#x+%#x differs from image.Reader", bs, c[0], c[1])
			}
		}
	}
}

// TestBlockSourceCorrupt: a flipped byte in a Raw block inside a batch is
// an error naming that block, never bytes.
func TestBlockSourceCorrupt(t *testing.T) {
	dir, r, _ := lazySourceSnapshot(t, 4<<10)
	var bad image.Block
	n := 0
	for b := range r.Blocks() {
		if b.Kind == codec.Raw {
			if n == 3 {
				bad = b
				break
			}
			n++
		}
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
	s, err := newBlockSource(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf := make([]byte, 256<<10)
	_, err = s.ReadAt(buf, 0x10000000)
	var be *image.BlockError
	if !errors.As(err, &be) || be.Block != bad.Index || !errors.Is(err, codec.ErrChecksum) {
		t.Fatalf("ReadAt over a corrupt block: %v, want a checksum error naming block %d", err, bad.Index)
	}
}
