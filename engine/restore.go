package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds/broker"
	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ipc"
	"github.com/lazyfs/lazyfs/engine/lazy"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/ns"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/engine/task"
	"github.com/lazyfs/lazyfs/engine/units"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// Snapshot is what is restored, opened by the caller (image.OpenWith:
	// a directory or an address, its keys, whether it is trusted), who
	// closes it once Restore has returned.
	Snapshot *image.Snapshot
	// Threads is --decompress-threads for the LZ4 blocks: 1 serial, 0
	// automatic, N a maximum. The writes that place memory in the
	// processes (page faults, mostly) run on every CPU whatever its value.
	Threads int
	// Source, if set, makes the restore lazy: anonymous private memory is
	// not filled before the processes run but served on demand through
	// userfaultfd, each process by a pager of its own reading from Source
	// (the snapshot's files, a lazyfs mount, a private mount: see
	// image.PageSource), until all of it is in. Lazy tunes that phase.
	Source image.PageSource
	Lazy   lazy.Options
	// Namespaces say which namespaces the processes live in: new pid and
	// mount ones, another network one (see ns.Namespaces).
	Namespaces ns.Namespaces
	// Running, if set, is called with the root's pid in our pid namespace
	// once every process runs (before the lazy phase ends): the place to
	// write a pidfile.
	Running func(pid int) error
	// Progress, if set, is called with the memory bytes filled so far.
	Progress func(done, total uint64)
	// LeaveStopped leaves every thread of every restored process in a
	// group stop, as if it had received SIGSTOP before running an
	// instruction: SIGCONT lets it run (criu restore --leave-stopped).
	// Not with Source.
	LeaveStopped bool
	Logger       *slog.Logger
	// TCPEstablished brings back connected the TCP connections the dump
	// took with TCP_REPAIR; without it they come back closed. The
	// network lock that held them is released either way once a restore
	// that got past its checks ends, whether it succeeded or not; one
	// refused by its checks keeps it, to be tried again.
	TCPEstablished bool
	// Inherit gives, by key, descriptors of the caller that take the
	// place of descriptors leading outside the tree (fds.ParseInherit);
	// the keys are checked against all its processes together.
	// ExternalFallback is what the others become (fds.ExternalRefuse, the
	// default, or fds.ExternalNull).
	Inherit          map[string]int
	ExternalFallback string
	// ShellJob: Inherit[tty.TerminalKey] is the caller's terminal (--shell-job).
	ShellJob bool
}

// RestoreResult describes a finished restore.
type RestoreResult struct {
	// PID is the root's pid in our pid namespace: the one to signal.
	PID int
	// OwnPID is its pid in its own pid namespace (the one it had), with
	// Namespaces.PID or Into; InitPID our pid of that namespace's init,
	// with Namespaces.PID (PID when the root is the init); 0 otherwise.
	OwnPID, InitPID int
	// Processes and Threads are how many the tree has, all together.
	Processes, Threads int
	// ToRunning is the time from the start of Restore until the processes
	// ran; Total until Restore returned (every page in, for a lazy one).
	ToRunning time.Duration
	Total     time.Duration
	// Filled is the memory written before the processes ran; Lazy what
	// the lazy phase served afterwards.
	Filled uint64
	Lazy   lazy.Stats
	// WorkingSets say what a lazy restore did with the working set of
	// each process, in tree order.
	WorkingSets []lazy.WorkingSetResult
	// Phases are the steps of the restore, in order, with their
	// durations: the lazy phase ("lazy memory") last.
	Phases []Phase
	// StoredBytes is what the snapshot's pages files hold (the parents'
	// of an incremental snapshot not counted): what an eager restore
	// reads.
	StoredBytes uint64
}

// Restore rebuilds the processes of opts.Snapshot and lets them run. The
// unit is a process tree, as CRIU's: a single process is a tree of one.
// On any error, everything it created is killed: no half-restored process
// is left running. The error names the step that failed.
//
// The steps, in order (runSteps; snapctl -v logs each):
//
//	check               every process (kernel, pids, files, descriptors),
//	                    then the tree's links (restore_check.go)
//	create root         from a stub, in the namespaces asked for
//	shared descriptors  pipes and socket pairs between processes
//	System V IPC        semaphore sets and message queues (engine/ipc)
//	for each process, parents first:
//	  unmap (what it inherited but the VMAs it keeps from its parent),
//	  move vdso, map memory, fill memory (restore_mem.go); create
//	  children: each cloned from it with its pid, its memory with them
//	  (restore_create.go)
//	process groups      each joins its group
//	for each process, parents first:
//	  lock memory, mm fields; file descriptors, hand out descriptors,
//	  controlling terminal (a pty pair's); threads, thread state; lazy memory (its userfaultfd); process
//	  state, pending signals, leave stopped (restore_thread.go)
//	finish              shared memory served lazily registered in every
//	                    process; then children first: registers, then
//	                    each runs
//
// then, for a lazy restore, the lazy phase (engine/lazy) until every
// page of every process is in.
func Restore(ctx context.Context, opts RestoreOptions) (res *RestoreResult, err error) {
	start := time.Now()
	var phases []Phase
	var tr *tree
	if err := timed(&phases, "open snapshot", func() (err error) { tr, err = openTree(opts); return err }); err != nil {
		return nil, step("open snapshot", err)
	}
	done := false
	defer func() {
		if !done { // an error, or a panic: nothing half-made may run on
			tr.abort()
		}
		tr.close()
	}()
	if err := timed(&phases, "check", tr.refuseUnrestorable); err != nil {
		return nil, step("check", err)
	}
	// Past its checks, the restore releases the network locks however it
	// ends: once the processes are made (or not), before a lazy phase.
	defer sock.ReleaseNetLocks(tr.sts, tr.released, tr.log)
	if tr.t, err = ptrace.New(); err != nil {
		return nil, step("start tracer", err)
	}
	if err := runSteps(ctx, tr.log, "restore", tr.steps(), &phases); err != nil {
		return nil, err
	}
	sock.ReleaseNetLocks(tr.sts, tr.released, tr.log)
	res = tr.result(start)
	defer func() {
		if res != nil {
			res.Phases = phases
		}
	}()
	if opts.LeaveStopped {
		for _, r := range tr.procs {
			if err := task.WaitStopped(ctx, r.pid, len(r.st.Threads)); err != nil {
				return nil, step("leave stopped", tr.name(r, err))
			}
		}
	}
	if opts.Running != nil {
		if err := opts.Running(res.PID); err != nil {
			return nil, step("running", err)
		}
	}
	if tr.lazy != nil {
		if err := timed(&phases, "lazy memory", func() (err error) { res.Lazy, err = tr.lazy.Serve(ctx); return err }); err != nil {
			return nil, step("lazy memory", err)
		}
		for _, r := range tr.procs {
			res.WorkingSets = append(res.WorkingSets, r.lazy.WorkingSet())
		}
		if err := tr.detach(); err != nil {
			return nil, step("lazy memory", err)
		}
	}
	res.Total, done = time.Since(start), true
	return res, nil
}

// tree is one restore: its processes in tree order (parents first, the
// root first), what they share, its lazy phase.
type tree struct {
	opts   RestoreOptions
	snap   *image.Snapshot
	log    *slog.Logger
	procs  []*restorer
	sts    []*image.Process  // the procs' states, in the same order
	byPID  map[int]*restorer // by pid at the dump
	broker *broker.Broker
	sysv   *mem.SysVSegments
	ipc    *ipc.Made   // the semaphore sets and message queues made
	lazy   *lazy.Phase // for a lazy restore
	t      *ptrace.Tracer
	join   *os.File // the network namespace to join (Namespaces.Net), or a pidfd of Namespaces.Into
	// intoPIDs are the ids taken in the pid namespace of Namespaces.Into,
	// with their tasks' names.
	intoPIDs map[int]string
	// released are the network locks released (sock.ReleaseNetLocks).
	released map[string]bool
}

// restorer is the restore of one process of the tree.
type restorer struct {
	tr    *tree
	st    *image.Process
	pages *image.Reader
	log   *slog.Logger

	stub  *ptrace.Process // the exec'd stub the root is cloned from
	child *ptrace.Process // the restored process
	// pid is the restored process's pid in our pid namespace: st.PID,
	// or another with Namespaces.PID.
	pid int
	// initPID is, for the root, our pid of the init of its new pid
	// namespace (Namespaces.PID), once it runs; 0 if none.
	initPID int
	in      *syscalls.Injector
	area    uint64 // our stub page and scratch in the process
	// threads are the restored threads, in the order of st.Threads.
	threads []*ptrace.Thread
	// shmem maps a shared object id to the fd of it in the process while
	// memory is mapped and fds restored.
	shmem  map[uint64]int
	filled uint64
	// inherit is what it keeps of its parent's memory at fork; forked
	// the pages its children keep, which it holds when it forks them.
	inherit mem.Inheritance
	forked  []units.Range
	// ghosts are the deleted files made again for its mappings
	// (mem.Target.Ghosts), open in it until setMM.
	ghosts map[[2]uint64]int
	// running is set once the process runs (detached, for an eager
	// restore).
	running bool
	lazy    *lazy.Process // its lazy phase, for a lazy restore
}

// openTree reads the state of every process of the snapshot and opens
// its pages.
func openTree(opts RestoreOptions) (*tree, error) {
	snap := opts.Snapshot
	if snap == nil {
		return nil, fmt.Errorf("no snapshot")
	}
	tr := &tree{opts: opts, snap: snap, log: logger(opts.Logger), byPID: map[int]*restorer{}, broker: broker.New(), released: map[string]bool{}, sysv: mem.NewSysVSegments()}
	if opts.Source != nil {
		// Its keeper starts while the processes' state and pages are read.
		tr.lazy = lazy.NewPhase(opts.Lazy, opts.Source, tr.log)
	}
	opened, err := openProcesses(snap, opts.Threads)
	if err != nil {
		tr.close()
		return nil, err
	}
	for _, o := range opened {
		r := &restorer{tr: tr, st: o.st, pages: o.pages, log: tr.log, ghosts: map[[2]uint64]int{}}
		if tr.lazy != nil {
			r.lazy = tr.lazy.Add(snap, o.st, o.pages)
		}
		tr.procs = append(tr.procs, r)
		tr.byPID[o.st.PID] = r
	}
	tr.procs = treeOrder(tr.procs, func(r *restorer) (int, int) { return r.st.PID, r.st.PPID })
	for _, r := range tr.procs {
		tr.sts = append(tr.sts, r.st)
		if p := tr.byPID[r.st.PPID]; p != nil && r != tr.procs[0] {
			r.inherit = mem.Inherit(r.st, r.pages, p.st)
			p.forked = append(p.forked, r.inherit.Kept...)
		}
	}
	for _, r := range tr.procs {
		r.forked = units.Union(r.forked)
		if r.lazy != nil {
			r.lazy.Inherit(r.inherit.Kept, r.forked)
		}
	}
	return tr, nil
}

// openedProcess is a process's state and pages, as openProcesses reads
// them.
type openedProcess struct {
	st    *image.Process
	pages *image.Reader
}

// openProcesses reads the state and opens the pages of every process of
// snap, in the snapshot's order, a process per CPU at a time: decoding
// the states is most of opening a snapshot of many processes.
func openProcesses(snap *image.Snapshot, threads int) ([]openedProcess, error) {
	pids := snap.PIDs()
	out := make([]openedProcess, len(pids))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, pid := range pids {
		g.Go(func() error {
			st, err := snap.State(pid)
			if err != nil {
				return err
			}
			pages, err := snap.OpenPages(pid, image.ReaderOptions{Threads: threads})
			if err != nil {
				return err
			}
			out[i] = openedProcess{st: st, pages: pages}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		for _, o := range out {
			if o.pages != nil {
				o.pages.Close()
			}
		}
		return nil, err
	}
	return out, nil
}

// close releases what the restore holds, once its processes run or are
// dead.
func (tr *tree) close() {
	if tr.lazy != nil {
		tr.lazy.Close()
	}
	for _, r := range tr.procs {
		r.pages.Close()
	}
	tr.broker.Close()
	if tr.join != nil {
		tr.join.Close()
	}
	if tr.t != nil {
		tr.t.Close()
	}
}

// steps lists the restore's steps: those of the tree, and each process's
// in tree order.
func (tr *tree) steps() []namedStep {
	steps := []namedStep{
		{"create root", tr.createRoot},
		{"shared descriptors", tr.makeSharedDescriptors},
		{"System V IPC", tr.sysvIPC},
	}
	name := func(r *restorer, s namedStep) namedStep {
		if len(tr.procs) > 1 {
			s.name = fmt.Sprintf("%s of pid %d (%s)", s.name, r.st.PID, r.st.Comm)
		}
		return s
	}
	for _, r := range tr.procs {
		for _, s := range []namedStep{
			{"unmap", r.unmapStub},
			{"move vdso", r.moveVDSO},
			{"map memory", r.mapMemory},
			{"fill memory", r.fillMemory},
			// Its memory in place, it forks its children: what they
			// still shared with it at the dump they share again.
			{"create children", r.createChildren},
		} {
			steps = append(steps, name(r, s))
		}
	}
	steps = append(steps, namedStep{"process groups", tr.joinGroups})
	for _, r := range tr.procs {
		for _, s := range []namedStep{
			{"lock memory", r.lockMemory},
			{"mm fields", r.setMM},
			{"file descriptors", r.restoreFDs},
			{"hand out descriptors", r.handOut},
			{"controlling terminal", r.controllingTerminal},
			{"threads", r.createThreads},
			{"thread state", r.threadState},
			// The userfaultfd is made while the process still has our
			// privileges: process state may set an unprivileged uid, for
			// which userfaultfd(2) is refused
			// (vm.unprivileged_userfaultfd=0).
			{"lazy memory", r.prepareLazy},
			{"process state", r.processState},
			{"pending signals", r.pendingSignals},
			{"leave stopped", r.leaveStopped},
		} {
			steps = append(steps, name(r, s))
		}
	}
	return append(steps, namedStep{"finish", tr.finish})
}

// name prefixes err with the process it concerns, in a tree of several.
func (tr *tree) name(r *restorer, err error) error {
	if len(tr.procs) == 1 || err == nil {
		return err
	}
	return fmt.Errorf("pid %d (%s): %w", r.st.PID, r.st.Comm, err)
}

// result is what Restore returns once every process runs.
func (tr *tree) result(start time.Time) *RestoreResult {
	root := tr.procs[0]
	res := &RestoreResult{PID: root.pid, Processes: len(tr.procs), ToRunning: time.Since(start)}
	for _, r := range tr.procs {
		res.Threads += len(r.st.Threads)
		res.Filled += r.filled
		if r.pages != nil {
			res.StoredBytes += r.pages.Stats().Total.Stored
		}
	}
	switch {
	case tr.opts.Namespaces.PID:
		res.OwnPID, res.InitPID = root.st.OwnPID(), root.initPID
		if root.initPID == 0 {
			res.InitPID = root.pid
		}
	case tr.opts.Namespaces.Into != 0:
		res.OwnPID = root.st.OwnPID()
	}
	return res
}

// finish lets every process run, children first: registers, then
// detach (or, for a lazy restore, resume, still traced). A shell job's
// terminal gets the settings the job's had first.
func (tr *tree) finish(ctx context.Context) error {
	if fd, ok := tr.opts.Inherit[tty.TerminalKey]; ok && tr.opts.ShellJob {
		if err := tty.SetTerminal(fd, tr.sts); err != nil {
			return err
		}
	}
	// Shared memory served lazily is registered in every process before
	// any of them runs, so that no page of it comes in but through a
	// pager: one touched where it is not registered would be a page of
	// zeros that the snapshot's data could never replace.
	for _, r := range tr.procs {
		if r.lazy != nil {
			if err := r.lazy.RegisterShared(); err != nil {
				return tr.name(r, err)
			}
		}
	}
	for i := len(tr.procs) - 1; i >= 0; i-- {
		r := tr.procs[i]
		if err := r.finish(ctx); err != nil {
			return tr.name(r, err)
		}
		r.running = true
	}
	return nil
}

// finish removes our injection area, sets every thread's scheduling,
// registers, FP state and signal mask, and lets the process run: detached, or for a
// lazy restore still traced with PTRACE_O_EXITKILL so that it dies with
// snapctl rather than run on with missing memory.
func (r *restorer) finish(ctx context.Context) error {
	if _, err := r.in.Syscall(unix.SYS_MUNMAP, r.area, areaLen); err != nil {
		return fmt.Errorf("munmap injection area: %w", err)
	}
	if err := r.in.Close(); err != nil {
		return err
	}
	if err := task.RestoreSched(r.threads, r.st); err != nil {
		return err
	}
	if err := r.setThreadRegs(); err != nil {
		return err
	}
	if r.lazy == nil {
		return r.child.Detach()
	}
	if err := r.lazy.Register(); err != nil {
		return err
	}
	return r.child.Resume()
}

// prepareLazy makes the process's userfaultfd, for a lazy restore.
func (r *restorer) prepareLazy(context.Context) error {
	if r.lazy == nil {
		return nil
	}
	return r.lazy.Prepare(r.in, r.pid, r.threads)
}

// detach lets every process go once the lazy phase is over: the restored
// ones, then every child they forked during it (which may have forked in
// turn until detached).
func (tr *tree) detach() error {
	var errs []error
	for _, r := range tr.procs {
		if err := r.child.Detach(); err != nil {
			errs = append(errs, tr.name(r, err))
		}
	}
	for range 100 {
		ps := tr.t.Processes()
		if len(ps) == 0 {
			break
		}
		for _, p := range ps {
			if err := p.Detach(); err != nil {
				errs = append(errs, fmt.Errorf("detach child %d: %w", p.Pid(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// abort kills every process the restore made, children first, and for a
// lazy restore every child they forked during the lazy phase.
func (tr *tree) abort() {
	for i := len(tr.procs) - 1; i >= 0; i-- {
		tr.procs[i].abort()
	}
	tr.sysv.RemoveMade()
	tr.ipc.Remove()
	if tr.lazy != nil && tr.t != nil {
		for _, p := range tr.t.Processes() {
			if err := p.Kill(); err != nil {
				tr.log.Error("kill child forked during the lazy phase", "pid", p.Pid(), "err", err)
			}
		}
	}
}

// abort kills what the restore of r made.
func (r *restorer) abort() {
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
