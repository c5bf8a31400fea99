package engine

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/task"
)

// makeZombies makes r's unreaped children (image.Process.Zombies) again,
// once its other children are made: each is cloned from r with its pid
// and ended at once as it had ended, and left for r to reap, with the
// status r would have reaped. Cloned from r, it is in r's process
// group and session, whatever group it was in at the dump.
func (r *restorer) makeZombies(ctx context.Context) error {
	for _, z := range r.st.Zombies {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.makeZombie(z); err != nil {
			return fmt.Errorf("unreaped child %d (%s, %s): %w", z.PID, z.Comm, z.Describe(), err)
		}
	}
	return nil
}

// makeZombie clones z from r and ends it as z ended (task.EndAs).
func (r *restorer) makeZombie(z image.Zombie) error {
	own := z.OwnPID()
	args := syscalls.CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{own}}
	th, err := cloneWithPID(r.in, args, own, r.tr.opts.Namespaces.OwnPIDs())
	if err != nil {
		return err
	}
	in, err := syscalls.At(th, r.area, r.area+pageSize, scratchLen)
	if err == nil {
		err = task.EndAs(in, z)
	}
	if err != nil {
		th.Process().Kill()
		return err
	}
	if err := task.AwaitZombie(th.Tid()); err != nil {
		unix.Kill(th.Tid(), unix.SIGKILL)
		return err
	}
	return nil
}
