package ptrace

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// threadState is where a tracee thread is, as far as the tracer knows.
type threadState int

const (
	// stRunning: resumed, or seized/interrupted and not yet reported.
	stRunning threadState = iota
	// stEvent: a ptrace event stop (PTRACE_INTERRUPT, clone, exec...).
	stEvent
	// stGroup: a group-stop (SIGSTOP and friends).
	stGroup
	// stSignal: a signal-delivery-stop; stopSig is suppressed on resume.
	stSignal
	// stExited: gone.
	stExited
)

// Process is a traced thread group. Obtain one from Tracer.Seize,
// Tracer.StartStopped or Injector.CallNewTask (the Clone3 of
// engine/ptrace/syscalls). Its methods are safe for concurrent use.
type Process struct {
	t   *Tracer
	pid int
	mem *os.File // /proc/PID/mem, opened O_RDWR

	// Owned by the tracer goroutine.
	owned        bool // started by this Tracer: killed and reaped by it
	foreignChild bool // our process is its real parent but someone else waits for it
	opts         int  // PTRACE_O_* options
	threads      map[int]*Thread
	stats        FreezeStats
	attached     bool
}

// Thread is one traced thread.
type Thread struct {
	p   *Process
	tid int

	// Owned by the tracer goroutine.
	state   threadState
	stopSig unix.Signal
	held    []raw.SigInfo // signals held back while injecting, delivered on resume
	inj     *Injector     // open injector, if any
	fresh   bool          // auto-attached, its first stop not yet seen
	orphan  bool          // detached from a process but did not stop in time: detach when it does
}

// FreezeStats describes the last freeze of a process.
type FreezeStats struct {
	Duration         time.Duration // from the first seize to the last thread stopped
	Threads          int           // threads stopped
	Rounds           int           // passes over /proc/PID/task
	SignalsDelivered int           // signals that arrived during the freeze and were let through
	GroupStopped     int           // threads found in a group-stop
}

// Pid returns the thread group id.
func (p *Process) Pid() int { return p.pid }

// Tracer returns the tracer that holds p.
func (p *Process) Tracer() *Tracer { return p.t }

// Stats returns the figures of the last freeze.
func (p *Process) Stats() FreezeStats {
	var s FreezeStats
	_ = p.t.Do(func() error { s = p.stats; return nil })
	return s
}

// Threads returns the traced threads, leader first, then by tid.
func (p *Process) Threads() []*Thread {
	var out []*Thread
	_ = p.t.Do(func() error { out = p.threadList(); return nil })
	return out
}

func (p *Process) threadList() []*Thread {
	out := make([]*Thread, 0, len(p.threads))
	for _, th := range p.threads {
		out = append(out, th)
	}
	slices.SortFunc(out, func(a, b *Thread) int {
		if a.tid == p.pid {
			return -1
		}
		if b.tid == p.pid {
			return 1
		}
		return a.tid - b.tid
	})
	return out
}

// Thread returns the traced thread tid, or nil.
func (p *Process) Thread(tid int) *Thread {
	var th *Thread
	_ = p.t.Do(func() error { th = p.threads[tid]; return nil })
	return th
}

// Leader returns the thread whose tid is the pid (nil once it is gone).
func (p *Process) Leader() *Thread { return p.Thread(p.pid) }

// Tid returns the thread id.
func (th *Thread) Tid() int { return th.tid }

// Process returns the thread group the thread belongs to.
func (th *Thread) Process() *Process { return th.p }

// reap says whether waits may consume this thread's exit status.
func (th *Thread) reap() bool { return !(th.tid == th.p.pid && th.p.foreignChild) }

// addThread registers a new tracee thread.
func (p *Process) addThread(tid int, state threadState) *Thread {
	th := &Thread{p: p, tid: tid, state: state}
	p.threads[tid] = th
	p.t.threads[tid] = th
	return th
}

// dropThread forgets a thread that is gone or detached.
func (p *Process) dropThread(th *Thread) {
	th.state = stExited
	th.orphan = false
	delete(p.threads, th.tid)
	if p.t.threads[th.tid] == th {
		delete(p.t.threads, th.tid)
	}
}

// forget drops the process and its threads from the tracer; orphans stay
// known to the tracer loop until they stop and are detached.
func (p *Process) forget() {
	for _, th := range p.threads {
		if th.orphan {
			delete(p.threads, th.tid)
			continue
		}
		p.dropThread(th)
	}
	p.attached = false
	if p.t.procs[p.pid] == p {
		delete(p.t.procs, p.pid)
	}
	if p.mem != nil {
		_ = p.mem.Close()
	}
}

// apply records a wait status for th.
func (th *Thread) apply(st raw.Status) {
	switch {
	case st.Exited:
		th.p.dropThread(th)
	case st.Event == unix.PTRACE_EVENT_STOP && isStopSignal(st.Sig):
		th.state, th.stopSig = stGroup, st.Sig
	case st.Event != 0:
		th.state, th.stopSig = stEvent, st.Sig
	default:
		th.state, th.stopSig = stSignal, st.Sig
	}
}

func isStopSignal(s unix.Signal) bool {
	return s == unix.SIGSTOP || s == unix.SIGTSTP || s == unix.SIGTTIN || s == unix.SIGTTOU
}

// stopped checks that th can take ptrace requests.
func (th *Thread) stopped() error {
	switch th.state {
	case stExited:
		return fmt.Errorf("thread %d: %w", th.tid, ErrExited)
	case stRunning:
		return fmt.Errorf("thread %d: %w", th.tid, ErrNotStopped)
	}
	return nil
}

// check turns a ptrace error on th into ErrExited when the thread is gone,
// and records that.
func (th *Thread) check(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.ESRCH) {
		th.p.dropThread(th)
		return fmt.Errorf("%s thread %d: %w", op, th.tid, ErrExited)
	}
	return fmt.Errorf("%s thread %d: %w", op, th.tid, err)
}

// Detach resumes every thread and detaches from the process. Open
// injectors are closed first (their registers restored, scratch memory
// they mapped unmapped). Signals held during injection are delivered.
// Threads found in a group-stop stay stopped.
func (p *Process) Detach() error { return p.t.Do(p.detach) }

func (p *Process) detach() error { return p.detachWithin(time.Now().Add(DefaultTimeout)) }

// detachWithin detaches every thread. A thread that cannot be stopped by
// the deadline (PTRACE_DETACH needs a stopped tracee; a cgroup-frozen one
// does not stop) is left to the tracer loop, which detaches it when it
// stops.
func (p *Process) detachWithin(deadline time.Time) error {
	if !p.attached {
		return nil
	}
	var errs []error
	if p.anyRunning() {
		if err := p.t.freeze(p, deadline); err != nil && !errors.Is(err, ErrExited) {
			errs = append(errs, fmt.Errorf("stop before detach: %w", err))
		}
	}
	for _, th := range p.threadList() {
		if th.state == stRunning {
			th.orphan = true
			continue
		}
		if err := th.release(true); err != nil && !errors.Is(err, ErrExited) {
			errs = append(errs, err)
		}
	}
	p.forget()
	return errors.Join(errs...)
}

// Resume lets every thread run while staying attached: the tracer passes
// signals on to them and follows new threads (PTRACE_O_TRACECLONE) until
// Interrupt, Detach or Kill. Held signals are delivered; group-stopped
// threads stay stopped (PTRACE_LISTEN).
func (p *Process) Resume() error {
	return p.t.Do(func() error {
		if !p.attached {
			return fmt.Errorf("resume %d: %w", p.pid, ErrExited)
		}
		var errs []error
		for _, th := range p.threadList() {
			if err := th.release(false); err != nil && !errors.Is(err, ErrExited) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

// Interrupt stops every thread of a resumed process again, with the same
// rules as the freeze of Seize.
func (p *Process) Interrupt(timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return p.t.Do(func() error {
		return p.t.freeze(p, time.Now().Add(timeout))
	})
}

// release resumes th (detach or continue), closing its injector and
// delivering held signals.
func (th *Thread) release(detach bool) error {
	if th.state == stExited {
		return nil
	}
	var errs []error
	if th.inj != nil {
		if err := th.inj.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if th.state == stExited {
		return errors.Join(errs...)
	}
	if th.state == stRunning {
		if detach {
			errs = append(errs, fmt.Errorf("detach thread %d: %w", th.tid, ErrNotStopped))
		}
		return errors.Join(errs...)
	}
	sig := 0
	held := th.held
	th.held = nil
	if th.state == stSignal && len(held) > 0 {
		// Replace the stop's signal by the first held one, siginfo and all.
		if err := raw.SetSigInfo(th.tid, &held[0]); err == nil {
			sig = int(held[0].Signo())
			held = held[1:]
		}
	}
	for i := range held {
		if err := requeue(th.p.pid, th.tid, &held[i]); err != nil {
			errs = append(errs, fmt.Errorf("redeliver %v to thread %d: %w", held[i].Signo(), th.tid, err))
		}
	}
	var err error
	switch {
	case detach:
		err = raw.Detach(th.tid, sig)
	case th.state == stGroup:
		err = raw.Listen(th.tid)
	default:
		err = raw.Cont(th.tid, sig)
	}
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			th.p.dropThread(th)
			return errors.Join(errs...)
		}
		errs = append(errs, fmt.Errorf("resume thread %d: %w", th.tid, err))
		return errors.Join(errs...)
	}
	if detach {
		th.p.dropThread(th)
	} else {
		th.state = stRunning
	}
	return errors.Join(errs...)
}

// siTkill is SI_TKILL: the kernel refuses it (and si_code >= 0) from
// rt_tgsigqueueinfo of another process.
const siTkill = -6

// requeue sends a held signal back to its thread from outside: siginfo is
// kept where the kernel allows it (si_code < 0), else only the number.
func requeue(tgid, tid int, si *raw.SigInfo) error {
	if c := si.Code(); c < 0 && c != siTkill {
		_, _, e := unix.Syscall6(unix.SYS_RT_TGSIGQUEUEINFO, uintptr(tgid), uintptr(tid), uintptr(si.Signo()), uintptr(unsafe.Pointer(si)), 0, 0)
		if e == 0 {
			return nil
		}
	}
	return unix.Tgkill(tgid, tid, si.Signo())
}

// Kill sends SIGKILL to the process and waits until every thread is gone.
// A process the tracer no longer holds (detached, or gone) is left alone:
// Kill returns nil, and the caller must kill it by pid if it has to.
func (p *Process) Kill() error { return p.t.Do(p.kill) }

// Doom kills the process with SIGKILL and lets it go without waiting for
// its exit, as criu dump does: none of its code runs again, and the
// memory it frees as it exits (50 ms for 600 MB on a small VM, seconds
// for tens of GiB) need not hold up the caller. Its pid stays taken until
// its parent reaps it (task.PIDInUse waits for a dying process).
func (p *Process) Doom() error {
	return p.t.Do(func() error {
		if !p.attached {
			return nil
		}
		if err := unix.Kill(p.pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return fmt.Errorf("kill %d: %w", p.pid, err)
		}
		p.forget()
		return nil
	})
}

func (p *Process) kill() error {
	if !p.attached {
		return nil
	}
	if err := unix.Kill(p.pid, unix.SIGKILL); err != nil && err != unix.ESRCH {
		return fmt.Errorf("kill %d: %w", p.pid, err)
	}
	deadline := time.Now().Add(DefaultTimeout)
	var errs []error
	// The leader last: the kernel reports a thread-group leader's exit
	// only once every other thread of the group has been reaped.
	threads := p.threadList()
	threads = append(threads[1:], threads[0])
	for _, th := range threads {
		for th.state != stExited {
			st, err := p.t.waitStop(th.tid, th.reap(), deadline)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if st.Exited {
				break
			}
			// An exit event or a stop racing with the kill.
			_ = raw.Cont(th.tid, 0)
		}
	}
	p.forget()
	return errors.Join(errs...)
}

func (p *Process) anyRunning() bool {
	for _, th := range p.threads {
		if th.state == stRunning {
			return true
		}
	}
	return false
}

// service looks at every thread the tracer holds without blocking:
// resumed threads get their stops handled (signals passed on, new threads
// followed, group-stops listened to); stopped threads are checked for an
// exit (a SIGKILL from outside), which must be reaped for the process's
// parent to see it.
func (t *Tracer) service() {
	for _, th := range t.threads {
		if th.orphan {
			if st, ok, err := raw.WaitOnce(th.tid, th.reap()); err == nil && ok {
				if !st.Exited {
					sig := 0
					if st.Event == 0 {
						sig = int(st.Sig)
					}
					_ = raw.Detach(th.tid, sig)
				}
				delete(t.threads, th.tid)
			}
			continue
		}
		if th.state != stRunning {
			st, ok, err := raw.WaitOnce(th.tid, th.reap())
			if err == nil && ok {
				th.apply(st)
			}
			continue
		}
		for range 16 { // bounded: a signal storm must not starve requests
			st, ok, err := raw.WaitOnce(th.tid, th.reap())
			if err != nil || !ok {
				break
			}
			if t.followStop(th, st) {
				break
			}
		}
	}
	for _, p := range t.procs {
		if p.attached && len(p.threads) == 0 {
			p.forget()
		}
	}
}

// followStop handles one stop of a running (resumed) thread and lets it
// run on. It returns true when the thread is no longer running.
func (t *Tracer) followStop(th *Thread, st raw.Status) bool {
	th.apply(st)
	switch th.state {
	case stExited:
		return true
	case stGroup:
		if raw.Listen(th.tid) == nil {
			th.state = stRunning
		}
		return false
	case stSignal:
		th.fresh = false
		if err := raw.Cont(th.tid, int(st.Sig)); err == nil {
			th.state = stRunning
		}
		return false
	}
	// Event stops.
	th.fresh = false
	switch st.Event {
	case unix.PTRACE_EVENT_CLONE, unix.PTRACE_EVENT_FORK, unix.PTRACE_EVENT_VFORK:
		if msg, err := raw.EventMsg(th.tid); err == nil {
			nt := t.adopt(th.p, int(msg))
			nt.state = stRunning
		}
	}
	if err := raw.Cont(th.tid, 0); err == nil {
		th.state = stRunning
	}
	return false
}

// adopt registers a task auto-attached by PTRACE_O_TRACECLONE/FORK: a new
// thread of p or a new process. Its first stop is still to come.
func (t *Tracer) adopt(p *Process, tid int) *Thread {
	if th := t.threads[tid]; th != nil {
		if th.orphan && th.p.pid == p.pid && th.p != p {
			// Left running by an earlier detach and still ours: take it
			// back; it has no stop of its own coming, so interrupt it.
			th.orphan, th.p = false, p
			p.threads[tid] = th
			_ = raw.Interrupt(tid)
		}
		return th
	}
	tgid := tid
	if st, err := proc.ReadStatus(tid); err == nil && st.Tgid > 0 {
		tgid = st.Tgid
	}
	owner := p
	if tgid != p.pid {
		owner = t.procs[tgid]
		if owner == nil {
			owner = &Process{
				t: t, pid: tgid, owned: p.owned, opts: p.opts,
				threads: make(map[int]*Thread), attached: true,
			}
			if f, err := openMem(tgid); err == nil {
				owner.mem = f
			}
			t.procs[tgid] = owner
		}
	}
	th := owner.addThread(tid, stRunning)
	th.fresh = true
	return th
}

// Process returns the traced process pid (for instance one auto-attached
// through PTRACE_O_TRACEFORK), or nil.
func (t *Tracer) Process(pid int) *Process {
	var p *Process
	_ = t.Do(func() error { p = t.procs[pid]; return nil })
	return p
}
