package engine

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ipc"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/ns"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/task"
)

const (
	pageSize = image.PageSize
	// scratchLen is the scratch memory restore injects through: paths,
	// struct prctl_mm_map with auxv, sigactions, clone_args.
	scratchLen = 64 << 10
	areaLen    = pageSize + scratchLen
)

// createRoot makes the root of the tree, stopped, from a stub
// (createProcess), leading its session or group if it did. Every other
// process is forked later from its parent (createChildren), once the
// parent's memory is in place.
func (tr *tree) createRoot(ctx context.Context) error {
	root := tr.procs[0]
	if err := root.createProcess(ctx); err != nil {
		return err
	}
	return tr.session(root)
}

// createChildren makes each child of r, cloned (clone3 with its pid)
// from r once r's memory is in place: parent and child links come from
// the clone itself, and the child starts with its parent's memory, the
// pages it still shared with it at the dump among them. A child that
// led its session calls setsid before it clones its own children, a
// group leader setpgid (joinGroups puts the others in their groups).
// Then its unreaped children are made again (makeZombies).
func (r *restorer) createChildren(ctx context.Context) error {
	tr := r.tr
	for _, c := range tr.procs[1:] {
		if tr.byPID[c.st.PPID] != r {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tr.clone(c); err != nil {
			return tr.name(c, err)
		}
	}
	return r.makeZombies(ctx)
}

// joinGroups puts every process in its process group once the leaders
// exist: a group led in the tree, or else the root's.
func (tr *tree) joinGroups(context.Context) error {
	root := tr.procs[0]
	for _, r := range tr.procs[1:] {
		st := r.st
		if st.SID == st.PID {
			continue
		}
		leader := root
		if l := tr.byPID[st.PGID]; l != nil {
			leader = l
		}
		if cur, err := unix.Getpgid(r.pid); err == nil && cur == leader.pid {
			continue
		}
		// In the process's pid namespace: the leader's own pid there.
		want := leader.st.OwnPID()
		if _, err := r.in.Call(unix.SYS_SETPGID, 0, uint64(want)); err != nil {
			return tr.name(r, fmt.Errorf("setpgid(0, %d): %w", want, err))
		}
	}
	return nil
}

// clone3 clones the process of r with args (its pid set) through in, and
// checks the pid it got: in our pid namespace its own, waiting for it if
// it is still held (AwaitPIDReleased); in a new one (Namespaces.PID), its
// own there.
func (r *restorer) clone3(in *syscalls.Injector, args syscalls.CloneArgs) (*ptrace.Thread, error) {
	own, pidns := r.st.OwnPID(), r.tr.opts.Namespaces.OwnPIDs()
	th, err := cloneWithPID(in, args, own, pidns)
	if err != nil {
		return nil, err
	}
	r.child, r.pid = th.Process(), th.Tid()
	if pidns {
		if err := task.CheckOwnPID(r.pid, own); err != nil {
			return nil, err
		}
	} else if r.pid != own {
		return nil, fmt.Errorf("clone3 made pid %d, wanted %d", r.pid, own)
	}
	if err := th.SetOptions(unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACECLONE); err != nil {
		return nil, err
	}
	return th, nil
}

// cloneWithPID clones the process of in with args, whose SetTID is own:
// in our pid namespace (pidns false), waiting for own if it is still
// held (AwaitPIDReleased).
func cloneWithPID(in *syscalls.Injector, args syscalls.CloneArgs, own int, pidns bool) (*ptrace.Thread, error) {
	th, err := in.Clone3(args)
	if errors.Is(err, unix.EEXIST) && !pidns {
		if err := task.AwaitPIDReleased(own); err != nil {
			return nil, err
		}
		th, err = in.Clone3(args)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%w: pid %d was taken meanwhile", ErrPIDInUse, own)
		}
		return nil, fmt.Errorf("clone3 with pid %d: %w", own, err)
	}
	return th, nil
}

// clone makes process r from its parent, which is made already: clone3
// with r's pid, injected into the parent.
func (tr *tree) clone(r *restorer) error {
	parent := tr.byPID[r.st.PPID]
	th, err := r.clone3(parent.in, syscalls.CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{r.st.OwnPID()}})
	if err != nil {
		return err
	}
	// The child's memory is its parent's, copy-on-write: the injection
	// area is in it at the same address.
	r.area = parent.area
	if r.in, err = syscalls.At(th, r.area, r.area+pageSize, scratchLen); err != nil {
		return err
	}
	r.threads = []*ptrace.Thread{th}
	return tr.session(r)
}

// session makes r lead its session or its process group if it led one,
// before it clones its children, who inherit them. The root that led
// neither gets a process group of its own in snapctl's session (a
// session or group led by a process outside the tree cannot be joined).
func (tr *tree) session(r *restorer) error {
	st := r.st
	switch {
	case st.SID == st.PID:
		if _, err := r.in.Call(unix.SYS_SETSID); err != nil {
			return fmt.Errorf("setsid: %w", err)
		}
	case st.PGID == st.PID || r == tr.procs[0]:
		if r == tr.procs[0] && st.PGID != st.PID {
			tr.log.Warn("the restored processes rejoin no session: the root did not lead its session or group", "pid", st.PID, "sid", st.SID, "pgid", st.PGID)
		}
		if _, err := r.in.Call(unix.SYS_SETPGID, 0, 0); err != nil {
			return fmt.Errorf("setpgid: %w", err)
		}
	}
	return nil
}

// sysvIPC makes (or takes over) the System V semaphore sets and message
// queues the processes used (engine/ipc), in snapctl's IPC namespace, the
// root putting in their values and messages.
func (tr *tree) sysvIPC(context.Context) (err error) {
	tr.ipc, err = ipc.Restore(tr.procs[0].st.SysVIPC, tr.procs[0].in, tr.log)
	return err
}

// controllingTerminal makes the new slave of a pseudo-terminal pair the
// controlling terminal of a session leader whose it was, with the same
// group in the foreground: a group of its session led in the tree, in its
// pid namespace, or else the leader's own (a group of another session
// cannot be).
func (r *restorer) controllingTerminal(context.Context) error {
	c := r.st.CTTY
	if c == nil {
		return nil
	}
	fg := r.st.OwnPID()
	if l := r.tr.byPID[c.Foreground]; l != nil && l.st.SID == r.st.PID {
		fg = l.st.OwnPID()
	}
	return tty.SetCTTY(r.in, r.st, c, fg, r.tr.broker)
}

// makeSharedDescriptors makes, in snapctl, the pipes and socket pairs whose ends are in
// several processes.
func (tr *tree) makeSharedDescriptors(context.Context) error { return tr.broker.MakeShared(tr.sts) }

// handOut hands out the open file descriptions of r that processes after
// it inherited.
func (r *restorer) handOut(context.Context) error {
	return r.tr.broker.GiveInherited(r.pid, r.st, r.tr.sts)
}

// createProcess starts a stub program stopped before its first
// instruction and clones the process out of it with its original pid: in
// our pid namespace, or in a new one (Namespaces.PID) of which the stub
// is the init, its pid there the one it saw. The stub starts in the new
// namespaces the restore asks for, and the process, its child, inherits
// them.
func (r *restorer) createProcess(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	flags, argv, files, stubIsInit := r.tr.opts.Namespaces.Stub(r.st.OwnPID(), r.tr.join)
	stub, err := r.tr.t.StartStopped(exe, argv, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL, Cloneflags: flags, Files: files})
	if err != nil {
		if flags != 0 {
			return ns.Error("new "+ns.Names(flags)+" namespace", err)
		}
		return fmt.Errorf("start stub: %w", err)
	}
	r.stub = stub
	in, err := syscalls.New(stub.Leader(), pageSize)
	if err != nil {
		return fmt.Errorf("stub: %w", err)
	}
	defer in.Close()
	if err := r.tr.opts.Namespaces.SetUpStub(in, flags); err != nil {
		return err
	}
	own := r.st.OwnPID()
	var cloneFlags uint64
	if r.tr.opts.Namespaces.PID && !stubIsInit {
		cloneFlags = unix.CLONE_NEWPID // the process is the new namespace's init
	}
	args := syscalls.CloneArgs{Flags: cloneFlags, ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{own}}
	th, err := r.clone3(in, args)
	if err != nil {
		return err
	}
	// The child's memory is a copy of the stub's, injector page included:
	// use it to map our own area where the restored layout leaves room.
	cin, err := syscalls.At(th, in.Stub(), 0, 0)
	if err != nil {
		return err
	}
	// Where no process of the tree has memory: the others are cloned
	// from the root with it in place.
	var layout []image.VMA
	for _, q := range r.tr.procs {
		layout = append(layout, q.st.VMAs...)
	}
	r.area, err = mem.MapArea(cin, r.child, layout, areaLen)
	cin.Close()
	if err != nil {
		return err
	}
	r.in, err = syscalls.At(th, r.area, r.area+pageSize, scratchLen)
	if err != nil {
		return err
	}
	r.threads = []*ptrace.Thread{th}
	if r.tr.opts.Namespaces.PID {
		if err := ns.MountProc(r.in); err != nil {
			return err
		}
	}
	if err := in.Close(); err != nil {
		return fmt.Errorf("stub: %w", err)
	}
	if stubIsInit {
		// The stub runs on as the namespace's init, the process's parent.
		if err := stub.Detach(); err != nil {
			return fmt.Errorf("start the pid namespace's init: %w", err)
		}
		r.initPID, r.stub = stub.Pid(), nil
		go ns.ReapInit(r.initPID)
		return nil
	}
	// The stub has done its work; the process is reparented to init.
	if err := stub.Kill(); err != nil {
		return fmt.Errorf("kill stub: %w", err)
	}
	r.stub = nil
	return nil
}
