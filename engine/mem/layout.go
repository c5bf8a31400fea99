package mem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/units"
)

// FreeAreas lists candidate addresses for n bytes outside every one of
// vmas (sorted by address), at most 16, from 4 GiB up.
func FreeAreas(vmas []image.VMA, n uint64) []uint64 {
	var out []uint64
	lo := uint64(1 << 32)
	for i := 0; i <= len(vmas) && len(out) < 16; i++ {
		hi := uint64(0x7ffffffff000)
		if i < len(vmas) {
			hi = vmas[i].Start
		}
		// keep a page of distance from stacks that grow down
		if hi > lo+n+2*image.PageSize {
			out = append(out, lo+image.PageSize)
		}
		if i < len(vmas) {
			lo = max(lo, vmas[i].End)
		}
	}
	return out
}

// Union sorts vmas and merges those that overlap or touch (the layouts
// of several processes) into ranges.
func Union(vmas []image.VMA) []image.VMA {
	vmas = slices.Clone(vmas)
	slices.SortFunc(vmas, func(a, b image.VMA) int { return cmp.Compare(a.Start, b.Start) })
	var out []image.VMA
	for _, v := range vmas {
		if n := len(out); n > 0 && v.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, v.End)
			continue
		}
		out = append(out, image.VMA{Start: v.Start, End: v.End})
	}
	return out
}

// UnmapAllBut closes every descriptor of the process (its parent's or
// the stub's, which it inherited) and removes every mapping but the one
// at keep (the injection area), the kernel's special mappings (see
// MoveVDSO) and the VMAs it inherits (Target.Inherit): in those it
// clears every page but the kept ones, which are its parent's.
func UnmapAllBut(ctx context.Context, t *Target, keep uint64) error {
	maps, err := proc.ReadMaps(t.pid())
	if err != nil {
		return err
	}
	c := t.In.NewCalls() // one resume for them all
	unmapCalls(c, maps, keep, t.Inherit)
	return t.In.RunCalls(c)
}

// unmapCalls adds to c the calls of UnmapAllBut, for a process whose
// mappings are maps.
func unmapCalls(c batch, maps []proc.Mapping, keep uint64, inherit Inheritance) {
	c.Add("close_range", unix.SYS_CLOSE_RANGE, 0, ^uint64(0)>>32, 0)
	for _, m := range maps {
		if m.Start == keep || m.IsSpecial() {
			continue
		}
		for _, g := range subtract(units.Range{Start: m.Start, End: m.End}, inherit.VMAs) {
			c.Add("munmap "+g.String(), unix.SYS_MUNMAP, g.Start, g.Len())
		}
	}
	for _, v := range inherit.VMAs {
		for _, g := range subtract(v, inherit.Kept) {
			c.Add("madvise "+g.String()+" dontneed", unix.SYS_MADVISE, g.Start, g.Len(), unix.MADV_DONTNEED)
		}
	}
}

// subtract returns the parts of r outside rs (sorted, not overlapping).
func subtract(r units.Range, rs []units.Range) []units.Range {
	var out []units.Range
	at := r.Start
	for _, x := range rs {
		if x.End <= at || x.Start >= r.End {
			continue
		}
		if x.Start > at {
			out = append(out, units.Range{Start: at, End: x.Start})
		}
		at = max(at, x.End)
	}
	if at < r.End {
		out = append(out, units.Range{Start: at, End: r.End})
	}
	return out
}

// MoveVDSO moves [vvar], [vvar_vclock] and [vdso] where the process had
// them (same kernel: same sizes, same relative layout), through a free
// area with slack bytes of room to spare if a target overlaps a current
// position; it refuses a kernel whose special mappings differ
// (image.ErrKernelMismatch).
func MoveVDSO(ctx context.Context, t *Target, slack uint64) error {
	maps, err := proc.ReadMaps(t.pid())
	if err != nil {
		return err
	}
	return moveVDSO(t.In, t.State.VMAs, maps, slack)
}

// vdsoMove is the move of one special mapping.
type vdsoMove struct {
	name     string
	from, to uint64
	len      uint64
}

// moveVDSO is MoveVDSO through in, for a process whose mappings are
// maps, to the layout of vmas.
func moveVDSO(in Injector, vmas []image.VMA, maps []proc.Mapping, slack uint64) error {
	moves, err := vdsoMoves(vmas, maps)
	if err != nil {
		return err
	}
	// Unmap specials the snapshot did not have.
	for _, m := range maps {
		if m.IsSpecial() && m.Path != "[vsyscall]" && !hasVMA(vmas, m.Path) {
			if _, err := in.Call(unix.SYS_MUNMAP, m.Start, m.Len()); err != nil {
				return fmt.Errorf("munmap %s: %w", m.Path, err)
			}
		}
	}
	// If a target overlaps a current position, go through a free area.
	if vdsoOverlap(moves) {
		var total uint64
		for _, m := range moves {
			total += m.len
		}
		tmp := FreeAreas(vmas, total+slack)
		if len(tmp) == 0 {
			return errors.New("no room to move the vDSO through")
		}
		at := tmp[len(tmp)-1]
		for i := range moves {
			if err := mremap(in, moves[i].from, moves[i].len, at); err != nil {
				return fmt.Errorf("move %s: %w", moves[i].name, err)
			}
			moves[i].from = at
			at += moves[i].len
		}
	}
	for _, m := range moves {
		if m.from == m.to {
			continue
		}
		if err := mremap(in, m.from, m.len, m.to); err != nil {
			return fmt.Errorf("move %s to %#x: %w", m.name, m.to, err)
		}
	}
	return nil
}

// vdsoMoves returns the moves that put the special mappings of maps
// where vmas had them, refusing a kernel whose special mappings differ.
func vdsoMoves(vmas []image.VMA, maps []proc.Mapping) ([]vdsoMove, error) {
	var moves []vdsoMove
	for _, v := range vmas {
		if v.Kind != image.VMAVDSO && v.Kind != image.VMAVVar && v.Kind != image.VMAVVarVclock {
			continue
		}
		found := false
		for _, m := range maps {
			if m.Path == v.Name {
				if m.Len() != v.End-v.Start {
					return nil, fmt.Errorf("%w: %s is %d bytes here, %d in the snapshot", image.ErrKernelMismatch, v.Name, m.Len(), v.End-v.Start)
				}
				moves = append(moves, vdsoMove{v.Name, m.Start, v.Start, m.Len()})
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("%w: no %s mapping here", image.ErrKernelMismatch, v.Name)
		}
	}
	return moves, nil
}

// vdsoOverlap reports whether the target of a move overlaps the current
// position of one.
func vdsoOverlap(moves []vdsoMove) bool {
	for _, a := range moves {
		for _, b := range moves {
			if a.to < b.from+b.len && b.from < a.to+a.len && a.to != a.from {
				return true
			}
		}
	}
	return false
}

func hasVMA(vmas []image.VMA, name string) bool {
	for _, v := range vmas {
		if v.Name == name {
			return true
		}
	}
	return false
}

// mremap moves the n bytes mapped at from to to, through in.
func mremap(in Injector, from, n, to uint64) error {
	got, err := in.Call(unix.SYS_MREMAP, from, n, n, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, to)
	if err == nil && got != to {
		err = fmt.Errorf("mremap moved to %#x", got)
	}
	return err
}

// MapArea maps n bytes for the injection area (stub page, scratch) in
// process p, through in, at an address outside every one of layout (the
// memory of every process to be restored, in any order), and writes the
// stub page there.
func MapArea(in *syscalls.Injector, p *ptrace.Process, layout []image.VMA, n uint64) (uint64, error) {
	for _, a := range FreeAreas(Union(layout), n) {
		res, err := in.Syscall(unix.SYS_MMAP, a, n, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, ^uint64(0), 0)
		if err != nil {
			return 0, err
		}
		if res == -int64(unix.EEXIST) {
			continue
		}
		if res < 0 {
			return 0, fmt.Errorf("mmap injection area: %w", ptrace.Errno(res))
		}
		if err := p.WriteStub(a); err != nil {
			return 0, err
		}
		return a, nil
	}
	return 0, errors.New("no room for the injection area in the restored layout")
}
