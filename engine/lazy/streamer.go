package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// streamChunk is the most bytes the streamer reads and places at once.
const streamChunk = 1 << 20

// streamer places a shared object's data in it through a mapping of the
// object in snapctl, registered with a userfaultfd of snapctl's: a copy
// there puts the page in the object (for every process that maps it)
// unless a process's pager put it there first (EEXIST). Nothing in
// snapctl touches the mapping, so it never faults, and no event changes
// it.
type streamer struct {
	obj    *sharedObject
	file   *os.File
	mem    []byte
	fd     int
	placed uint64 // bytes the streamer placed (not found present)
}

// newStreamer maps the object that VMA v of process pid (ours) maps, from
// /proc/PID/map_files (a shared anonymous mapping has no other name), and
// registers the mapping.
func newStreamer(pid int, v *image.VMA, o *sharedObject) (*streamer, error) {
	// The mapping's name is its range now, which may differ from the
	// snapshot's VMA (the kernel merges mappings that it can).
	ms, err := proc.ReadMaps(pid)
	if err != nil {
		return nil, err
	}
	start, end := v.Start, v.End
	for _, m := range ms {
		if m.Start <= v.Start && v.Start < m.End {
			start, end = m.Start, m.End
		}
	}
	name := fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, start, end)
	prot := unix.PROT_READ | unix.PROT_WRITE
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		// UFFDIO_COPY places pages in a read-only mapping too.
		prot = unix.PROT_READ
		if f, err = os.Open(name); err != nil {
			return nil, fmt.Errorf("open shared memory object: %w", err)
		}
	}
	s := &streamer{obj: o, file: f, fd: -1}
	fi, err := f.Stat()
	if err != nil {
		s.close()
		return nil, err
	}
	last := o.runs[len(o.runs)-1]
	size := (uint64(fi.Size()) + image.PageSize - 1) &^ (image.PageSize - 1)
	if size < last.off+last.n {
		s.close()
		return nil, fmt.Errorf("%w: shared memory object %d of %d bytes, its data up to %d", image.ErrCorrupt, o.id, size, last.off+last.n)
	}
	if s.mem, err = unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED); err != nil {
		s.close()
		return nil, fmt.Errorf("map shared memory object: %w", err)
	}
	// A process snapctl forks must not take the registration with it.
	if err := unix.Madvise(s.mem, unix.MADV_DONTFORK); err != nil {
		s.close()
		return nil, err
	}
	if s.fd, err = newUffd(); err != nil {
		s.close()
		return nil, err
	}
	if _, _, err := uffdio.API(s.fd, uffdio.FeatureMissingShmem); err != nil {
		s.close()
		return nil, err
	}
	if _, err := uffdio.Register(s.fd, s.base(), size, uffdio.RegisterModeMissing); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// base is the address of the streamer's mapping.
func (s *streamer) base() uint64 { return uint64(uintptr(unsafe.Pointer(&s.mem[0]))) }

// close unmaps the object: its pages stay in it.
func (s *streamer) close() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
	if s.file != nil {
		s.file.Close()
		s.file = nil
	}
}

// streamChunkOf is a chunk of the object's data read from the snapshot.
type streamChunkOf struct {
	off uint64
	buf []byte
	err error
}

// run places every data run of the object, reading them through read a
// chunk ahead of the copies.
func (s *streamer) run(ctx context.Context, read func(p *Process) io.ReaderAt, hold func(context.Context)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan streamChunkOf, 2)
	go func() {
		defer close(chunks)
		runs := s.obj.runs
		for i := 0; i < len(runs); {
			// Runs that follow each other in the object and in the
			// snapshot of one process are read at once.
			j, n := i+1, runs[i].n
			for j < len(runs) && runs[j].from == runs[i].from && runs[j].off == runs[i].off+n && runs[j].addr == runs[i].addr+n && n+runs[j].n <= streamChunk {
				n += runs[j].n
				j++
			}
			hold(ctx)
			c := streamChunkOf{off: runs[i].off, buf: make([]byte, n)}
			if _, err := read(runs[i].from).ReadAt(c.buf, int64(runs[i].addr)); err != nil {
				c.err = &uffd.ServeError{Op: "read", Addr: runs[i].addr, Len: n, Err: err}
			}
			select {
			case chunks <- c:
			case <-ctx.Done():
				return
			}
			if c.err != nil {
				return
			}
			i = j
		}
	}()
	for c := range chunks {
		if c.err != nil {
			return c.err
		}
		if err := s.place(c.off, c.buf); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// place copies b to offset off of the object, page by page past those a
// process's pager placed first.
func (s *streamer) place(off uint64, b []byte) error {
	dst := s.base() + off
	for len(b) > 0 {
		n, err := uffdio.Copy(s.fd, dst, b, uffdio.CopyModeDontWake)
		switch {
		case err == nil, errors.Is(err, uffdio.ErrShort):
			s.placed += uint64(n)
		case errors.Is(err, uffdio.ErrExist):
			n = image.PageSize
		default:
			return &uffd.ServeError{Op: "copy", Addr: dst, Len: uint64(len(b)), Err: fmt.Errorf("shared memory object %d at %#x: %w", s.obj.id, off, err)}
		}
		dst, off, b = dst+uint64(n), off+uint64(n), b[n:]
	}
	return nil
}

// serveShared starts, on wg, the streamers of the shared objects served
// lazily and the pagers of every process's mappings of them; a failure
// ends the phase (cancel). The pagers serve faults until every streamer
// is done: the objects are whole then, and the pages they still miss
// are those the snapshot holds as zeros, which the kernel fills once
// the mappings are unregistered.
func (ph *Phase) serveShared(ctx context.Context, cancel context.CancelCauseFunc, wg *sync.WaitGroup) {
	if len(ph.shared) == 0 {
		return
	}
	read := func(p *Process) io.ReaderAt { return p.src }
	faultRead := read
	if ph.src.Waits() {
		// As for private memory: a fault's block is decoded here.
		faultRead = func(p *Process) io.ReaderAt { return p.pages.Uncached() }
	}
	whole, done := context.WithCancel(ctx)
	ids := slices.Sorted(maps.Keys(ph.shared))
	wg.Go(func() {
		defer done()
		if d := ph.opts.PrefetchDelay; d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return
			}
		}
		for _, id := range ids {
			if str := ph.shared[id].str; str != nil {
				if err := str.run(ctx, read, ph.holdAfterFault); err != nil {
					cancel(fmt.Errorf("shared memory: %w", err))
					return
				}
			}
		}
	})
	po := uffd.Options{Shared: true, Logger: ph.log, OnFault: ph.faulted}
	if k := ph.keeperOf(); k != nil {
		po.Holder = k
	}
	for _, p := range ph.procs {
		if p.shm == nil {
			continue
		}
		wg.Go(func() {
			if err := p.serveShared(ctx, whole, po, read, faultRead); err != nil {
				cancel(fmt.Errorf("pid %d (%s), shared memory: %w", p.st.PID, p.st.Comm, err))
			}
		})
	}
}

// serveShared runs the pager of the process's mappings of shared objects
// until whole ends (or every page it serves faulted in), then unregisters
// and closes its userfaultfd.
func (p *Process) serveShared(ctx, whole context.Context, po uffd.Options, read, faultRead func(*Process) io.ReaderAt) error {
	sh := p.shm
	src := &segmentSource{segs: sh.segs, read: read}
	po.Unit = src.unit
	po.FaultSrc = &segmentSource{segs: sh.segs, read: faultRead}
	extents := make([]uffd.Extent, len(sh.segs))
	for i, g := range sh.segs {
		extents[i] = uffd.Extent{Addr: g.start, Len: g.end - g.start}
	}
	sh.pager = uffd.New(sh.fd, src, extents, po)
	err := sh.pager.Run(whole)
	sh.stats = sh.pager.Stats()
	if err != nil && (ctx.Err() != nil || !errors.Is(err, context.Canceled)) {
		return err
	}
	if !sh.stats.Exited {
		if _, err := unregisterLazy(sh.fd, sh.ranges, p.pid); err != nil {
			return err
		}
	}
	p.closeShared()
	return nil
}

// streamHold is how long the streamers hold back after a fault, as a
// pager's prefetch workers do: a thread waiting on its faults needs the
// CPUs more than streaming does.
const streamHold = 10 * time.Millisecond

// faulted is uffd.Options.OnFault of every pager: it notes the time.
func (ph *Phase) faulted(_, _ uint64, at time.Time) {
	ph.lastFault.Store(at.UnixNano())
}

// holdAfterFault waits until streamHold after the last fault, at most
// streamHold: a process that faults without pause slows the streaming
// down, but never stops it.
func (ph *Phase) holdAfterFault(ctx context.Context) {
	d := time.Until(time.Unix(0, ph.lastFault.Load()).Add(streamHold))
	if d <= 0 {
		return
	}
	t := time.NewTimer(min(d, streamHold))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
