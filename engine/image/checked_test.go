package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
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
