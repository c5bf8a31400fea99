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
	Logger    *slog.Logger
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
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pid := opts.PID
	if err := precheck(pid); err != nil {
		return nil, step("check", err)
	}
	w, err := image.Create(opts.Dir, image.Options{BlockSize: opts.BlockSize, Mode: opts.Mode, Workers: opts.Workers, Tool: "lazyfs " + Version})
	if err != nil {
		return nil, step("create snapshot", err)
	}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()

	t, err := ptrace.New()
	if err != nil {
		return nil, step("freeze", err)
	}
	defer t.Close()
	p, err := t.Seize(pid, ptrace.SeizeOptions{})
	if err != nil {
		return nil, step("freeze", err)
	}
	frozen := time.Now().Add(-p.Stats().Duration)
	log.Info("frozen", "pid", pid, "threads", len(p.Threads()), "took", p.Stats().Duration)
	resumed := false
	defer func() {
		if !resumed {
			if derr := p.Detach(); derr != nil {
				log.Error("resume after failed dump", "pid", pid, "err", derr)
			}
		}
	}()

	// Children may have appeared between the check and the freeze.
	if kids, _ := children(pid); len(kids) > 0 {
		return nil, step("check", fmt.Errorf("pid %d: %w (%v): dump the tree's leaves or stop them first", pid, ErrHasChildren, kids))
	}
	d := &dumper{pid: pid, p: p, log: log}
	st, err := d.collect(ctx)
	if err != nil {
		return nil, err
	}
	log.Debug("state collected", "pid", pid, "since freeze", time.Since(frozen))
	// With LeaveRunning the process resumes as soon as its memory has been
	// read: encoding the last blocks, syncing the files and committing
	// need it no more. A dump that fails after that still leaves it
	// running, as it would have been. Without LeaveRunning it is killed
	// only once the snapshot is committed.
	var freeze time.Duration
	var resumeErr error
	captured := func() {
		if !opts.LeaveRunning {
			return
		}
		resumed = true
		resumeErr = p.Detach()
		freeze = time.Since(frozen)
		log.Info("resumed", "pid", pid, "frozen", freeze)
	}
	if err := d.dumpMemory(ctx, w, st, opts.Progress, captured); err != nil {
		return nil, step("dump memory", withResumeErr(err, resumeErr))
	}
	log.Debug("pages written", "pid", pid, "since freeze", time.Since(frozen))
	if err := w.WriteState(st); err != nil {
		return nil, step("write state", withResumeErr(err, resumeErr))
	}
	if err := w.Commit(); err != nil {
		return nil, step("commit", withResumeErr(err, resumeErr))
	}
	log.Debug("committed", "pid", pid, "since freeze", time.Since(frozen))
	res = &DumpResult{PID: pid, Threads: len(st.Threads), FreezeStop: p.Stats().Duration, Stats: d.stats, MemoryBytes: d.stats.Total.Bytes}
	if !resumed {
		resumed = true
		if opts.LeaveRunning {
			resumeErr = p.Detach()
		} else {
			fds.ResetConnections(st, log) // no TIME_WAIT left holding its ports
			resumeErr = p.Kill()
		}
		freeze = time.Since(frozen)
	}
	res.Freeze = freeze
	res.Total = time.Since(start)
	if resumeErr != nil {
		// The snapshot is complete; say so along with the failure.
		return res, step("finish", fmt.Errorf("snapshot written, but %w", resumeErr))
	}
	return res, nil
}

// withResumeErr adds to err the failure, if any, of the early resume.
func withResumeErr(err, resumeErr error) error {
	if resumeErr == nil {
		return err
	}
	return errors.Join(err, fmt.Errorf("resume: %w", resumeErr))
}

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
