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

// precheckChild refuses a descendant that cannot be dumped, naming it
// and its parent: a process traced or stopped by a debugger, a kernel
// thread. (A child that has exited is left out: dumper.leaveOut.)
func precheckChild(pid, parent int) error {
	comm, _ := proc.ReadComm(pid)
	if err := precheck(pid); err != nil {
		return fmt.Errorf("pid %d (%s), child of %d: %w", pid, comm, parent, err)
	}
	return nil
}

// markSharedObjects marks the shared memory objects that several
// processes of the tree map (image.ShmemRef.Tree): restore makes each
// once and maps it in each.
func markSharedObjects(procs []*dumpProc) {
	if len(procs) < 2 {
		return
	}
	users := map[uint64]map[int]bool{}
	for _, p := range procs {
		for _, v := range p.st.VMAs {
			if v.Shmem != nil {
				if users[v.Shmem.ID] == nil {
					users[v.Shmem.ID] = map[int]bool{}
				}
				users[v.Shmem.ID][p.pid] = true
			}
		}
	}
	for _, p := range procs {
		for i := range p.st.VMAs {
			if s := p.st.VMAs[i].Shmem; s != nil && len(users[s.ID]) > 1 {
				s.Tree = true
			}
		}
	}
}
