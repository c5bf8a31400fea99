package mem

import (
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// Lazy reports whether a lazy restore serves v's memory through
// userfaultfd: dumped anonymous private memory but the stack, locked
// memory, and memory that a fork must see as zeros (MADV_WIPEONFORK).
func Lazy(v *image.VMA) bool {
	if v.Kind != image.VMAAnon || !v.Dumped {
		return false
	}
	if v.Flags&unix.MAP_GROWSDOWN != 0 || v.Name == "[stack]" {
		return false
	}
	return !slices.ContainsFunc(v.VMFlags, func(f string) bool { return f == "lo" || f == "lf" || f == "wf" })
}

// EagerPage reports whether [addr, addr+n) holds memory the kernel writes
// before the lazy phase starts (a thread's rseq area, written when rseq is
// registered): such blocks are filled before the process runs, or the
// kernel's write would fault in a zero page that snapshot data could
// never replace.
func EagerPage(threads []image.Thread, addr, n uint64) bool {
	for _, t := range threads {
		if t.Rseq == nil {
			continue
		}
		lo, hi := t.Rseq.Addr&^(image.PageSize-1), (t.Rseq.Addr+uint64(t.Rseq.Len)+image.PageSize-1)&^(image.PageSize-1)
		if lo < addr+n && addr < hi {
			return true
		}
	}
	return false
}
