package uffd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/uffd/pending"
	"github.com/lazyfs/lazyfs/engine/uffd/policy"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// Internal outcomes of a placement that are not errors of Run.
var (
	errAgain = errors.New("retry after events")
	errGone  = errors.New("address space gone")
)

// fault is a page-fault message waiting for service.
type fault struct {
	m  uffdio.Msg
	at time.Time // when it was read
}

// server serves one userfaultfd: the root process's or a forked child's.
// Its state is grouped by who may touch it: what is set before the
// serving goroutine starts; the serving goroutine's own (own); what the
// prefetch workers share with it (pend, under pend.mu); the stats (stat,
// under stat.mu); the progress reports (prog) and the fd's closing (fds),
// each under a lock of its own.
type server struct {
	fd    int
	src   io.ReaderAt
	opts  Options
	log   *slog.Logger
	child bool
	tree  *tree
	total uint64 // bytes pending at the start
	// prefetchAt: the prefetcher starts then (PrefetchDelay); set by run
	// before the workers start.
	prefetchAt time.Time

	own  serving
	pend pendingState
	stat counters
	prog progress
	fds  fdState

	// evMu: held for writing while messages are read and events applied,
	// for reading around every look at the pending set that a copy or
	// zero fill follows (see the workers in prefetch_linux.go).
	evMu    sync.RWMutex
	workers sync.WaitGroup
	wk      atomic.Pointer[waker] // set by run: wakes it in wait
	gone    atomic.Bool           // the address space is gone (written under pend.mu)
	// latencyUntil (unix ns): until then, the process waits on the
	// latency of its faults, not on streaming (see policy.LatencyHold).
	latencyUntil atomic.Int64
}

// serving is the serving goroutine's own state: the fault queue, the
// planner and the buffers. No other goroutine touches it.
type serving struct {
	faults      []fault
	pl          policy.Planner
	msgBuf      []byte
	faultBuf    []byte
	faultParts  []pending.Piece // what the last data fault read
	zeros       []byte
	ra          *readAhead
	syncBuf     []byte // prefetch without read-ahead
	probeSrc    []byte
	spinUntil   time.Time
	probed      time.Time
	strideReads []strideRead
	strideBuf   []byte
	firstParts  []pending.Piece // what the last firstAhead placed
	firstBuf    []byte
}

// pendingState is what the serving goroutine and the prefetch workers
// share: the pages still pending, the prefetcher's plan, and the workers'
// chunks and stop.
type pendingState struct {
	mu   sync.Mutex
	cond *sync.Cond // on mu: the pending set, inflight, evGen or stop changed

	// +checklocks:mu
	set *pending.Set
	// +checklocks:mu
	cursor uint64 // prefetch: next address to plan
	// +checklocks:mu
	scan policy.Scan // the scan faults last served
	// +checklocks:mu
	first firstQueue // Options.First still to prefetch
	// +checklocks:mu
	inflight int // chunks claimed by workers, not yet placed
	// +checklocks:mu
	claimed []pending.Piece // those chunks
	// +checklocks:mu
	evGen uint64 // events applied so far
	// +checklocks:mu
	werr error // the first error of a worker
	// +checklocks:mu
	stop bool // workers must return
}

// counters are a server's stats and its fault latencies.
type counters struct {
	mu sync.Mutex
	// +checklocks:mu
	st Stats
	// +checklocks:mu
	h hist
}

// add changes the stats under their lock.
func (c *counters) add(f func(st *Stats)) {
	c.mu.Lock()
	f(&c.st)
	c.mu.Unlock()
}

// progress serialises Options.Progress and remembers what it reported.
type progress struct {
	mu sync.Mutex
	// +checklocks:mu
	done uint64
	// +checklocks:mu
	reported bool
}

// fdState is whether a child's userfaultfd is closed and whether
// Options.Holder holds a copy of it.
type fdState struct {
	mu sync.Mutex
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	held bool
}

// newServer returns a server of fd with the pages of pend pending.
//
// +checklocksignore
// s is not shared until newServer returns.
func newServer(fd int, src io.ReaderAt, pend *pending.Set, opts Options, t *tree, child bool) *server {
	s := &server{fd: fd, src: src, opts: opts, log: opts.Logger, child: child, tree: t, total: pend.Bytes()}
	s.pend.set = pend
	s.pend.cond = sync.NewCond(&s.pend.mu)
	if child {
		s.opts.Progress = nil
		s.opts.PrefetchDelay = 0
		s.opts.Workers = 0
		s.log = s.log.With("child_uffd", fd)
	}
	s.own.pl.Config = policy.Config{Prefetch: s.opts.Prefetch, Workers: s.opts.Workers, PrefetchChunk: s.opts.PrefetchChunk,
		MaxFaultBytes: s.opts.MaxFaultBytes, Unit: s.opts.Unit, ZeroReadChunk: s.opts.ZeroReadChunk}
	s.stat.st.Total, s.stat.st.Pending = pend.Bytes(), pend.Bytes()
	return s
}

func (s *server) stats() Stats {
	s.stat.mu.Lock()
	defer s.stat.mu.Unlock()
	st := s.stat.st
	st.FaultP50, st.FaultP99, st.FaultMax = s.stat.h.quantile(0.5), s.stat.h.quantile(0.99), s.stat.h.max
	return st
}

// wake wakes the serving goroutine if it is blocked in wait.
func (s *server) wake() {
	if wk := s.wk.Load(); wk != nil {
		wk.wake()
	}
}

func (s *server) closeFD() error {
	s.fds.mu.Lock()
	defer s.fds.mu.Unlock()
	if s.fds.closed {
		return nil
	}
	s.fds.closed = true
	if s.fds.held {
		s.fds.held = false
		if err := s.opts.Holder.Release(s.fd); err != nil {
			s.log.Warn("uffd: keeper release", "fd", s.fd, "err", err)
		}
	}
	if err := unix.Close(s.fd); err != nil {
		return fmt.Errorf("close child userfaultfd %d: %w", s.fd, err)
	}
	return nil
}

// run is the serving loop: read messages and apply events, serve faults,
// then one prefetch chunk, then again; block in ppoll when there is
// nothing to do.
func (s *server) run(ctx context.Context) error {
	if s.opts.Affinity != nil {
		if err := unix.SchedSetaffinity(0, s.opts.Affinity); err != nil {
			return fmt.Errorf("pin serving thread: %w", err)
		}
	}
	if err := unix.SetNonblock(s.fd, true); err != nil {
		return fmt.Errorf("userfaultfd %d nonblocking: %w", s.fd, err)
	}
	wk, err := newWaker()
	if err != nil {
		return err
	}
	s.wk.Store(wk)
	defer wk.close()
	defer context.AfterFunc(ctx, wk.wake)()
	defer func() {
		if s.own.probeSrc != nil {
			unix.Munmap(s.own.probeSrc)
		}
	}()
	s.own.probed = time.Now()

	s.own.msgBuf = make([]byte, 64*uffdio.MsgSize)
	start := time.Now()
	s.prefetchAt = start.Add(s.opts.PrefetchDelay)
	switch {
	case !s.opts.Prefetch || s.pendingEmpty():
	case s.opts.Workers > 0:
		s.startWorkers(ctx, s.opts.Workers)
		defer s.stopWorkers()
	case s.opts.ReadAhead > 0:
		s.own.ra = startReadAhead(s.src, s.opts.ReadAhead+1, s.opts.PrefetchChunk, wk.wake)
		defer s.own.ra.stop()
	}
	s.report()
	err = s.loop(ctx)
	st := s.stats()
	s.log.Debug("uffd pager done", "err", err, "elapsed", time.Since(start),
		"faults", st.Faults, "fault_bytes", st.FaultBytes, "prefetch_bytes", st.PrefetchBytes,
		"read_bytes", st.ReadBytes, "existing_bytes", st.ExistingBytes, "stride_bytes", st.StrideBytes,
		"zero_bytes", st.ZeroBytes, "fault_p50", st.FaultP50, "fault_p99", st.FaultP99,
		"removes", st.Removes, "unmaps", st.Unmaps, "remaps", st.Remaps, "forks", st.Forks, "exited", st.Exited)
	return err
}

func (s *server) loop(ctx context.Context) error {
	backoff := 20 * time.Microsecond
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !s.child {
			if _, err := s.tree.state(); err != nil {
				return err
			}
		}
		if err := s.workerErr(); err != nil {
			return err
		}
		if err := s.pump(); err != nil {
			return err
		}
		again, err := s.serveFaults()
		if err == nil && !again && s.opts.Workers == 0 && s.prefetching() && !s.pendingEmpty() {
			var progressed bool
			progressed, again, err = s.prefetch()
			if err == nil && progressed && !again {
				continue
			}
		}
		if err != nil {
			return err
		}
		if again {
			// An event is queued (or about to be: the kernel raises its
			// flag first) and unread. A failed mremap lowers the flag
			// without any message, so poll with a growing timeout.
			if err := s.wait(backoff); err != nil {
				return err
			}
			backoff = min(2*backoff, 10*time.Millisecond)
			continue
		}
		backoff = 20 * time.Microsecond
		if s.pendingEmpty() && len(s.own.faults) == 0 && s.idleWorkers() {
			if s.child {
				return nil
			}
			n, err := s.tree.state()
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
		}
		if s.opts.Spin > 0 && time.Now().Before(s.own.spinUntil) {
			continue // poll the userfaultfd instead of sleeping
		}
		timeout := time.Duration(-1)
		if !s.pendingEmpty() {
			timeout = probeInterval
			if s.opts.Prefetch && s.opts.Workers == 0 && !s.prefetching() && !s.tree.prefetchHeld.Load() {
				timeout = min(timeout, time.Until(s.prefetchAt))
			}
		}
		if err := s.wait(timeout); err != nil {
			return err
		}
		if !s.pendingEmpty() && time.Since(s.own.probed) >= probeInterval {
			if err := s.probe(); err != nil {
				return err
			}
		}
	}
}

// pendingEmpty reports whether nothing is pending.
func (s *server) pendingEmpty() bool {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	return s.pend.set.Empty()
}

// idleWorkers reports whether no worker holds a chunk.
func (s *server) idleWorkers() bool {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	return s.pend.inflight == 0
}

// workerErr returns the first error of a worker.
func (s *server) workerErr() error {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	return s.pend.werr
}

// prefetching reports whether the prefetcher may run now.
func (s *server) prefetching() bool {
	return s.opts.Prefetch && !s.tree.prefetchHeld.Load() && (s.opts.PrefetchDelay <= 0 || !time.Now().Before(s.prefetchAt))
}

// probeInterval is how long a pager with pages pending stays idle before
// it checks that the process still exists.
const probeInterval = 100 * time.Millisecond

// probe detects a process that exited while the pager idles with pages
// pending (no prefetch, or a child that never touches them): no event
// reports an exit, but every fill ioctl then fails with ESRCH. The probe
// is a UFFDIO_COPY of one pending page from an inaccessible page of ours:
// with the process alive it fails (EFAULT reading the source, or EEXIST,
// EAGAIN, ENOENT) without placing anything.
func (s *server) probe() error {
	s.own.probed = time.Now()
	s.pend.mu.Lock()
	p, ok := s.pend.set.Next(0)
	s.pend.mu.Unlock()
	if !ok {
		return nil
	}
	if s.own.probeSrc == nil {
		b, err := unix.Mmap(-1, 0, PageSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("probe page: %w", err)
		}
		s.own.probeSrc = b
	}
	_, err := uffdio.Copy(s.fd, p.Cur, s.own.probeSrc, uffdio.CopyModeDontWake)
	switch {
	case errors.Is(err, uffdio.ErrGone):
		s.exited()
	case err == nil, errors.Is(err, uffdio.ErrShort):
		// Cannot happen (the source is PROT_NONE); never let it pass.
		return &ServeError{Op: "probe", Addr: p.Cur, Len: PageSize, Err: errors.New("probe copy from an inaccessible page succeeded")}
	}
	return nil
}

// wait blocks until the userfaultfd is readable, the waker is written, or
// timeout (negative: none) passes.
func (s *server) wait(timeout time.Duration) error {
	wk := s.wk.Load()
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(wk.fd), Events: unix.POLLIN}}
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	if s.gone.Load() {
		fds = fds[1:]
	}
	_, err := unix.Ppoll(fds, ts, nil)
	if err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("poll userfaultfd: %w", err)
	}
	for _, f := range fds {
		if f.Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
			return fmt.Errorf("poll userfaultfd: fd %d revents %#x", f.Fd, f.Revents)
		}
	}
	if fds[len(fds)-1].Revents != 0 {
		wk.drain()
	}
	return nil
}

// pump reads every pending message: events are applied at once, in order;
// faults are queued and served afterwards against the updated state.
func (s *server) pump() error {
	if s.gone.Load() {
		return nil
	}
	if s.opts.Workers > 0 {
		// Taking evMu waits for the workers' copies in progress: only
		// when there is something to read.
		p := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(p, 0); err == nil && n == 0 {
			return nil
		}
	}
	// No copy may be between its look at the pending set and the copy
	// while events are read and applied.
	s.evMu.Lock()
	defer s.evMu.Unlock()
	for {
		n, err := uffdio.ReadMsgs(s.fd, s.own.msgBuf)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		now := time.Now()
		events := false
		s.pend.mu.Lock()
		for i := range n {
			m, err := uffdio.DecodeMsg(s.own.msgBuf[i*uffdio.MsgSize:])
			if err != nil {
				s.pend.mu.Unlock()
				return &ServeError{Op: "event", Err: err}
			}
			events = s.apply(m, now) || events
		}
		if events {
			s.pend.evGen++
			s.pend.cond.Broadcast()
		}
		s.pend.mu.Unlock()
		s.report()
		if n < len(s.own.msgBuf)/uffdio.MsgSize {
			return nil
		}
	}
}

// apply queues a fault or applies an event (reported true).
//
// +checklocks:s.pend.mu
func (s *server) apply(m uffdio.Msg, now time.Time) bool {
	switch m.Event {
	case uffdio.EventPagefault:
		s.own.faults = append(s.own.faults, fault{m, now})
		return false
	case uffdio.EventRemove:
		if s.opts.Shared && s.pend.werr == nil {
			s.pend.werr = &ServeError{Op: "event", Addr: m.Start, Len: m.End - m.Start, Err: fmt.Errorf("madvise of lazily served shared memory: %w", ErrUnexpected)}
		}
		n := s.pend.set.Remove(m.Start, m.End, nil)
		s.stat.add(func(st *Stats) {
			st.Removes++
			st.RemovedBytes += n
		})
	case uffdio.EventUnmap:
		n := s.pend.set.Remove(m.Start, m.End, nil)
		s.stat.add(func(st *Stats) {
			st.Unmaps++
			st.UnmappedBytes += n
		})
	case uffdio.EventRemap:
		n := s.pend.set.Remap(m.From, m.To, m.Len)
		s.stat.add(func(st *Stats) {
			st.Remaps++
			st.RemappedBytes += n
		})
	case uffdio.EventFork:
		s.fork(m.UFD)
		s.stat.add(func(st *Stats) { st.Forks++ })
	}
	s.log.Debug("uffd event", "msg", m)
	return true
}

// fork starts a pager for a child forked with pages pending: its memory is
// ours at the fork, so it misses what we had not placed yet.
//
// +checklocks:s.pend.mu
func (s *server) fork(ufd int) {
	c := newServer(ufd, s.src, s.pend.set.Clone(), s.opts, s.tree, true)
	if s.opts.Holder != nil {
		if err := s.opts.Holder.Hold(ufd); err != nil {
			s.log.Warn("uffd: hand a child's userfaultfd to its keeper", "fd", ufd, "err", err)
		} else {
			c.fds.mu.Lock()
			c.fds.held = true
			c.fds.mu.Unlock()
		}
	}
	s.tree.start(c)
}

// report publishes the pending count and calls Progress on a change.
func (s *server) report() {
	s.pend.mu.Lock()
	left := s.pend.set.Bytes()
	s.pend.mu.Unlock()
	s.stat.add(func(st *Stats) { st.Pending = left })
	done := s.total - left
	s.prog.mu.Lock()
	defer s.prog.mu.Unlock()
	if s.opts.Progress != nil && (done != s.prog.done || !s.prog.reported) {
		s.opts.Progress(done, s.total)
	}
	s.prog.done, s.prog.reported = done, true
}
