package engine

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

const (
	pageSize = image.PageSize
	// scratchLen is the scratch memory restore injects through: paths,
	// struct prctl_mm_map with auxv, sigactions, clone_args.
	scratchLen = 64 << 10
	areaLen    = pageSize + scratchLen
)

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
	flags, argv, files, stubIsInit := r.stubNamespaces()
	stub, err := r.t.StartStopped(exe, argv, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL, Cloneflags: flags, Files: files})
	if err != nil {
		if flags != 0 {
			return nsError("new "+nsNames(flags)+" namespace", err)
		}
		return fmt.Errorf("start stub: %w", err)
	}
	r.stub = stub
	in, err := stub.Leader().NewInjector(pageSize)
	if err != nil {
		return fmt.Errorf("stub: %w", err)
	}
	defer in.Close()
	if err := r.setUpStub(in, flags); err != nil {
		return err
	}
	own := r.st.OwnPID()
	var cloneFlags uint64
	if r.opts.Namespaces.PID && !stubIsInit {
		cloneFlags = unix.CLONE_NEWPID // the process is the new namespace's init
	}
	args := ptrace.CloneArgs{Flags: cloneFlags, ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{own}}
	th, err := in.Clone3(args)
	if errors.Is(err, unix.EEXIST) && !r.opts.Namespaces.PID {
		if err := awaitPIDReleased(own); err != nil {
			return err
		}
		th, err = in.Clone3(args)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: pid %d was taken meanwhile", ErrPIDInUse, own)
		}
		return fmt.Errorf("clone3 with pid %d: %w", own, err)
	}
	r.child = th.Process()
	r.pid = th.Tid()
	if r.opts.Namespaces.PID {
		if err := checkOwnPID(r.pid, own); err != nil {
			return err
		}
	} else if r.pid != own {
		return fmt.Errorf("clone3 made pid %d, wanted %d", r.pid, own)
	}
	if err := th.SetOptions(unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACECLONE); err != nil {
		return err
	}
	// The child's memory is a copy of the stub's, injector page included:
	// use it to map our own area where the restored layout leaves room.
	cin, err := th.InjectorAt(in.Stub(), 0, 0)
	if err != nil {
		return err
	}
	r.area, err = r.mapArea(cin)
	cin.Close()
	if err != nil {
		return err
	}
	r.in, err = th.InjectorAt(r.area, r.area+pageSize, scratchLen)
	if err != nil {
		return err
	}
	r.threads = []*ptrace.Thread{th}
	if r.opts.Namespaces.PID {
		if err := r.mountProc(); err != nil {
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
		go reapInit(r.initPID)
		return nil
	}
	// The stub has done its work; the process is reparented to init.
	if err := stub.Kill(); err != nil {
		return fmt.Errorf("kill stub: %w", err)
	}
	r.stub = nil
	return nil
}

// reapInit waits for the pid namespace's init, our child, to exit, so
// that it leaves no zombie while we run (a program that restores many
// times). The tracer does not wait for it once detached.
func reapInit(pid int) {
	for {
		_, err := unix.Wait4(pid, nil, 0, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// mapArea maps the injection area (stub page, scratch) at an address the
// restored layout does not use.
func (r *restorer) mapArea(in *ptrace.Injector) (uint64, error) {
	layout := r.layout
	if layout == nil {
		layout = r.st.VMAs
	}
	for _, a := range mem.FreeAreas(layout, areaLen) {
		res, err := in.Syscall(unix.SYS_MMAP, a, areaLen, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, ^uint64(0), 0)
		if err != nil {
			return 0, err
		}
		if res == -int64(unix.EEXIST) {
			continue
		}
		if res < 0 {
			return 0, fmt.Errorf("mmap injection area: %w", ptrace.Errno(res))
		}
		if err := r.child.WriteStub(a); err != nil {
			return 0, err
		}
		return a, nil
	}
	return 0, errors.New("no room for the injection area in the restored layout")
}

// call injects a system call into the leader and turns a failure into an
// error.
func (r *restorer) call(nr int, args ...uint64) (uint64, error) {
	return r.in.Call(nr, args...)
}

func (r *restorer) closeFD(fd int) {
	if err := r.in.CloseFD(fd); err != nil {
		r.log.Warn("close in restored process", "fd", fd, "err", err)
	}
}

// setMM sets the mm fields, auxv and exe with PR_SET_MM_MAP. The old
// exe (the stub's) is unmapped already, as the kernel requires.
func (r *restorer) setMM(ctx context.Context) error {
	exeFD, err := fds.OpenVerified(r.in, r.st.Exe.Path, unix.O_RDONLY|unix.O_CLOEXEC, r.st.Exe, true)
	if err != nil {
		return err
	}
	defer r.closeFD(exeFD)
	return r.in.SetMM(ptrace.MM(r.st.MM), exeFD)
}
