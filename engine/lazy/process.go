package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Process is the lazy phase of one restored process: its userfaultfd,
// what its pager serves, its working set.
type Process struct {
	ph    *Phase
	snap  *image.Snapshot
	st    *image.Process
	pages *image.Reader

	src     io.ReaderAt // where the pager reads (PageSource.Pages)
	pid     int         // ours, once Prepare made the userfaultfd
	fd      int         // our copy of the process's userfaultfd
	held    bool
	ranges  []units.Range // registered: the lazy VMAs that hold data
	extents []uffd.Extent
	pager   *uffd.Pager
	stats   uffd.Stats
	// kept and forked are pages the process has without the pager
	// (Inherit).
	kept, forked []units.Range
	// shm is its share of the shared memory served lazily, if it maps
	// any (shared.go).
	shm *sharedPart

	// wsLoad waits for the working set loadWorkingSet started reading.
	wsLoad func() (*workingset.Set, error)
	ws     WorkingSetResult
}

// lazyTraceOptions are the ptrace options of every thread of a lazily
// restored process while pages are missing. EXITKILL: if snapctl dies,
// the process dies with it. TRACECLONE, TRACEFORK, TRACEVFORK: threads
// and processes it creates meanwhile are auto-attached and inherit
// EXITKILL. A child forked now has its own userfaultfd, served by us: it
// must die with snapctl too rather than run on with zero pages. (A vfork
// child shares the parent's memory and its userfaultfd.) The kernel
// attaches a child in copy_process after the fork event was read, and a
// parent killed before that fails the fork: no child escapes.
const lazyTraceOptions = unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK

// Skip reports whether block b of VMA v is left out of the fill before
// the process runs: its pager serves it.
func (p *Process) Skip(b image.Block, v *image.VMA) bool {
	if id := sharedID(v); id != 0 {
		return p.ph.sharedObjects()[id] != nil
	}
	return mem.Lazy(v) && p.served(b)
}

// served reports whether the pager serves block b of a lazy VMA: not a
// page the threads need to start (mem.EagerPage), nor one the process
// has without it (Inherit).
func (p *Process) served(b image.Block) bool {
	n := uint64(b.Len)
	return !mem.EagerPage(p.st.Threads, b.Addr, n) && !mem.Within(p.kept, b.Addr, n) && !mem.Overlaps(p.forked, b.Addr, n)
}

// Inherit says which pages the process has without its pager: kept, those
// it keeps from its parent since fork (mem.Inheritance), and forked,
// those its children keep, which it must hold when it forks them (filled
// before it runs). Called before Skip and Prepare.
func (p *Process) Inherit(kept, forked []units.Range) { p.kept, p.forked = kept, forked }

// serves reports whether the pager serves block b.
func (p *Process) serves(b image.Block) bool {
	v := mem.VMAAt(p.st.VMAs, b.Addr)
	return v != nil && p.Skip(b, v)
}

// Prepare creates the userfaultfd of process pid (ours) inside it, by
// injection through in, takes it and hands a copy to the keeper, lists
// what the pager serves and what is registered, and makes every thread
// (and what it forks from now on) die with snapctl. It must run while the
// process still has our privileges: process state may set an
// unprivileged uid, for which userfaultfd(2) is refused
// (vm.unprivileged_userfaultfd=0).
//
// What is registered: whole VMAs that hold at least one non-zero block.
// A VMA whose blocks are all ZERO (or that was never dumped) is not
// registered: the kernel fills it on first touch where a fault round
// trip through the pager costs far more. Zero ranges inside a registered
// VMA are served by the pager, the zero page 2 MiB at a time for reads
// (uffd.Options.ZeroReadChunk), and need nothing once the lazy phase
// ends. Registering only the non-zero ranges of a VMA instead was no
// faster (the pager's zero reads are few and cheap; see
// test/bench/BENCHMARKS.md, Decisions), and it costs: registering part of
// a VMA splits it for the whole lazy phase, and mremap() of a range that
// crosses a split fails with EFAULT (a realloc the process could do
// before the restore could fail during it).
func (p *Process) Prepare(in *syscalls.Injector, pid int, threads []*ptrace.Thread) error {
	p.pid = pid
	var err error
	if p.fd, err = mem.Userfaultfd(in, pid); err != nil {
		return err
	}
	if _, _, err := uffdio.API(p.fd, uffdio.Features); err != nil {
		return fmt.Errorf("UFFDIO_API: %w", err)
	}
	if k := p.ph.keeperOf(); k != nil {
		if err := k.Hold(p.fd); err != nil {
			return fmt.Errorf("hand the userfaultfd to its keeper: %w", err)
		}
		p.held = true
	}
	withData := map[*image.VMA]bool{}
	// Blocks come in address order: the VMA and its verdict are looked up
	// once per VMA, not per block (a 1 GiB snapshot of 4 KiB blocks has
	// 262144 of them).
	var v *image.VMA
	lazy := false
	p.extents = make([]uffd.Extent, 0, p.pages.Stats().Total.Blocks)
	for b := range p.pages.Blocks() {
		if v == nil || b.Addr < v.Start || b.Addr >= v.End {
			v = mem.VMAAt(p.st.VMAs, b.Addr)
			lazy = v != nil && mem.Lazy(v)
		}
		if b.Kind == codec.Zero || !lazy || !p.served(b) {
			continue
		}
		if n := len(p.extents); n == 0 || p.extents[n-1].End() <= v.Start {
			withData[v] = true // the VMA's first extent
		}
		p.extents = append(p.extents, uffd.Extent{Addr: b.Addr, Len: uint64(b.Len)})
	}
	for i := range p.st.VMAs {
		if v := &p.st.VMAs[i]; withData[v] {
			// VMAs that touch are registered with one UFFDIO_REGISTER
			// (the kernel walks the VMAs of a range): numpy's arrays are
			// two VMAs each, and a 1 GiB process of them had 128 to
			// register one by one before it could run.
			if n := len(p.ranges); n > 0 && p.ranges[n-1].End == v.Start {
				p.ranges[n-1].End = v.End
				continue
			}
			p.ranges = append(p.ranges, units.Range{Start: v.Start, End: v.End})
		}
	}
	if err := p.prepareShared(in, pid); err != nil {
		return err
	}
	for _, th := range threads {
		if err := th.SetOptions(lazyTraceOptions); err != nil {
			return err
		}
	}
	return nil
}

// Register registers the lazy VMAs, the last step before the process
// runs: every page not present from now on faults to us.
func (p *Process) Register() error {
	for _, rg := range p.ranges {
		if _, err := uffdio.Register(p.fd, rg.Start, rg.Len(), uffdio.RegisterModeMissing); err != nil {
			return fmt.Errorf("UFFDIO_REGISTER %v: %w", rg, err)
		}
	}
	return nil
}

// WorkingSet says what the restore of this process did with working sets.
func (p *Process) WorkingSet() WorkingSetResult { return p.ws }

// close drops the pager and the userfaultfd. The process must be dead or
// have all its memory: one whose userfaultfd is closed reads zeros where
// its memory is missing.
func (p *Process) close() {
	if p.pager != nil {
		p.pager.Close()
		p.pager = nil
	}
	if p.held {
		p.held = false
		if err := p.ph.keeper.Release(p.fd); err != nil {
			p.ph.log.Warn("userfaultfd keeper", "err", err)
		}
	}
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
	if p.wsLoad != nil {
		// Its mapping goes once the pager that read it is done.
		if ws, _ := p.wsLoad(); ws != nil {
			ws.Close()
		}
		p.wsLoad = nil
	}
}

// serve runs the pager until every page is in, then unregisters and
// closes the userfaultfd; the process stays traced.
func (p *Process) serve(ctx context.Context, po uffd.Options) error {
	rec := p.startRecording(&po, time.Now())
	po.Unit = func(addr uint64) (uint64, uint64, bool) { return p.pages.Unit(addr, lazyFaultWindow) }
	first, src := p.workingSetFirst(p.src) // p.src: Phase.OpenSources
	po.First = first
	if p.ws.Copy {
		po.FaultSrc = nil // the working set's copy serves faults too
	}
	p.pager = uffd.New(p.fd, src, slices.Clip(p.extents), po)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var recorded chan struct{}
	if rec != nil {
		recorded = make(chan struct{})
		go func() {
			defer close(recorded)
			p.record(ctx, rec, p.pager)
		}()
	}
	err := p.pager.Run(ctx)
	if recorded != nil {
		cancel(errLazyDone(err))
		<-recorded
	}
	p.stats = p.pager.Stats()
	if err != nil {
		return explainRead(p.pages, err)
	}
	if !p.stats.Exited {
		exited, err := unregisterLazy(p.fd, p.ranges, p.pid)
		if err != nil {
			return err
		}
		p.stats.Exited = exited
	}
	err = p.pager.Close()
	p.pager = nil
	p.close()
	return err
}

// unregisterLazy removes the registration of the lazy ranges of process
// pid. A process that exits once its last page is in, before this (killed
// while its working set is written, say), takes its address space with it,
// and the kernel then refuses with ENOMEM: that is an exit (exited true),
// not a failed restore.
func unregisterLazy(fd int, ranges []units.Range, pid int) (exited bool, err error) {
	for _, rg := range ranges {
		err := uffdio.Unregister(fd, rg.Start, rg.Len())
		if err == nil {
			continue
		}
		if errors.Is(err, unix.ENOMEM) && addressSpaceGone(pid) {
			return true, nil
		}
		return false, fmt.Errorf("UFFDIO_UNREGISTER %v: %w", rg, err)
	}
	return false, nil
}

// addressSpaceGone reports whether process pid has exited, or is past the
// point of its exit where its memory is released (no virtual size).
func addressSpaceGone(pid int) bool {
	st, err := proc.ReadStat(pid)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)
	}
	return st.Exited() || st.VSize == 0
}

// lazyFaultWindow is what a fault in a block whose pages have checksums
// of their own is served: the aligned 16 KiB around the page, read and
// checked alone, rather than the whole block. A process touching a page
// here and there (a request that reads 1% of its weights) then waits for
// what it reads, not for 256 KiB per page; one that reads in order is
// served FaultAhead at a time all the same. See test/bench/BENCHMARKS.md.
const lazyFaultWindow = 16 << 10
