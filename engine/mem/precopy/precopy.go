package precopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/pagemap"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Copy copies the memory of a process while it runs, so that the dump
// that follows need stop it only to copy what it wrote since the last copy
// (snapctl dump --pre-copy).
//
// Writes are tracked without soft-dirty bits: the writable private
// anonymous mappings of the process are registered with a userfaultfd in
// UFFDIO_REGISTER_MODE_WP with the WP_ASYNC and WP_UNPOPULATED features,
// so that a write to a write-protected page is resolved by the kernel
// itself (no message, no thread of ours involved) and leaves the page
// marked written. A round (Round) asks PAGEMAP_SCAN for the pages written
// since the previous round, write-protecting them again in the same walk
// (PM_SCAN_WP_MATCHING), then copies them into memory of ours: a write
// after the walk marks the page written for the next round, so no write
// is lost between the walk and the copy. Stop, with the process frozen,
// drops from the copy every page written since the last round or no
// longer in a registered mapping, and removes the registration. mem.Dump then
// copies what the copy lacks while the process is still frozen, and
// encodes from the copy once it no longer needs the process.
//
// The userfaultfd is created inside the process (its registrations apply
// to the address space of its creator) and taken out with pidfd_getfd;
// the process's own descriptor is closed at once. Ours is then the only
// one: closing it, as Stop and Close do, or snapctl's death, even by
// SIGKILL, makes the kernel unregister every range and clear every
// write-protection it set. Writes the CPU does not make through the
// process's page tables (a device's DMA into pages pinned before the
// first round, io_uring's registered buffers) are not seen, as soft-dirty
// tracking would not see them either.
type Copy struct {
	pid  int
	src  io.ReaderAt // the process's memory, read while it runs
	uffd int
	pm   *pagemap.Pagemap
	// segs are the staged ranges by address, never overlapping: first
	// the registered mappings, then (at the dump) whatever else it needs.
	segs    []*segment
	rounds  int
	stopped bool
	runs    []pagemap.Run
}

// segment is memory of ours that holds a copy of the process's memory at
// [start, end).
type segment struct {
	start, end uint64
	data       []byte
	// valid are the pages whose copy is the process's memory as it is:
	// copied since they were last written.
	valid rangeSet
	// tracked: the range is registered; lost: it no longer is (unmapped,
	// moved or replaced), and nothing in the copy is trusted.
	tracked, lost bool
}

// RoundStats are the figures of one round.
type RoundStats struct {
	Round  int
	Copied uint64 // bytes copied
	Runs   int    // ranges copied
}

// preCopyFeatures are the userfaultfd features write tracking needs:
// WP_UNPOPULATED is what makes an anonymous range count as tracked for
// PAGEMAP_SCAN (PAGE_IS_WPALLOWED).
const preCopyFeatures = uffdio.FeatureWPAsync | uffdio.FeatureWPUnpopulated

// Start starts tracking the writes of process pid, which must be
// stopped (in injects into one of its threads; it is not needed after
// Start returns): it makes the userfaultfd and registers every
// writable private anonymous mapping of maps (as read after in closed).
// src reads the process's memory while it runs. Mappings that cannot be
// registered are left alone: the dump copies them while the process is
// frozen. Close undoes everything, on any path.
func Start(in mem.Injector, pid int, src io.ReaderAt) (pc *Copy, err error) {
	fd, err := mem.UserfaultfdWith(in, pid, 0)
	if errors.Is(err, unix.EPERM) {
		// vm.unprivileged_userfaultfd=0 and a process without
		// CAP_SYS_PTRACE: a descriptor that handles faults from user mode
		// only is allowed, and asynchronous write-protection does not
		// involve its handler.
		fd, err = mem.UserfaultfdWith(in, pid, uffdUserModeOnly)
	}
	if err != nil {
		return nil, err
	}
	pc = &Copy{pid: pid, src: src, uffd: fd}
	defer func() {
		if err != nil {
			pc.Close()
			pc = nil
		}
	}()
	supported, _, err := uffdio.API(fd, preCopyFeatures)
	if err != nil {
		return nil, fmt.Errorf("write tracking: %w", err)
	}
	if supported&preCopyFeatures != preCopyFeatures {
		return nil, fmt.Errorf("write tracking: %w: userfaultfd lacks WP_ASYNC or WP_UNPOPULATED (features %#x)", errors.ErrUnsupported, supported)
	}
	if pc.pm, err = pagemap.Open(pid); err != nil {
		return nil, err
	}
	if !pc.pm.ScanSupported() {
		return nil, fmt.Errorf("write tracking: %w: PAGEMAP_SCAN refused on /proc/%d/pagemap", errors.ErrUnsupported, pid)
	}
	return pc, nil
}

// uffdUserModeOnly is UFFD_USER_MODE_ONLY.
const uffdUserModeOnly = 1

// Register registers the writable private anonymous mappings of maps
// (the process's, read after the injector that made the userfaultfd was
// closed, so that its scratch page is not among them).
func (pc *Copy) Register(maps []proc.Mapping) error {
	for i := range maps {
		m := &maps[i]
		if m.Kind() != proc.KindAnon || m.Perms&proc.PermWrite == 0 || m.Shared() {
			continue
		}
		if _, err := uffdio.Register(pc.uffd, m.Start, m.End-m.Start, uffdio.RegisterModeWP); err != nil {
			// A mapping the kernel will not track (VM_IO, hugetlb without
			// support...) is copied while the process is frozen.
			continue
		}
		data, err := stageMem(m.End - m.Start)
		if err != nil {
			return err
		}
		pc.segs = append(pc.segs, &segment{start: m.Start, end: m.End, data: data, tracked: true})
	}
	return nil
}

// stageMem maps n bytes of memory of ours to copy into; pages never
// copied take no memory.
func stageMem(n uint64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes to copy memory into: %w", n, err)
	}
	// Fewer page faults filling it (where transparent huge pages are
	// "madvise"); an error only means small pages.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return b, nil
}

// Tracked returns the bytes of the registered ranges.
func (pc *Copy) Tracked() uint64 {
	var n uint64
	for _, s := range pc.segs {
		if s.tracked {
			n += s.end - s.start
		}
	}
	return n
}

// Round copies, while the process runs, the pages of the registered
// ranges written since the previous round (every page that holds data,
// the first time), write-protecting them again as they are found.
func (pc *Copy) Round(ctx context.Context) (RoundStats, error) {
	if pc.stopped {
		return RoundStats{}, errors.New("pre-copy round after Stop")
	}
	pc.rounds++
	st := RoundStats{Round: pc.rounds}
	q := pagemap.Query{AnyOf: pagemap.PagePresent | pagemap.PageSwapped, WriteProtect: true}
	if pc.rounds > 1 {
		q.Require = pagemap.PageWritten
	}
	for _, s := range pc.segs {
		if !s.tracked || s.lost {
			continue
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		q.Start, q.End = s.start, s.end
		var err error
		pc.runs, err = pc.pm.RunsScan(q, pc.runs[:0])
		if err != nil {
			// EPERM: a mapping there is no longer registered (the range
			// was unmapped, moved or replaced in part). ENOENT and the
			// like: the process is going. Either way the range is
			// copied when the process is frozen.
			s.lost = true
			s.valid = nil
			continue
		}
		for _, r := range pc.runs {
			st.Runs++
			n, _ := pc.src.ReadAt(s.data[r.Start-s.start:r.End-s.start], int64(r.Start))
			n &^= PageSizeMask
			st.Copied += uint64(n)
			s.valid.add(units.Range{Start: r.Start, End: r.Start + uint64(n)})
			if r.Start+uint64(n) < r.End {
				s.valid.sub(units.Range{Start: r.Start + uint64(n), End: r.End})
			}
		}
	}
	return st, nil
}

// PageSizeMask masks the offset inside a page.
const PageSizeMask = proc.PageSize - 1

// Stop ends the rounds; the process must be frozen (and stay so until
// Dump has read what the copy lacks). It forgets the copy of every page
// written since the last round and of every range no longer registered.
// The registrations stay until Dump no longer needs the process (they
// cost a frozen process nothing, and removing them takes time): the
// VMAs read meanwhile carry the flag "uw", which the dump must drop.
func (pc *Copy) Stop() error {
	if pc.stopped {
		return nil
	}
	pc.stopped = true
	// A new descriptor: /proc/PID/pagemap reads the address space the
	// process had when it was opened, and one that has called execve
	// since has another, where nothing is registered.
	pm, err := pagemap.Open(pc.pid)
	if err != nil {
		return err
	}
	defer pm.Close()
	// Written pages: the kernel's fast path (a test of each entry's
	// write-protection bit) when it is exact, that is when no page of
	// the process is in swap, where a swap entry's bits could read as
	// protected; otherwise every page classified, much slower.
	st, err := proc.ReadStatus(pc.pid)
	if err != nil {
		return err
	}
	written := pagemap.Query{Require: pagemap.PageWritten, Return: pagemap.PageWritten}
	if st.VmSwap > 0 {
		written = pagemap.Query{AnyOf: pagemap.PagePresent | pagemap.PageSwapped, Return: pagemap.PageWPAllowed | pagemap.PageWritten}
	}
	// Pages outside a registered mapping (one made, moved or replaced
	// since): the kernel skips registered mappings whole.
	foreign := pagemap.Query{AnyOf: pagemap.PagePresent | pagemap.PageSwapped, Exclude: pagemap.PageWPAllowed}
	for _, s := range pc.segs {
		if !s.tracked || s.lost {
			continue
		}
		for _, q := range []pagemap.Query{written, foreign} {
			q.Start, q.End = s.start, s.end
			pc.runs, err = pm.RunsScan(q, pc.runs[:0])
			if err != nil {
				s.lost = true
				s.valid = nil
				break
			}
			for _, r := range pc.runs {
				if q.Return == 0 || r.Categories&(pagemap.PageWPAllowed|pagemap.PageWritten) != pagemap.PageWPAllowed {
					s.valid.sub(units.Range{Start: r.Start, End: r.End})
				}
			}
		}
	}
	return nil
}

// TrackingFlag is the VmFlags name of a range registered for write
// tracking, which a snapshot must not record.
const TrackingFlag = "uw"

// CloseTracking closes the userfaultfd: the kernel removes the
// registrations and the write-protection.
func (pc *Copy) CloseTracking() {
	if pc.uffd >= 0 {
		unix.Close(pc.uffd)
		pc.uffd = -1
	}
	if pc.pm != nil {
		pc.pm.Close()
		pc.pm = nil
	}
}

// Close stops write tracking if Stop did not, and frees the copy.
func (pc *Copy) Close() {
	if pc == nil {
		return
	}
	pc.stopped = true
	pc.CloseTracking()
	for _, s := range pc.segs {
		if s.data != nil {
			unix.Munmap(s.data)
			s.data = nil
		}
	}
	pc.segs = nil
}

// Capture makes the copy hold every range of ranges as the frozen process
// has it: what the rounds copied and nobody wrote since is kept, the rest
// is read now, with read (the dump's own way of reading range i: from
// the process or from a shared object). It returns the bytes read.
func (pc *Copy) Capture(ranges []units.Range, read func(i int, dst []byte, addr uint64) error) (uint64, error) {
	if !pc.stopped {
		return 0, errors.New("pre-copy: Capture before Stop")
	}
	var done uint64
	var added []*segment
	for i, r := range ranges {
		for a := r.Start; a < r.End; {
			s := pc.find(a)
			if s == nil {
				// Not staged: a new segment up to the next one.
				end := r.End
				if j := pc.after(a); j < len(pc.segs) {
					end = min(end, pc.segs[j].start)
				}
				for _, x := range added {
					if x.start > a {
						end = min(end, x.start)
					}
				}
				data, err := stageMem(end - a)
				if err != nil {
					return done, err
				}
				s = &segment{start: a, end: end, data: data}
				added = append(added, s)
			}
			end := min(r.End, s.end)
			for _, gap := range s.valid.gaps(a, end) {
				if err := read(i, s.data[gap.Start-s.start:gap.End-s.start], gap.Start); err != nil {
					return done, err
				}
				done += gap.Len()
				s.valid.add(gap)
			}
			a = end
		}
	}
	pc.segs = append(pc.segs, added...)
	slices.SortFunc(pc.segs, func(a, b *segment) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	return done, nil
}

// find returns the staged segment holding addr, among those sorted so
// far (Capture adds its own after).
func (pc *Copy) find(addr uint64) *segment {
	i := sort.Search(len(pc.segs), func(i int) bool { return pc.segs[i].end > addr })
	if i < len(pc.segs) && pc.segs[i].start <= addr {
		return pc.segs[i]
	}
	return nil
}

// after returns the index of the first segment that ends after addr.
func (pc *Copy) after(addr uint64) int {
	return sort.Search(len(pc.segs), func(i int) bool { return pc.segs[i].end > addr })
}

// ReadMem reads the copy of [addr, addr+len(b)), which Capture made
// whole.
func (pc *Copy) ReadMem(addr uint64, b []byte) error {
	for len(b) > 0 {
		s := pc.find(addr)
		if s == nil || !s.valid.covers(addr, addr+uint64(min(len(b), int(s.end-addr)))) {
			return fmt.Errorf("pre-copy: no copy of %#x", addr)
		}
		n := copy(b, s.data[addr-s.start:])
		b = b[n:]
		addr += uint64(n)
	}
	return nil
}

// rangeSet is a set of addresses: sorted, disjoint, non-adjacent ranges.
type rangeSet []units.Range

// add adds r.
func (rs *rangeSet) add(r units.Range) {
	if r.End <= r.Start {
		return
	}
	s := *rs
	i := sort.Search(len(s), func(i int) bool { return s[i].End >= r.Start })
	j := i
	for j < len(s) && s[j].Start <= r.End {
		r.Start = min(r.Start, s[j].Start)
		r.End = max(r.End, s[j].End)
		j++
	}
	*rs = slices.Replace(s, i, j, r)
}

// sub removes r.
func (rs *rangeSet) sub(r units.Range) {
	if r.End <= r.Start {
		return
	}
	s := *rs
	i := sort.Search(len(s), func(i int) bool { return s[i].End > r.Start })
	j := i
	var keep []units.Range
	for j < len(s) && s[j].Start < r.End {
		if s[j].Start < r.Start {
			keep = append(keep, units.Range{Start: s[j].Start, End: r.Start})
		}
		if s[j].End > r.End {
			keep = append(keep, units.Range{Start: r.End, End: s[j].End})
		}
		j++
	}
	*rs = slices.Replace(s, i, j, keep...)
}

// gaps returns the parts of [lo, hi) not in the set.
func (rs rangeSet) gaps(lo, hi uint64) []units.Range {
	var out []units.Range
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End > lo })
	for a := lo; a < hi; {
		if i >= len(rs) || rs[i].Start >= hi {
			out = append(out, units.Range{Start: a, End: hi})
			break
		}
		if rs[i].Start > a {
			out = append(out, units.Range{Start: a, End: rs[i].Start})
		}
		a = rs[i].End
		i++
	}
	return out
}

// covers reports whether [lo, hi) is wholly in the set.
func (rs rangeSet) covers(lo, hi uint64) bool { return len(rs.gaps(lo, hi)) == 0 }
