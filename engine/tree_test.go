package engine

import (
	"slices"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
)

func TestTreeOrder(t *testing.T) {
	type p struct{ pid, parent int }
	// A root whose pid wrapped below its children's, children listed out
	// of order, a grandchild before its parent.
	in := []p{{40, 7}, {12, 30}, {30, 5}, {5, 1}, {7, 5}, {31, 30}}
	got := treeOrder(in, func(x p) (int, int) { return x.pid, x.parent })
	var pids []int
	for _, x := range got {
		pids = append(pids, x.pid)
	}
	// Parents first; each child's subtree whole; children by pid.
	if want := []int{5, 7, 40, 30, 12, 31}; !slices.Equal(pids, want) {
		t.Errorf("tree order %v, want %v", pids, want)
	}
}

func TestUnionVMAs(t *testing.T) {
	in := []image.VMA{{Start: 0x5000, End: 0x6000}, {Start: 0x1000, End: 0x3000}, {Start: 0x2000, End: 0x4000}, {Start: 0x4000, End: 0x4800}}
	got := unionVMAs(in)
	want := []image.VMA{{Start: 0x1000, End: 0x4800}, {Start: 0x5000, End: 0x6000}}
	if !slices.EqualFunc(got, want, func(a, b image.VMA) bool { return a.Start == b.Start && a.End == b.End }) {
		t.Errorf("union %+v, want %+v", got, want)
	}
}

func TestMergeLazyStats(t *testing.T) {
	a := LazyStats{Total: 10, Faults: 2, FaultBytes: 8192, Exited: true}
	b := LazyStats{Total: 5, Faults: 1, PrefetchBytes: 4096}
	s := mergeLazyStats([]LazyStats{a, b})
	if s.Total != 15 || s.Faults != 3 || s.FaultBytes != 8192 || s.PrefetchBytes != 4096 || s.Exited || len(s.Children) != 2 {
		t.Errorf("merged %+v", s)
	}
}
