package task

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// endWait bounds how long a child made to end takes to be a zombie.
const endWait = 5 * time.Second

// EndAs ends the traced process of in, a clone made to stand for
// unreaped child z, as z ended: exit_group with its code, or, for a
// child a signal killed, that signal unblocked at its default action,
// sent once the tracer has let it go (RLIMIT_CORE 0 first: a signal that
// dumps core kills it without a core file, and the status lacks the core
// bit). No instruction of its own runs: it ends in the injected call, or
// on its way back from the stop it is released from.
func EndAs(in *syscalls.Injector, z image.Zombie) error {
	if z.Exited() {
		code := z.Status >> 8 & 0xff
		if _, err := in.Syscall(unix.SYS_EXIT_GROUP, uint64(code)); !errors.Is(err, ptrace.ErrExited) {
			return fmt.Errorf("exit_group(%d): %v", code, err)
		}
		return nil
	}
	sig := unix.Signal(z.Status & 0x7f)
	c := in.NewCalls()
	c.Add("rt_sigprocmask(SIG_SETMASK, {})", unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, c.Data(make([]byte, 8)), 0, 8)
	if sig != unix.SIGKILL {
		c.Add(fmt.Sprintf("rt_sigaction(%d, SIG_DFL)", sig), unix.SYS_RT_SIGACTION, uint64(sig), c.Data(make([]byte, 32)), 0, 8)
	}
	c.Add("prlimit64(RLIMIT_CORE, 0)", unix.SYS_PRLIMIT64, 0, unix.RLIMIT_CORE, c.Data(make([]byte, 16)), 0)
	if err := in.RunCalls(c); err != nil {
		return err
	}
	th := in.Thread()
	if err := unix.Tgkill(th.Tid(), th.Tid(), sig); err != nil {
		return fmt.Errorf("tgkill %v: %w", sig, err)
	}
	return th.Process().Detach()
}

// AwaitZombie waits (endWait at most) until pid has ended: a zombie
// for its parent, which is stopped, to reap.
func AwaitZombie(pid int) error {
	deadline := time.Now().Add(endWait)
	for {
		st, err := proc.ReadStat(pid)
		if err != nil {
			return fmt.Errorf("pid %d gone before its parent reaped it: %w", pid, err)
		}
		if st.Exited() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d did not end within %v (state %c)", pid, endWait, st.State)
		}
		time.Sleep(time.Millisecond)
	}
}
