package uffd

import "testing"

func TestValidExtents(t *testing.T) {
	for _, tc := range []struct {
		ext  []Extent
		want bool
	}{
		{nil, true},
		{[]Extent{{0x1000, 0x1000}, {0x2000, 0x3000}}, true},
		{[]Extent{{0x1000, 0}}, false},
		{[]Extent{{0x1001, 0x1000}}, false},
		{[]Extent{{0x1000, 0x1001}}, false},
		{[]Extent{{0x2000, 0x1000}, {0x1000, 0x1000}}, false},
		{[]Extent{{0x1000, 0x2000}, {0x2000, 0x1000}}, false},
		{[]Extent{{^uint64(0) &^ 0xfff, 0x2000}}, false},
	} {
		if got := validExtents(tc.ext); got != tc.want {
			t.Errorf("validExtents(%v) = %v, want %v", tc.ext, got, tc.want)
		}
	}
}
