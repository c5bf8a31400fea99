package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/units"
)

// LazyStats describe the lazy phase of a restore.
type LazyStats = uffd.Stats

// LazyOptions tune the lazy phase of a restore (RestoreOptions.Lazy set).
type LazyOptions struct {
	// PrefetchDelay holds the background prefetch back for this long after
	// the process starts running: faults are served at once, the rest of
	// memory streams in afterwards. 0 starts it at once.
	PrefetchDelay time.Duration
	// Progress, if set, is called from the pager with the lazily served
	// bytes placed so far and their total. It must return at once.
	Progress func(done, total uint64)
	// SourceWaits says what the source is like: its reads wait on
	// another process that does the work (a FUSE server answering with
	// direct I/O, as fs.MountPrivate's). The pager then reads with a
	// worker per CPU, so that one waits while another copies; otherwise
	// with one per CPU but one, which the process and the fault service
	// need. See lazyWorkers.
	SourceWaits bool
	// CheckSource says that the source's bytes are someone else's (a
	// lazyfs mount): the pager then checks every block it reads from it
	// against the snapshot's CRC32C (image.Reader.Checked), as the
	// snapshot's own readers do, and a block that fails kills the
	// process. A source that checks its own reads (image.Reader's) needs
	// none.
	CheckSource bool
	// RawDirect says that the source is a lazyfs mount of the snapshot
	// being restored: blocks stored as is (Raw) are then read from the
	// snapshot's pages file instead, as with the direct source, and only
	// the blocks that must be decoded go through the mount
	// (image.Reader.Mixed). A Raw block gains nothing from a mount (the
	// pages file's page cache is shared between restores just as well)
	// and costs it a round trip to the FUSE server and two more copies.
	RawDirect bool
	// Keeper starts a keeper process (see KeeperArg0) that holds a copy
	// of every userfaultfd of the restored process tree from before the
	// process runs until its memory is all in, so that if snapctl dies,
	// the userfaultfds outlive the kill that PTRACE_O_EXITKILL sends: a
	// missing page is never filled with zeros in a process still
	// running. If it cannot start, the restore goes on without (and logs
	// a warning). Ignored when Holder is set.
	Keeper bool
	// SourceReady, if set, is called before the process first runs: a
	// source that comes up in the background while the process is
	// created (the private mount) waits for it there and says if it
	// failed, so that a process never runs without its source (unless
	// SourceUp says how it can). It returns when ctx ends (SIGINT or
	// SIGTERM), however long the source takes to come up.
	SourceReady func(ctx context.Context) error
	// SourceUp, if set, reports without waiting whether
	// the source (one that comes up in the background, as SourceReady's)
	// can be read yet. The process then runs without waiting for it
	// (SourceReady is not called): until SourceUp reports true, the
	// blocks meant for the source are decoded here from the snapshot's
	// files, as with the direct source; if it never comes up, they all
	// are.
	SourceUp func() bool
	// SourceGone, if set, receives an error naming what died when the
	// process that serves the source is gone (the private mount's FUSE
	// server): the lazy phase then ends at once, the process tree is
	// killed, and Restore returns that error rather than wait for faults
	// that can no longer be served.
	SourceGone <-chan error
	// SourceAbort, if set, makes every read waiting on the source fail at
	// once: called when the restore's context ends (SIGINT, SIGTERM) during
	// the lazy phase, so that the pager does not wait on reads that a
	// stalled store may hold for their whole timeout.
	SourceAbort func()
	// Holder, if set, holds those copies instead of a keeper that
	// Restore starts.
	Holder uffd.Holder
	// Pager tunes the pager (chunk sizes, spinning, affinity); its
	// Prefetch, Logger, Progress, Holder, PrefetchDelay, First, OnFault
	// and HoldPrefetch are set by Restore, and its Workers if zero (see
	// SourceWaits).
	Pager uffd.Options
	// WorkingSet says whether the working set beside the snapshot is
	// fetched first (restore_workingset.go).
	WorkingSet WorkingSetMode
	// Record, if set, records a working set (and ignores the one there).
	Record *RecordOptions
}

// KeeperArg0 is the argv[0] of the keeper process that a lazy restore
// with LazyOptions.Keeper starts: the running program, re-executed. A
// program that sets Keeper must run KeeperMain before anything else when
// os.Args[0] is KeeperArg0, in an init function:
//
//	func init() {
//		if filepath.Base(os.Args[0]) == engine.KeeperArg0 {
//			os.Exit(engine.KeeperMain(os.Args))
//		}
//	}
const KeeperArg0 = uffd.KeeperArg0

// KeeperMain is the keeper process (args is its os.Args); it returns the
// exit code.
func KeeperMain(args []string) int { return uffd.KeeperMain(args, nil) }

// startKeeper starts the keeper that opts ask for, or returns nil.
func startKeeper(opts RestoreOptions, log *slog.Logger) *uffd.Keeper {
	if (opts.Lazy == nil && opts.LazyOf == nil) || !opts.LazyOptions.Keeper || opts.LazyOptions.Holder != nil {
		return nil
	}
	exe, err := os.Executable()
	var k *uffd.Keeper
	if err == nil {
		k, err = uffd.StartKeeper(exe)
	}
	if err != nil {
		log.Warn("no userfaultfd keeper: if snapctl is killed, the process may see zero pages before it dies", "err", err)
		return nil
	}
	return k
}

// closeKeeper lets the keeper go: by then every userfaultfd it held was
// released, or the processes they served are dead.
func closeKeeper(k *uffd.Keeper, log *slog.Logger) {
	if err := k.Close(); err != nil {
		log.Warn("userfaultfd keeper", "err", err)
	}
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

// lazyState is the userfaultfd of a lazy restore.
type lazyState struct {
	fd      int // our copy of the process's userfaultfd
	held    bool
	ranges  []units.Range // registered: the lazy VMAs that hold data
	extents []uffd.Extent
	bytes   uint64 // in the extents
	pager   *uffd.Pager
	holder  uffd.Holder
	kill    func() // kills the restored process tree
}

// close kills the process tree first (a process whose userfaultfd is
// closed reads zeros where its memory is missing), then drops the fds.
func (l *lazyState) close() {
	if l.kill != nil {
		l.kill()
	}
	if l.pager != nil {
		l.pager.Close()
	}
	if l.held && l.holder != nil {
		l.holder.Release(l.fd)
		l.held = false
	}
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

// isLazy reports whether v's memory is served through userfaultfd.
func (r *restorer) isLazy(v *image.VMA) bool { return r.opts.Lazy != nil && mem.Lazy(v) }

// eagerPage reports whether [addr, addr+n) must be filled before the
// process runs even in a lazy restore (see mem.EagerPage).
func (r *restorer) eagerPage(addr, n uint64) bool { return mem.EagerPage(r.st.Threads, addr, n) }

// lazyBlock reports whether block b is served by the pager rather than
// written before the process runs.
func (r *restorer) lazyBlock(b image.Block) bool {
	v := mem.VMAAt(r.st.VMAs, b.Addr)
	return v != nil && r.isLazy(v) && !r.eagerPage(b.Addr, uint64(b.Len))
}

// prepareLazy creates the process's userfaultfd (inside it, by injection)
// and takes it, then lists what the pager serves and what is registered.
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
func (r *restorer) prepareLazy(ctx context.Context) error {
	if r.opts.Lazy == nil {
		return nil
	}
	l := &lazyState{fd: -1, holder: r.opts.LazyOptions.Holder}
	r.lazy = l
	l.kill = r.killTree
	var err error
	if l.fd, err = mem.Userfaultfd(r.in, r.pid); err != nil {
		return err
	}
	if _, _, err := uffd.API(l.fd, uffd.Features); err != nil {
		return fmt.Errorf("UFFDIO_API: %w", err)
	}
	if l.holder != nil {
		if err := l.holder.Hold(l.fd); err != nil {
			return fmt.Errorf("hand the userfaultfd to its keeper: %w", err)
		}
		l.held = true
	}
	withData := map[*image.VMA]bool{}
	// Blocks come in address order: the VMA and its verdict are looked up
	// once per VMA, not per block (a 1 GiB snapshot of 4 KiB blocks has
	// 262144 of them).
	var v *image.VMA
	lazy := false
	l.extents = make([]uffd.Extent, 0, r.pages.Stats().Total.Blocks)
	for b := range r.pages.Blocks() {
		if v == nil || b.Addr < v.Start || b.Addr >= v.End {
			v = mem.VMAAt(r.st.VMAs, b.Addr)
			lazy = v != nil && r.isLazy(v)
		}
		if b.Kind == codec.Zero || !lazy || r.eagerPage(b.Addr, uint64(b.Len)) {
			continue
		}
		if n := len(l.extents); n == 0 || l.extents[n-1].End() <= v.Start {
			withData[v] = true // the VMA's first extent
		}
		l.extents = append(l.extents, uffd.Extent{Addr: b.Addr, Len: uint64(b.Len)})
		l.bytes += uint64(b.Len)
	}
	for i := range r.st.VMAs {
		if v := &r.st.VMAs[i]; withData[v] {
			// VMAs that touch are registered with one UFFDIO_REGISTER
			// (the kernel walks the VMAs of a range): numpy's arrays are
			// two VMAs each, and a 1 GiB process of them had 128 to
			// register one by one before it could run.
			if n := len(l.ranges); n > 0 && l.ranges[n-1].End == v.Start {
				l.ranges[n-1].End = v.End
				continue
			}
			l.ranges = append(l.ranges, units.Range{Start: v.Start, End: v.End})
		}
	}
	// Threads and children created during the lazy phase are traced too.
	for _, th := range r.threads {
		if err := th.SetOptions(lazyTraceOptions); err != nil {
			return err
		}
	}
	return nil
}

// killTree kills the restored process and every process it forked during
// the lazy phase (all traced, all held by our tracer).
func (r *restorer) killTree() {
	if r.child != nil {
		if err := r.child.Kill(); err != nil {
			unix.Kill(r.pid, unix.SIGKILL)
		}
	}
	for _, p := range r.t.Processes() {
		if err := p.Kill(); err != nil {
			r.log.Error("kill child forked during the lazy phase", "pid", p.Pid(), "err", err)
		}
	}
}

// register registers the lazy VMAs, the last step before the process
// runs: every page not present from now on faults to us.
func (l *lazyState) register() error {
	for _, rg := range l.ranges {
		if _, err := uffd.Register(l.fd, rg.Start, rg.Len(), uffd.RegisterModeMissing); err != nil {
			return fmt.Errorf("UFFDIO_REGISTER %v: %w", rg, err)
		}
	}
	return nil
}

// finish removes our injection area, sets every thread's registers, FP
// state and signal mask, and lets the process run: detached, or for a
// lazy restore still traced with PTRACE_O_EXITKILL so that it dies with
// snapctl rather than run on with missing memory.
func (r *restorer) finish(ctx context.Context) error {
	if _, err := r.in.Syscall(unix.SYS_MUNMAP, r.area, areaLen); err != nil {
		return fmt.Errorf("munmap injection area: %w", err)
	}
	if err := r.in.Close(); err != nil {
		return err
	}
	if err := r.setThreadRegs(); err != nil {
		return err
	}
	if r.lazy == nil {
		return r.child.Detach()
	}
	if err := r.lazy.register(); err != nil {
		return err
	}
	if ready := r.opts.LazyOptions.SourceReady; ready != nil && r.opts.LazyOptions.SourceUp == nil {
		if err := ready(ctx); err != nil {
			return fmt.Errorf("page source: %w", err)
		}
	}
	return r.child.Resume()
}

// serveLazy runs the pager until every page is in, then hands the
// process its memory for good: unregister, close, detach (the process and
// any child it forked meanwhile).
func (r *restorer) serveLazy(ctx context.Context, stats *LazyStats, wsr *WorkingSetResult) error {
	if err := r.servePages(ctx, stats, wsr); err != nil {
		return err
	}
	return r.detachTree()
}

// servePages runs the pager until every page is in, then unregisters and
// closes the userfaultfd; the process stays traced.
func (r *restorer) servePages(ctx context.Context, stats *LazyStats, wsr *WorkingSetResult) error {
	l := r.lazy
	o := r.opts.LazyOptions
	po := o.Pager
	po.Prefetch, po.PrefetchDelay, po.Logger, po.Progress, po.Holder = true, o.PrefetchDelay, r.log, o.Progress, o.Holder
	rec := r.startRecording(&po, time.Now())
	if po.Workers == 0 {
		po.Workers = lazyWorkers(o.SourceWaits)
	}

	if po.Unit == nil {
		po.Unit = func(addr uint64) (uint64, uint64, bool) { return r.pages.Unit(addr, lazyFaultWindow) }
	}
	src := r.opts.Lazy
	if o.CheckSource {
		src = r.pages.Checked(src)
	}
	if o.SourceUp != nil {
		src = standIn{up: o.SourceUp, src: src, direct: r.pages.Uncached()}
	}
	if o.RawDirect {
		src = r.pages.Mixed(src)
	}
	po.First, src = r.workingSetFirst(src, wsr)
	l.pager = uffd.New(l.fd, src, slices.Clip(l.extents), po)
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go r.watchHelpers(parent, ctx, cancel)
	var recorded chan struct{}
	if rec != nil {
		recorded = make(chan struct{})
		go func() {
			defer close(recorded)
			r.record(ctx, rec, l.pager, wsr)
		}()
	}
	err := l.pager.Run(ctx)
	cause := context.Cause(ctx)
	if recorded != nil {
		cancel(errLazyDone(err))
		<-recorded
	}
	*stats = l.pager.Stats()
	if err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // a helper died: say which
	}
	if err != nil {
		return r.lazyError(err)
	}
	if !stats.Exited {
		exited, err := unregisterLazy(l.fd, l.ranges, r.pid)
		if err != nil {
			return err
		}
		stats.Exited = exited
	}
	if err := l.pager.Close(); err != nil {
		return err
	}
	l.pager = nil
	if l.held {
		l.held = false
		if err := l.holder.Release(l.fd); err != nil {
			r.log.Warn("userfaultfd keeper", "err", err)
		}
	}
	unix.Close(l.fd)
	l.fd = -1
	r.lazy = nil
	return nil
}

// unregisterLazy removes the registration of the lazy ranges of process
// pid. A process that exits once its last page is in, before this (killed
// while its working set is written, say), takes its address space with it,
// and the kernel then refuses with ENOMEM: that is an exit (exited true),
// not a failed restore.
func unregisterLazy(fd int, ranges []units.Range, pid int) (exited bool, err error) {
	for _, rg := range ranges {
		err := uffd.Unregister(fd, rg.Start, rg.Len())
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

// ErrHelperDied: a process a lazy restore depends on (the keeper of the
// userfaultfds, the private mount's FUSE server) died during the lazy
// phase; the error wrapping it names it.
var ErrHelperDied = errors.New("helper process died")

// watchHelpers ends the lazy phase (cancel, with the cause) if the keeper
// or the source's server dies before it is over: without the keeper, a
// snapctl killed now would leave the process reading zeros; without the
// server, faults would fail one by one, or never come if the process is
// idle, and snapctl would wait on a restore that cannot finish.
//
// When the restore's own context (parent) ends, it aborts the source
// (LazyOptions.SourceAbort): reads waiting on it fail, and the pager ends
// now rather than when they time out.
func (r *restorer) watchHelpers(parent, ctx context.Context, cancel context.CancelCauseFunc) {
	var keeperExited <-chan struct{}
	if r.keeper != nil {
		keeperExited = r.keeper.Exited()
	}
	select {
	case <-ctx.Done():
		if parent.Err() != nil && r.opts.LazyOptions.SourceAbort != nil {
			r.opts.LazyOptions.SourceAbort()
		}
	case err, ok := <-r.opts.LazyOptions.SourceGone:
		if !ok || err == nil {
			err = errors.New("the page source's server")
		}
		cancel(fmt.Errorf("%w: %w", ErrHelperDied, err))
	case <-keeperExited:
		cancel(fmt.Errorf("%w: the userfaultfd keeper (%s, pid %d): %v", ErrHelperDied, KeeperArg0, r.keeper.Pid(), r.keeper.ExitErr()))
	}
}

// lazyFaultWindow is what a fault in a block whose pages have checksums
// of their own is served: the aligned 16 KiB around the page, read and
// checked alone, rather than the whole block. A process touching a page
// here and there (a request that reads 1% of its weights) then waits for
// what it reads, not for 256 KiB per page; one that reads in order is
// served FaultAhead at a time all the same. See test/bench/BENCHMARKS.md.
const lazyFaultWindow = 16 << 10

// lazyWorkers is how many threads prefetch, each reading its chunk and
// placing it. A source that does its own work (a file read) gets one per
// CPU we may run on but one, which the process and the fault service
// need: with more, they wait for a CPU. A source whose reads wait on
// another process gets one per CPU: one reads while another copies. At
// least one (two when waiting), at most 4. Running the workers at
// SCHED_IDLE did not help. The figures behind it: test/bench/BENCHMARKS.md
// (Decisions).
func lazyWorkers(sourceWaits bool) int {
	if sourceWaits {
		return min(4, max(2, runtime.GOMAXPROCS(0)))
	}
	return min(4, max(1, runtime.GOMAXPROCS(0)-1))
}

// detachTree detaches the restored process, then every child it forked
// during the lazy phase (which may have forked in turn until detached).
func (r *restorer) detachTree() error {
	var errs []error
	if err := r.child.Detach(); err != nil {
		errs = append(errs, err)
	}
	for range 100 {
		ps := r.t.Processes()
		if len(ps) == 0 {
			break
		}
		for _, p := range ps {
			if err := p.Detach(); err != nil {
				errs = append(errs, fmt.Errorf("detach child %d: %w", p.Pid(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// lazyError names the block behind a failed read (see explainRead).
func (r *restorer) lazyError(err error) error { return explainRead(r.pages, err) }

// snapshotBlocks is what explainRead reads again: the snapshot's own
// reader (*image.Reader).
type snapshotBlocks interface {
	BlockAt(addr uint64) (image.Block, bool)
	io.ReaderAt
}

// explainRead names the block behind a pager's failed read: a read
// through a mount reports only EIO, so the block is read again from the
// snapshot itself, which tells a corrupt block (its file, index, address
// and checksum) or a snapshot that cannot be read any more (a store gone)
// from a source that went away on its own.
func explainRead(pages snapshotBlocks, err error) error {
	var se *uffd.ServeError
	if !errors.As(err, &se) || se.Op != "read" {
		return err
	}
	var be *image.BlockError
	if errors.As(se.Err, &be) {
		return fmt.Errorf("%w (uffd read %#x+%#x)", be, se.Addr, se.Len)
	}
	src := se.Src
	if src == 0 {
		src = se.Addr
	}
	for a := src; a < src+se.Len; {
		b, ok := pages.BlockAt(a)
		if !ok {
			break
		}
		if b.Kind != codec.Zero {
			buf := make([]byte, b.Len)
			_, derr := pages.ReadAt(buf, int64(b.Addr))
			if errors.As(derr, &be) {
				return fmt.Errorf("%w (uffd read %#x+%#x through the page source: %v)", be, se.Addr, se.Len, se.Err)
			}
			if derr != nil && !errors.Is(derr, io.EOF) {
				return fmt.Errorf("%w (read again from the snapshot: %w)", err, derr)
			}
		}
		a = b.End()
	}
	return fmt.Errorf("%w (the snapshot files read fine there: the page source failed)", err)
}

// standIn reads from src once up reports it can be read, and from direct
// (the snapshot's own files) until then (LazyOptions.SourceUp).
type standIn struct {
	up          func() bool
	src, direct io.ReaderAt
}

func (s standIn) ReadAt(p []byte, off int64) (int, error) {
	if s.up() {
		return s.src.ReadAt(p, off)
	}
	return s.direct.ReadAt(p, off)
}
