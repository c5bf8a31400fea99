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
// The serving goroutine owns the fault queue and the buffers; the pending
// set and the prefetch state, which prefetch workers share, are under
// setMu; the stats under mu.
type server struct {
	fd    int
	src   io.ReaderAt
	opts  Options
	log   *slog.Logger
	child bool
	tree  *tree

	pend       *pieceSet // under setMu
	total      uint64
	faults     []fault
	msgBuf     []byte
	faultBuf   []byte
	faultParts []piece // what the last data fault read
	zeros      []byte
	parts      []piece
	cursor     uint64      // prefetch: next address to plan; under setMu
	scan       policy.Scan // the scan faults last served; under setMu
	pl         policy.Planner
	ra         *readAhead
	syncBuf    []byte // prefetch without read-ahead
	wk         *waker
	gone       atomic.Bool // the address space is gone (written under setMu)
	probeSrc   []byte
	spinUntil  time.Time
	prefetchAt time.Time // the prefetcher starts then (PrefetchDelay)
	probed     time.Time
	// latencyUntil (unix ns): until then, the process waits on the
	// latency of its faults, not on streaming (see policy.LatencyHold).
	latencyUntil atomic.Int64
	strideReads  []strideRead
	strideBuf    []byte

	first      firstQueue // Options.First still to prefetch; under setMu
	firstParts []piece    // what the last firstAhead placed
	firstBuf   []byte

	// evMu: held for writing while messages are read and events applied,
	// for reading around every look at the pending set that a copy or
	// zero fill follows (see the workers in prefetch_linux.go).
	evMu     sync.RWMutex
	setMu    sync.Mutex
	setCond  *sync.Cond // on setMu: the pending set, inflight, evGen or stop changed
	inflight int        // chunks claimed by workers, not yet placed
	claimed  []piece    // those chunks
	evGen    uint64     // events applied so far
	werr     error      // the first error of a worker
	stop     bool       // workers must return
	workers  sync.WaitGroup

	progMu   sync.Mutex // serialises Progress; guards lastDone, reported
	lastDone uint64
	reported bool

	fdMu     sync.Mutex
	fdClosed bool
	held     bool // opts.Holder holds a copy of fd

	mu sync.Mutex // guards st, h
	st Stats
	h  hist
}

func newServer(fd int, src io.ReaderAt, pend *pieceSet, opts Options, t *tree, child bool) *server {
	s := &server{fd: fd, src: src, opts: opts, log: opts.Logger, child: child, tree: t, pend: pend, total: pend.bytes}
	s.setCond = sync.NewCond(&s.setMu)
	if child {
		s.opts.Progress = nil
		s.opts.PrefetchDelay = 0
		s.opts.Workers = 0
		s.log = s.log.With("child_uffd", fd)
	}
	s.pl.Config = policy.Config{Prefetch: s.opts.Prefetch, Workers: s.opts.Workers, PrefetchChunk: s.opts.PrefetchChunk,
		MaxFaultBytes: s.opts.MaxFaultBytes, Unit: s.opts.Unit, ZeroReadChunk: s.opts.ZeroReadChunk}
	s.st.Total, s.st.Pending = pend.bytes, pend.bytes
	return s
}

func (s *server) stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.FaultP50, st.FaultP99, st.FaultMax = s.h.quantile(0.5), s.h.quantile(0.99), s.h.max
	return st
}

func (s *server) wake() {
	s.mu.Lock()
	wk := s.wk
	s.mu.Unlock()
	if wk != nil {
		wk.wake()
	}
}

func (s *server) closeFD() error {
	s.fdMu.Lock()
	defer s.fdMu.Unlock()
	if s.fdClosed {
		return nil
	}
	s.fdClosed = true
	if s.held {
		s.held = false
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
	s.mu.Lock()
	s.wk = wk
	s.mu.Unlock()
	defer wk.close()
	defer context.AfterFunc(ctx, wk.wake)()
	defer func() {
		if s.probeSrc != nil {
			unix.Munmap(s.probeSrc)
		}
	}()
	s.probed = time.Now()

	s.msgBuf = make([]byte, 64*uffdio.MsgSize)
	start := time.Now()
	s.prefetchAt = start.Add(s.opts.PrefetchDelay)
	switch {
	case !s.opts.Prefetch || s.pendingEmpty():
	case s.opts.Workers > 0:
		s.startWorkers(ctx, s.opts.Workers)
		defer s.stopWorkers()
	case s.opts.ReadAhead > 0:
		s.ra = startReadAhead(s.src, s.opts.ReadAhead+1, s.opts.PrefetchChunk, wk.wake)
		defer s.ra.stop()
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
		if s.pendingEmpty() && len(s.faults) == 0 && s.idleWorkers() {
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
		if s.opts.Spin > 0 && time.Now().Before(s.spinUntil) {
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
		if !s.pendingEmpty() && time.Since(s.probed) >= probeInterval {
			if err := s.probe(); err != nil {
				return err
			}
		}
	}
}

// pendingEmpty reports whether nothing is pending.
func (s *server) pendingEmpty() bool {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	return s.pend.empty()
}

// idleWorkers reports whether no worker holds a chunk.
func (s *server) idleWorkers() bool {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	return s.inflight == 0
}

// workerErr returns the first error of a worker.
func (s *server) workerErr() error {
	s.setMu.Lock()
	defer s.setMu.Unlock()
	return s.werr
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
	s.probed = time.Now()
	s.setMu.Lock()
	p, _, ok := s.pend.next(0)
	s.setMu.Unlock()
	if !ok {
		return nil
	}
	if s.probeSrc == nil {
		b, err := unix.Mmap(-1, 0, PageSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("probe page: %w", err)
		}
		s.probeSrc = b
	}
	_, err := uffdio.Copy(s.fd, p.cur, s.probeSrc, uffdio.CopyModeDontWake)
	switch {
	case errors.Is(err, uffdio.ErrGone):
		s.exited()
	case err == nil, errors.Is(err, uffdio.ErrShort):
		// Cannot happen (the source is PROT_NONE); never let it pass.
		return &ServeError{Op: "probe", Addr: p.cur, Len: PageSize, Err: errors.New("probe copy from an inaccessible page succeeded")}
	}
	return nil
}

// wait blocks until the userfaultfd is readable, the waker is written, or
// timeout (negative: none) passes.
func (s *server) wait(timeout time.Duration) error {
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.wk.fd), Events: unix.POLLIN}}
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
		s.wk.drain()
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
		n, err := uffdio.ReadMsgs(s.fd, s.msgBuf)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		now := time.Now()
		events := false
		s.setMu.Lock()
		for i := range n {
			m, err := uffdio.DecodeMsg(s.msgBuf[i*uffdio.MsgSize:])
			if err != nil {
				s.setMu.Unlock()
				return &ServeError{Op: "event", Err: err}
			}
			events = s.apply(m, now) || events
		}
		if events {
			s.evGen++
			s.setCond.Broadcast()
		}
		s.setMu.Unlock()
		s.report()
		if n < len(s.msgBuf)/uffdio.MsgSize {
			return nil
		}
	}
}

// apply queues a fault or applies an event (reported true); the caller
// holds setMu.
func (s *server) apply(m uffdio.Msg, now time.Time) bool {
	switch m.Event {
	case uffdio.EventPagefault:
		s.faults = append(s.faults, fault{m, now})
		return false
	case uffdio.EventRemove:
		n := s.pend.remove(m.Start, m.End, nil)
		s.mu.Lock()
		s.st.Removes++
		s.st.RemovedBytes += n
		s.mu.Unlock()
	case uffdio.EventUnmap:
		n := s.pend.remove(m.Start, m.End, nil)
		s.mu.Lock()
		s.st.Unmaps++
		s.st.UnmappedBytes += n
		s.mu.Unlock()
	case uffdio.EventRemap:
		n := s.pend.remap(m.From, m.To, m.Len)
		s.mu.Lock()
		s.st.Remaps++
		s.st.RemappedBytes += n
		s.mu.Unlock()
	case uffdio.EventFork:
		s.fork(m.UFD)
		s.mu.Lock()
		s.st.Forks++
		s.mu.Unlock()
	}
	s.log.Debug("uffd event", "msg", m)
	return true
}

// fork starts a pager for a child forked with pages pending: its memory is
// ours at the fork, so it misses what we had not placed yet.
func (s *server) fork(ufd int) {
	c := newServer(ufd, s.src, s.pend.clone(), s.opts, s.tree, true)
	if s.opts.Holder != nil {
		if err := s.opts.Holder.Hold(ufd); err != nil {
			s.log.Warn("uffd: hand a child's userfaultfd to its keeper", "fd", ufd, "err", err)
		} else {
			c.held = true
		}
	}
	s.tree.start(c)
}

// report publishes the pending count and calls Progress on a change.
func (s *server) report() {
	s.setMu.Lock()
	pending := s.pend.bytes
	s.setMu.Unlock()
	s.mu.Lock()
	s.st.Pending = pending
	s.mu.Unlock()
	done := s.total - pending
	s.progMu.Lock()
	defer s.progMu.Unlock()
	if s.opts.Progress != nil && (done != s.lastDone || !s.reported) {
		s.opts.Progress(done, s.total)
	}
	s.lastDone, s.reported = done, true
}
