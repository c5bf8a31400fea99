package ptrace

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// SeizeOptions configure Tracer.Seize.
type SeizeOptions struct {
	// Options are PTRACE_O_* flags given to PTRACE_SEIZE, for instance
	// unix.PTRACE_O_TRACECLONE|unix.PTRACE_O_EXITKILL. TRACECLONE makes
	// threads created during the freeze attach themselves; without it
	// they are found by the re-scan of /proc/PID/task.
	Options int
	// Timeout bounds the whole freeze; DefaultTimeout if zero.
	Timeout time.Duration
}

// Seize attaches to every thread of process pid and stops them all (see
// the package doc). The result's Stats tell how long the freeze took. On
// error nothing stays attached.
func (t *Tracer) Seize(pid int, o SeizeOptions) (*Process, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	var p *Process
	err := t.Do(func() error {
		var err error
		p, err = t.seize(pid, o)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("seize %d: %w", pid, err)
	}
	return p, nil
}

func (t *Tracer) seize(pid int, o SeizeOptions) (*Process, error) {
	start := time.Now()
	if pid <= 0 {
		return nil, ErrNoProcess
	}
	st, err := proc.ReadStatus(pid)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoProcess
	}
	if err != nil {
		return nil, err
	}
	if st.Tgid != pid {
		return nil, fmt.Errorf("%d is a thread of process %d, not a process", pid, st.Tgid)
	}
	if st.State == 'Z' || st.State == 'X' {
		// A zombie leader whose other threads still run is a live process.
		if tids, err := proc.Tasks(pid); err != nil || len(tids) <= 1 {
			return nil, ErrExited
		}
	}
	if q := t.procs[pid]; q != nil {
		return nil, &AlreadyTracedError{Pid: pid, TracerPid: os.Getpid()}
	}
	p := &Process{
		t: t, pid: pid, opts: o.Options,
		foreignChild: st.PPid == os.Getpid(),
		threads:      make(map[int]*Thread),
		attached:     true,
	}
	t.procs[pid] = p
	if err := t.freezeFrom(p, start, start.Add(o.Timeout)); err != nil {
		_ = p.detachWithin(time.Now().Add(time.Second))
		return nil, err
	}
	if p.mem, err = openMem(pid); err != nil {
		_ = p.detach()
		return nil, fmt.Errorf("open mem: %w", err)
	}
	return p, nil
}

// freeze stops every thread of an attached, resumed process.
func (t *Tracer) freeze(p *Process, deadline time.Time) error {
	return t.freezeFrom(p, time.Now(), deadline)
}

// freezeFrom seizes every thread in /proc/PID/task
// not yet held, interrupts every running one, waits for all of them to
// stop and repeats until a pass over the task list finds nothing new.
func (t *Tracer) freezeFrom(p *Process, start, deadline time.Time) error {
	stats := FreezeStats{}
	for {
		stats.Rounds++
		tids, err := proc.Tasks(p.pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return ErrExited
			}
			return fmt.Errorf("list tasks: %w", err)
		}
		for _, tid := range tids {
			if p.threads[tid] != nil {
				continue
			}
			if err := t.attachThread(p, tid); err != nil {
				return err
			}
		}
		var pending []*Thread
		for _, th := range p.threads {
			if th.state != stRunning {
				continue
			}
			if err := th.requestStop(); err != nil {
				return err
			}
			pending = append(pending, th)
		}
		if len(pending) == 0 {
			if _, ok := p.threads[p.pid]; !ok && len(p.threads) == 0 {
				return ErrExited
			}
			break
		}
		if err := t.waitFrozen(p, pending, &stats, deadline); err != nil {
			return err
		}
	}
	if len(p.threads) == 0 {
		return ErrExited
	}
	stats.Threads = len(p.threads)
	for _, th := range p.threads {
		if th.state == stGroup {
			stats.GroupStopped++
		}
	}
	stats.Duration = time.Since(start)
	p.stats = stats
	return nil
}

// attachThread seizes and interrupts one thread found in /proc/PID/task.
func (t *Tracer) attachThread(p *Process, tid int) error {
	err := raw.Seize(tid, p.opts)
	switch {
	case err == nil:
	case errors.Is(err, unix.ESRCH):
		return nil // exited since the listing
	case errors.Is(err, unix.EPERM):
		st, serr := proc.ReadStatus(tid)
		if serr != nil || st.State == 'Z' || st.State == 'X' {
			return nil // dead thread (a zombie cannot be attached)
		}
		if st.TracerPid == t.tid {
			// Created by a thread we hold and auto-attached
			// (PTRACE_O_TRACECLONE) before its parent's clone event was
			// seen: it reports its own first stop.
			t.adopt(p, tid)
			return nil
		}
		if st.TracerPid != 0 {
			return &AlreadyTracedError{Pid: p.pid, TracerPid: st.TracerPid}
		}
		return fmt.Errorf("PTRACE_SEIZE %d: %w", tid, err)
	default:
		return fmt.Errorf("PTRACE_SEIZE %d: %w", tid, err)
	}
	p.addThread(tid, stRunning)
	return nil
}

// waitFrozen waits until every pending thread is stopped or gone.
func (t *Tracer) waitFrozen(p *Process, pending []*Thread, stats *FreezeStats, deadline time.Time) error {
	sleep := 20 * time.Microsecond
	for idle := 0; ; idle++ {
		progress := false
		live := pending[:0]
		for _, th := range pending {
			if th.state != stRunning {
				continue
			}
			st, ok, err := raw.WaitOnce(th.tid, th.reap())
			if err != nil {
				return err
			}
			if !ok {
				live = append(live, th)
				continue
			}
			progress = true
			newTh, err := t.freezeStop(th, st, stats)
			if err != nil {
				return err
			}
			if th.state == stRunning {
				live = append(live, th)
			}
			if newTh != nil && newTh.state == stRunning {
				live = append(live, newTh)
			}
		}
		pending = live
		if len(pending) == 0 {
			return nil
		}
		if progress {
			idle, sleep = 0, 20*time.Microsecond
			continue
		}
		if idle < spinPolls {
			yield()
			continue
		}
		now := time.Now()
		if !now.Before(deadline) {
			return fmt.Errorf("freeze: %d thread(s) did not stop (first %d): %w", len(pending), pending[0].tid, ErrTimeout)
		}
		timer := time.NewTimer(min(sleep, deadline.Sub(now)))
		select {
		case <-t.sigchld:
		case <-timer.C:
		}
		timer.Stop()
		sleep = min(sleep*2, 5*time.Millisecond)
	}
}

// freezeStop handles one stop of a thread being frozen. Stops other than
// the freeze's own are dealt with and the thread interrupted again: any
// ptrace trap clears a pending PTRACE_INTERRUPT. It returns a thread that
// appeared (auto-attached), if any.
func (t *Tracer) freezeStop(th *Thread, st raw.Status, stats *FreezeStats) (*Thread, error) {
	p := th.p
	th.fresh = false
	th.apply(st)
	again := func(sig int) error {
		if err := raw.Cont(th.tid, sig); err != nil {
			return th.check("continue", err)
		}
		th.state = stRunning
		return th.requestStop()
	}
	switch th.state {
	case stExited, stGroup:
		return nil, nil
	case stSignal:
		// A signal arrived before the interrupt: deliver it, as the kernel
		// would have, and stop right after.
		stats.SignalsDelivered++
		return nil, again(int(st.Sig))
	}
	switch st.Event {
	case unix.PTRACE_EVENT_STOP:
		return nil, nil // the interrupt (or the first stop of a new thread)
	case unix.PTRACE_EVENT_CLONE, unix.PTRACE_EVENT_FORK, unix.PTRACE_EVENT_VFORK:
		msg, err := raw.EventMsg(th.tid)
		if err != nil {
			return nil, th.check("PTRACE_GETEVENTMSG", err)
		}
		nt := t.adopt(p, int(msg))
		return nt, again(0)
	default: // exec, exit, seccomp...: let it go on to the interrupt
		return nil, again(0)
	}
}

// requestStop interrupts a running thread, unless it is still to report
// its first stop (auto-attached threads stop by themselves).
func (th *Thread) requestStop() error {
	if th.fresh {
		return nil
	}
	if err := raw.Interrupt(th.tid); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("interrupt %d: %w", th.tid, err)
	}
	return nil
}
