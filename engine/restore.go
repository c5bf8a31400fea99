package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	Dir string
	// TrustSnapshot accepts a snapshot that users other than the caller
	// and root can change (image.OpenOptions.Trust).
	TrustSnapshot bool
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
	// LazyOptions tune the lazy phase (with Lazy).
	LazyOptions LazyOptions
	// Running, if set, is called once the process runs (before the lazy
	// phase ends): the place to write a pidfile.
	Running func(pid int) error
	// Progress, if set, is called with the memory bytes restored so far.
	Progress func(done, total uint64)
	// LeaveStopped leaves every thread of the restored process in a
	// group stop, as if it had received SIGSTOP before running an
	// instruction: SIGCONT lets it run (criu restore --leave-stopped).
	// Not with Lazy.
	LeaveStopped bool
	Logger       *slog.Logger
}

// RestoreResult describes a finished restore.
type RestoreResult struct {
	PID     int
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
	if opts.LeaveStopped && opts.Lazy != nil {
		return nil, fmt.Errorf("%w: a lazy restore cannot leave the process stopped", ErrUnsupported)
	}
	snap, st, pages, err := openSnapshot(opts)
	if err != nil {
		return nil, step("open snapshot", err)
	}
	defer pages.Close()
	defer snap.Close()
	k := startKeeper(opts, log)
	if k != nil {
		defer closeKeeper(k, log) // after abort, which kills what it protects
		opts.LazyOptions.Holder = k
	}
	r := &restorer{snap: snap, st: st, pages: pages, opts: opts, log: log, keeper: k}
	defer func() {
		if r.wsLoad != nil {
			r.wsLoad() // it reads through snap's directory, closed next
		}
	}()
	if err := r.check(); err != nil {
		return nil, step("check", err)
	}
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
	if err != nil {
		return nil, err
	}
	r.running = true
	res = &RestoreResult{PID: st.PID, Threads: len(st.Threads), ToRunning: time.Since(start), Filled: r.filled}
	if opts.LeaveStopped {
		if err := waitStopped(ctx, st.PID, len(st.Threads)); err != nil {
			return nil, step("leave stopped", err)
		}
	}
	if opts.Running != nil {
		if err := opts.Running(st.PID); err != nil {
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

// SnapshotPID returns the pid of the process of snap, the one Restore
// restores: this build restores snapshots of one process.
func SnapshotPID(snap *image.Snapshot) (int, error) {
	pids := snap.PIDs()
	if len(pids) != 1 {
		return 0, fmt.Errorf("snapshot holds %d processes; this build restores one", len(pids))
	}
	return pids[0], nil
}

// openSnapshot opens the snapshot of a restore: its one process's state
// and pages.
func openSnapshot(opts RestoreOptions) (*image.Snapshot, *image.Process, *image.Reader, error) {
	snap, err := image.OpenWith(opts.Dir, image.OpenOptions{Trust: opts.TrustSnapshot})
	if err != nil {
		return nil, nil, nil, err
	}
	pid, err := SnapshotPID(snap)
	if err == nil {
		var st *image.Process
		if st, err = snap.State(pid); err == nil {
			var pages *image.Reader
			if pages, err = snap.OpenPages(st.PID, image.ReaderOptions{Threads: opts.Threads}); err == nil {
				return snap, st, pages, nil
			}
		}
	}
	snap.Close()
	return nil, nil, nil, err
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
				r.log.Error("kill half-restored process", "pid", r.st.PID, "err", err)
			}
			unix.Kill(r.st.PID, unix.SIGKILL)
		}
	}
	if r.stub != nil {
		r.stub.Kill()
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
