package engine

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/ipc"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/mem/precopy"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Version is the tool version recorded in snapshots.
const Version = "0.1.0"

// DumpOptions configure Dump.
type DumpOptions struct {
	PID int
	Dir string
	// LeaveRunning resumes the process instead of killing it: as soon as
	// its memory has been read, before the snapshot is synced and
	// committed.
	LeaveRunning bool
	// BlockSize, Mode and Workers are the encoding settings (see
	// image.Options).
	BlockSize int
	Mode      codec.Mode
	Workers   int
	// Remote configures the store when Dir is an address
	// (s3://BUCKET/PREFIX).
	Remote store.Options
	Logger *slog.Logger
	// Progress, if set, is called from time to time with the memory bytes
	// written so far and the total to write.
	Progress func(done, total uint64)
	// TCPEstablished takes established TCP connections with TCP_REPAIR
	// under a network lock (sock.NetLock) that holds them until the
	// restore (criu dump --tcp-established); without it they are
	// recorded to be closed at restore.
	TCPEstablished bool
	// External names the pipes and unix sockets leading outside the
	// process (outside the tree, for a process tree) that the snapshot
	// records (fds.ParseExternal).
	External *fds.External
	// ShellJob records the descriptors on a terminal outside the tree, to
	// be given the restoring snapctl's (criu dump --shell-job).
	ShellJob bool
	// GhostLimit is the largest open deleted file kept (fds.DumpOptions:
	// 0 the default, -1 none).
	GhostLimit int64
	// Seal, if set, seals the snapshot for its recipients (image.Options.Seal).
	Seal *image.SealOptions
	// Sign, if set, signs the snapshot (image.Options.Sign).
	Sign ed25519.PrivateKey
	// PreCopy, if set, copies the memory while the process runs, in
	// rounds, before the freeze: the freeze then copies only what was
	// written since the last round (snapctl dump --pre-copy). It dumps a
	// single process: one with children is refused.
	PreCopy *PreCopyOptions
	// Parent, if set, makes an incremental snapshot of the snapshot at
	// this path or address (image.Options.Parent): only the blocks that
	// differ from it are stored. BlockSize zero then means the parent's.
	Parent string

	// beforeFreeze, in tests, runs after the pre-copy rounds, just
	// before the freeze.
	beforeFreeze func()
}

// DumpResult describes a finished dump.
type DumpResult struct {
	PID     int
	Threads int
	// Processes is how many processes the tree had (1: no children).
	Processes int
	// Freeze is the time the process was stopped: from the first
	// interrupt to its resume or kill.
	Freeze time.Duration
	// FreezeStop is how long stopping every thread took.
	FreezeStop time.Duration
	Total      time.Duration
	Stats      image.Stats
	// MemoryBytes is the memory dumped (decoded bytes).
	MemoryBytes uint64
	// Conns is the number of TCP connections taken with TCP_REPAIR (all
	// processes of the tree together); NetLock the nftables table
	// (family inet) that holds them until the restore, if the processes
	// were killed.
	Conns   int
	NetLock string
	// PreCopy are the figures of the rounds of a pre-copy dump.
	PreCopy *PreCopyResult
	// Phases are the steps of the dump, in order, with their durations.
	Phases []Phase
}

// dumper is one dump: what it learns of its frozen processes, and what it
// has created and must undo if it fails.
type dumper struct {
	pid  int
	opts DumpOptions
	log  *slog.Logger

	w *image.Writer
	t *ptrace.Tracer
	// procs are the processes of the tree, in tree order (treeOrder):
	// the dumped process first.
	procs      []*dumpProc
	frozen     time.Time     // when the first thread stopped
	stop       time.Duration // stopping every thread took
	stats      image.Stats
	committed  bool
	resumed    bool // detached or killed
	resumeErr  error
	freezeTime time.Duration
	res        *DumpResult
	// tcp holds the connections of every process of the tree taken with
	// TCP_REPAIR (--tcp-established), under one network lock, until the
	// processes run again or die.
	tcp *sock.TCPRepair
	// pc and preRes, in a pre-copy dump: the copy made while the process
	// ran, and the figures of its rounds.
	pc     *precopy.Copy
	preRes *PreCopyResult
	preP   *ptrace.Process // attached since the pre-copy
}

// dumpProc is one process of the dumped tree.
type dumpProc struct {
	pid, parent int
	comm        string
	p           *ptrace.Process
	maps        []proc.Mapping
	st          *image.Process
	// zombies are its children that had exited and that it had not
	// reaped (image.Process.Zombies).
	zombies []image.Zombie
}

// Dump freezes the process opts.PID and all its descendants, writes their
// snapshot into opts.Dir and then kills them once the snapshot is
// committed, or, with LeaveRunning, resumes them as soon as their memory
// has been read. Every process of the tree is stopped before any is
// read: the snapshot is one instant of the tree. On any error the
// processes are resumed as they were and the directory holds no
// manifest.
func Dump(ctx context.Context, opts DumpOptions) (res *DumpResult, err error) {
	start := time.Now()
	d := &dumper{pid: opts.PID, opts: opts, log: logger(opts.Logger)}
	defer d.cleanup(&err)
	var phases []Phase
	err = runSteps(ctx, d.log, "dump", []namedStep{
		{"check", d.refuseUndumpable},
		{"create snapshot", d.create},
		{"pre-copy", d.preCopy},
		{"freeze", d.freeze},
		{"collect state", d.collect},
		{"dump memory", d.dumpMemory},
		{"write state", d.writeState},
		{"commit", d.commit},
		{"finish", d.finish},
	}, &phases)
	if d.res != nil {
		d.res.Total, d.res.Phases = time.Since(start), phases
	}
	return d.res, err
}

// refuseUndumpable refuses a process that cannot be dumped, before
// touching it.
func (d *dumper) refuseUndumpable(context.Context) error {
	if err := dumpable(d.pid); err != nil {
		return err
	}
	if d.opts.PreCopy != nil {
		return preCopyable(d.pid)
	}
	return nil
}

// create makes the snapshot directory's files.
func (d *dumper) create(context.Context) error {
	o := d.opts
	var err error
	d.w, err = image.Create(o.Dir, image.Options{BlockSize: o.BlockSize, Mode: o.Mode, Workers: o.Workers, Tool: "lazyfs " + Version, Remote: o.Remote, Seal: o.Seal, Sign: o.Sign, Parent: o.Parent})
	return err
}

// freeze stops every thread of the process and of each of its
// descendants, parents first: a stopped process forks no more, so once
// the children of every stopped process are stopped too the tree is
// whole.
func (d *dumper) freeze(context.Context) error {
	if d.preP != nil {
		if d.opts.beforeFreeze != nil {
			d.opts.beforeFreeze()
		}
		if !d.preP.AddressSpaceGone() {
			// An exec while it stops fails the checks of the old
			// program (the new one may have forked): the exec decides.
			err := d.freezePreCopied()
			if !d.preP.AddressSpaceGone() {
				return err
			}
		}
		d.abandonPreCopy()
	}
	t, err := ptrace.New()
	if err != nil {
		return err
	}
	d.t = t
	var stop time.Duration
	queue := []*dumpProc{{pid: d.pid}}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p.pid != d.pid {
			if d.leaveOut(p) {
				continue
			}
			if err := dumpableChild(p.pid, p.parent); err != nil {
				if d.leaveOut(p) { // it exited meanwhile
					continue
				}
				return err
			}
		}
		p.comm, _ = proc.ReadComm(p.pid)
		if p.p, err = t.Seize(p.pid, ptrace.SeizeOptions{}); err != nil {
			if p.pid != d.pid && d.leaveOut(p) {
				continue
			}
			return fmt.Errorf("pid %d (%s): %w", p.pid, p.comm, err)
		}
		if d.frozen.IsZero() {
			d.frozen = time.Now().Add(-p.p.Stats().Duration)
		}
		stop += p.p.Stats().Duration
		d.procs = append(d.procs, p)
		kids, err := children(p.pid)
		if err != nil {
			return fmt.Errorf("pid %d (%s): children: %w", p.pid, p.comm, err)
		}
		for _, k := range kids {
			queue = append(queue, &dumpProc{pid: k, parent: p.pid})
		}
	}
	d.procs = treeOrder(d.procs, func(p *dumpProc) (int, int) { return p.pid, p.parent })
	d.stop = stop
	threads := 0
	for _, p := range d.procs {
		threads += len(p.p.Threads())
	}
	d.log.Info("frozen", "pid", d.pid, "processes", len(d.procs), "threads", threads, "took", time.Since(d.frozen))
	return nil
}

// leaveOut reports whether child p of a frozen process has exited, and
// so is not dumped as a process. A zombie, which its frozen parent has
// not reaped, is recorded with the parent (image.Process.Zombies): a
// restore makes it again, exiting as it did, for the parent to reap. A
// child that is gone (its parent ignores SIGCHLD, so the kernel reaped
// it) is left out. Pre-fork servers and shell pipelines have such
// children at any moment.
func (d *dumper) leaveOut(p *dumpProc) bool {
	s, err := proc.ReadStatus(p.pid)
	if err == nil && s.State != 'Z' && s.State != 'X' {
		return false
	}
	if err == nil && s.Threads > 1 {
		return false // a leader that exited while its other threads run: refused, not left out
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
		return false
	}
	if err == nil && s.State == 'Z' {
		if z, ok := d.zombie(p, s); ok {
			d.log.Info("kept: a child that exited and that its parent has not reaped", "pid", p.pid, "parent", p.parent, "status", z.Describe())
			return true
		}
	}
	d.log.Info("left out: a child that exited during the freeze", "pid", p.pid, "parent", p.parent)
	return true
}

// zombie records zombie child p (whose status is s) with its parent,
// once its exit status is read.
func (d *dumper) zombie(p *dumpProc, s *proc.Status) (image.Zombie, bool) {
	st, err := proc.ReadStat(p.pid)
	if err != nil || !st.Exited() {
		return image.Zombie{}, false
	}
	z := image.Zombie{PID: p.pid, Comm: s.Name, Status: st.ExitCode}
	if len(s.NSpid) > 1 {
		z.NSPID = s.NSpid
	}
	for _, q := range d.procs {
		if q.pid == p.parent {
			q.zombies = append(q.zombies, z)
			return z, true
		}
	}
	return image.Zombie{}, false
}

func (d *dumper) memoryLayout(p *dumpProc) error {
	var err error
	p.st.VMAs, err = mem.VMAs(p.pid, p.maps, d.opts.GhostLimit)
	if d.pc != nil {
		// Write tracking is still registered: not the process's own.
		for i := range p.st.VMAs {
			v := &p.st.VMAs[i]
			v.VMFlags = slices.DeleteFunc(v.VMFlags, func(f string) bool { return f == precopy.TrackingFlag })
		}
	}
	return err
}

// fds describes the descriptors of every process, those they share with
// each other linked (fds.DumpTree); maps are the processes' mappings (as
// /proc/PID/maps lists them: fds looks only for shared objects).
func (d *dumper) fds(maps [][]proc.Mapping) error {
	if d.opts.TCPEstablished {
		// One lock, one set of repaired sockets for the whole tree.
		d.tcp = sock.NewTCPRepair(d.pid)
	}
	o := fds.DumpOptions{Log: d.log, TCP: d.tcp, External: d.opts.External, ShellJob: d.opts.ShellJob, GhostLimit: d.opts.GhostLimit}
	if len(d.procs) == 1 {
		var err error
		p := d.procs[0]
		p.st.FDs, err = fds.Dump(p.pid, maps[0], o)
		return err
	}
	pids := make([]int, len(d.procs))
	for i, p := range d.procs {
		pids[i] = p.pid
	}
	all, err := fds.DumpTree(pids, maps, o)
	if err != nil {
		return err
	}
	for i, p := range d.procs {
		p.st.FDs = all[i]
	}
	return nil
}

// resumeConns takes the connections of every process out of repair mode
// and releases the network lock, before the processes run again (a
// failed dump, or --leave-running).
func (d *dumper) resumeConns() {
	if d.tcp == nil {
		return
	}
	if err := d.tcp.Resume(d.log); err != nil {
		d.log.Error("connections not resumed", "pid", d.pid, "err", err)
	}
	d.tcp = nil
}

// dumpMemory writes the pages of each process in turn; a shared memory
// object is dumped once, with the first process that maps it. With
// LeaveRunning the processes resume as soon as the memory of the last
// has been read: encoding the last blocks, syncing the files and
// committing need them no more. A dump that fails after that still
// leaves them running, as they would have been. Without LeaveRunning they
// are killed only once the snapshot is committed.
func (d *dumper) dumpMemory(ctx context.Context) error {
	d.log.Debug("state collected", "pid", d.pid, "since freeze", time.Since(d.frozen))
	if err := d.controllingTerminals(); err != nil {
		return d.withResumeErr(err)
	}
	var tree mem.TreeObjects
	if len(d.procs) > 1 {
		tree = mem.TreeObjects{}
		if err := d.markInherited(); err != nil {
			return d.withResumeErr(err)
		}
	}
	byPID := map[int]*dumpProc{}
	pids := map[int]bool{}
	for _, p := range d.procs {
		byPID[p.pid] = p
		pids[p.pid] = true
		if len(p.st.NSPID) > 0 {
			// In a pid namespace of its own, the kernel records the pid
			// it has there.
			pids[p.st.OwnPID()] = true
		}
	}
	// Semaphore sets and message queues the processes used: with the
	// root, read while they are frozen.
	var err error
	if d.procs[0].st.SysVIPC, err = ipc.Dump(pids); err != nil {
		return d.withResumeErr(step("System V IPC", err))
	}
	for i, p := range d.procs {
		if parent := byPID[p.parent]; parent != nil {
			// What it shares with its parent, dumped before it, is
			// stored once, in the parent's pages.
			shared := mem.InheritedRanges(p.st)
			d.w.Forked(p.st.PID, parent.st.PID, func(addr, n uint64) bool { return mem.Within(shared, addr, n) })
		}
		var captured func()
		if i == len(d.procs)-1 {
			captured = func() {
				if d.opts.LeaveRunning {
					d.resumeConns()
					d.resume(d.detachAll)
					d.log.Info("resumed", "pid", d.pid, "frozen", d.freezeTime)
				}
			}
		}
		stats, err := mem.Dump(ctx, d.w, p.st, p.maps, p.p, d.memOptions(captured, tree))
		if err != nil {
			if len(d.procs) > 1 {
				err = fmt.Errorf("pid %d (%s): %w", p.pid, p.comm, err)
			}
			return d.withResumeErr(err)
		}
		d.stats.Add(stats)
	}
	sts := make([]*image.Process, len(d.procs))
	for i, p := range d.procs {
		sts[i] = p.st
	}
	mem.MarkShared(sts)
	return nil
}

// controllingTerminals notes, for each session leader whose controlling
// terminal is the slave of a pseudo-terminal pair the processes hold, the
// pair and the process group in the foreground of it (image.CTTY).
func (d *dumper) controllingTerminals() error {
	sts := make([]*image.Process, len(d.procs))
	for i, p := range d.procs {
		sts[i] = p.st
	}
	for _, p := range d.procs {
		if p.st.SID != p.st.PID {
			continue
		}
		s, err := proc.ReadStat(p.pid)
		if err != nil {
			return d.procErr(p, err)
		}
		if idx, ok := tty.CTTYOf(uint64(s.TTYNr), sts); ok {
			p.st.CTTY = &image.CTTY{Pty: idx, Foreground: s.TPGid}
		}
	}
	return nil
}

// markInherited notes, in each child's state, the pages it still shares
// copy-on-write with its parent (mem.MarkInherited).
func (d *dumper) markInherited() error {
	byPID := map[int]*dumpProc{}
	for _, p := range d.procs {
		byPID[p.pid] = p
	}
	for _, p := range d.procs {
		parent := byPID[p.parent]
		if parent == nil {
			continue
		}
		n, err := mem.MarkInherited(p.st, parent.st, p.pid, parent.pid)
		if err != nil {
			return d.procErr(p, fmt.Errorf("pages shared with the parent: %w", err))
		}
		if n > 0 {
			d.log.Debug("pages shared with the parent", "pid", p.pid, "bytes", n)
		}
	}
	return nil
}

func (d *dumper) writeState(context.Context) error {
	d.log.Debug("pages written", "pid", d.pid, "since freeze", time.Since(d.frozen))
	if len(d.procs) > 1 {
		d.w.MarkTree()
	}
	for _, p := range d.procs {
		if err := d.w.WriteState(p.st); err != nil {
			return d.withResumeErr(err)
		}
	}
	return nil
}

func (d *dumper) commit(context.Context) error {
	if err := d.w.Commit(); err != nil {
		return d.withResumeErr(err)
	}
	d.committed = true
	d.log.Debug("committed", "pid", d.pid, "since freeze", time.Since(d.frozen))
	return nil
}

// finish resumes or kills the processes, the snapshot complete.
func (d *dumper) finish(context.Context) error {
	threads := 0
	for _, p := range d.procs {
		threads += len(p.st.Threads)
	}
	d.res = &DumpResult{PID: d.pid, Processes: len(d.procs), Threads: threads, FreezeStop: d.stop, Stats: d.stats, MemoryBytes: d.stats.Total.Bytes, PreCopy: d.preRes}
	if !d.resumed {
		if d.opts.LeaveRunning {
			d.resumeConns()
			d.resume(d.detachAll)
		} else {
			for _, p := range d.procs {
				sock.ResetConnections(p.st, d.log) // no TIME_WAIT left holding its ports
			}
			d.resume(d.killAll)
		}
	}
	if d.tcp != nil && d.resumeErr == nil {
		// Dead, the processes closed their sockets in repair mode: the
		// lock holds the connections for the restore.
		d.tcp.Keep()
		if n := d.tcp.Lock.Conns(); n > 0 {
			d.res.Conns, d.res.NetLock = n, d.tcp.Lock.Table()
		}
		d.tcp = nil
	}
	d.res.Freeze = d.freezeTime
	if d.resumeErr != nil {
		// The snapshot is complete; say so along with the failure.
		return fmt.Errorf("snapshot written, but %w", d.resumeErr)
	}
	return nil
}

// resume lets the processes go (fn: detachAll or killAll) and ends the
// freeze.
func (d *dumper) resume(fn func() error) {
	d.resumed = true
	d.resumeErr = fn()
	d.freezeTime = time.Since(d.frozen)
}

// detachAll lets every process of the tree run on.
func (d *dumper) detachAll() error {
	var errs []error
	for _, p := range d.procs {
		if p.p == nil {
			continue
		}
		if err := p.p.Detach(); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", p.pid, err))
		}
	}
	return errors.Join(errs...)
}

// killAll kills every process of the tree, children first.
func (d *dumper) killAll() error {
	var errs []error
	for i := len(d.procs) - 1; i >= 0; i-- {
		p := d.procs[i]
		if err := p.p.Doom(); err != nil {
			errs = append(errs, fmt.Errorf("pid %d: %w", p.pid, err))
		}
	}
	return errors.Join(errs...)
}

// cleanup, after a failed dump, removes what it wrote and resumes the
// processes as they were; it ends the tracer in any case.
func (d *dumper) cleanup(err *error) {
	d.pc.Close() // write tracking ends here at the latest, on every path
	if d.preP != nil && len(d.procs) == 0 && !d.resumed {
		if derr := d.preP.Detach(); derr != nil {
			d.log.Error("resume after failed pre-copy", "pid", d.pid, "err", derr)
		}
	}
	if *err != nil && d.w != nil && !d.committed {
		d.w.Abort()
	}
	d.resumeConns()
	if !d.resumed {
		if derr := d.detachAll(); derr != nil {
			d.log.Error("resume after failed dump", "pid", d.pid, "err", derr)
		}
	}
	if d.t != nil {
		d.t.Close()
	}
}

// withResumeErr adds to err the failure, if any, of the early resume.
func (d *dumper) withResumeErr(err error) error {
	if err == nil || d.resumeErr == nil {
		return err
	}
	return errors.Join(err, fmt.Errorf("resume: %w", d.resumeErr))
}

// pfKthread is PF_KTHREAD, the flag of a kernel thread in /proc/PID/stat.
const pfKthread = 0x00200000

// dumpable refuses a process that cannot be dumped, before touching it.
func dumpable(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("invalid pid %d", pid)
	}
	if pid == os.Getpid() {
		return fmt.Errorf("pid %d is snapctl itself", pid)
	}
	s, err := proc.ReadStatus(pid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pid %d: %w", pid, ptrace.ErrNoProcess)
		}
		return err
	}
	if s.Tgid != pid {
		return fmt.Errorf("pid %d is a thread of process %d: dump the process", pid, s.Tgid)
	}
	if s.State == 'Z' {
		return fmt.Errorf("pid %d is a zombie", pid)
	}
	if st, err := proc.ReadStat(pid); err == nil && st.Flags&pfKthread != 0 {
		return fmt.Errorf("%w: pid %d (%s) is a kernel thread: it has no memory or state of its own to dump", ErrUnsupported, pid, st.Comm)
	}
	if s.TracerPid != 0 {
		return tracedError(pid, s.TracerPid)
	}
	return nil
}

// tracedError names the process that traces pid: TracerPid is the
// tracing thread, which need not be its process's leader.
func tracedError(pid, tracer int) error {
	e := &ptrace.AlreadyTracedError{Pid: pid, TracerPid: tracer}
	ts, err := proc.ReadStatus(tracer)
	if err != nil {
		return e
	}
	e.TracerPid = ts.Tgid
	comm, err := proc.ReadComm(ts.Tgid)
	if err != nil {
		return e
	}
	return fmt.Errorf("%w (%s): detach it first", e, comm)
}

// children returns the child processes of every thread of pid.
func children(pid int) ([]int, error) {
	kids, err := proc.Children(pid)
	if err != nil && errors.Is(err, unix.ESRCH) {
		return nil, nil
	}
	return kids, err
}
