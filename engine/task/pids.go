package task

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// Pids at restore: a process is made with the pid it had (clone3 with
// set_tid), which must be free.

// ErrPIDInUse: the process's pid (or a thread's tid) is taken.
var ErrPIDInUse = errors.New("pid in use")

// zombieWait bounds how long restore waits for a dead process's zombie
// (the dumped process, just killed) to be reaped by its parent.
const zombieWait = 5 * time.Second

// pfExiting is PF_EXITING of /proc/PID/stat's flags: the task is in
// do_exit.
const pfExiting = 0x4

// PIDInUse reports whether a task with this id exists. A zombie is
// waited for: a process killed by its dump keeps its pid until its parent
// (often init, which can take a moment) reaps it.
func PIDInUse(id int) (bool, string) {
	deadline := time.Now().Add(zombieWait)
	for {
		st, err := proc.ReadStat(id)
		if errors.Is(err, proc.ErrMalformed) || errors.Is(err, proc.ErrTooLarge) {
			return true, "?"
		}
		if err != nil {
			return false, ""
		}
		// A process exiting (PF_EXITING: the dump killed it, and it is
		// freeing its memory) is a zombie within moments.
		if !st.Exited() && st.Flags&pfExiting == 0 {
			return true, st.Comm
		}
		if time.Now().After(deadline) {
			return true, st.Comm + " (a zombie its parent has not reaped)"
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AwaitPIDReleased is called when clone3 found id taken although no task
// has it: the kernel keeps a pid while it is still some process group's or
// session's id. The processes holding it so are most often dying (the
// children of a session leader the dump killed, zombies until init reaps
// them): it waits for them to go, within zombieWait, and returns nil once
// id can be taken again. Otherwise it returns ErrPIDInUse naming a holder.
func AwaitPIDReleased(id int) error {
	start := time.Now()
	for {
		holder, live := idHolder(id)
		if holder == nil {
			if busy, comm := PIDInUse(id); busy {
				return fmt.Errorf("%w: pid %d was taken meanwhile, by %q", ErrPIDInUse, id, comm)
			}
			return nil
		}
		// A process killed with the rest is a zombie within moments; one
		// that still runs after liveWait is not dying.
		if waited := time.Since(start); waited > zombieWait || live && waited > liveWait {
			if live {
				return fmt.Errorf("%w: pid %d is still the %s of pid %d (%s), which runs: end it first",
					ErrPIDInUse, id, holder.role, holder.pid, holder.comm)
			}
			return fmt.Errorf("%w: pid %d is still the %s of pid %d (%s), a zombie its parent has not reaped",
				ErrPIDInUse, id, holder.role, holder.pid, holder.comm)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveWait bounds how long AwaitPIDReleased waits for a holder that still
// runs to die.
const liveWait = time.Second

// pidHolder is a process whose process group or session id is a pid.
type pidHolder struct {
	pid  int
	comm string
	role string // "process group id", "session id" or both
}

// idHolder returns a process whose process group or session id is id,
// preferring one that runs (live true) to a zombie; nil if there is none.
func idHolder(id int) (h *pidHolder, live bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := proc.ReadStat(pid)
		if err != nil || st.Pgrp != id && st.Session != id {
			continue
		}
		role := "session id"
		switch {
		case st.Pgrp == id && st.Session == id:
			role = "process group and session id"
		case st.Pgrp == id:
			role = "process group id"
		}
		h = &pidHolder{pid: pid, comm: st.Comm, role: role}
		if !st.Exited() {
			return h, true
		}
	}
	return h, false
}

// WaitStopped waits until the n threads of pid are in a group stop (they
// take their SIGSTOP once detached, before they return to user space).
func WaitStopped(ctx context.Context, pid, n int) error {
	deadline := time.Now().Add(zombieWait)
	for {
		stopped := 0
		tids, err := proc.Tasks(pid)
		if err != nil {
			return err
		}
		for _, tid := range tids {
			if st, err := proc.ReadTaskStat(pid, tid); err == nil && st.State == 'T' {
				stopped++
			}
		}
		if stopped == n && len(tids) == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d threads stopped after %v", stopped, n, zombieWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// PIDsIn returns the ids taken in the pid namespace of process of, with
// the names of the tasks holding them: every thread, zombies included,
// of every process in that namespace (the ids of namespaces nested in it
// are not looked at).
func PIDsIn(of int) (map[int]string, error) {
	want, err := proc.Namespace(of, "pid")
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := proc.Namespace(pid, "pid"); err != nil || ns != want {
			continue // gone meanwhile, or elsewhere
		}
		tasks, err := proc.Tasks(pid)
		if err != nil {
			continue // gone meanwhile
		}
		comm, _ := proc.ReadComm(pid)
		for _, tid := range tasks {
			s, err := proc.ReadTaskStatus(pid, tid)
			if err != nil {
				continue
			}
			if n := len(s.NSpid); n > 0 {
				out[s.NSpid[n-1]] = comm
			}
		}
	}
	return out, nil
}
