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

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Defaults of Options.
const (
	DefaultPrefetchChunk = 1 << 20
	DefaultReadAhead     = 2
	DefaultMaxFaultBytes = 4 << 20
	DefaultZeroChunk     = 64 << 10
	DefaultZeroReadChunk = 2 << 20
	DefaultFaultAhead    = 1 << 20
)

// Options tune a Pager. The zero value serves faults only.
type Options struct {
	// Prefetch streams every extent not yet served, in address order (or
	// after and below a thread that reads in order: see plan), in the
	// background of fault service (faults always first).
	Prefetch bool
	// Logger receives debug records of events and a summary; nil discards.
	Logger *slog.Logger
	// Progress, if set, is called from the serving thread after every
	// change with the bytes served or dropped so far and the total. It
	// must return quickly. Forked children do not report.
	Progress func(done, total uint64)
	// PrefetchChunk is the most bytes placed by one prefetch copy (and read
	// from the source in one ReadAt): the longest a fault can wait behind
	// the prefetcher. Page multiple; default DefaultPrefetchChunk.
	PrefetchChunk uint64
	// ReadAhead is how many prefetch chunks a helper goroutine reads from
	// the source while the serving thread copies; 0 means
	// DefaultReadAhead, negative reads on the serving thread.
	ReadAhead int
	// MaxFaultBytes caps what one fault brings in: the extent holding the
	// address, clipped to the MaxFaultBytes-aligned window around it. Page
	// multiple; default DefaultMaxFaultBytes.
	MaxFaultBytes uint64
	// Unit, if set, gives the range a fault at addr is served: the
	// smallest the source reads and checks on its own around it (a few
	// pages of a block whose pages have checksums of their own), or the
	// block. ok false, or nil Unit: the whole extent. Either way clipped
	// to the extent and to MaxFaultBytes, and grown by FaultAhead for a
	// sequential reader.
	Unit func(addr uint64) (lo, hi uint64, ok bool)
	// FaultAhead is how much a fault that follows the previous one
	// (the process reads through memory the prefetcher has not reached)
	// brings in: the pending memory from the faulting extent on. Page
	// multiple; default DefaultFaultAhead; PageSize turns it off.
	FaultAhead uint64
	// ZeroChunk is how much a fault outside every extent zero-fills, from
	// the faulting page up to the next pending extent. Page multiple;
	// default DefaultZeroChunk; PageSize serves single pages.
	ZeroChunk uint64
	// ZeroReadChunk is ZeroChunk for a read fault, which is served the
	// zero page (UFFDIO_ZEROPAGE: no memory, only page table entries, a
	// few µs per MiB), so it can be large; a read fault that follows the
	// zeros the last one mapped is served twice as much, up to 64 MiB.
	// Default DefaultZeroReadChunk.
	ZeroReadChunk uint64
	// Spin, if positive, keeps the serving thread polling the userfaultfd
	// for this long after each fault served from the source instead of
	// sleeping: the next fault of a thread walking its memory is then
	// seen without waking a halted CPU. It burns CPU; see the benchmarks.
	Spin time.Duration
	// Affinity, if set, pins the serving threads (the root's and every
	// forked child's) to these CPUs.
	Affinity *unix.CPUSet
	// Workers, if positive, is how many threads prefetch, each reading
	// and placing chunks of its own, while the serving thread serves
	// faults and events (forked children's pagers prefetch on their
	// serving thread). 0 prefetches on the serving thread, with
	// ReadAhead.
	Workers int
	// PrefetchDelay holds the prefetcher back for this long after Run
	// starts (faults are served at once).
	PrefetchDelay time.Duration
	// Holder, if set, is handed every forked child's userfaultfd as soon
	// as the fork event is read, and told before the pager closes it.
	Holder Holder
	// First are ranges of snapshot addresses that the prefetcher fetches
	// before anything else, in this order (a recorded working set; see
	// workingset_linux.go). Faults still come first.
	First []units.Range
	// OnFault, if set, is called from a serving thread after each fault
	// served from the source, with the snapshot range it brought in and
	// when the fault was read. It must return quickly.
	OnFault func(src, n uint64, at time.Time)
	// NoStrideAhead turns off serving a thread that touches memory at a
	// stride its next strides ahead of its faults (a recording of what
	// the process touches must see every page fault).
	NoStrideAhead bool
	// FaultSrc, if set, is what a fault reads instead of the pager's
	// source: a source whose reads wait on another process (a private
	// mount decoding for the prefetch) costs a thread that waits on a
	// fault that round trip, and a block decoded here costs it less.
	FaultSrc io.ReaderAt
	// HoldPrefetch keeps the prefetcher from starting until
	// Pager.ReleasePrefetch (while a working set is recorded, every page
	// the process needs must come by a fault).
	HoldPrefetch bool
	// Shared: the extents are of a shared memory object that others
	// place too. A REMOVE event ends Run with an error: MADV_DONTNEED
	// leaves the object's pages and MADV_REMOVE frees them, which the
	// event does not tell apart, and either guess could be wrong data.
	Shared bool
}

// Holder keeps copies of userfaultfds in another process (engine/uffd/keeper), so
// that they outlive this one.
type Holder interface {
	// Hold takes a copy of fd. It must not block.
	Hold(fd int) error
	// Release drops the copy of fd; called before fd is closed.
	Release(fd int) error
}

func (o Options) normalized() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	fix := func(v *uint64, def uint64) {
		if *v == 0 {
			*v = def
		}
		*v = max(*v-*v%PageSize, PageSize)
	}
	fix(&o.PrefetchChunk, DefaultPrefetchChunk)
	fix(&o.MaxFaultBytes, DefaultMaxFaultBytes)
	fix(&o.ZeroChunk, DefaultZeroChunk)
	fix(&o.ZeroReadChunk, DefaultZeroReadChunk)
	fix(&o.FaultAhead, DefaultFaultAhead)
	if o.ReadAhead == 0 {
		o.ReadAhead = DefaultReadAhead
	}
	o.Workers = max(o.Workers, 0)
	return o
}

// Stats describe a pager's work so far. Bytes are process memory bytes.
type Stats struct {
	Total   uint64 // bytes in the extents at start (for a child: pending at fork)
	Pending uint64 // bytes neither placed nor dropped

	Faults      uint64 // page-fault messages handled
	DataFaults  uint64 // ... served from the source
	ZeroFaults  uint64 // ... served zeros (holes, dropped pages)
	FaultBytes  uint64 // placed from the source to serve faults
	StrideBytes uint64 // of which read ahead of a thread touching memory at a stride
	// FirstAheadBytes: of which read ahead of a thread touching its
	// working set (Options.First) faster than the prefetcher placed it.
	FirstAheadBytes uint64
	PrefetchBytes   uint64 // placed from the source by the prefetcher
	ZeroBytes       uint64 // zero-filled to serve faults
	ReadBytes       uint64 // read from the source
	ExistingBytes   uint64 // pending pages found present (EEXIST), skipped
	DroppedBytes    uint64 // pending pages found unmapped in a child, dropped
	Wakes           uint64 // UFFDIO_WAKE calls (fault on a present or unmapped page)
	Retries         uint64 // copies refused with EAGAIN (events pending)

	Removes, Unmaps, Remaps, Forks uint64 // events read
	RemovedBytes                   uint64 // pending bytes dropped by REMOVE
	UnmappedBytes                  uint64 // pending bytes dropped by UNMAP
	RemappedBytes                  uint64 // pending bytes moved by REMAP

	// Exited: the process's address space went away (exit or exec) while
	// pages were pending; they were dropped.
	Exited bool

	// Fault service time, from reading the message to the end of the
	// copy (the fault's own wait in the kernel is not seen here).
	FaultP50, FaultP99, FaultMax time.Duration

	// Children are the stats of the pagers of forked children.
	Children []Stats
}

// Pager serves one lazily restored process (and the children it forks
// while pages are pending) its memory over userfaultfd.
type Pager struct {
	root *server
	err  error // from New: reported by Run

	tree *tree

	mu sync.Mutex
	// +checklocks:mu
	ran bool
}

// New returns a pager for fd: an O_NONBLOCK-capable userfaultfd on which
// uffdio.API was called with uffdio.Features (at least
// uffdio.RequiredFeatures) and the extents' VMAs registered with
// uffdio.RegisterModeMissing. src.ReadAt(buf,
// int64(addr)) must return the snapshot's bytes at addr, and allow
// concurrent calls. Extents must be sorted, disjoint and page aligned (else
// Run returns ErrExtents). The pager does not own fd: after Run the caller
// unregisters and closes it.
func New(fd int, src io.ReaderAt, extents []Extent, opts Options) *Pager {
	opts = opts.normalized()
	p := &Pager{tree: &tree{}}
	p.tree.prefetchHeld.Store(opts.HoldPrefetch)
	if !validExtents(extents) {
		p.err = fmt.Errorf("new pager: %w", ErrExtents)
		extents = nil
	}
	p.root = newServer(fd, src, newPending(extents), opts, p.tree, false)
	return p
}

// Run serves until every extent has been placed or dropped by an event,
// in this process and in every child it forked meanwhile, then returns
// nil. It returns a *ServeError if a page cannot be served (the process
// must then be killed), or the context's error. Run may be called once.
//
// Once Run has returned, nothing reads the userfaultfd: the caller
// unregisters the ranges and closes it (and releases any copy a Holder
// keeps) promptly. Until then, a fork or madvise the process began as
// Run returned waits in the kernel for its event to be read; closing the
// userfaultfd lets it go on (a child forked then gets no userfaultfd:
// all its memory was in place).
func (p *Pager) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.ran {
		p.mu.Unlock()
		return errors.New("uffd pager: Run called twice")
	}
	p.ran = true
	p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	if err := checkFeatures(p.root.fd); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	p.tree.init(ctx, p.root)
	errc := make(chan error, 1)
	go func() {
		// The thread may be pinned (Options.Affinity): it exits with the
		// goroutine rather than return to the runtime's pool.
		lockThread()
		errc <- p.root.run(ctx)
	}()
	err := <-errc
	cancel()
	p.tree.wait()
	return err
}

// Stats returns the pager's statistics; safe during Run.
func (p *Pager) Stats() Stats {
	st := p.root.stats()
	for _, c := range p.tree.all() {
		st.Children = append(st.Children, c.stats())
	}
	return st
}

// Close closes the userfaultfds of forked children that were not fully
// served (Run failed or was cancelled): their pages then read as zeros, so
// kill those processes first. It does not close the fd given to New.
func (p *Pager) Close() error {
	var errs []error
	for _, c := range p.tree.all() {
		if err := c.closeFD(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tree tracks the pagers of forked children: the root's Run ends only when
// they are done; the first child error ends it too.
type tree struct {
	ctx  context.Context
	root *server
	wg   sync.WaitGroup

	// prefetchHeld: Options.HoldPrefetch until ReleasePrefetch, for the
	// root and every child.
	prefetchHeld atomic.Bool

	mu sync.Mutex
	// +checklocks:mu
	active int
	// +checklocks:mu
	err error
	// +checklocks:mu
	children []*server
}

func (t *tree) init(ctx context.Context, root *server) {
	t.ctx, t.root = ctx, root
}

func (t *tree) start(c *server) {
	t.mu.Lock()
	t.active++
	t.children = append(t.children, c)
	t.mu.Unlock()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		lockThread()
		err := c.run(t.ctx)
		if err == nil {
			err = c.closeFD()
		}
		t.mu.Lock()
		t.active--
		if err != nil && t.err == nil && t.ctx.Err() == nil {
			t.err = fmt.Errorf("forked child (uffd %d): %w", c.fd, err)
		}
		t.mu.Unlock()
		t.root.wake()
	}()
}

// state returns the number of running children and the first error.
func (t *tree) state() (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.active, t.err
}

func (t *tree) all() []*server {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*server(nil), t.children...)
}

func (t *tree) wait() { t.wg.Wait() }

// PageSize is the page size of the ranges the pager serves (uffdio's).
const PageSize = uffdio.PageSize
