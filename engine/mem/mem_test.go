package mem

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

var testVMAs = []image.VMA{
	{Start: 0x5000_0000, End: 0x5001_0000, Kind: image.VMAFile, Flags: unix.MAP_PRIVATE},
	{Start: 0x7f00_0000_0000, End: 0x7f00_4000_0000, Kind: image.VMAAnon, Flags: unix.MAP_PRIVATE, Dumped: true},
	{Start: 0x7f00_4000_0000, End: 0x7f00_4010_0000, Kind: image.VMAAnon, Flags: unix.MAP_PRIVATE, Dumped: true, VMFlags: []string{"rd", "wr", "lo"}},
	{Start: 0x7ffd_0000_0000, End: 0x7ffd_0002_0000, Kind: image.VMAAnon, Flags: unix.MAP_PRIVATE | unix.MAP_GROWSDOWN, Name: "[stack]", Dumped: true},
}

func TestVMAAt(t *testing.T) {
	for _, tc := range []struct {
		addr uint64
		want int // index in testVMAs, -1 for none
	}{
		{0x5000_0000, 0}, {0x5000_ffff, 0}, {0x5001_0000, -1}, {0x7f00_3fff_ffff, 1},
		{0x7f00_4000_0000, 2}, {0x1000, -1}, {0x7ffd_0001_0000, 3}, {0x7fff_0000_0000, -1},
	} {
		got := VMAAt(testVMAs, tc.addr)
		if (tc.want < 0) != (got == nil) || (got != nil && got != &testVMAs[tc.want]) {
			t.Errorf("VMAAt(%#x) = %v, want VMA %d", tc.addr, got, tc.want)
		}
	}
}

// TestLazy: anonymous private dumped memory is served lazily, but not the
// stack, locked memory, or memory a fork must see zeroed.
func TestLazy(t *testing.T) {
	want := []bool{false, true, false, false}
	for i := range testVMAs {
		if got := Lazy(&testVMAs[i]); got != want[i] {
			t.Errorf("Lazy(VMA %d %v) = %v, want %v", i, testVMAs[i].VMFlags, got, want[i])
		}
	}
	wipe := testVMAs[1]
	wipe.VMFlags = []string{"wf"}
	if Lazy(&wipe) {
		t.Error("a MADV_WIPEONFORK VMA is lazy")
	}
}

// TestEagerPage: a thread's rseq area, page-rounded, is filled before the
// process runs; nothing else is.
func TestEagerPage(t *testing.T) {
	threads := []image.Thread{{TID: 1}, {TID: 2, Rseq: &image.Rseq{Addr: 0x7f00_0000_1ff0, Len: 32}}}
	for _, tc := range []struct {
		addr, n uint64
		want    bool
	}{
		{0x7f00_0000_0000, 0x1000, false},
		{0x7f00_0000_1000, 0x1000, true}, // holds the start of the area
		{0x7f00_0000_2000, 0x1000, true}, // holds its end, on the next page
		{0x7f00_0000_3000, 0x1000, false},
		{0x7f00_0000_0000, 0x40000, true}, // a block holding it
	} {
		if got := EagerPage(threads, tc.addr, tc.n); got != tc.want {
			t.Errorf("EagerPage(%#x+%#x) = %v, want %v", tc.addr, tc.n, got, tc.want)
		}
	}
}

// TestFreeAreas: every candidate lies above 4 GiB, outside every VMA,
// with a page of distance from what follows.
func TestFreeAreas(t *testing.T) {
	const n = 0x11000
	got := FreeAreas(testVMAs, n)
	if len(got) == 0 {
		t.Fatal("no free area")
	}
	for _, a := range got {
		if a < 1<<32 {
			t.Errorf("candidate %#x below 4 GiB", a)
		}
		for _, v := range testVMAs {
			if a < v.End && v.Start < a+n+image.PageSize {
				t.Errorf("candidate %#x+%#x overlaps or touches VMA %#x-%#x", a, n, v.Start, v.End)
			}
		}
	}
}
