package measure

import (
	"slices"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/units"
)

// SameMemory reports whether the snapshots a and b of pid hold the same
// pages with the same bytes, but for the threads' rseq areas: the kernel
// writes there the CPU a thread returns to user mode on, and a dump's
// injected system calls make it return (two plain dumps of a stopped
// process differ there too).
func SameMemory(a, b string, pid int) (bool, error) {
	var rs [2]*image.Reader
	var skip []units.Range
	for i, dir := range []string{a, b} {
		s, err := image.Open(dir)
		if err != nil {
			return false, err
		}
		defer s.Close()
		st, err := s.State(pid)
		if err != nil {
			return false, err
		}
		for _, th := range st.Threads {
			if th.Rseq != nil {
				skip = append(skip, units.Range{Start: th.Rseq.Addr, End: th.Rseq.Addr + uint64(th.Rseq.Len)})
			}
		}
		if rs[i], err = s.OpenPages(pid, image.ReaderOptions{}); err != nil {
			return false, err
		}
		defer rs[i].Close()
	}
	if !slices.Equal(rs[0].Runs(), rs[1].Runs()) {
		return false, nil
	}
	var x, y []byte
	for blk := range rs[0].Blocks() {
		other, ok := rs[1].BlockAt(blk.Addr)
		if !ok || other.Addr != blk.Addr || other.Len != blk.Len {
			return false, nil
		}
		if other.CRC == blk.CRC {
			continue
		}
		x, y = make([]byte, blk.Len), make([]byte, blk.Len)
		if _, err := rs[0].ReadAt(x, int64(blk.Addr)); err != nil {
			return false, err
		}
		if _, err := rs[1].ReadAt(y, int64(blk.Addr)); err != nil {
			return false, err
		}
		for i := range x {
			addr := blk.Addr + uint64(i)
			if x[i] != y[i] && !slices.ContainsFunc(skip, func(r units.Range) bool { return r.Contains(addr) }) {
				return false, nil
			}
		}
	}
	return true, nil
}
