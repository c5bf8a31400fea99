package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/task"
)

// treeRestore is the restore of a process tree. Its processes are made
// first, parents first, each cloned (clone3 with its pid) from its
// restored parent while both are still bare copies of the stub: parent
// and child links come from the clone itself, a session leader calls
// setsid before it clones its children, a group leader setpgid; then the
// others join their groups. Then each process in turn gets its memory,
// descriptors, threads and state as a single process would; the objects
// processes share (an inherited open file description, a pipe or
// socket pair between two of them, a shared memory object) go through
// snapctl (broker). Every process runs only once all are ready. A
// failure kills every process made.
type treeRestore struct {
	opts  RestoreOptions
	log   *slog.Logger
	procs []*restorer // tree order
	byPID map[int]*restorer
	b     *broker
}

// restoreTree restores the tree of snap.
func restoreTree(ctx context.Context, opts RestoreOptions, snap *image.Snapshot, start time.Time, log *slog.Logger) (res *RestoreResult, err error) {
	if opts.Lazy != nil && opts.LazyOf == nil {
		return nil, step("check", fmt.Errorf("%w: a lazy restore of a process tree (%d processes) needs a page source for each (RestoreOptions.LazyOf)", ErrUnsupported, len(snap.PIDs())))
	}
	if opts.LeaveStopped && opts.LazyOf != nil {
		return nil, fmt.Errorf("%w: a lazy restore cannot leave the processes stopped", ErrUnsupported)
	}
	if opts.Namespaces.any() {
		return nil, step("check", fmt.Errorf("%w: a process tree (%d processes) restores in snapctl's namespaces only (--pidns and --netns take a single process)", ErrUnsupported, len(snap.PIDs())))
	}
	tr := &treeRestore{opts: opts, log: log, byPID: map[int]*restorer{}, b: newBroker()}
	defer tr.b.close()
	defer func() {
		for _, r := range tr.procs {
			r.pages.Close()
		}
	}()
	for _, pid := range snap.PIDs() {
		st, err := snap.State(pid)
		if err != nil {
			return nil, step("open snapshot", err)
		}
		pages, err := snap.OpenPages(pid, image.ReaderOptions{Threads: opts.Threads})
		if err != nil {
			return nil, step("open snapshot", err)
		}
		r := &restorer{snap: snap, st: st, pages: pages, opts: opts, log: log, tree: tr.b}
		if opts.LazyOf != nil {
			if r.opts.Lazy, err = opts.LazyOf(pid); err != nil {
				pages.Close()
				return nil, step("open snapshot", err)
			}
		}
		tr.procs = append(tr.procs, r)
		tr.byPID[pid] = r
	}
	tr.procs = treeOrder(tr.procs, func(r *restorer) (int, int) { return r.st.PID, r.st.PPID })
	if err := tr.check(); err != nil {
		return nil, step("check", err)
	}
	// Past its checks, the restore releases the network lock however it
	// ends: as soon as the processes are made (or not), before a lazy
	// phase.
	sts := make([]*image.Process, len(tr.procs))
	for i, r := range tr.procs {
		sts[i] = r.st
	}
	released := map[string]bool{}
	defer releaseNetLocks(sts, released, log)
	var progress *treeProgress
	if opts.LazyOf != nil {
		// One pager per process: each has its own userfaultfd and page
		// source; the keeper holds every userfaultfd.
		if k := startKeeper(opts, log); k != nil {
			defer closeKeeper(k, log) // after abort, which kills what it protects
			for _, r := range tr.procs {
				r.opts.LazyOptions.Holder, r.keeper = k, k
			}
		}
		progress = newTreeProgress(len(tr.procs), opts.LazyOptions.Progress)
		for i, r := range tr.procs {
			if r.opts.LazyOptions.Pager.Workers == 0 {
				r.opts.LazyOptions.Pager.Workers = max(1, lazyWorkers(opts.LazyOptions.SourceWaits)/len(tr.procs))
			}
			if progress != nil {
				r.opts.LazyOptions.Progress = progress.of(i)
			}
		}
	}
	t, err := ptrace.New()
	if err != nil {
		return nil, step("start tracer", err)
	}
	for _, r := range tr.procs {
		r.t = t
	}
	defer func() {
		if err != nil {
			tr.abort()
		}
		t.Close()
	}()
	steps := []namedStep{
		{"create processes", tr.create},
		{"shared descriptors", tr.shared},
	}
	for _, r := range tr.procs {
		for _, s := range []namedStep{
			{"unmap stub", r.unmapStub},
			{"move vdso", r.moveVDSO},
			{"map memory", r.mapMemory},
			{"fill memory", r.fillMemory},
			{"lock memory", r.lockMemory},
			{"mm fields", r.setMM},
			{"file descriptors", r.restoreFDs},
			{"hand out descriptors", tr.give(r)},
			{"threads", r.createThreads},
			{"thread state", r.threadState},
			{"lazy memory", r.prepareLazy},
			{"process state", func(context.Context) error { return task.RestoreProcessInTree(r.in, r.st, r.log) }},
			{"pending signals", r.pendingSignals},
			{"leave stopped", r.leaveStopped},
		} {
			s.name = fmt.Sprintf("%s of pid %d (%s)", s.name, r.st.PID, r.st.Comm)
			steps = append(steps, s)
		}
	}
	steps = append(steps, namedStep{"finish", tr.finish})
	err = runSteps(ctx, log, "restore", steps)
	releaseNetLocks(sts, released, log)
	if err != nil {
		return nil, err
	}
	threads := 0
	for _, r := range tr.procs {
		threads += len(r.st.Threads)
	}
	root := tr.procs[0]
	res = &RestoreResult{PID: root.st.PID, Processes: len(tr.procs), Threads: threads, ToRunning: time.Since(start)}
	for _, r := range tr.procs {
		res.Filled += r.filled
	}
	if opts.LeaveStopped {
		for _, r := range tr.procs {
			if err := waitStopped(ctx, r.st.PID, len(r.st.Threads)); err != nil {
				return nil, step("leave stopped", fmt.Errorf("pid %d: %w", r.st.PID, err))
			}
		}
	}
	if opts.Running != nil {
		if err := opts.Running(root.st.PID); err != nil {
			return nil, step("running", err)
		}
	}
	if opts.LazyOf != nil {
		if err := tr.serveLazy(ctx, &res.Lazy); err != nil {
			return nil, step("lazy memory", err)
		}
	}
	res.Total = time.Since(start)
	return res, nil
}

// serveLazy runs the pagers of every process at once until all their
// memory is in, then lets every process go (and any child one forked
// meanwhile). If one pager fails, the others stop and the caller kills
// the tree.
func (tr *treeRestore) serveLazy(ctx context.Context, stats *LazyStats) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	all := make([]LazyStats, len(tr.procs))
	errs := make([]error, len(tr.procs))
	var wg sync.WaitGroup
	for i, r := range tr.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.servePages(ctx, &all[i], &WorkingSetResult{}); err != nil {
				errs[i] = fmt.Errorf("pid %d (%s): %w", r.st.PID, r.st.Comm, err)
				cancel(errs[i])
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	*stats = mergeLazyStats(all)
	return tr.procs[0].detachTree() // every process the tracer holds
}

// mergeLazyStats adds up the lazy phases of the processes of a tree; each
// one's own figures are in Children, in tree order.
func mergeLazyStats(all []LazyStats) LazyStats {
	var s LazyStats
	s.Exited = true
	for _, a := range all {
		s.Total += a.Total
		s.Pending += a.Pending
		s.Faults += a.Faults
		s.DataFaults += a.DataFaults
		s.ZeroFaults += a.ZeroFaults
		s.FaultBytes += a.FaultBytes
		s.PrefetchBytes += a.PrefetchBytes
		s.ZeroBytes += a.ZeroBytes
		s.ReadBytes += a.ReadBytes
		s.FaultMax = max(s.FaultMax, a.FaultMax)
		s.Exited = s.Exited && a.Exited
		s.Children = append(s.Children, a)
	}
	return s
}

// treeProgress adds up the lazy progress of the pagers of a tree.
type treeProgress struct {
	mu          sync.Mutex
	done, total []uint64
	fn          func(done, total uint64)
}

func newTreeProgress(n int, fn func(done, total uint64)) *treeProgress {
	if fn == nil {
		return nil
	}
	return &treeProgress{done: make([]uint64, n), total: make([]uint64, n), fn: fn}
}

// of returns the progress function of the pager of process i.
func (p *treeProgress) of(i int) func(done, total uint64) {
	return func(done, total uint64) {
		p.mu.Lock()
		p.done[i], p.total[i] = done, total
		var d, t uint64
		for j := range p.done {
			d += p.done[j]
			t += p.total[j]
		}
		p.mu.Unlock()
		p.fn(d, t)
	}
}

// check refuses, before anything is made, a tree this build cannot
// restore: each process as a single one would be checked, then the
// descriptors leading outside the tree, then the links between them. A
// session or a process group can be recreated only if its leader is in
// the tree, or if it is the root's own one outside it (which the
// restored tree gets from snapctl, as a single process does).
func (tr *treeRestore) check() error {
	root := tr.procs[0]
	sts := make([]*image.Process, len(tr.procs))
	for i, r := range tr.procs {
		if err := r.check(); err != nil {
			return fmt.Errorf("pid %d (%s): %w", r.st.PID, r.st.Comm, err)
		}
		sts[i] = r.st
	}
	// Descriptors leading outside the tree, and the keys of
	// --inherit-fd, of all processes together.
	if err := fds.CheckExternal(sts, root.fdOptions()); err != nil {
		return err
	}
	for _, r := range tr.procs[1:] {
		st := r.st
		parent := tr.byPID[st.PPID]
		if parent == nil {
			return fmt.Errorf("%w: the snapshot holds several trees (pid %d's parent %d is not in it)", image.ErrCorrupt, st.PID, st.PPID)
		}
		name := fmt.Sprintf("pid %d (%s)", st.PID, st.Comm)
		if st.SID != st.PID && st.SID != parent.st.SID {
			return fmt.Errorf("%w: %s: its session %d is neither its own nor its parent's", ErrUnsupported, name, st.SID)
		}
		if leader := tr.byPID[st.PGID]; leader != nil {
			if leader.st.SID != st.SID {
				return fmt.Errorf("%w: %s: its process group %d is in another session", ErrUnsupported, name, st.PGID)
			}
		} else if st.PGID != root.st.PGID || st.SID != root.st.SID {
			return fmt.Errorf("%w: %s: its process group %d has no leader in the tree", ErrUnsupported, name, st.PGID)
		}
	}
	return nil
}

// create makes every process of the tree, with its pid, parent, session
// and process group, all of them stopped.
func (tr *treeRestore) create(ctx context.Context) error {
	root := tr.procs[0]
	for _, r := range tr.procs {
		root.layout = append(root.layout, r.st.VMAs...)
	}
	root.layout = unionVMAs(root.layout)
	if err := root.createProcess(ctx); err != nil {
		return err
	}
	if err := tr.session(root); err != nil {
		return err
	}
	for _, r := range tr.procs[1:] {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tr.clone(r); err != nil {
			return fmt.Errorf("pid %d (%s): %w", r.st.PID, r.st.Comm, err)
		}
	}
	// Join the groups now that their leaders exist.
	rootGroup, err := unix.Getpgid(root.st.PID)
	if err != nil {
		return err
	}
	for _, r := range tr.procs[1:] {
		st := r.st
		if st.SID == st.PID {
			continue
		}
		want := rootGroup
		if tr.byPID[st.PGID] != nil {
			want = st.PGID
		}
		if cur, err := unix.Getpgid(st.PID); err == nil && cur == want {
			continue
		}
		if _, err := r.in.Call(unix.SYS_SETPGID, 0, uint64(want)); err != nil {
			return fmt.Errorf("pid %d (%s): setpgid(0, %d): %w", st.PID, st.Comm, want, err)
		}
	}
	return nil
}

// clone makes process r from its parent, which is made already: clone3
// with r's pid, injected into the parent.
func (tr *treeRestore) clone(r *restorer) error {
	parent := tr.byPID[r.st.PPID]
	args := ptrace.CloneArgs{ExitSignal: uint64(unix.SIGCHLD), SetTID: []int{r.st.PID}}
	th, err := parent.in.Clone3(args)
	if errors.Is(err, unix.EEXIST) {
		if err := awaitPIDReleased(r.st.PID); err != nil {
			return err
		}
		th, err = parent.in.Clone3(args)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: pid %d was taken meanwhile", ErrPIDInUse, r.st.PID)
		}
		return fmt.Errorf("clone3 with pid %d from %d: %w", r.st.PID, parent.st.PID, err)
	}
	r.child = th.Process()
	r.pid = th.Tid() // a tree is restored in our pid namespace: its pids are ours
	if th.Tid() != r.st.PID {
		return fmt.Errorf("clone3 made pid %d, wanted %d", th.Tid(), r.st.PID)
	}
	if err := th.SetOptions(unix.PTRACE_O_EXITKILL | unix.PTRACE_O_TRACECLONE); err != nil {
		return err
	}
	// The child's memory is a copy of its parent's: the injection area
	// is in it at the same address.
	r.area = parent.area
	if r.in, err = th.InjectorAt(r.area, r.area+pageSize, scratchLen); err != nil {
		return err
	}
	r.threads = []*ptrace.Thread{th}
	return tr.session(r)
}

// session makes r lead its session or its process group if it led one,
// before it clones its children, who inherit them. The root that led
// neither gets a process group of its own in snapctl's session, as a
// single process does.
func (tr *treeRestore) session(r *restorer) error {
	st := r.st
	switch {
	case st.SID == st.PID:
		if _, err := r.in.Call(unix.SYS_SETSID); err != nil {
			return fmt.Errorf("setsid: %w", err)
		}
	case st.PGID == st.PID || r == tr.procs[0]:
		if r == tr.procs[0] && st.PGID != st.PID {
			tr.log.Warn("the tree rejoins no session: its root did not lead its session or group", "pid", st.PID, "sid", st.SID, "pgid", st.PGID)
		}
		if _, err := r.in.Call(unix.SYS_SETPGID, 0, 0); err != nil {
			return fmt.Errorf("setpgid: %w", err)
		}
	}
	return nil
}

// shared makes, in snapctl, the pipes and socket pairs whose ends are in
// several processes.
func (tr *treeRestore) shared(context.Context) error {
	sts := make([]*image.Process, len(tr.procs))
	for i, r := range tr.procs {
		sts[i] = r.st
	}
	objs, err := fds.MakeShared(sts)
	if err != nil {
		return err
	}
	for k, fd := range objs {
		tr.b.mine[k] = fd
	}
	return nil
}

// give hands out the open file descriptions of r that processes after it
// inherited.
func (tr *treeRestore) give(r *restorer) func(context.Context) error {
	return func(context.Context) error {
		var nums []int
		for _, q := range tr.procs {
			for _, f := range q.st.FDs {
				if f.Tree != nil && f.Tree.PID == r.st.PID && !slices.Contains(nums, f.Tree.FD) {
					nums = append(nums, f.Tree.FD)
				}
			}
		}
		for _, fd := range nums {
			if err := tr.b.Give(r.st.PID, fds.OFDKey(r.st.PID, fd), fd); err != nil {
				return fmt.Errorf("fd %d: %w", fd, err)
			}
		}
		return nil
	}
}

// finish lets every process run, children first: registers, then
// detach.
func (tr *treeRestore) finish(ctx context.Context) error {
	for i := len(tr.procs) - 1; i >= 0; i-- {
		r := tr.procs[i]
		if err := r.finish(ctx); err != nil {
			return fmt.Errorf("pid %d (%s): %w", r.st.PID, r.st.Comm, err)
		}
		r.running = true
	}
	return nil
}

// abort kills every process the restore made, children first.
func (tr *treeRestore) abort() {
	for i := len(tr.procs) - 1; i >= 0; i-- {
		tr.procs[i].abort()
	}
}

// unionVMAs sorts vmas and merges those that overlap (the layouts of
// several processes) into ranges.
func unionVMAs(vmas []image.VMA) []image.VMA {
	slices.SortFunc(vmas, func(a, b image.VMA) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	var out []image.VMA
	for _, v := range vmas {
		if n := len(out); n > 0 && v.Start <= out[n-1].End {
			out[n-1].End = max(out[n-1].End, v.End)
			continue
		}
		out = append(out, image.VMA{Start: v.Start, End: v.End})
	}
	return out
}

// broker holds, in snapctl, the objects processes of a tree share, and
// hands them to the processes that need them (fds.Tree): pidfd_getfd
// injected into the process, on a pidfd of snapctl.
type broker struct {
	mine   map[string]int // key -> our descriptor
	pidfds map[int]int    // pid -> our pidfd of it
}

func newBroker() *broker { return &broker{mine: map[string]int{}, pidfds: map[int]int{}} }

// Take puts the object key into the process and returns its descriptor
// there.
func (b *broker) Take(in *ptrace.Injector, key string) (int, bool, error) {
	fd, ok := b.mine[key]
	if !ok {
		return -1, false, nil
	}
	pfd, err := in.Call(unix.SYS_PIDFD_OPEN, uint64(os.Getpid()), 0)
	if err != nil {
		return -1, true, fmt.Errorf("pidfd_open(snapctl): %w", err)
	}
	nfd, err := in.Call(unix.SYS_PIDFD_GETFD, pfd, uint64(fd), 0)
	if cerr := in.CloseFD(int(pfd)); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return -1, true, fmt.Errorf("pidfd_getfd %s: %w", key, err)
	}
	return int(nfd), true, nil
}

// Give takes a copy of descriptor fd of process pid as key.
func (b *broker) Give(pid int, key string, fd int) error {
	if _, ok := b.mine[key]; ok {
		return nil
	}
	pidfd, ok := b.pidfds[pid]
	if !ok {
		var err error
		if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
			return fmt.Errorf("pidfd_open %d: %w", pid, err)
		}
		b.pidfds[pid] = pidfd
	}
	nfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd %d of pid %d: %w", fd, pid, err)
	}
	b.mine[key] = nfd
	return nil
}

func (b *broker) close() {
	for _, fd := range b.mine {
		unix.Close(fd)
	}
	for _, fd := range b.pidfds {
		unix.Close(fd)
	}
	b.mine, b.pidfds = nil, nil
}
