package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/uffd/keeper"
)

// Phase is the lazy phase of a restore: a Process for each restored
// process, their page source, the keeper of their userfaultfds.
type Phase struct {
	opts  Options
	src   image.PageSource
	log   *slog.Logger
	procs []*Process

	keeperOnce sync.Once
	started    chan *keeper.Keeper // the keeper, once started (Options.Keeper)
	keeper     *keeper.Keeper

	sharedOnce sync.Once
	shared     map[uint64]*sharedObject // served lazily, by id (shared.go)
	// lastFault is when a pager last served a fault from the source
	// (unix ns): the streamers of shared memory hold back after it.
	lastFault atomic.Int64
}

// NewPhase starts the lazy phase of a restore whose memory src serves;
// with opts.Keeper, the keeper starts at once, in the background (its
// fork and exec take milliseconds the restore need not wait for). Close
// ends it.
func NewPhase(opts Options, src image.PageSource, log *slog.Logger) *Phase {
	ph := &Phase{opts: opts, src: src, log: log}
	if opts.Keeper {
		ph.started = make(chan *keeper.Keeper, 1)
		go func() { ph.started <- startKeeper(log) }()
	}
	return ph
}

// Add adds a process of the tree, whose state is st and whose pages pages
// reads, and starts reading its working set if the restore uses one.
func (ph *Phase) Add(snap *image.Snapshot, st *image.Process, pages *image.Reader) *Process {
	p := &Process{ph: ph, snap: snap, st: st, pages: pages, fd: -1}
	p.loadWorkingSet()
	ph.procs = append(ph.procs, p)
	return p
}

// OpenSources opens what each process's pager will read from its page
// source (image.PageSource.Pages): called before anything runs, so that
// a source that cannot serve a process (a --mount of another snapshot, a
// process missing from it) refuses the restore rather than kill it once
// it runs.
func (ph *Phase) OpenSources() error {
	for _, p := range ph.procs {
		if p.src != nil {
			continue
		}
		src, err := ph.src.Pages(p.pages)
		if err != nil {
			return fmt.Errorf("page source of pid %d: %w", p.st.PID, err)
		}
		p.src = src
	}
	return nil
}

// keeperOf waits for the keeper to start and returns it (nil if there is
// none).
func (ph *Phase) keeperOf() *keeper.Keeper {
	ph.keeperOnce.Do(func() {
		if ph.started != nil {
			ph.keeper = <-ph.started
		}
	})
	return ph.keeper
}

// Close drops every process's pager and userfaultfd, and lets the keeper
// go. The caller kills first whatever has memory missing: a process whose
// userfaultfd is closed reads zeros there.
func (ph *Phase) Close() {
	for _, p := range ph.procs {
		p.close()
		p.closeShared()
	}
	for _, o := range ph.shared {
		if o.str != nil {
			o.str.close()
		}
	}
	if k := ph.keeperOf(); k != nil {
		if err := k.Close(); err != nil {
			ph.log.Warn("userfaultfd keeper", "err", err)
		}
	}
}

// Serve runs the pagers of every process at once until all their memory
// is in (or their address space gone), once every process runs. If one
// pager fails, or a helper dies (the keeper, the source's server), the
// others stop and Serve returns that error: the caller kills the tree.
// When ctx ends (SIGINT, SIGTERM), the source is aborted: reads waiting
// on it fail now rather than when they time out.
func (ph *Phase) Serve(ctx context.Context) (Stats, error) {
	if err := ph.OpenSources(); err != nil {
		return Stats{}, err
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go ph.watch(parent, ctx, cancel)
	n := len(ph.procs)
	progress := newTreeProgress(n, ph.opts.Progress)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ph.serveShared(ctx, cancel, &wg)
	for i, p := range ph.procs {
		po := uffd.Options{Prefetch: true, PrefetchDelay: ph.opts.PrefetchDelay, Logger: ph.log,
			Workers: max(1, lazyWorkers(ph.waits())/n), OnFault: ph.faulted}
		if ph.src.Waits() {
			// A thread waits on a fault: its block is decoded here rather
			// than by the source's server, a round trip away.
			po.FaultSrc = p.pages.Uncached()
		}
		if k := ph.keeperOf(); k != nil {
			po.Holder = k // a forked child's userfaultfd too
		}
		if progress != nil {
			po.Progress = progress.pager(i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.serve(ctx, po); err != nil {
				if n > 1 {
					err = fmt.Errorf("pid %d (%s): %w", p.st.PID, p.st.Comm, err)
				}
				errs[i] = err
				cancel(err)
			}
		}()
	}
	wg.Wait()
	stats := Stats{Exited: true}
	for _, p := range ph.procs {
		stats.add(p.stats)
		if p.shm != nil {
			stats.addShared(p.shm.stats)
		}
		ph.log.Debug("lazy phase", "pid", p.st.PID, "faults", p.stats.Faults, "fault_bytes", p.stats.FaultBytes,
			"prefetch_bytes", p.stats.PrefetchBytes, "fault_p99", p.stats.FaultP99, "fault_max", p.stats.FaultMax)
	}
	for _, o := range ph.shared {
		if o.str != nil {
			stats.PrefetchBytes += o.str.placed
		}
	}
	if err := context.Cause(ctx); err != nil {
		return stats, err
	}
	return stats, errors.Join(errs...)
}

// ErrHelperDied: a process a lazy restore depends on (the keeper of the
// userfaultfds, the private mount's FUSE server) died during the lazy
// phase; the error wrapping it names it.
var ErrHelperDied = errors.New("helper process died")

// watch ends the lazy phase (cancel, with the cause) if the keeper or the
// source's server dies before it is over: without the keeper, a snapctl
// killed now would leave the processes reading zeros; without the server,
// faults would fail one by one, or never come if the processes are idle,
// and snapctl would wait on a restore that cannot finish. When the
// restore's own context (parent) ends, it aborts the source.
func (ph *Phase) watch(parent, ctx context.Context, cancel context.CancelCauseFunc) {
	var keeperExited <-chan struct{}
	if ph.keeper != nil {
		keeperExited = ph.keeper.Exited()
	}
	select {
	case <-ctx.Done():
		if parent.Err() != nil {
			ph.src.Abort()
		}
	case err, ok := <-ph.src.Gone():
		if !ok || err == nil {
			err = errors.New("the page source's server")
		}
		cancel(fmt.Errorf("%w: %w", ErrHelperDied, err))
	case <-keeperExited:
		cancel(fmt.Errorf("%w: the userfaultfd keeper (%s, pid %d): %v", ErrHelperDied, keeper.Arg0, ph.keeper.Pid(), ph.keeper.ExitErr()))
	}
}

// waits reports whether the pagers' reads wait on another process: the
// source's server decodes for them (PageSource.Waits) and most of the
// memory must be decoded. Blocks stored as they are (most of a model's
// weights: LZ4 saves too little on them) are read from the pages file by
// the pager itself (image.Reader.Mixed), and a second worker then only
// takes a CPU from the restored process.
func (ph *Phase) waits() bool {
	if !ph.src.Waits() {
		return false
	}
	sts := make([]image.Stats, len(ph.procs))
	for i, p := range ph.procs {
		sts[i] = p.pages.Stats()
	}
	return mostDecoded(sts)
}

// mostDecoded reports whether most of the stored memory of sts (zeros
// aside) is in blocks that must be decoded.
func mostDecoded(sts []image.Stats) bool {
	var decoded, all uint64
	for _, st := range sts {
		d := st.LZ4.Bytes + st.Shuffle.Bytes
		decoded += d
		all += d + st.Raw.Bytes
	}
	return 2*decoded >= all
}

// lazyWorkers is how many threads prefetch, each reading its chunk and
// placing it, every process of the tree together. A source that does its
// own work (a file read) gets one per CPU we may run on but one, which
// the processes and the fault service need: with more, they wait for a
// CPU. A source whose reads wait on another process gets one per CPU: one
// reads while another copies. At least one (two when waiting), at most 4.
// Running the workers at SCHED_IDLE did not help. The figures behind it:
// test/bench/BENCHMARKS.md (Decisions).
func lazyWorkers(sourceWaits bool) int {
	if sourceWaits {
		return min(4, max(2, runtime.GOMAXPROCS(0)))
	}
	return min(4, max(1, runtime.GOMAXPROCS(0)-1))
}

// treeProgress adds up the progress of the pagers of a tree.
type treeProgress struct {
	mu sync.Mutex
	// +checklocks:mu
	done, total []uint64
	fn          func(done, total uint64)
}

func newTreeProgress(n int, fn func(done, total uint64)) *treeProgress {
	if fn == nil {
		return nil
	}
	return &treeProgress{done: make([]uint64, n), total: make([]uint64, n), fn: fn}
}

// pager returns the progress function of the pager of process i.
func (p *treeProgress) pager(i int) func(done, total uint64) {
	return func(done, total uint64) {
		p.mu.Lock()
		p.done[i], p.total[i] = done, total
		var d, t uint64
		for j := range p.done {
			d += p.done[j]
			t += p.total[j]
		}
		p.mu.Unlock()
		p.fn(d, t)
	}
}

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
