package engine

import (
	"context"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/task"
)

// The memory steps of a restore: engine/mem does the work.

func (r *restorer) target() *mem.Target {
	return &mem.Target{In: r.in, State: r.st, Log: r.log, Tree: r.tr.broker, SysV: r.tr.sysv, Inherit: r.inherit, Ghosts: r.ghosts,
		Foreign: r.tr.opts.Namespaces.Into != 0}
}

// unmapStub closes every descriptor the stub inherited and removes every
// mapping it left in the child but our area and the kernel's special
// mappings (moved next).
func (r *restorer) unmapStub(ctx context.Context) error {
	return mem.UnmapAllBut(ctx, r.target(), r.area)
}

// moveVDSO moves the kernel's special mappings where the process had
// them.
func (r *restorer) moveVDSO(ctx context.Context) error { return mem.MoveVDSO(ctx, r.target(), areaLen) }

// mapMemory maps every VMA; the shared objects it made stay open for the
// descriptors that share them (restoreFDs closes them).
func (r *restorer) mapMemory(ctx context.Context) error {
	var err error
	r.shmem, err = mem.Map(ctx, r.target())
	return err
}

// fillMemory writes the snapshot's pages, but those it keeps from its
// parent and those a lazy restore serves later (not those its children
// keep: they must be in when it forks them).
func (r *restorer) fillMemory(ctx context.Context) error {
	o := mem.FillOptions{
		Pages:       r.pages,
		PagesFile:   r.pages.Payloads(),
		Threads:     r.tr.opts.Threads,
		Userfaultfd: r.lazy == nil,
		Progress:    r.tr.opts.Progress,
		Skip: func(b image.Block, v *image.VMA) bool {
			return mem.Within(r.inherit.Kept, b.Addr, uint64(b.Len)) || r.lazy != nil && r.lazy.Skip(b, v)
		},
	}
	n, err := mem.Fill(ctx, r.target(), o)
	r.filled += n
	return err
}

func (r *restorer) lockMemory(ctx context.Context) error { return mem.Lock(ctx, r.target()) }

// setMM sets the mm fields, auxv and exe (task.SetMM), then closes the
// deleted files mapMemory made again: their mappings hold them.
func (r *restorer) setMM(context.Context) error {
	err := task.SetMM(r.in, r.st, r.ghosts, r.tr.opts.Namespaces.Into != 0, r.log)
	for key, fd := range r.ghosts {
		if cerr := r.in.CloseFD(fd); cerr != nil {
			r.log.Warn("close in restored process", "fd", fd, "err", cerr)
		}
		delete(r.ghosts, key)
	}
	return err
}
