package report

import ()

// WeightAdvices are the weightserver's two layouts: numpy's MADV_HUGEPAGE
// on every array, and the same process without it (the baseline).
var WeightAdvices = []string{"hugepage", "none"}

// WeightCases are the restores of each weightserver snapshot.
func WeightCases() []RestoreCase {
	return []RestoreCase{
		{Mode: Eager, Threads: DefThreads},
		{Mode: Eager, Cold: true, Threads: DefThreads},
		{Mode: LazyMount, Threads: DefThreads},
		{Mode: LazyMount, Cold: true, Threads: DefThreads},
		{Mode: lazyDirect, Threads: DefThreads},
		{Mode: lazyDirect, Cold: true, Threads: DefThreads},
		{Mode: Eager, Threads: DefThreads, TokenFirst: true},
		{Mode: LazyMount, Threads: DefThreads, TokenFirst: true},
	}
}
