package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/uffd"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	Dir string
	// TrustSnapshot accepts a snapshot that users other than the caller
	// and root can change (image.OpenOptions.Trust).
	TrustSnapshot bool
	// Remote configures the store when Dir is an address
	// (s3://BUCKET/PREFIX).
	Remote image.RemoteOptions
	// Keys open a sealed or signed snapshot (image.OpenOptions.Keys),
	// in a directory or at an address.
	Keys *image.Keyring
	// Threads is --decompress-threads for the LZ4 blocks: 1 serial, 0
	// automatic, N a maximum. The writes that place memory in the process
	// (page faults, mostly) run on every CPU whatever its value.
	Threads int
	// Lazy, when set, is where lazily restored memory is read from: the
	// memory of the snapshot's process (SnapshotPID) at its addresses,
	// such as a lazyfs mount's MNT/<pid>/mem file (fs.MountPrivate) or
	// the snapshot's pages read uncached (image.Reader.Uncached).
	// Anonymous private memory is then served on demand through
	// userfaultfd instead of being filled before the process runs.
	// LazyOptions say what the source is like.
	Lazy io.ReaderAt
	// LazyOf, for a snapshot of a process tree, is Lazy for each of its
	// processes: where the memory of process pid is read from (the
	// mount's MNT/<pid>/mem files, fs.MountPrivateTree). Each process
	// gets a pager of its own.
	LazyOf func(pid int) (io.ReaderAt, error)
	// LazyOptions tune the lazy phase (with Lazy or LazyOf).
	LazyOptions LazyOptions
	// Namespaces say which namespaces the process lives in: new pid and
	// mount ones, another network one (see Namespaces).
	Namespaces Namespaces
	// Running, if set, is called with the process's pid in our pid
	// namespace once it runs (before the lazy phase ends): the place to
	// write a pidfile.
	Running func(pid int) error
	// Progress, if set, is called with the memory bytes restored so far.
	Progress func(done, total uint64)
	// LeaveStopped leaves every thread of the restored process in a
	// group stop, as if it had received SIGSTOP before running an
	// instruction: SIGCONT lets it run (criu restore --leave-stopped).
	// Not with Lazy.
	LeaveStopped bool
	Logger       *slog.Logger
	// TCPEstablished brings back connected the TCP connections the dump
	// took with TCP_REPAIR; without it they come back closed. The
	// network lock that held them is released either way once a restore
	// that got past its checks ends, whether it succeeded or not; one
	// refused by its checks keeps it, to be tried again.
	TCPEstablished bool
	// Inherit gives, by key, descriptors of the caller that take the
	// place of descriptors leading outside the process
	// (fds.ParseInherit); for a tree, outside the tree, and the keys are
	// checked against all its processes together. ExternalFallback is
	// what the others become (fds.ExternalRefuse, the default, or
	// fds.ExternalNull).
	Inherit          map[string]int
	ExternalFallback string
}

// RestoreResult describes a finished restore.
type RestoreResult struct {
	// PID is the process's pid in our pid namespace: the one to signal.
	PID int
	// OwnPID is its pid in its own pid namespace (the one it had), and
	// InitPID our pid of that namespace's init, with Namespaces.PID
	// (InitPID is PID when the process is the init); 0 otherwise.
	OwnPID, InitPID int
	// Processes is how many processes the tree has (1: a single one).
	Processes int
	// Threads is how many threads, all processes together.
	Threads int
	// ToRunning is the time from the start of Restore until the process
	// ran; Total until Restore returned (every page in, for a lazy one).
	ToRunning time.Duration
	Total     time.Duration
	// Filled is the memory written before the process ran; Lazy the memory
	// served through userfaultfd afterwards.
	Filled uint64
	Lazy   LazyStats
	// WorkingSet says what a lazy restore did with working sets.
	WorkingSet WorkingSetResult
}

// Restore rebuilds the process of the snapshot in opts.Dir and lets it
// run. On any error, everything it created is killed: no half-restored
// process is left running. The error names the step that failed.
func Restore(ctx context.Context, opts RestoreOptions) (res *RestoreResult, err error) {
	start := time.Now()
	log := logger(opts.Logger)
	if opts.LeaveStopped && (opts.Lazy != nil || opts.LazyOf != nil) {
		return nil, fmt.Errorf("%w: a lazy restore cannot leave the process stopped", ErrUnsupported)
	}
	snap, err := image.OpenWith(opts.Dir, image.OpenOptions{Trust: opts.TrustSnapshot, Remote: opts.Remote, Keys: opts.Keys})
	if err != nil {
		return nil, step("open snapshot", err)
	}
	if opts.LazyOptions.Record != nil && snap.Sealed() {
		snap.Close()
		return nil, step("check", fmt.Errorf("%w: %s is sealed: a working set would be written in clear beside it (the addresses its process touched, and their memory)", ErrUnsupported, snap.Dir))
	}
	if len(snap.PIDs()) > 1 {
		defer snap.Close()
		return restoreTree(ctx, opts, snap, start, log)
	}
	// The keeper starts while the process's state and pages are read:
	// its fork and exec take milliseconds the restore need not wait for.
	keeper := make(chan *uffd.Keeper, 1)
	go func(o RestoreOptions) { keeper <- startKeeper(o, log) }(opts)
	st, pages, err := openProcess(snap, opts)
	if err == nil && opts.Lazy == nil && opts.LazyOf != nil {
		if opts.Lazy, err = opts.LazyOf(st.PID); err != nil {
			pages.Close()
		}
	}
	k := <-keeper
	if err != nil {
		if k != nil {
			closeKeeper(k, log)
		}
		snap.Close()
		return nil, step("open snapshot", err)
	}
	defer pages.Close()
	defer snap.Close()
	if k != nil {
		defer closeKeeper(k, log) // after abort, which kills what it protects
		opts.LazyOptions.Holder = k
	}
	r := &restorer{snap: snap, st: st, pages: pages, opts: opts, log: log, keeper: k}
	defer func() {
		if r.wsLoad != nil {
			// It reads through snap's directory, closed next; its mapping
			// goes once the pager that read it is done.
			if ws, _ := r.wsLoad(); ws != nil {
				ws.Close()
			}
		}
	}()
	if err := r.check(); err != nil {
		return nil, step("check", err)
	}
	if ns := opts.Namespaces.Net; ns != "" && ns != NetNew {
		if r.netns, err = OpenNetns(ns); err != nil {
			return nil, step("check", err)
		}
		defer r.netns.Close()
	}
	// Past its checks, the restore releases the network lock however it
	// ends: as soon as the process is made (or not), before a lazy phase.
	released := map[string]bool{}
	defer releaseNetLocks([]*image.Process{st}, released, log)
	t, err := ptrace.New()
	if err != nil {
		return nil, step("start tracer", err)
	}
	r.t = t
	defer func() {
		if err != nil {
			r.abort()
		}
		t.Close()
	}()
	err = runSteps(ctx, log, "restore", []namedStep{
		{"working set", r.loadWorkingSet}, // read while the rest goes on
		{"create process", r.createProcess},
		{"unmap stub", r.unmapStub},
		{"move vdso", r.moveVDSO},
		{"map memory", r.mapMemory},
		{"fill memory", r.fillMemory},
		{"lock memory", r.lockMemory},
		{"mm fields", r.setMM},
		{"file descriptors", r.restoreFDs},
		{"threads", r.createThreads},
		{"thread state", r.threadState},
		// The userfaultfd is made while the process still has our
		// privileges: process state may set an unprivileged uid, for
		// which userfaultfd(2) is refused (vm.unprivileged_userfaultfd=0).
		{"lazy memory", r.prepareLazy},
		{"process state", r.processState},
		{"pending signals", r.pendingSignals},
		{"leave stopped", r.leaveStopped},
		{"finish", r.finish},
	})
	releaseNetLocks([]*image.Process{st}, released, log)
	if err != nil {
		return nil, err
	}
	r.running = true
	res = &RestoreResult{PID: r.pid, Processes: 1, Threads: len(st.Threads), ToRunning: time.Since(start), Filled: r.filled}
	if opts.Namespaces.PID {
		res.OwnPID, res.InitPID = st.OwnPID(), r.initPID
		if r.initPID == 0 {
			res.InitPID = r.pid
		}
	}
	if opts.LeaveStopped {
		if err := waitStopped(ctx, r.pid, len(st.Threads)); err != nil {
			return nil, step("leave stopped", err)
		}
	}
	if opts.Running != nil {
		if err := opts.Running(r.pid); err != nil {
			return nil, step("running", err)
		}
	}
	if opts.Lazy != nil {
		if err := r.serveLazy(ctx, &res.Lazy, &res.WorkingSet); err != nil {
			return nil, step("lazy memory", err)
		}
	}
	res.Total = time.Since(start)
	return res, nil
}

// SnapshotPID returns the pid of the process of snap, a snapshot of one
// process, whose memory a lazy restore reads: this build restores a
// process tree only eagerly.
func SnapshotPID(snap *image.Snapshot) (int, error) {
	pids := snap.PIDs()
	if len(pids) != 1 {
		return 0, fmt.Errorf("%w: a lazy restore of a process tree (%d processes): restore it without --lazy", ErrUnsupported, len(pids))
	}
	return pids[0], nil
}

// openProcess opens the one process of a snapshot: its state and pages.
func openProcess(snap *image.Snapshot, opts RestoreOptions) (*image.Process, *image.Reader, error) {
	pid, err := SnapshotPID(snap)
	if err != nil {
		return nil, nil, err
	}
	st, err := snap.State(pid)
	if err != nil {
		return nil, nil, err
	}
	pages, err := snap.OpenPages(st.PID, image.ReaderOptions{Threads: opts.Threads})
	if err != nil {
		return nil, nil, err
	}
	return st, pages, nil
}

// abort kills everything the restore created.
func (r *restorer) abort() {
	if r.lazy != nil {
		r.lazy.close()
	}
	if r.child != nil {
		// A detached process (an eager restore that failed after it
		// ran) is no longer the tracer's to kill: kill it by pid.
		if err := r.child.Kill(); err != nil || r.running {
			if err != nil {
				r.log.Error("kill half-restored process", "pid", r.pid, "err", err)
			}
			unix.Kill(r.pid, unix.SIGKILL)
		}
	}
	if r.stub != nil {
		r.stub.Kill()
	}
	if r.initPID != 0 {
		// The namespace's init: the kernel kills what is left in it.
		unix.Kill(r.initPID, unix.SIGKILL)
	}
}

// zombieWait bounds how long restore waits for a dead process's zombie
// (the dumped process, just killed) to be reaped by its parent.
const zombieWait = 5 * time.Second

// pidInUse reports whether a task with this id exists. A zombie is
// waited for: a process killed by its dump keeps its pid until its parent
// (often init, which can take a moment) reaps it.
func pidInUse(id int) (bool, string) {
	deadline := time.Now().Add(zombieWait)
	for {
		st, err := proc.ReadStat(id)
		if errors.Is(err, proc.ErrMalformed) || errors.Is(err, proc.ErrTooLarge) {
			return true, "?"
		}
		if err != nil {
			return false, ""
		}
		if !st.Exited() {
			return true, st.Comm
		}
		if time.Now().After(deadline) {
			return true, st.Comm + " (a zombie its parent has not reaped)"
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitPIDReleased is called when clone3 found id taken although no task
// has it: the kernel keeps a pid while it is still some process group's or
// session's id. The processes holding it so are most often dying (the
// children of a session leader the dump killed, zombies until init reaps
// them): it waits for them to go, within zombieWait, and returns nil once
// id can be taken again. Otherwise it returns ErrPIDInUse naming a holder.
func awaitPIDReleased(id int) error {
	start := time.Now()
	for {
		holder, live := idHolder(id)
		if holder == nil {
			if busy, comm := pidInUse(id); busy {
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

// liveWait bounds how long awaitPIDReleased waits for a holder that still
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

// waitStopped waits until the n threads of pid are in a group stop (they
// take their SIGSTOP once detached, before they return to user space).
func waitStopped(ctx context.Context, pid, n int) error {
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
