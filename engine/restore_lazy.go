package engine

import (
	"context"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd"
)

// LazyStats describe the lazy phase of a restore.
type LazyStats = uffd.Stats

// lazyState is the userfaultfd of a lazy restore.
type lazyState struct {
	fd      int // our copy of the process's userfaultfd
	ranges  [][2]uint64
	extents []uffd.Extent
	pager   *uffd.Pager
}

func (l *lazyState) close() {
	if l.pager != nil {
		l.pager.Close()
	}
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

// isLazy reports whether v's memory is served through userfaultfd:
// anonymous private memory but the stack, locked memory, and memory that a
// fork must see as zeros (MADV_WIPEONFORK).
func (r *restorer) isLazy(v *image.VMA) bool {
	if r.opts.Lazy == nil || v.Kind != image.VMAAnon || !v.Dumped {
		return false
	}
	if v.Flags&unix.MAP_GROWSDOWN != 0 || v.Name == "[stack]" {
		return false
	}
	for _, f := range v.VMFlags {
		if f == "lo" || f == "lf" || f == "wf" {
			return false
		}
	}
	return true
}

// eagerPage reports whether [addr, addr+n) holds memory the kernel writes
// before the lazy phase starts (a thread's rseq area, written when rseq is
// registered): such blocks are filled before the process runs, or the
// kernel's write would fault in a zero page that snapshot data could
// never replace.
func (r *restorer) eagerPage(addr, n uint64) bool {
	for _, t := range r.st.Threads {
		if t.Rseq == nil {
			continue
		}
		lo, hi := t.Rseq.Addr&^(pageSize-1), (t.Rseq.Addr+uint64(t.Rseq.Len)+pageSize-1)&^(pageSize-1)
		if lo < addr+n && addr < hi {
			return true
		}
	}
	return false
}

// prepareLazy creates the process's userfaultfd (inside it, by injection)
// and takes it, then lists what the pager serves: every non-zero block of
// the lazy VMAs that was not filled already. Zero blocks and holes are
// left to the pager's zero fill.
func (r *restorer) prepareLazy(ctx context.Context) error {
	if r.opts.Lazy == nil {
		return nil
	}
	l := &lazyState{fd: -1}
	r.lazy = l
	tfd, err := r.call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK)
	if err != nil {
		return fmt.Errorf("userfaultfd in the process: %w", err)
	}
	pidfd, err := unix.PidfdOpen(r.st.PID, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	l.fd, err = unix.PidfdGetfd(pidfd, int(tfd), 0)
	unix.Close(pidfd)
	if err != nil {
		return fmt.Errorf("pidfd_getfd: %w", err)
	}
	r.closeFD(int(tfd))
	if _, _, err := uffd.API(l.fd, uffd.Features); err != nil {
		return fmt.Errorf("UFFDIO_API: %w", err)
	}
	for i := range r.st.VMAs {
		v := &r.st.VMAs[i]
		if r.isLazy(v) {
			l.ranges = append(l.ranges, [2]uint64{v.Start, v.End})
		}
	}
	for b := range r.pages.Blocks() {
		if b.Kind == codec.Zero || r.eagerPage(b.Addr, uint64(b.Len)) {
			continue
		}
		if v := r.vmaAt(b.Addr); v != nil && r.isLazy(v) {
			l.extents = append(l.extents, uffd.Extent{Addr: b.Addr, Len: uint64(b.Len)})
		}
	}
	return nil
}

// register registers the lazy VMAs, the last step before the process
// runs: every page not present from now on faults to us.
func (l *lazyState) register() error {
	for _, rg := range l.ranges {
		if _, err := uffd.Register(l.fd, rg[0], rg[1]-rg[0], uffd.RegisterModeMissing); err != nil {
			return fmt.Errorf("UFFDIO_REGISTER %#x-%#x: %w", rg[0], rg[1], err)
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
	return r.child.Resume()
}

// serveLazy runs the pager until every page is in, then hands the
// process its memory for good: unregister, close, detach.
func (r *restorer) serveLazy(ctx context.Context, stats *LazyStats) error {
	l := r.lazy
	l.pager = uffd.New(l.fd, r.opts.Lazy, slices.Clip(l.extents), uffd.Options{Prefetch: true, Logger: r.log, Progress: r.opts.Progress})
	err := l.pager.Run(ctx)
	*stats = l.pager.Stats()
	if err != nil {
		return err
	}
	if !stats.Exited {
		for _, rg := range l.ranges {
			if err := uffd.Unregister(l.fd, rg[0], rg[1]-rg[0]); err != nil {
				return fmt.Errorf("UFFDIO_UNREGISTER %#x-%#x: %w", rg[0], rg[1], err)
			}
		}
	}
	if err := l.pager.Close(); err != nil {
		return err
	}
	l.pager = nil
	unix.Close(l.fd)
	l.fd = -1
	r.lazy = nil
	return r.child.Detach()
}
