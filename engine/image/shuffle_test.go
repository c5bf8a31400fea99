package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/codec"
)

// normalWeights fills b with bf16 values of N(0, 0.02), as trained weights.
func normalWeights(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 9))
	for i := 0; i+2 <= len(b); i += 2 {
		binary.LittleEndian.PutUint16(b[i:], uint16(math.Float32bits(float32(r.NormFloat64()*0.02))>>16))
	}
}

// TestShuffleSnapshot writes snapshots with the shuffling codecs and reads
// them back through every reader: the cached ReadAt, Stream and Uncached.
// Snapshots with Shuffle blocks need the shuffle feature; those without
// (nothing to shuffle) do not, and read with older builds.
func TestShuffleSnapshot(t *testing.T) {
	ranges := layoutRanges(3)
	last := ranges[len(ranges)-1]
	w := make([]byte, 2<<20)
	normalWeights(w, 1)
	ranges = append(ranges, memRange{addr: last.addr + uint64(len(last.data)) + 16*PageSize, data: w})
	lo := ranges[0].addr
	last = ranges[len(ranges)-1]
	hi := last.addr + uint64(len(last.data))
	want := expected(ranges, lo, hi)

	for _, mode := range []codec.Mode{codec.ShuffleLZ4, codec.ShuffleHuff} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "snap")
			ws := writeSnapshot(t, dir, 42, ranges, Options{BlockSize: 64 << 10, Mode: mode, Workers: 2})
			if ws.Shuffle.Blocks == 0 || ws.Raw.Blocks == 0 {
				t.Fatalf("stats %+v: want shuffle and raw blocks", ws)
			}
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if m := s.Manifest; !m.HasFeature(FeatureShuffle) || m.Compression != mode.String() {
				t.Fatalf("manifest features %v, compression %q", m.Features, m.Compression)
			}
			for _, threads := range []int{1, 2} {
				r := openReader(t, dir, 42, ReaderOptions{Cache: cache.New(8 << 20), Threads: threads})
				if rs := r.Stats(); rs != ws {
					t.Fatalf("reader stats %+v, writer stats %+v", rs, ws)
				}
				got := make([]byte, hi-lo)
				if _, err := r.ReadAt(got, int64(lo)); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("ReadAt differs at %d", firstDiff(got, want))
				}
				clear(got)
				if _, err := r.Uncached().ReadAt(got, int64(lo)); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("uncached ReadAt differs at %d", firstDiff(got, want))
				}
				err := r.Stream(context.Background(), 0, ^uint64(0), false, func(c []Chunk) error {
					for _, x := range c {
						if !bytes.Equal(x.Data, expected(ranges, x.Addr, x.Addr+uint64(len(x.Data)))) {
							return errors.New("streamed block differs")
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	// Nothing to shuffle: no feature, and the codec still in the manifest.
	rnd := make([]byte, 1<<20)
	synth("random", rnd, 5)
	dir := filepath.Join(t.TempDir(), "plain")
	writeSnapshot(t, dir, 42, []memRange{{addr: 0x10000000, data: rnd}}, Options{Mode: codec.ShuffleLZ4})
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := s.Manifest; m.HasFeature(FeatureShuffle) || m.Compression != "shuffle-lz4" {
		t.Fatalf("snapshot without shuffle blocks: features %v, compression %q", m.Features, m.Compression)
	}
}

// TestShuffleFeatureRefused: a build that does not know Shuffle blocks
// refuses a snapshot with them, naming the feature, as a newer format.
func TestShuffleFeatureRefused(t *testing.T) {
	w := make([]byte, 1<<20)
	normalWeights(w, 2)
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, []memRange{{addr: 0x10000000, data: w}}, Options{Mode: codec.ShuffleLZ4})
	delete(knownFeatures, FeatureShuffle)
	t.Cleanup(func() { knownFeatures[FeatureShuffle] = true })
	_, err := Open(dir)
	if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), `"shuffle"`) {
		t.Fatalf("Open: %v, want ErrVersion naming the shuffle feature", err)
	}
}
