package policy

import "github.com/lazyfs/lazyfs/engine/units"

// FirstSearch is how far past the prefetcher's position in the working
// set a fault is looked for (First).
const FirstSearch = 1024

// First returns the index of the range of the working set first that
// holds the snapshot address at, looked for from the prefetcher's
// position from on, or -1: a fault there means the thread touches its
// working set faster than the prefetcher places it, in the recorded
// order, and what follows it in that order comes with it.
func First(first []units.Range, from int, at uint64) int {
	for k := from; k < len(first) && k < from+FirstSearch; k++ {
		if r := first[k]; r.Start <= at && at < r.End {
			return k
		}
	}
	return -1
}
