package check

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// checkTracing checks ptrace, clone3 with set_tid and PR_SET_MM_MAP in a
// stub.
func checkTracing(ctx context.Context, stub string) []Feature {
	names := []string{"ptrace", "clone3 set_tid", "PR_SET_MM_MAP"}
	fail := func(i int, err error) []Feature {
		var out []Feature
		for j, n := range names {
			if j < i {
				continue
			}
			if j > i {
				err = fmt.Errorf("not tried: needs %s", names[i])
			}
			out = append(out, feature(n, neededRestore, err, ""))
		}
		return out
	}
	if stub == "" {
		var err error
		if stub, err = os.Executable(); err != nil {
			return fail(0, err)
		}
	}
	t, err := ptrace.New()
	if err != nil {
		return fail(0, err)
	}
	defer t.Close()
	p, err := t.StartStopped(stub, []string{"lazyfs-check-stub"}, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL})
	if err != nil {
		if scope, serr := kernel.Sysctl("kernel.yama.ptrace_scope"); serr == nil {
			err = fmt.Errorf("%w (kernel.yama.ptrace_scope=%s)", err, scope)
		}
		return fail(0, err)
	}
	defer p.Kill()
	in, err := syscalls.New(p.Leader(), pageSize)
	if err == nil {
		var pid uint64
		if pid, err = in.Call(unix.SYS_GETPID); err == nil && int(pid) != p.Pid() {
			err = fmt.Errorf("injected getpid returned %d in pid %d", pid, p.Pid())
		}
	}
	if err != nil {
		return fail(0, fmt.Errorf("inject into a seized stub: %w", err))
	}
	defer in.Close()
	out := []Feature{feature("ptrace", neededRestore, nil,
		fmt.Sprintf("started pid %d stopped, seized, interrupted, injected getpid", p.Pid()))}

	pid, err := cloneFreePID(ctx, in)
	out = append(out, feature("clone3 set_tid", neededRestore, err, fmt.Sprintf("made pid %d on request", pid)))

	err = checkMMMap(in, p)
	return append(out, feature("PR_SET_MM_MAP", neededRestore, err, "set a stub's mm fields and auxv to their own values"))
}

// cloneFreePID clones a process with a free pid out of the stub, and
// kills it.
func cloneFreePID(ctx context.Context, in *syscalls.Injector) (int, error) {
	var err error
	for range 3 {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		pid, ferr := freePID()
		if ferr != nil {
			return 0, ferr
		}
		var th *ptrace.Thread
		th, err = in.Clone3(syscalls.CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{pid}})
		if errors.Is(err, unix.EEXIST) {
			continue // taken meanwhile
		}
		if err != nil {
			if errors.Is(err, unix.EPERM) {
				err = fmt.Errorf("%w (needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN)", err)
			}
			return 0, err
		}
		if kerr := th.Process().Kill(); kerr != nil {
			return 0, fmt.Errorf("kill the clone: %w", kerr)
		}
		if th.Tid() != pid {
			return 0, fmt.Errorf("asked for pid %d, got %d", pid, th.Tid())
		}
		return pid, nil
	}
	return 0, err
}

// freePID returns a pid no process holds, well away from the next one
// the kernel hands out.
func freePID() (int, error) {
	last, err := kernel.SysctlInt("kernel.ns_last_pid")
	if err != nil {
		return 0, err
	}
	pidMax, err := kernel.SysctlInt("kernel.pid_max")
	if err != nil {
		return 0, err
	}
	const low = 300 // where the kernel starts again after pid_max
	if pidMax <= low+2000 {
		return 0, fmt.Errorf("pid_max %d too small", pidMax)
	}
	for i := range pidMax - low {
		pid := low + (last-low+1000+i)%(pidMax-low)
		if taken, _ := proc.Exists(pid); !taken {
			return pid, nil
		}
	}
	return 0, errors.New("no free pid")
}

// checkMMMap asks for the size of struct prctl_mm_map and sets the stub's
// mm fields and auxv to the values they have.
func checkMMMap(in *syscalls.Injector, p *ptrace.Process) error {
	scratch, _ := in.Scratch()
	if _, err := in.Call(unix.SYS_PRCTL, unix.PR_SET_MM, unix.PR_SET_MM_MAP_SIZE, scratch); err != nil {
		return fmt.Errorf("PR_SET_MM_MAP_SIZE: %w", err)
	}
	var b [4]byte
	if err := p.ReadMem(scratch, b[:]); err != nil {
		return err
	}
	if size := binary.LittleEndian.Uint32(b[:]); size != syscalls.MMMapSize {
		return fmt.Errorf("struct prctl_mm_map is %d bytes here, restore writes %d", size, syscalls.MMMapSize)
	}
	st, err := proc.ReadStat(p.Pid())
	if err != nil {
		return err
	}
	auxv, err := proc.ReadAuxv(p.Pid())
	if err != nil {
		return err
	}
	brk, err := in.Brk()
	if err != nil {
		return err
	}
	return in.SetMM(syscalls.MM{StartCode: st.StartCode, EndCode: st.EndCode, StartData: st.StartData, EndData: st.EndData,
		StartBrk: st.StartBrk, Brk: brk, StartStack: st.StartStack, ArgStart: st.ArgStart, ArgEnd: st.ArgEnd,
		EnvStart: st.EnvStart, EnvEnd: st.EnvEnd, Auxv: auxv}, -1)
}
