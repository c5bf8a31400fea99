package mem

import (
	"slices"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
)

// TestUnion: the layouts of several processes merge into sorted ranges,
// where they overlap or touch.
func TestUnion(t *testing.T) {
	in := []image.VMA{{Start: 0x5000, End: 0x6000}, {Start: 0x1000, End: 0x3000}, {Start: 0x2000, End: 0x4000}, {Start: 0x4000, End: 0x4800}}
	got := Union(in)
	want := []image.VMA{{Start: 0x1000, End: 0x4800}, {Start: 0x5000, End: 0x6000}}
	if !slices.EqualFunc(got, want, func(a, b image.VMA) bool { return a.Start == b.Start && a.End == b.End }) {
		t.Errorf("union %+v, want %+v", got, want)
	}
	if in[0].Start != 0x5000 {
		t.Error("Union sorted its argument in place")
	}
}
