package engine

import (
	"fmt"
	"slices"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// Process trees. Dump and restore walk the processes of a tree in one
// order, treeOrder: the root, then each child's subtree in turn,
// children by pid. A process's parent comes before it, and so does every
// process it refers to (an open file description it inherited, a shared
// memory object dumped with another).

// treeOrder sorts items into tree order; ids gives an item's pid and its
// parent's. The root is the item whose parent is not among them (the
// first such if several).
func treeOrder[T any](items []T, ids func(T) (pid, parent int)) []T {
	byPID := map[int]T{}
	kids := map[int][]int{}
	for _, it := range items {
		pid, _ := ids(it)
		byPID[pid] = it
	}
	var roots []int
	for _, it := range items {
		pid, parent := ids(it)
		if _, ok := byPID[parent]; ok && parent != pid {
			kids[parent] = append(kids[parent], pid)
		} else {
			roots = append(roots, pid)
		}
	}
	slices.Sort(roots)
	out := make([]T, 0, len(items))
	var walk func(pid int)
	walk = func(pid int) {
		out = append(out, byPID[pid])
		k := kids[pid]
		slices.Sort(k)
		for _, c := range k {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out
}

// dumpableChild refuses a descendant that cannot be dumped, naming it
// and its parent: a process traced or stopped by a debugger, a kernel
// thread. (A child that has exited is left out: dumper.leaveOut.)
func dumpableChild(pid, parent int) error {
	comm, _ := proc.ReadComm(pid)
	if err := dumpable(pid); err != nil {
		return fmt.Errorf("pid %d (%s), child of %d: %w", pid, comm, parent, err)
	}
	return nil
}
