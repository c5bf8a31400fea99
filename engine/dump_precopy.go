package engine

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/mem/precopy"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// PreCopyOptions bound the copy rounds of a pre-copy dump
// (DumpOptions.PreCopy): rounds go on while what each copies shrinks, up
// to MaxRounds and MaxTime, and stop as soon as one copies no more than
// Enough.
type PreCopyOptions struct {
	MaxRounds int           // 0: DefaultPreCopyRounds
	MaxTime   time.Duration // 0: DefaultPreCopyTime
	Enough    uint64        // 0: DefaultPreCopyEnough
}

// Defaults of PreCopyOptions.
const (
	DefaultPreCopyRounds = 8
	DefaultPreCopyTime   = 30 * time.Second
	DefaultPreCopyEnough = 1 << 20
)

// PreCopyResult are the figures of the rounds of a pre-copy dump.
type PreCopyResult struct {
	// Pause is how long the process was stopped to set up write
	// tracking, before the rounds.
	Pause  time.Duration
	Rounds []precopy.RoundStats
	// Tracked is the size of the ranges whose writes were tracked.
	Tracked uint64
	// FrozenCopy is the memory read while the process was frozen.
	FrozenCopy uint64
	// Time is the time from the start of the pre-copy to the freeze.
	Time time.Duration
	// Abandoned: the process exec'd during the pre-copy; what the rounds
	// copied was of its old program, and its memory was read whole while
	// it was frozen, as without --pre-copy.
	Abandoned bool
}

// preCopy, for DumpOptions.PreCopy, stops the process just long enough
// to set up write tracking (precopy.Copy), lets it run, and copies its
// memory in rounds. The process stays attached (not stopped) until the
// freeze.
func (d *dumper) preCopy(ctx context.Context) (err error) {
	o := d.opts.PreCopy
	if o == nil {
		return nil
	}
	start := time.Now()
	if d.t, err = ptrace.New(); err != nil {
		return err
	}
	if d.preP, err = d.t.Seize(d.pid, ptrace.SeizeOptions{Options: unix.PTRACE_O_TRACECLONE}); err != nil {
		return err
	}
	stopped := time.Now().Add(-d.preP.Stats().Duration)
	leader := d.preP.Leader()
	if leader == nil {
		leader = d.preP.Threads()[0]
	}
	in, err := syscalls.New(leader, 0)
	if err != nil {
		return err
	}
	d.pc, err = precopy.Start(in, d.pid, d.preP)
	if cerr := in.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("end injection: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("set up write tracking: %w", err)
	}
	maps, err := proc.ReadMaps(d.pid)
	if err != nil {
		return err
	}
	if err := d.pc.Register(maps); err != nil {
		return err
	}
	if err := d.preP.Resume(); err != nil {
		return fmt.Errorf("resume after setting up write tracking: %w", err)
	}
	r := &PreCopyResult{Pause: time.Since(stopped), Tracked: d.pc.Tracked()}
	d.preRes = r
	d.log.Info("write tracking set up", "pid", d.pid, "paused", r.Pause, "tracked", r.Tracked)

	maxRounds, maxTime, enough := o.MaxRounds, o.MaxTime, o.Enough
	if maxRounds <= 0 {
		maxRounds = DefaultPreCopyRounds
	}
	if maxTime <= 0 {
		maxTime = DefaultPreCopyTime
	}
	if enough == 0 {
		enough = DefaultPreCopyEnough
	}
	for {
		t0 := time.Now()
		st, err := d.pc.Round(ctx)
		if d.preP.AddressSpaceGone() {
			break // it exec'd: the freeze abandons the pre-copy
		}
		if err != nil {
			return err
		}
		r.Rounds = append(r.Rounds, st)
		d.log.Info("pre-copy round", "pid", d.pid, "round", st.Round, "copied", st.Copied, "ranges", st.Runs, "took", time.Since(t0))
		n := len(r.Rounds)
		switch {
		case n >= maxRounds, st.Copied <= enough, time.Since(start) >= maxTime:
		case n > 2 && st.Copied*4 > r.Rounds[n-2].Copied*3:
			// No longer shrinking (by a quarter a round): more rounds
			// would not shorten the freeze.
		default:
			continue
		}
		break
	}
	r.Time = time.Since(start)
	return nil
}

// preCopyable refuses a pre-copy dump of a process with children:
// pre-copy tracks the writes of one process.
func preCopyable(pid int) error {
	if kids, err := children(pid); err != nil {
		return err
	} else if len(kids) > 0 {
		return fmt.Errorf("%w: pid %d has children (%v): --pre-copy dumps a single process; dump the tree without it", ErrUnsupported, pid, kids)
	}
	return nil
}

// freezePreCopied stops the process attached since the pre-copy again:
// the freeze of a pre-copy dump.
func (d *dumper) freezePreCopied() error {
	start := time.Now()
	if err := d.preP.Interrupt(0); err != nil {
		return err
	}
	d.frozen, d.stop = start, time.Since(start)
	comm, _ := proc.ReadComm(d.pid)
	d.procs = []*dumpProc{{pid: d.pid, comm: comm, p: d.preP}}
	if err := preCopyable(d.pid); err != nil {
		return err
	}
	d.log.Info("frozen", "pid", d.pid, "threads", len(d.preP.Threads()), "took", d.stop)
	return nil
}

// abandonPreCopy gives up a pre-copy whose process exec'd: the rounds
// copied, and tracked the writes of, an address space that is gone. The
// process is detached, to be frozen and read whole as without --pre-copy.
func (d *dumper) abandonPreCopy() {
	d.log.Warn("the process exec'd (or exited) during the pre-copy: its memory is read whole while it is frozen", "pid", d.pid)
	d.pc.Close()
	d.pc = nil
	if err := d.preP.Detach(); err != nil {
		d.log.Debug("detach after exec", "pid", d.pid, "err", err)
	}
	d.preP, d.procs = nil, nil
	d.frozen, d.stop = time.Time{}, 0 // the freeze is the one to come
	d.t.Close()
	d.t = nil
	d.preRes.Abandoned = true
}

// memOptions are the options of mem.Dump for one process.
func (d *dumper) memOptions(captured func(), tree mem.TreeObjects) mem.DumpOptions {
	o := mem.DumpOptions{Progress: d.opts.Progress, Captured: captured, Tree: tree}
	if d.pc != nil {
		o.PreCopy = d.pc
	}
	if d.preRes != nil {
		o.CaptureStats = func(n uint64) { d.preRes.FrozenCopy = n }
	}
	return o
}

// stopTracking, in a pre-copy dump, ends write tracking once the process
// is frozen: what was written since the last round is dropped from the
// copy, to be read now.
func (d *dumper) stopTracking(context.Context) error {
	if d.pc == nil {
		return nil
	}
	if err := d.pc.Stop(); err != nil {
		return fmt.Errorf("stop write tracking: %w", err)
	}
	return nil
}
