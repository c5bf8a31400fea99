package mem

import (
	"fmt"
	"iter"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc/pagemap"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Copy-on-write sharing across fork. A pre-fork server (a model server
// that loads its weights and forks workers, gunicorn --preload, nginx,
// PostgreSQL) has its workers share the parent's private memory: the
// same physical pages, mapped copy-on-write, until one of them writes.
// The dump finds those pages (MarkInherited); restore forks each child
// from its parent once the parent's memory is in, keeps the VMAs that
// hold them, and writes only the child's other pages (Inheritance), so
// that parent and children share them again, eager or lazy.

// MarkInherited sets VMA.Inherited in child's state: the pages of its
// private anonymous VMAs that are the same physical pages as its
// parent's at the same address (pagemap's frame numbers, which only a
// privileged reader sees: without them nothing is marked). A VMA counts
// only where the parent has one fork made it from (forkedAs). childPID
// and parentPID are the frozen processes; it returns the bytes marked.
func MarkInherited(child, parent *image.Process, childPID, parentPID int) (uint64, error) {
	var cpm, ppm *pagemap.Pagemap
	defer func() {
		if cpm != nil {
			cpm.Close()
		}
		if ppm != nil {
			ppm.Close()
		}
	}()
	var ce, pe []pagemap.Entry
	var total uint64
	for i := range child.VMAs {
		v := &child.VMAs[i]
		v.Inherited = nil
		w := VMAAt(parent.VMAs, v.Start)
		if !forkedAs(v, w) {
			continue
		}
		if cpm == nil {
			var err error
			if cpm, err = pagemap.Open(childPID); err != nil {
				return 0, err
			}
			if ppm, err = pagemap.Open(parentPID); err != nil {
				return 0, err
			}
			ce, pe = make([]pagemap.Entry, inheritChunk), make([]pagemap.Entry, inheritChunk)
		}
		for addr := v.Start; addr < v.End; {
			n := int(min((v.End-addr)/image.PageSize, inheritChunk))
			cn, err := cpm.ReadEntries(addr, ce[:n])
			if err != nil {
				return 0, err
			}
			pn, err := ppm.ReadEntries(addr, pe[:n])
			if err != nil {
				return 0, err
			}
			if cn != n || pn != n {
				return 0, fmt.Errorf("pagemap %#x: %d and %d entries of %d", addr, cn, pn, n)
			}
			for j := range n {
				if pfn := ce[j].PFN(); pfn == 0 || pfn != pe[j].PFN() {
					continue
				}
				a := addr + uint64(j)*image.PageSize
				if k := len(v.Inherited); k > 0 && v.Inherited[k-1].End == a {
					v.Inherited[k-1].End += image.PageSize
				} else {
					v.Inherited = append(v.Inherited, image.PageRange{Start: a, End: a + image.PageSize})
				}
				total += image.PageSize
			}
			addr += uint64(n) * image.PageSize
		}
	}
	return total, nil
}

// inheritChunk is how many pagemap entries MarkInherited reads at a time
// (512 KiB of them, 256 MiB of memory).
const inheritChunk = 64 << 10

// forkedAs reports whether the child's VMA v is what fork makes of the
// parent's w, as restore makes them: the same range, protection, flags
// and advice (madvise, which a kept VMA keeps from its parent), private
// anonymous memory that fork passes on (not MADV_DONTFORK or
// MADV_WIPEONFORK).
func forkedAs(v, w *image.VMA) bool {
	if w == nil || !inheritable(v) || !inheritable(w) || w.Start != v.Start || w.End != v.End || w.Prot != v.Prot || w.Flags != v.Flags ||
		slices.Contains(w.VMFlags, "dc") || slices.Contains(w.VMFlags, "wf") {
		return false
	}
	for f := range madvFlags {
		if slices.Contains(v.VMFlags, f) != slices.Contains(w.VMFlags, f) {
			return false
		}
	}
	return true
}

// inheritable reports whether fork passes v on as it is: private
// anonymous memory that does not grow down (a stack's VMA is as long as
// the stack grew).
func inheritable(v *image.VMA) bool {
	return v.Kind == image.VMAAnon && v.Flags&unix.MAP_PRIVATE != 0 && v.Flags&unix.MAP_GROWSDOWN == 0
}

// Inheritance is what a process of a tree takes from its parent's memory
// at fork, for restore.
type Inheritance struct {
	// VMAs are the ranges of the VMAs it keeps as fork made them.
	VMAs []units.Range
	// Kept are the pages in them it keeps: its blocks that lie wholly in
	// VMA.Inherited, which restore neither writes nor serves. Every other
	// page of those VMAs is cleared at restore and written as its own.
	Kept []units.Range
}

// Inherit returns what process st, whose memory is pages, takes from its
// parent at fork: the VMAs whose pages it shared at the dump, where the
// parent still has the same VMA (nil parent: none).
func Inherit(st *image.Process, pages *image.Reader, parent *image.Process) Inheritance {
	if parent == nil {
		return Inheritance{}
	}
	return inherit(st, pages.Blocks(), parent)
}

// inherit is Inherit of the process whose blocks are blocks.
func inherit(st *image.Process, blocks iter.Seq[image.Block], parent *image.Process) Inheritance {
	var in Inheritance
	if parent == nil {
		return in
	}
	ok := map[uint64]bool{}
	for i := range st.VMAs {
		v := &st.VMAs[i]
		if len(v.Inherited) == 0 {
			continue
		}
		if forkedAs(v, VMAAt(parent.VMAs, v.Start)) {
			ok[v.Start] = true
		}
	}
	if len(ok) == 0 {
		return in
	}
	var v *image.VMA
	j := 0 // v.Inherited[j] is the first range not before the block
	for b := range blocks {
		if v == nil || b.Addr >= v.End {
			if v = VMAAt(st.VMAs, b.Addr); v == nil || !ok[v.Start] {
				v = nil
				continue
			}
			j = 0
		}
		for j < len(v.Inherited) && v.Inherited[j].End <= b.Addr {
			j++
		}
		if j == len(v.Inherited) || v.Inherited[j].Start > b.Addr || v.Inherited[j].End < b.End() {
			continue
		}
		if n := len(in.Kept); n > 0 && in.Kept[n-1].End == b.Addr {
			in.Kept[n-1].End = b.End()
		} else {
			in.Kept = append(in.Kept, units.Range{Start: b.Addr, End: b.End()})
		}
		if n := len(in.VMAs); n == 0 || in.VMAs[n-1].Start != v.Start {
			in.VMAs = append(in.VMAs, units.Range{Start: v.Start, End: v.End})
		}
	}
	return in
}

// Overlaps reports whether [addr, addr+n) overlaps a range of rs
// (sorted, not overlapping).
func Overlaps(rs []units.Range, addr, n uint64) bool {
	i, _ := slices.BinarySearchFunc(rs, addr, func(r units.Range, a uint64) int {
		if r.End <= a {
			return -1
		}
		return 1
	})
	return i < len(rs) && rs[i].Start < addr+n
}

// Within reports whether [addr, addr+n) lies in one range of rs (sorted,
// not overlapping, as Inheritance.Kept).
func Within(rs []units.Range, addr, n uint64) bool {
	i, _ := slices.BinarySearchFunc(rs, addr, func(r units.Range, a uint64) int {
		if r.End <= a {
			return -1
		}
		return 1
	})
	return i < len(rs) && rs[i].Start <= addr && addr+n <= rs[i].End
}

// InheritedRanges returns the pages of st that MarkInherited found shared
// with its parent, in address order.
func InheritedRanges(st *image.Process) []units.Range {
	var out []units.Range
	for _, v := range st.VMAs {
		for _, r := range v.Inherited {
			out = append(out, units.Range{Start: r.Start, End: r.End})
		}
	}
	return units.Union(out)
}
