package lazy

import (
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
)

// TestMostDecoded: a source that decodes (a private mount) gets a second
// prefetch worker only when most of the memory must be decoded: not for a
// model's float weights, stored raw, nor for zeros.
func TestMostDecoded(t *testing.T) {
	st := func(raw, lz4, shuffle, zero uint64) image.Stats {
		return image.Stats{Raw: image.KindStats{Bytes: raw}, LZ4: image.KindStats{Bytes: lz4},
			Shuffle: image.KindStats{Bytes: shuffle}, Zero: image.KindStats{Bytes: zero}}
	}
	for _, c := range []struct {
		name string
		sts  []image.Stats
		want bool
	}{
		{"PyTorch server: 81% raw", []image.Stats{st(498, 120, 0, 0)}, false},
		{"modelserver: mostly LZ4", []image.Stats{st(100, 700, 0, 200)}, true},
		{"shuffled floats", []image.Stats{st(100, 0, 400, 0)}, true},
		{"zeros do not count", []image.Stats{st(300, 200, 0, 5000)}, false},
		{"a tree, added up", []image.Stats{st(400, 0, 0, 0), st(0, 500, 0, 0)}, true},
	} {
		if got := mostDecoded(c.sts); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
