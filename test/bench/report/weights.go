package report

// WeightAdvices are the weightserver's two layouts: numpy's MADV_HUGEPAGE
// on every array, and the same process without it (the baseline).
var WeightAdvices = []string{"hugepage", "none"}

// WeightCases are the restores of each weightserver snapshot.
func WeightCases() []RestoreCase {
	return append(eachWayCases(),
		RestoreCase{Mode: Eager, Threads: DefThreads, TokenFirst: true},
		RestoreCase{Mode: LazyMount, Threads: DefThreads, TokenFirst: true})
}
