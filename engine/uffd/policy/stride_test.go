package policy

import (
	"slices"
	"testing"
)

// TestStride: a stride is seen after three faults at one distance,
// up or down, and the pages predicted grow with each fault on it; a
// sequential fault, a repeat or another distance resets it.
func TestStride(t *testing.T) {
	var st stride
	var got []int
	for _, p := range []uint64{100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100} {
		got = append(got, st.next(p*PageSize, false))
	}
	want := []int{0, 0, 4, 8, 16, 32, 64, 64, 64, 64, 64}
	if !slices.Equal(got, want) {
		t.Errorf("upward stride: %v, want %v", got, want)
	}
	if n := st.next(1101*PageSize, true); n != 0 {
		t.Errorf("sequential fault: %d ahead", n)
	}
	st = stride{}
	got = got[:0]
	for _, p := range []uint64{1000, 900, 800, 700, 650, 600, 550, 500} {
		got = append(got, st.next(p*PageSize, false))
	}
	if want := []int{0, 0, 4, 8, 0, 4, 8, 16}; !slices.Equal(got, want) {
		t.Errorf("downward stride, then another: %v, want %v", got, want)
	}
}
