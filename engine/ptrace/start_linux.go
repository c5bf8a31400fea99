package ptrace

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// StartOptions configure Tracer.StartStopped.
type StartOptions struct {
	// Options are PTRACE_O_* flags set once the program is stopped, for
	// instance unix.PTRACE_O_EXITKILL|unix.PTRACE_O_TRACECLONE.
	Options int
	Env     []string   // nil: no environment
	Dir     string     // "" : the caller's
	Files   []*os.File // fds 0, 1, 2...; nil entries are closed
	Timeout time.Duration
	// Cloneflags are CLONE_NEW* flags the program is started with: new
	// namespaces of which it is the first process (with CLONE_NEWPID, the
	// init).
	Cloneflags uintptr
}

// StartStopped forks and executes path with argv on the tracer thread
// (PTRACE_TRACEME binds the child to the thread that forked it) and
// returns the new process stopped before its first instruction, attached
// with PTRACE_SEIZE like a seized process: after the exec stop the tracer
// detaches with SIGSTOP, seizes the stopped process and continues it
// with SIGCONT into an interrupt stop, all before the program runs an
// instruction. Children it is made to create (Injector.CallNewTask) are seized
// too. The process is owned by the Tracer: Kill reaps it, Tracer.Close
// kills it if it is still there.
func (t *Tracer) StartStopped(path string, argv []string, o StartOptions) (*Process, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	var p *Process
	err := t.Do(func() error {
		var err error
		p, err = t.startStopped(path, argv, o)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	return p, nil
}

// startStopped is StartStopped on the tracer thread. The order of its
// steps is the whole point: exec stop, detach into a group-stop, seize,
// SIGCONT into an interrupt stop; whichever step fails, the child is
// killed and reaped the same way.
func (t *Tracer) startStopped(path string, argv []string, o StartOptions) (*Process, error) {
	pid, err := forkExecTraced(path, argv, o)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(o.Timeout)
	p := &Process{t: t, pid: pid, owned: true, opts: o.Options, threads: make(map[int]*Thread), attached: true}
	t.procs[pid] = p
	th := p.addThread(pid, stRunning)
	err = t.seizeAfterExec(th, o.Options, deadline)
	if err == nil {
		err = t.continueIntoInterrupt(p, th, deadline)
	}
	if err == nil {
		if p.mem, err = openMem(pid); err != nil {
			err = fmt.Errorf("open mem: %w", err)
		}
	}
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		_ = p.kill()
		for { // reap our child whatever state the tracing is in
			st, ok, werr := raw.WaitOnce(pid, true)
			if werr != nil || !ok || st.Exited {
				break
			}
		}
		return nil, err
	}
	return p, nil
}

// forkExecTraced forks and executes path with PTRACE_TRACEME, with the
// environment, directory, files and namespaces of o.
func forkExecTraced(path string, argv []string, o StartOptions) (int, error) {
	files := make([]uintptr, len(o.Files))
	for i, f := range o.Files {
		if f == nil {
			files[i] = ^uintptr(0)
		} else {
			files[i] = f.Fd()
		}
	}
	env := o.Env
	if env == nil {
		env = []string{}
	}
	return syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Dir:   o.Dir,
		Env:   env,
		Files: files,
		Sys:   &syscall.SysProcAttr{Ptrace: true, Cloneflags: o.Cloneflags},
	})
}

// seizeAfterExec takes the child th from its exec stop to a seize: steps
// 1 to 3 of startStopped.
func (t *Tracer) seizeAfterExec(th *Thread, options int, deadline time.Time) error {
	pid := th.tid
	// 1. The exec stop of PTRACE_TRACEME.
	st, err := t.waitStop(pid, true, deadline)
	if err != nil {
		return fmt.Errorf("wait for exec stop: %w", err)
	}
	if st.Exited || st.Event != 0 || st.Sig != unix.SIGTRAP {
		return fmt.Errorf("pid %d: %v after exec, want SIGTRAP", pid, st)
	}
	// 2. Let go with SIGSTOP: the process enters a group-stop, which we,
	// its parent, see as a stop of our child.
	if err := raw.Detach(pid, int(unix.SIGSTOP)); err != nil {
		return fmt.Errorf("PTRACE_DETACH: %w", err)
	}
	if st, err = t.waitStop(pid, true, deadline); err != nil || st.Exited || st.Sig != unix.SIGSTOP {
		return fmt.Errorf("pid %d: %v after detach with SIGSTOP, want a group-stop (%w)", pid, st, err)
	}
	// 3. Seize the stopped process: it reports the group-stop as an event
	// stop.
	if err := raw.Seize(pid, options); err != nil {
		return fmt.Errorf("PTRACE_SEIZE: %w", err)
	}
	if err := raw.Interrupt(pid); err != nil {
		return fmt.Errorf("PTRACE_INTERRUPT: %w", err)
	}
	if err := th.waitFirstStop(deadline); err != nil {
		return fmt.Errorf("wait for seize stop: %w", err)
	}
	return nil
}

// continueIntoInterrupt is step 4 of startStopped: end the group-stop and
// settle in an interrupt stop; the SIGCONT the kernel queues is delivered
// (ignored by default) on the way.
func (t *Tracer) continueIntoInterrupt(p *Process, th *Thread, deadline time.Time) error {
	if err := unix.Kill(p.pid, unix.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT: %w", err)
	}
	for range 3 {
		if err := th.release(false); err != nil {
			return err
		}
		if err := t.freeze(p, deadline); err != nil {
			return fmt.Errorf("stop after SIGCONT: %w", err)
		}
		if th.state == stEvent && !sigPending(p.pid, unix.SIGCONT) {
			break
		}
	}
	if th.state != stEvent {
		return fmt.Errorf("pid %d: not in an interrupt stop after start", p.pid)
	}
	return nil
}

// sigPending reports whether sig is pending for pid (thread or process
// queue), from /proc/PID/status.
func sigPending(pid int, sig unix.Signal) bool {
	st, err := proc.ReadStatus(pid)
	if err != nil {
		return false
	}
	return (st.SigPnd|st.ShdPnd)&(1<<(uint(sig)-1)) != 0
}
