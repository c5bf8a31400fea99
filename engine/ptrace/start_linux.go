package ptrace

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
}

// StartStopped forks and executes path with argv on the tracer thread
// (PTRACE_TRACEME binds the child to the thread that forked it) and
// returns the new process stopped right after execve, in the SIGTRAP
// signal-delivery-stop the kernel raises for a traced exec. The process is
// owned by the Tracer: Kill reaps it, Tracer.Close kills it if still there.
// It is attached with PTRACE_TRACEME, not PTRACE_SEIZE: Process.Interrupt
// is not available, and children it is made to create report SIGSTOP as
// their first stop (handled here).
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

func (t *Tracer) startStopped(path string, argv []string, o StartOptions) (*Process, error) {
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
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Dir:   o.Dir,
		Env:   env,
		Files: files,
		Sys:   &syscall.SysProcAttr{Ptrace: true},
	})
	if err != nil {
		return nil, err
	}
	p := &Process{t: t, pid: pid, owned: true, opts: o.Options, threads: make(map[int]*Thread), attached: true}
	t.procs[pid] = p
	th := p.addThread(pid, stRunning)
	st, err := t.waitStop(pid, true, time.Now().Add(o.Timeout))
	if err != nil {
		_ = p.kill()
		return nil, fmt.Errorf("wait for exec stop: %w", err)
	}
	th.apply(st)
	if th.state != stSignal || st.sig != unix.SIGTRAP {
		_ = p.kill()
		return nil, fmt.Errorf("pid %d: %v after exec, want SIGTRAP", pid, st)
	}
	if o.Options != 0 {
		if err := ptSetOptions(pid, o.Options); err != nil {
			_ = p.kill()
			return nil, fmt.Errorf("PTRACE_SETOPTIONS: %w", err)
		}
	}
	if p.mem, err = openMem(pid); err != nil {
		_ = p.kill()
		return nil, fmt.Errorf("open mem: %w", err)
	}
	return p, nil
}
