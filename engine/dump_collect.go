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
// their page tables to count their pages): it runs beside the rest, that
// is the end of write tracking in a pre-copy dump, what /proc tells of
// each process, the system calls injected into its threads and the
// descriptors. The injection maps its stub and scratch memory in the
// process meanwhile; that area is left out of the mappings read (mappingsBut), and if the
// read saw it merged with a mapping of the process's own, the mappings
// are read again once it is gone. Everything is read while the
// processes are frozen: the result is the state at the freeze.
func (d *dumper) collect(ctx context.Context) error {
	type mapsRead struct {
		maps [][]proc.Mapping
		err  error
		took time.Duration
	}
	for _, p := range d.procs {
		p.st = &image.Process{PID: p.pid}
	}
	start := time.Now()
	mapsCh := make(chan mapsRead, 1)
	go func() {
		r := mapsRead{}
		defer func() { r.took = time.Since(start); mapsCh <- r }()
		for _, p := range d.procs {
			m, err := proc.ReadMappings(p.pid)
			if err != nil {
				r.err = d.procErr(p, err)
				break
			}
			r.maps = append(r.maps, m)
		}
	}()
	stopCh := make(chan error, 1)
	var stopTook time.Duration
	go func() {
		err := d.stopTracking(ctx)
		stopTook = time.Since(start)
		stopCh <- err
	}()

	fdsCh := make(chan error, 1)
	var fdsTook time.Duration
	go func() {
		// The descriptors look only for shared objects among the
		// mappings: /proc/PID/maps, read in no time, is enough (the
		// injection's area is private memory).
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

	areas := make([]injectArea, len(d.procs))
	var stateErr error
	for i, p := range d.procs {
		if err := ctx.Err(); err != nil {
			stateErr = err
			break
		}
		if err := d.processState(p); err != nil {
			stateErr = step("process state", d.procErr(p, err))
			break
		}
		err := task.Inject(p.p, p.st, d.log, func(addr uint64, n int) { areas[i] = injectArea{addr, addr + uint64(n)} })
		if err != nil {
			stateErr = step("thread state", d.procErr(p, err))
			break
		}
	}
	injected := time.Since(start)
	stopErr := <-stopCh
	mr := <-mapsCh
	fdsErr := <-fdsCh
	d.log.Debug("state read", "pid", d.pid, "smaps", mr.took, "stop tracking", stopTook, "injected", injected, "descriptors", fdsTook)
	if err := errors.Join(step("stop write tracking", stopErr), step("read mappings", mr.err)); err != nil {
		return err
	}
	if stateErr != nil {
		return stateErr
	}
	if fdsErr != nil {
		return step("file descriptors", fdsErr)
	}
	for i, p := range d.procs {
		var ok bool
		if p.maps, ok = mappingsBut(mr.maps[i], areas[i]); !ok {
			// The scratch memory merged with a neighbour while the
			// mappings were read: read them again, the area unmapped.
			d.log.Debug("mappings read again", "pid", p.pid, "area", fmt.Sprintf("%#x-%#x", areas[i].start, areas[i].end))
			m, err := proc.ReadMappings(p.pid)
			if err != nil {
				return step("read mappings", d.procErr(p, err))
			}
			if p.maps, ok = mappingsBut(m, injectArea{}); !ok {
				return step("read mappings", d.procErr(p, errors.New("/proc/PID/smaps lists overlapping mappings")))
			}
		}
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

// injectArea is the memory an injection mapped in a process, [start, end).
type injectArea struct{ start, end uint64 }

// mappingsBut returns maps without the mappings inside area; ok is false
// if a mapping straddles its bounds (the area merged with a mapping of
// the process's own) or the list is not in order without overlaps (a
// read torn by the area's changes).
func mappingsBut(maps []proc.Mapping, area injectArea) (out []proc.Mapping, ok bool) {
	out = maps[:0:0]
	var end uint64
	for _, m := range maps {
		if m.Start < end || m.End <= m.Start {
			return nil, false
		}
		end = m.End
		switch {
		case m.End <= area.start || m.Start >= area.end:
			out = append(out, m)
		case m.Start >= area.start && m.End <= area.end:
			// The injection's own.
		default:
			return nil, false
		}
	}
	return out, true
}
