package engine

import (
	"slices"
	"testing"
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
