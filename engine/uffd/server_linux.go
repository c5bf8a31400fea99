package uffd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Internal outcomes of a placement that are not errors of Run.
var (
	errAgain = errors.New("retry after events")
	errGone  = errors.New("address space gone")
)

// Why bytes were placed, for the stats.
const (
	whyFault = iota
	whyPrefetch
)

// fault is a page-fault message waiting for service.
type fault struct {
	m  Msg
	at time.Time // when it was read
}

// server serves one userfaultfd: the root process's or a forked child's.
// Everything but the stats is owned by the serving goroutine.
type server struct {
	fd    int
	src   io.ReaderAt
	opts  Options
	log   *slog.Logger
	child bool
	tree  *tree

	pend      *pieceSet
	total     uint64
	faults    []fault
	msgBuf    []byte
	faultBuf  []byte
	zeros     []byte
	parts     []piece
	cursor    uint64 // prefetch: next address to plan
	ra        *readAhead
	syncBuf   []byte // prefetch without read-ahead
	wk        *waker
	gone      bool
	skipped   bool // a page was found present during the last placement
	probeSrc  []byte
	spinUntil time.Time
	probed    time.Time
	lastDone  uint64
	reported  bool

	fdMu     sync.Mutex
	fdClosed bool

	mu sync.Mutex // guards st, h
	st Stats
	h  hist
}

func newServer(fd int, src io.ReaderAt, pend *pieceSet, opts Options, t *tree, child bool) *server {
	s := &server{fd: fd, src: src, opts: opts, log: opts.Logger, child: child, tree: t, pend: pend, total: pend.bytes}
	if child {
		s.opts.Progress = nil
		s.log = s.log.With("child_uffd", fd)
	}
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

	s.msgBuf = make([]byte, 64*MsgSize)
	if s.opts.Prefetch && s.opts.ReadAhead > 0 && !s.pend.empty() {
		s.ra = startReadAhead(s.src, s.opts.ReadAhead+1, s.opts.PrefetchChunk, wk.wake)
		defer s.ra.stop()
	}
	start := time.Now()
	s.report()
	err = s.loop(ctx)
	st := s.stats()
	s.log.Debug("uffd pager done", "err", err, "elapsed", time.Since(start),
		"faults", st.Faults, "fault_bytes", st.FaultBytes, "prefetch_bytes", st.PrefetchBytes,
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
		if err := s.pump(); err != nil {
			return err
		}
		again, err := s.serveFaults()
		if err == nil && !again && s.opts.Prefetch && !s.pend.empty() {
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
		if s.pend.empty() && len(s.faults) == 0 {
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
		if !s.pend.empty() {
			timeout = probeInterval
		}
		if err := s.wait(timeout); err != nil {
			return err
		}
		if !s.pend.empty() && time.Since(s.probed) >= probeInterval {
			if err := s.probe(); err != nil {
				return err
			}
		}
	}
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
	p, _, ok := s.pend.next(0)
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
	_, err := Copy(s.fd, p.cur, s.probeSrc, CopyModeDontWake)
	switch {
	case errors.Is(err, ErrGone):
		s.exited()
	case err == nil, errors.Is(err, ErrShort):
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
	if s.gone {
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
	if s.gone {
		return nil
	}
	for {
		n, err := ReadMsgs(s.fd, s.msgBuf)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		now := time.Now()
		for i := range n {
			m, err := DecodeMsg(s.msgBuf[i*MsgSize:])
			if err != nil {
				return &ServeError{Op: "event", Err: err}
			}
			s.apply(m, now)
		}
		s.report()
		if n < len(s.msgBuf)/MsgSize {
			return nil
		}
	}
}

func (s *server) apply(m Msg, now time.Time) {
	switch m.Event {
	case EventPagefault:
		s.faults = append(s.faults, fault{m, now})
		return
	case EventRemove:
		n := s.pend.remove(m.Start, m.End, nil)
		s.mu.Lock()
		s.st.Removes++
		s.st.RemovedBytes += n
		s.mu.Unlock()
	case EventUnmap:
		n := s.pend.remove(m.Start, m.End, nil)
		s.mu.Lock()
		s.st.Unmaps++
		s.st.UnmappedBytes += n
		s.mu.Unlock()
	case EventRemap:
		n := s.pend.remap(m.From, m.To, m.Len)
		s.mu.Lock()
		s.st.Remaps++
		s.st.RemappedBytes += n
		s.mu.Unlock()
	case EventFork:
		s.fork(m.UFD)
		s.mu.Lock()
		s.st.Forks++
		s.mu.Unlock()
	}
	s.log.Debug("uffd event", "msg", m)
}

// fork starts a pager for a child forked with pages pending: its memory is
// ours at the fork, so it misses what we had not placed yet.
func (s *server) fork(ufd int) {
	c := newServer(ufd, s.src, s.pend.clone(), s.opts, s.tree, true)
	s.tree.start(c)
}

// report publishes the pending count and calls Progress on a change.
func (s *server) report() {
	pending := s.pend.bytes
	s.mu.Lock()
	s.st.Pending = pending
	s.mu.Unlock()
	done := s.total - pending
	if s.opts.Progress != nil && (done != s.lastDone || !s.reported) {
		s.opts.Progress(done, s.total)
	}
	s.lastDone, s.reported = done, true
}

// serveFaults serves the queued faults in order. again reports that a copy
// was refused until the pending events are read (the rest stay queued).
func (s *server) serveFaults() (again bool, err error) {
	for len(s.faults) > 0 {
		f := s.faults[0]
		err := s.serveFault(f)
		switch {
		case errors.Is(err, errAgain):
			return true, nil
		case errors.Is(err, errGone):
			s.exited()
			return false, nil
		case err != nil:
			return false, err
		}
		s.faults = s.faults[1:]
		if len(s.faults) == 0 {
			s.faults = s.faults[:0:0]
		}
		if s.opts.Spin > 0 {
			s.spinUntil = time.Now().Add(s.opts.Spin)
		}
	}
	return false, nil
}

func (s *server) serveFault(f fault) error {
	if f.m.Flags&(PagefaultFlagWP|PagefaultFlagMinor) != 0 {
		return &ServeError{Op: "fault", Addr: f.m.Addr, Len: PageSize, Err: fmt.Errorf("%v: %w", f.m, ErrUnexpected)}
	}
	page := f.m.Addr &^ (PageSize - 1)
	p, ok := s.pend.find(page)
	if !ok {
		zeroed, err := s.serveZero(page, f.m.Flags&PagefaultFlagWrite != 0)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.st.Faults++
		s.st.ZeroFaults++
		s.st.ZeroBytes += zeroed
		s.h.add(time.Since(f.at))
		s.mu.Unlock()
		return nil
	}
	lo, hi := p.cur, p.end()
	if w := s.opts.MaxFaultBytes; hi-lo > w {
		lo = max(lo, page-page%w)
		hi = min(hi, lo+w)
	}
	src := p.src + (lo - p.cur)
	if uint64(cap(s.faultBuf)) < hi-lo {
		s.faultBuf = make([]byte, hi-lo)
	}
	buf := s.faultBuf[:hi-lo]
	if err := readFull(s.src, buf, src); err != nil {
		return &ServeError{Op: "read", Addr: lo, Len: hi - lo, Src: src, Err: err}
	}
	s.mu.Lock()
	s.st.ReadBytes += hi - lo
	s.mu.Unlock()
	s.skipped = false
	if err := s.place(lo, src, buf, whyFault); err != nil {
		return err
	}
	if s.skipped {
		if err := s.wakePage(page); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.st.Faults++
	s.st.DataFaults++
	s.h.add(time.Since(f.at))
	s.mu.Unlock()
	s.report()
	return nil
}

// serveZero serves a fault outside every pending extent with zeros, from
// the faulting page up to ZeroChunk or the next pending extent: the zero
// page for a read, a copy of zeros for a write (no copy-on-write fault to
// follow). A present page (the fault raced a copy) or a vanished VMA (it
// raced munmap or mremap) only needs the waiting thread woken.
func (s *server) serveZero(page uint64, write bool) (uint64, error) {
	end := page + s.opts.ZeroChunk
	if q, _, ok := s.pend.next(page); ok && q.cur < end {
		end = q.cur
	}
	for {
		var n int64
		var err error
		if write {
			if uint64(len(s.zeros)) < end-page {
				s.zeros = make([]byte, s.opts.ZeroChunk)
			}
			n, err = Copy(s.fd, page, s.zeros[:end-page], 0)
		} else {
			n, err = ZeroPage(s.fd, page, end-page, 0)
		}
		switch {
		case err == nil, errors.Is(err, ErrShort):
			return uint64(n), nil
		case errors.Is(err, ErrExist):
			return 0, s.wakePage(page)
		case errors.Is(err, ErrNoVMA):
			if end-page > PageSize {
				end = page + PageSize
				continue
			}
			return 0, s.wakePage(page)
		case errors.Is(err, ErrAgain):
			s.retried()
			return 0, errAgain
		case errors.Is(err, ErrGone):
			return 0, errGone
		}
		op := "zeropage"
		if write {
			op = "copy zeros"
		}
		return 0, &ServeError{Op: op, Addr: page, Len: end - page, Err: err}
	}
}

func (s *server) wakePage(page uint64) error {
	s.mu.Lock()
	s.st.Wakes++
	s.mu.Unlock()
	if err := Wake(s.fd, page, PageSize); err != nil {
		return &ServeError{Op: "wake", Addr: page, Len: PageSize, Err: err}
	}
	return nil
}

func (s *server) retried() {
	s.mu.Lock()
	s.st.Retries++
	s.mu.Unlock()
}

// exited drops everything pending: the address space is gone.
func (s *server) exited() {
	s.gone = true
	s.pend = newPieceSet(nil)
	s.faults = nil
	s.mu.Lock()
	s.st.Exited = true
	s.mu.Unlock()
	s.report()
	s.log.Debug("uffd: process address space gone")
}

// place copies buf (the snapshot bytes at src) to dst and takes what it
// placed out of the pending set. Present pages are skipped one by one; a
// range the kernel refuses as not in one registered VMA is halved until
// the boundary is found. A page with no VMA at all is dropped in a forked
// child (MADV_DONTFORK memory) and an error in the root, where events keep
// the pending set inside registered VMAs.
func (s *server) place(dst, src uint64, buf []byte, why int) error {
	for len(buf) > 0 {
		n, err := Copy(s.fd, dst, buf, 0)
		if n > 0 {
			s.placed(dst, uint64(n), why)
			dst, src, buf = dst+uint64(n), src+uint64(n), buf[n:]
		}
		switch {
		case err == nil, errors.Is(err, ErrShort):
			continue
		case errors.Is(err, ErrExist):
			s.pend.remove(dst, dst+PageSize, nil)
			s.mu.Lock()
			s.st.ExistingBytes += PageSize
			s.mu.Unlock()
			s.skipped = true
			dst, src, buf = dst+PageSize, src+PageSize, buf[PageSize:]
			continue
		case errors.Is(err, ErrNoVMA):
			if len(buf) > PageSize {
				h := len(buf) / PageSize / 2 * PageSize
				if err := s.place(dst, src, buf[:h], why); err != nil {
					return err
				}
				dst, src, buf = dst+uint64(h), src+uint64(h), buf[h:]
				continue
			}
			if !s.child {
				return &ServeError{Op: "copy", Addr: dst, Len: PageSize, Src: src, Err: err}
			}
			s.pend.remove(dst, dst+PageSize, nil)
			s.mu.Lock()
			s.st.DroppedBytes += PageSize
			s.mu.Unlock()
			dst, src, buf = dst+PageSize, src+PageSize, buf[PageSize:]
			continue
		case errors.Is(err, ErrAgain):
			s.retried()
			return errAgain
		case errors.Is(err, ErrGone):
			return errGone
		}
		return &ServeError{Op: "copy", Addr: dst, Len: uint64(len(buf)), Src: src, Err: err}
	}
	return nil
}

func (s *server) placed(dst, n uint64, why int) {
	s.pend.remove(dst, dst+n, nil)
	s.mu.Lock()
	if why == whyFault {
		s.st.FaultBytes += n
	} else {
		s.st.PrefetchBytes += n
	}
	s.mu.Unlock()
}

// plan returns the next chunk to prefetch, wrapping to the lowest address
// once the cursor has passed the last pending piece and nothing is in
// flight (pieces moved behind the cursor by mremap are found that way).
func (s *server) plan(inflight int) (piece, bool) {
	c, ok := s.pend.chunk(s.cursor, s.opts.PrefetchChunk)
	if !ok && inflight == 0 && s.cursor != 0 {
		s.cursor = 0
		c, ok = s.pend.chunk(0, s.opts.PrefetchChunk)
	}
	if ok {
		s.cursor = c.end()
	}
	return c, ok
}

// prefetch places at most one chunk. progressed reports that it did work
// (the loop then checks for faults again before the next chunk).
func (s *server) prefetch() (progressed, again bool, err error) {
	if s.ra == nil {
		c, ok := s.plan(0)
		if !ok {
			return false, false, nil
		}
		if uint64(cap(s.syncBuf)) < c.len {
			s.syncBuf = make([]byte, s.opts.PrefetchChunk)
		}
		r := &raReq{c: c, buf: s.syncBuf[:c.len]}
		r.err = readFull(s.src, r.buf, c.src)
		again, err = s.placeChunk(r)
		if again {
			s.cursor = c.cur // replan it after the events
		}
		return true, again, err
	}
	for !s.ra.full() {
		c, ok := s.plan(len(s.ra.inflight))
		if !ok {
			break
		}
		s.ra.issue(c)
	}
	r := s.ra.ready()
	if r == nil {
		return false, false, nil
	}
	again, err = s.placeChunk(r)
	if again || err != nil {
		return true, again, err // keep the chunk: retried after the events
	}
	s.ra.pop()
	return true, false, nil
}

// placeChunk places the parts of a chunk that are still pending where the
// chunk expects them: events since it was planned may have placed,
// dropped or moved some (moved pages are found again by a later plan).
func (s *server) placeChunk(r *raReq) (again bool, err error) {
	c := r.c
	s.parts = s.parts[:0]
	s.pend.overlapping(c.cur, c.end(), func(p piece) {
		if p.src == c.src+(p.cur-c.cur) {
			s.parts = append(s.parts, p)
		}
	})
	if len(s.parts) == 0 {
		return false, nil
	}
	if r.err != nil {
		p := s.parts[0]
		return false, &ServeError{Op: "read", Addr: c.cur, Len: c.len, Src: c.src, Err: fmt.Errorf("prefetch (first pending page %#x): %w", p.cur, r.err)}
	}
	if !r.counted {
		r.counted = true
		s.mu.Lock()
		s.st.ReadBytes += c.len
		s.mu.Unlock()
	}
	for _, p := range s.parts {
		off := p.cur - c.cur
		err := s.place(p.cur, p.src, r.buf[off:off+p.len], whyPrefetch)
		switch {
		case errors.Is(err, errAgain):
			s.report()
			return true, nil
		case errors.Is(err, errGone):
			s.exited()
			return false, nil
		case err != nil:
			return false, err
		}
	}
	s.report()
	return false, nil
}
