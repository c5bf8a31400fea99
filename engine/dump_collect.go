package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/task"
)

// collect reads the state of the frozen processes. Reading their
// mappings from /proc/PID/smaps is the longest part (the kernel walks
// their page tables to count their pages), then the end of write tracking
// in a pre-copy dump (PAGEMAP_SCAN, another walk). Both hold the process's
// mmap lock for reading for the whole walk of a large mapping, and the
// injected calls need it for writing (the mmap of their stub, brk, the
// munmap): run side by side, the calls would wait for the walks and the
// walks queue behind the waiting calls. So the calls come first, with what
// /proc tells of each process and, beside them, the descriptors (which
// take no such lock for long); then the two walks side by side. Everything
// is read while the processes are frozen: the result is the state at the
// freeze.
func (d *dumper) collect(ctx context.Context) error {
	for _, p := range d.procs {
		p.st = &image.Process{PID: p.pid, Zombies: p.zombies}
	}
	start := time.Now()
	fdsCh := make(chan error, 1)
	var fdsTook time.Duration
	go func() {
		// The descriptors look only for shared objects among the
		// mappings: /proc/PID/maps, read in no time, is enough (the
		// injection's own area is private memory).
		var err error
		defer func() { fdsTook = time.Since(start); fdsCh <- err }()
		maps := make([][]proc.Mapping, len(d.procs))
		for i, p := range d.procs {
			if maps[i], err = proc.ReadMaps(p.pid); err != nil {
				err = d.procErr(p, err)
				return
			}
		}
		err = d.fds(maps)
	}()
	var stateErr error
	for _, p := range d.procs {
		if err := ctx.Err(); err != nil {
			stateErr = err
			break
		}
		if err := d.processState(p); err != nil {
			stateErr = step("process state", d.procErr(p, err))
			break
		}
		if err := task.Inject(p.p, p.st, d.log); err != nil {
			stateErr = step("thread state", d.procErr(p, err))
			break
		}
	}
	injected := time.Since(start)
	if stateErr != nil {
		<-fdsCh
		return stateErr
	}

	// The injection's area is unmapped: the mappings read now are the
	// process's own.
	var smapsErr error
	var smapsTook time.Duration
	smapsDone := make(chan struct{})
	go func() {
		defer func() { smapsTook = time.Since(start); close(smapsDone) }()
		for _, p := range d.procs {
			var err error
			if p.maps, err = proc.ReadMappings(p.pid); err != nil {
				smapsErr = d.procErr(p, err)
				return
			}
		}
	}()
	stopErr := d.stopTracking(ctx)
	stopTook := time.Since(start)
	<-smapsDone
	fdsErr := <-fdsCh
	d.log.Debug("state read", "pid", d.pid, "injected", injected, "descriptors", fdsTook, "smaps", smapsTook, "stop tracking", stopTook)
	if err := errors.Join(step("stop write tracking", stopErr), step("read mappings", smapsErr), step("file descriptors", fdsErr)); err != nil {
		return err
	}
	for _, p := range d.procs {
		if err := d.memoryLayout(p); err != nil {
			return step("memory layout", d.procErr(p, err))
		}
	}
	return nil
}

// procErr names the process in err when the tree has several.
func (d *dumper) procErr(p *dumpProc, err error) error {
	if len(d.procs) > 1 {
		return fmt.Errorf("pid %d (%s): %w", p.pid, p.comm, err)
	}
	return err
}

// processState reads what /proc tells of the process (task.ReadProcess).
func (d *dumper) processState(p *dumpProc) error { return task.ReadProcess(p.pid, p.st) }
