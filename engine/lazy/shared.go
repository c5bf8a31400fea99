package lazy

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Shared memory (a shared anonymous mapping, a memfd mapped by several
// processes of a tree) is served lazily too where the kernel lets a
// userfaultfd register it (UFFD_FEATURE_MISSING_SHMEM). The object is
// made and mapped as in an eager restore, but left empty. Every process
// that maps it registers its mappings of it with a userfaultfd of their
// own (not the one of its private memory, whose pager streams all it
// serves), before any process of the tree runs: a page one of them
// touched unregistered would come in as zeros that snapshot data could
// never replace. A fault on a page of the object is served by the
// faulting process's pager, UFFDIO_COPY at the faulting address, which
// puts the page in the object for every process that maps it; a second
// copy of a page another placed fails with EEXIST and only wakes the
// thread. Those pagers serve faults only. The object's data is streamed
// once, by snapctl itself, through a mapping of the object of its own
// registered with a userfaultfd of its own (streamer.go): it sees no
// event of the processes (no unmap, no mremap, no exit), so every page it
// places or finds present is the object's for good, and once it is done
// the object is whole and the processes' pagers stop.
//
// An object is filled before the processes run as before where lazy
// service could be wrong: a System V segment (its mappings cannot be
// registered), an object a process holds a descriptor of (read(2) and
// write(2) see the object without faulting), a mapping that is locked,
// private or holds a thread's rseq area, an object whose data the dump
// kept twice, or one that a process maps only in part (a mapping mremap
// grew over the rest would be served zeros there).

// sharedObject is a shared memory object served lazily: where its data
// is in the snapshot, and its streamer.
type sharedObject struct {
	id   uint64
	runs []dataRun // sorted by offset, disjoint
	str  *streamer // made by the first process that maps it (Prepare)
}

// dataRun is a block of an object's data: n bytes from offset off are
// those of process from's memory at addr in the snapshot.
type dataRun struct {
	off, n uint64
	from   *Process
	addr   uint64
}

// sharedID returns the id of the object v maps, 0 for memory that is
// not shared.
func sharedID(v *image.VMA) uint64 {
	if v.Kind != image.VMAShmem || v.Shmem == nil {
		return 0
	}
	return v.Shmem.ID
}

// sharedObjects returns the shared objects served lazily, by id, planned
// the first time from every process of the tree.
func (ph *Phase) sharedObjects() map[uint64]*sharedObject {
	ph.sharedOnce.Do(func() { ph.shared = planShared(ph.procs, ph.log) })
	return ph.shared
}

// planShared returns the shared objects of procs that can be served
// lazily: their data runs, from each process's blocks.
func planShared(procs []*Process, log *slog.Logger) map[uint64]*sharedObject {
	ok := sharedCandidates(procs)
	if len(ok) == 0 {
		return nil
	}
	if err := probeMissingShmem(); err != nil {
		log.Info("shared memory filled before the processes run: the kernel cannot serve it lazily", "err", err)
		return nil
	}
	objs := map[uint64]*sharedObject{}
	for _, p := range procs {
		var v *image.VMA
		for b := range p.pages.Blocks() {
			if v == nil || b.Addr < v.Start || b.Addr >= v.End {
				v = mem.VMAAt(p.st.VMAs, b.Addr)
			}
			id := uint64(0)
			if v != nil {
				id = sharedID(v)
			}
			if !ok[id] || v.Shmem.Owner != 0 || b.Kind == codec.Zero {
				continue
			}
			o := objs[id]
			if o == nil {
				o = &sharedObject{id: id}
				objs[id] = o
			}
			o.runs = append(o.runs, dataRun{off: v.Offset + b.Addr - v.Start, n: uint64(b.Len), from: p, addr: b.Addr})
		}
	}
	for id, o := range objs {
		sort.Slice(o.runs, func(i, j int) bool { return o.runs[i].off < o.runs[j].off })
		if !o.disjoint() || !o.coveredBy(procs) {
			log.Debug("shared memory object filled before the processes run", "id", id)
			delete(objs, id)
		}
	}
	return objs
}

// sharedCandidates returns the objects of procs that no rule of lazy
// service excludes (see the top of this file).
func sharedCandidates(procs []*Process) map[uint64]bool {
	ok := map[uint64]bool{}
	no := map[uint64]bool{}
	for _, p := range procs {
		for i := range p.st.VMAs {
			v := &p.st.VMAs[i]
			id := sharedID(v)
			if id == 0 {
				continue
			}
			ok[id] = true
			if v.Shmem.SysV != nil || v.Flags&unix.MAP_SHARED == 0 || mem.EagerPage(p.st.Threads, v.Start, v.End-v.Start) ||
				slices.ContainsFunc(v.VMFlags, func(f string) bool { return f == "lo" || f == "lf" }) {
				no[id] = true
			}
		}
		for _, f := range p.st.FDs {
			if f.File != nil {
				no[f.File.Ino] = true
			}
		}
	}
	for id := range no {
		delete(ok, id)
	}
	return ok
}

// disjoint reports whether o's data runs do not overlap (the dump keeps
// an object's data once, but for a mapping of another part of it).
func (o *sharedObject) disjoint() bool {
	for i := 1; i < len(o.runs); i++ {
		if o.runs[i].off < o.runs[i-1].off+o.runs[i-1].n {
			return false
		}
	}
	return true
}

// coveredBy reports whether every process of procs that maps o maps all
// of its data.
func (o *sharedObject) coveredBy(procs []*Process) bool {
	for _, p := range procs {
		var offs []units.Range
		for i := range p.st.VMAs {
			if v := &p.st.VMAs[i]; sharedID(v) == o.id {
				offs = append(offs, units.Range{Start: v.Offset, End: v.Offset + v.End - v.Start})
			}
		}
		if len(offs) == 0 {
			continue
		}
		offs = units.Union(offs)
		for _, r := range o.runs {
			if !mem.Within(offs, r.off, r.n) {
				return false
			}
		}
	}
	return true
}

// segments returns where o's data goes in a mapping of it at [start,
// end) that shows it from offset off on.
func (o *sharedObject) segments(start, end, off uint64) []segment {
	var segs []segment
	for _, r := range o.runs {
		lo, hi := max(r.off, off), min(r.off+r.n, off+end-start)
		if lo < hi {
			segs = append(segs, segment{start: start + lo - off, end: start + hi - off, from: r.from, addr: r.addr + lo - r.off})
		}
	}
	return segs
}

// probeMissingShmem checks that the kernel lets a userfaultfd serve
// missing pages of shared memory (Linux 4.11).
func probeMissingShmem() error {
	fd, err := newUffd()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _, err = uffdio.API(fd, uffdio.Features|uffdio.FeatureMissingShmem)
	return err
}

// newUffd returns a userfaultfd of snapctl's own.
func newUffd() (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		return -1, fmt.Errorf("userfaultfd: %w", e)
	}
	return int(fd), nil
}

// segment says that [start, end) of a mapping holds the memory of
// process from at addr in the snapshot.
type segment struct {
	start, end uint64
	from       *Process
	addr       uint64
}

// segmentSource reads a mapping of shared objects from the processes
// whose snapshot holds their data, each through read.
type segmentSource struct {
	segs []segment // sorted, disjoint
	read func(p *Process) io.ReaderAt
}

// find returns the segment holding addr.
func (s *segmentSource) find(addr uint64) (segment, bool) {
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].end > addr })
	if i == len(s.segs) || s.segs[i].start > addr {
		return segment{}, false
	}
	return s.segs[i], true
}

// ReadAt reads the snapshot's bytes of the mapping at off: a pager reads
// only what its extents (the segments) hold.
func (s *segmentSource) ReadAt(b []byte, off int64) (int, error) {
	addr, n := uint64(off), 0
	for n < len(b) {
		g, ok := s.find(addr)
		if !ok {
			return n, fmt.Errorf("shared memory at %#x: no data in the snapshot", addr)
		}
		k := int(min(uint64(len(b)-n), g.end-addr))
		m, err := s.read(g.from).ReadAt(b[n:n+k], int64(g.addr+addr-g.start))
		n += m
		if m < k {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
		addr += uint64(k)
	}
	return n, nil
}

// unit is uffd.Options.Unit for a mapping: the unit of the block behind
// addr, in the mapping's addresses.
func (s *segmentSource) unit(addr uint64) (lo, hi uint64, ok bool) {
	g, ok := s.find(addr)
	if !ok {
		return 0, 0, false
	}
	l, h, ok := g.from.pages.Unit(g.addr+addr-g.start, lazyFaultWindow)
	if !ok {
		return 0, 0, false
	}
	lo, hi = g.start, g.end
	if l > g.addr {
		lo = g.start + l - g.addr
	}
	if h < g.addr+g.end-g.start {
		hi = g.start + h - g.addr
	}
	return lo, hi, lo < hi
}

// sharedPart is a process's share of the shared memory served lazily:
// the userfaultfd its mappings of it are registered with, and the pager
// that serves their faults.
type sharedPart struct {
	fd     int
	held   bool
	ranges []units.Range
	segs   []segment
	pager  *uffd.Pager
	stats  uffd.Stats
}

// prepareShared makes the userfaultfd of the process's mappings of the
// shared objects served lazily (and the objects' streamers, the first
// time), and lists what its pager serves; RegisterShared registers them.
func (p *Process) prepareShared(in *syscalls.Injector, pid int) error {
	objs := p.ph.sharedObjects()
	if len(objs) == 0 {
		return nil
	}
	sh := &sharedPart{fd: -1}
	for i := range p.st.VMAs {
		v := &p.st.VMAs[i]
		o := objs[sharedID(v)]
		if o == nil {
			continue
		}
		if o.str == nil {
			str, err := newStreamer(pid, v, o)
			if err != nil {
				return err
			}
			o.str = str
		}
		sh.segs = append(sh.segs, o.segments(v.Start, v.End, v.Offset)...)
		if n := len(sh.ranges); n > 0 && sh.ranges[n-1].End == v.Start {
			sh.ranges[n-1].End = v.End
		} else {
			sh.ranges = append(sh.ranges, units.Range{Start: v.Start, End: v.End})
		}
	}
	if len(sh.ranges) == 0 {
		return nil
	}
	p.shm = sh
	var err error
	if sh.fd, err = mem.Userfaultfd(in, pid); err != nil {
		return err
	}
	if _, _, err := uffdio.API(sh.fd, uffdio.Features|uffdio.FeatureMissingShmem); err != nil {
		return fmt.Errorf("UFFDIO_API for shared memory: %w", err)
	}
	if k := p.ph.keeperOf(); k != nil {
		if err := k.Hold(sh.fd); err != nil {
			return fmt.Errorf("hand the userfaultfd to its keeper: %w", err)
		}
		sh.held = true
	}
	return nil
}

// RegisterShared registers the process's mappings of the shared objects
// served lazily. Every process of the tree must have before any runs.
func (p *Process) RegisterShared() error {
	if p.shm == nil {
		return nil
	}
	for _, rg := range p.shm.ranges {
		if _, err := uffdio.Register(p.shm.fd, rg.Start, rg.Len(), uffdio.RegisterModeMissing); err != nil {
			return fmt.Errorf("UFFDIO_REGISTER shared memory %v: %w", rg, err)
		}
	}
	return nil
}

// closeShared drops the pager and the userfaultfd of the process's
// shared memory.
func (p *Process) closeShared() {
	sh := p.shm
	if sh == nil {
		return
	}
	if sh.pager != nil {
		sh.pager.Close()
		sh.pager = nil
	}
	if sh.held {
		sh.held = false
		if err := p.ph.keeper.Release(sh.fd); err != nil {
			p.ph.log.Warn("userfaultfd keeper", "err", err)
		}
	}
	if sh.fd >= 0 {
		unix.Close(sh.fd)
		sh.fd = -1
	}
}
