package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Version is the tool version recorded in snapshots.
const Version = "0.1.0"

// DumpOptions configure Dump.
type DumpOptions struct {
	PID int
	Dir string
	// LeaveRunning resumes the process instead of killing it: as soon as
	// its memory has been read, before the snapshot is synced and
	// committed.
	LeaveRunning bool
	// BlockSize, Mode and Workers are the encoding settings (see
	// image.Options).
	BlockSize int
	Mode      codec.Mode
	Workers   int
	// Remote configures the store when Dir is an address
	// (s3://BUCKET/PREFIX).
	Remote image.RemoteOptions
	Logger *slog.Logger
	// Progress, if set, is called from time to time with the memory bytes
	// written so far and the total to write.
	Progress func(done, total uint64)
}

// DumpResult describes a finished dump.
type DumpResult struct {
	PID     int
	Threads int
	// Freeze is the time the process was stopped: from the first
	// interrupt to its resume or kill.
	Freeze time.Duration
	// FreezeStop is how long stopping every thread took.
	FreezeStop time.Duration
	Total      time.Duration
	Stats      image.Stats
	// MemoryBytes is the memory dumped (decoded bytes).
	MemoryBytes uint64
}

// Dump freezes the process opts.PID, writes its snapshot into opts.Dir and
// then kills it once the snapshot is committed, or, with LeaveRunning,
// resumes it as soon as its memory has been read. On any error the process
// is resumed as it was and the directory holds no manifest.
func Dump(ctx context.Context, opts DumpOptions) (res *DumpResult, err error) {
	start := time.Now()
	d := &dumper{pid: opts.PID, opts: opts, log: logger(opts.Logger)}
	defer d.cleanup(&err)
	err = runSteps(ctx, d.log, "dump", []namedStep{
		{"check", d.check},
		{"create snapshot", d.create},
		{"freeze", d.freeze},
		{"check", d.checkFrozen},
		{"read mappings", d.readMappings},
		{"process state", d.processState},
		{"memory layout", d.memoryLayout},
		{"thread state", d.injected},
		{"file descriptors", d.fds},
		{"dump memory", d.dumpMemory},
		{"write state", d.writeState},
		{"commit", d.commit},
		{"finish", d.finish},
	})
	if d.res != nil {
		d.res.Total = time.Since(start)
	}
	return d.res, err
}

// check refuses a process that cannot be dumped, before touching it.
func (d *dumper) check(context.Context) error { return precheck(d.pid) }

// create makes the snapshot directory's files.
func (d *dumper) create(context.Context) error {
	o := d.opts
	var err error
	d.w, err = image.Create(o.Dir, image.Options{BlockSize: o.BlockSize, Mode: o.Mode, Workers: o.Workers, Tool: "lazyfs " + Version, Remote: o.Remote})
	return err
}

// freeze stops every thread of the process.
func (d *dumper) freeze(context.Context) error {
	t, err := ptrace.New()
	if err != nil {
		return err
	}
	d.t = t
	if d.p, err = t.Seize(d.pid, ptrace.SeizeOptions{}); err != nil {
		return err
	}
	d.frozen = time.Now().Add(-d.p.Stats().Duration)
	d.log.Info("frozen", "pid", d.pid, "threads", len(d.p.Threads()), "took", d.p.Stats().Duration)
	return nil
}

// checkFrozen refuses children that appeared between the check and the
// freeze.
func (d *dumper) checkFrozen(context.Context) error {
	if kids, _ := children(d.pid); len(kids) > 0 {
		return fmt.Errorf("pid %d: %w (%v): dump the tree's leaves or stop them first", d.pid, ErrHasChildren, kids)
	}
	return nil
}

// readMappings reads the memory layout, before injection maps its scratch
// page.
func (d *dumper) readMappings(context.Context) error {
	var err error
	d.maps, err = proc.ReadMappings(d.pid)
	d.st = &image.Process{PID: d.pid}
	return err
}

func (d *dumper) memoryLayout(context.Context) error {
	var err error
	d.st.VMAs, err = mem.VMAs(d.pid, d.maps)
	return err
}

func (d *dumper) fds(context.Context) error {
	var err error
	d.st.FDs, err = fds.Dump(d.pid, d.maps, d.log)
	return err
}

// dumpMemory writes the pages. With LeaveRunning the process resumes as
// soon as its memory has been read: encoding the last blocks, syncing the
// files and committing need it no more. A dump that fails after that
// still leaves it running, as it would have been. Without LeaveRunning it
// is killed only once the snapshot is committed.
func (d *dumper) dumpMemory(ctx context.Context) error {
	d.log.Debug("state collected", "pid", d.pid, "since freeze", time.Since(d.frozen))
	captured := func() {
		if d.opts.LeaveRunning {
			d.resume(d.p.Detach)
			d.log.Info("resumed", "pid", d.pid, "frozen", d.freezeTime)
		}
	}
	var err error
	d.stats, err = mem.Dump(ctx, d.w, d.st, d.maps, d.p, mem.DumpOptions{Progress: d.opts.Progress, Captured: captured})
	return d.withResumeErr(err)
}

func (d *dumper) writeState(context.Context) error {
	d.log.Debug("pages written", "pid", d.pid, "since freeze", time.Since(d.frozen))
	return d.withResumeErr(d.w.WriteState(d.st))
}

func (d *dumper) commit(context.Context) error {
	if err := d.w.Commit(); err != nil {
		return d.withResumeErr(err)
	}
	d.committed = true
	d.log.Debug("committed", "pid", d.pid, "since freeze", time.Since(d.frozen))
	return nil
}

// finish resumes or kills the process, the snapshot complete.
func (d *dumper) finish(context.Context) error {
	d.res = &DumpResult{PID: d.pid, Threads: len(d.st.Threads), FreezeStop: d.p.Stats().Duration, Stats: d.stats, MemoryBytes: d.stats.Total.Bytes}
	if !d.resumed {
		if d.opts.LeaveRunning {
			d.resume(d.p.Detach)
		} else {
			fds.ResetConnections(d.st, d.log) // no TIME_WAIT left holding its ports
			d.resume(d.p.Kill)
		}
	}
	d.res.Freeze = d.freezeTime
	if d.resumeErr != nil {
		// The snapshot is complete; say so along with the failure.
		return fmt.Errorf("snapshot written, but %w", d.resumeErr)
	}
	return nil
}

// resume lets the process go (fn: Detach or Kill) and ends the freeze.
func (d *dumper) resume(fn func() error) {
	d.resumed = true
	d.resumeErr = fn()
	d.freezeTime = time.Since(d.frozen)
}

// cleanup, after a failed dump, removes what it wrote and resumes the
// process as it was; it ends the tracer in any case.
func (d *dumper) cleanup(err *error) {
	if *err != nil && d.w != nil && !d.committed {
		d.w.Abort()
	}
	if d.p != nil && !d.resumed {
		if derr := d.p.Detach(); derr != nil {
			d.log.Error("resume after failed dump", "pid", d.pid, "err", derr)
		}
	}
	if d.t != nil {
		d.t.Close()
	}
}

// withResumeErr adds to err the failure, if any, of the early resume.
func (d *dumper) withResumeErr(err error) error {
	if err == nil || d.resumeErr == nil {
		return err
	}
	return errors.Join(err, fmt.Errorf("resume: %w", d.resumeErr))
}

// pfKthread is PF_KTHREAD, the flag of a kernel thread in /proc/PID/stat.
const pfKthread = 0x00200000

// precheck refuses a process that cannot be dumped, before touching it.
func precheck(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("invalid pid %d", pid)
	}
	if pid == os.Getpid() {
		return fmt.Errorf("pid %d is snapctl itself", pid)
	}
	s, err := proc.ReadStatus(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pid %d: %w", pid, ptrace.ErrNoProcess)
		}
		return err
	}
	if s.Tgid != pid {
		return fmt.Errorf("pid %d is a thread of process %d: dump the process", pid, s.Tgid)
	}
	if s.State == 'Z' {
		return fmt.Errorf("pid %d is a zombie", pid)
	}
	if st, err := proc.ReadStat(pid); err == nil && st.Flags&pfKthread != 0 {
		return fmt.Errorf("%w: pid %d (%s) is a kernel thread: it has no memory or state of its own to dump", ErrUnsupported, pid, st.Comm)
	}
	if s.TracerPid != 0 {
		return tracedError(pid, s.TracerPid)
	}
	if kids, err := children(pid); err != nil {
		return err
	} else if len(kids) > 0 {
		return fmt.Errorf("pid %d: %w (%v): process trees are not supported yet", pid, ErrHasChildren, kids)
	}
	return nil
}

// tracedError names the process that traces pid: TracerPid is the
// tracing thread, which need not be its process's leader.
func tracedError(pid, tracer int) error {
	e := &ptrace.AlreadyTracedError{Pid: pid, TracerPid: tracer}
	ts, err := proc.ReadStatus(tracer)
	if err != nil {
		return e
	}
	e.TracerPid = ts.Tgid
	comm, err := proc.ReadComm(ts.Tgid)
	if err != nil {
		return e
	}
	return fmt.Errorf("%w (%s): detach it first", e, comm)
}

// children returns the child processes of every thread of pid.
func children(pid int) ([]int, error) {
	kids, err := proc.Children(pid)
	if err != nil && errors.Is(err, unix.ESRCH) {
		return nil, nil
	}
	return kids, err
}
