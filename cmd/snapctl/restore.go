package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/fds/tty"
	"github.com/lazyfs/lazyfs/engine/helper"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/lazy"
	"github.com/lazyfs/lazyfs/engine/ns"
	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/fs"
)

// init runs a helper process of a restore (the userfaultfd keeper, the
// private mount's helper, the init of a new pid namespace: each registers
// itself with engine/helper) when snapctl was executed again as one:
// before anything else, and nothing else.
func init() { helper.Main() }

// runRestore is snapctl restore: flags to engine.RestoreOptions, in named
// steps: the flags and their checks, the snapshot opened, the options
// built (those of a lazy restore apart), the restore run and reported.
func runRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl, f := newRestoreFlags(stdout, stderr)
	if err := fl.Parse(args); err != nil {
		return err
	}
	inherited, term, err := f.check()
	if err != nil {
		return err
	}
	if term != nil {
		defer term.Close()
	}
	snap, log, closeAll, err := f.open(ctx, fl, stderr)
	if err != nil {
		return err
	}
	defer closeAll()
	opts := f.options(snap, inherited, log, stdout)
	terminal := isTerminal(stderr)
	if terminal {
		opts.Progress = progressPrinter(stderr, "restore", time.Second)
	}
	var progress *lazyProgress
	if *f.lazy {
		var endLazy func()
		if progress, endLazy, err = f.lazyOptions(&opts, snap, log, stderr, terminal); err != nil {
			return err
		}
		// After Restore: by then every process is fully served or dead.
		defer endLazy()
	}
	res, err := engine.Restore(ctx, opts)
	if progress != nil {
		progress.stop() // its last line before the summary
	}
	if err != nil {
		return err
	}
	printRestored(stdout, res, *f.lazy)
	for _, ws := range res.WorkingSets {
		printWorkingSet(stdout, ws)
	}
	if *f.statsFile != "" {
		return writeStats(*f.statsFile, newRestoreStats(*f.dir, *f.lazy, res))
	}
	return nil
}

// restoreFlags are snapctl restore's flags.
type restoreFlags struct {
	dir            *string
	threads        *int
	trust          *bool
	identity       func() (*seal.Keyring, error)
	pidfile        *string
	lazy           *bool
	mount          *string
	source         *string
	prefetchDelay  *time.Duration
	leaveStopped   *bool
	tcpEstablished *bool
	tcpClose       *bool
	inherit        []string
	shellJob       *bool
	fallback       *string
	pidns          *bool
	netns          *string
	into           *int
	workingSet     *string
	record         *bool
	recordFor      *time.Duration
	recordFaults   *int
	log            *cli.LogFlags
	statsFile      *string
	remote         *cli.Remote
}

// newRestoreFlags defines snapctl restore's flags, its help and its exit
// statuses.
func newRestoreFlags(stdout, stderr io.Writer) (*cli.FlagSet, *restoreFlags) {
	fl := newFlags("restore", "-D DIR [--lazy [--mount MNT] [--source mount|direct]] [--pidns] [--netns new|PATH] [options]", restoreHelp,
		[]int{cli.ExitUnsupported, cli.ExitPIDInUse, cli.ExitOtherKernel, cli.ExitBadSnapshot, cli.ExitUntrusted, cli.ExitFileChanged, cli.ExitNoPrivilege}, stdout, stderr)
	f := &restoreFlags{}
	f.dir = fl.String("D", "", "the snapshot `DIR`: a directory, s3://BUCKET/PREFIX, or an archive file (snapctl export)")
	fl.Alias("images-dir", "D")
	f.threads = threadsFlag(fl)
	f.trust = trustFlag(fl)
	f.identity = fl.Identity()
	f.pidfile = fl.String("pidfile", "", "write the restored pid to `FILE` once the process runs")
	f.lazy = fl.Bool("lazy", false, "serve anonymous memory on demand through userfaultfd")
	f.mount = fl.String("mount", "", "with --lazy: read pages from this running lazyfs mount (`MNT`) of the same snapshot")
	f.source = fl.String("source", "mount", "with --lazy: where pages are read, `SOURCE` mount (a FUSE mount of the snapshot) or direct (the snapshot files)")
	f.prefetchDelay = fl.Duration("prefetch-delay", 0, "with --lazy: start streaming the pages not yet faulted in only after `DELAY` (e.g. 200ms)")
	f.leaveStopped = fl.Bool("leave-stopped", false, "leave every restored process stopped, as if SIGSTOP came before its first instruction: SIGCONT lets it run (not with --lazy)")
	f.tcpEstablished = fl.Bool("tcp-established", false, "bring back connected the TCP connections the dump kept (dump --tcp-established)")
	f.tcpClose = fl.Bool("tcp-close", false, "close established TCP connections (the default without --tcp-established)")
	fl.Func("inherit-fd", "give snapctl's descriptor N for the descriptor leading outside of key KEY (`fd[N]:KEY`; KEY pipe:[INO], socket:[INO] or fd[M]); repeat for each", func(v string) error {
		f.inherit = append(f.inherit, v)
		return nil
	})
	f.shellJob = fl.Bool("shell-job", false, "give the descriptors on a terminal outside the tree (dump --shell-job) snapctl's own terminal")
	f.fallback = fl.String("external-fallback", fds.ExternalRefuse, "what a descriptor leading outside without --inherit-fd becomes: `MODE` refuse (the restore) or null (/dev/null)")
	f.pidns = fl.Bool("pidns", false, "restore into a new pid namespace (and mount namespace), with the original pid there")
	f.netns = fl.String("netns", "", "recreate sockets in network namespace `NS`: new (empty, loopback up) or the path of a namespace file")
	f.into = fl.Int("into", 0, "restore into the namespaces (mount, network, IPC, UTS, cgroup, pid) and cgroups of the running process `PID`, a container's placeholder: the processes keep the pids they had in their container, their files are looked up in its root")
	f.workingSet = fl.String("working-set", "auto", "with --lazy: `MODE` auto (fetch DIR/workingset-PID.img first if it matches the snapshot, from its own copy of the memory), blocks (the same from the snapshot's blocks that hold it) or off")
	f.record = fl.Bool("record-working-set", false, "with --lazy: record the memory the process touches first into DIR/workingset-PID.img (stops at SIGUSR1, --record-for or --record-faults)")
	f.recordFor = fl.Duration("record-for", 10*time.Second, "with --record-working-set: stop recording after `DURATION`")
	f.recordFaults = fl.Int("record-faults", 0, "with --record-working-set: stop recording after `N` faults (0: no limit)")
	f.log = cli.NewLogFlags(fl)
	f.statsFile = statsFlag(fl, "restore")
	f.remote = cli.RemoteFlags(fl, true)
	return fl, f
}

// check refuses the flags that go against each other, and returns the
// descriptors handed to the restore (--inherit-fd) with, for --shell-job,
// snapctl's terminal among them, which the caller closes.
func (f *restoreFlags) check() (inherited map[string]int, term *os.File, err error) {
	if err := checkStats(*f.statsFile); err != nil {
		return nil, nil, err
	}
	if *f.leaveStopped && *f.lazy {
		return nil, nil, cli.Usagef("--leave-stopped and --lazy are exclusive: a lazy restore keeps its processes traced until their memory is in")
	}
	if *f.into != 0 && (*f.pidns || *f.netns != "") {
		return nil, nil, cli.Usagef("--into joins the namespaces of a process: it goes with neither --pidns nor --netns")
	}
	if *f.into < 0 {
		return nil, nil, cli.Usagef("--into %d: want the pid of a running process", *f.into)
	}
	if *f.tcpEstablished && *f.tcpClose {
		return nil, nil, cli.Usagef("--tcp-established and --tcp-close are exclusive")
	}
	if *f.fallback != fds.ExternalRefuse && *f.fallback != fds.ExternalNull {
		return nil, nil, cli.Usagef("--external-fallback %q: want refuse or null", *f.fallback)
	}
	inherited, err = fds.ParseInherit(f.inherit)
	if err != nil {
		return nil, nil, cli.Usagef("%v", err)
	}
	if *f.shellJob {
		if _, given := inherited[tty.TerminalKey]; given {
			return nil, nil, cli.Usagef("--shell-job and --inherit-fd ...:%s are exclusive", tty.TerminalKey)
		}
		term, err = ownTerminal()
		if err != nil {
			return nil, nil, cli.Usagef("--shell-job: %v", err)
		}
		inherited[tty.TerminalKey] = int(term.Fd())
	}
	return inherited, term, nil
}

// open checks the flags that name the snapshot and the lazy restore's,
// then opens the logger and the snapshot; closeAll closes both.
func (f *restoreFlags) open(ctx context.Context, fl *cli.FlagSet, stderr io.Writer) (snap *image.Snapshot, log *slog.Logger, closeAll func(), err error) {
	if err := requireDir(*f.dir); err != nil {
		return nil, nil, nil, err
	}
	if err := f.remote.Check(*f.dir); err != nil {
		return nil, nil, nil, err
	}
	open := image.OpenOptions{Trust: *f.trust, Remote: f.remote.Options(ctx)}
	if err := checkLazyFlags(fl, *f.lazy, *f.source, *f.mount, *f.prefetchDelay); err != nil {
		return nil, nil, nil, err
	}
	if err := checkWorkingSetFlags(fl, *f.lazy, *f.workingSet, *f.record, *f.recordFor, *f.recordFaults); err != nil {
		return nil, nil, nil, err
	}
	log, closeLog, err := f.log.Logger(stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	fail := func(err error) (*image.Snapshot, *slog.Logger, func(), error) {
		closeLog()
		return nil, nil, nil, err
	}
	if *f.netns != "" && *f.netns != ns.NetNew {
		nf, err := ns.OpenNet(*f.netns)
		if err != nil {
			return fail(cli.Usagef("--netns: %v", err))
		}
		nf.Close()
	}
	keys, err := f.identity()
	if err != nil {
		return fail(err)
	}
	open.Keys = keys
	snap, err = image.OpenWith(*f.dir, open)
	if err != nil {
		return fail(fmt.Errorf("open snapshot: %w", err))
	}
	return snap, log, func() { snap.Close(); closeLog() }, nil
}

// options returns the restore's options, but for those of a lazy restore
// (lazyOptions).
func (f *restoreFlags) options(snap *image.Snapshot, inherited map[string]int, log *slog.Logger, stdout io.Writer) engine.RestoreOptions {
	opts := engine.RestoreOptions{Snapshot: snap, Threads: *f.threads, Logger: log, LeaveStopped: *f.leaveStopped,
		Namespaces:     ns.Namespaces{PID: *f.pidns, Net: *f.netns, Into: *f.into, Detach: []string{fs.FSType}},
		TCPEstablished: *f.tcpEstablished, Inherit: inherited, ExternalFallback: *f.fallback, ShellJob: *f.shellJob}
	started := time.Now()
	opts.Running = func(pid int) error {
		if *f.lazy {
			fmt.Fprintf(stdout, "pid %d running after %s; serving its memory\n", pid, time.Since(started).Round(time.Millisecond))
		}
		if *f.pidfile == "" {
			return nil
		}
		return writePidfile(*f.pidfile, pid)
	}
	return opts
}

// lazyOptions sets the options of a lazy restore in opts: its page source,
// working set, recording (stopped by SIGUSR1) and, on a terminal, the
// progress of the fill, which it returns. end closes the page source and
// stops the rest, once the restore has returned.
func (f *restoreFlags) lazyOptions(opts *engine.RestoreOptions, snap *image.Snapshot, log *slog.Logger, stderr io.Writer, terminal bool) (progress *lazyProgress, end func(), err error) {
	if opts.Source, err = pageSource(snap, *f.source, *f.mount, *f.threads, log); err != nil {
		return nil, nil, err
	}
	ends := []func(){func() {
		if err := opts.Source.Close(); err != nil {
			log.Warn("lazy page source", "err", err)
		}
	}}
	opts.Lazy = lazy.Options{PrefetchDelay: *f.prefetchDelay, Keeper: true}
	switch *f.workingSet {
	case "off":
		opts.Lazy.WorkingSet = lazy.WorkingSetOff
	case "blocks":
		opts.Lazy.WorkingSet = lazy.WorkingSetBlocks
	}
	if *f.record {
		stop := make(chan struct{})
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGUSR1)
		ends = append(ends, func() { signal.Stop(sig) })
		go func() {
			if _, ok := <-sig; ok {
				close(stop)
			}
		}()
		opts.Lazy.Record = &lazy.RecordOptions{For: *f.recordFor, Faults: *f.recordFaults, Stop: stop}
	}
	if terminal {
		progress = newLazyProgress(stderr)
		ends = append(ends, progress.stop)
		opts.Lazy.Progress = progress.update
	}
	return progress, func() {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i]()
		}
	}, nil
}

// restoreHelp is snapctl restore's description, in its --help and its
// manual page.
const restoreHelp = `
Rebuild the process of the snapshot in DIR, with its pid, threads, memory,
file descriptors and registers, and let it run (reparented to init, like
criu restore -d). A snapshot of a process tree is rebuilt whole: each
process with its pid, parent, session and process group, the descriptors,
pipes, socket pairs and shared memory its processes shared; none runs until
all are ready, and a failure kills every process made. With --lazy, each
process of a tree gets a pager of its own, all reading through one mount. Exits 0 once it runs; with --lazy, once every page is in.

With --lazy, anonymous memory is not filled before the process runs: it is
served on demand through userfaultfd (a few pages of a block stored raw,
a whole compressed block), while the rest streams in behind, faults first;
a thread reading in order, or at a stride, is served ahead of itself.
Blocks that must be decoded are read through a lazyfs mount of the
snapshot: a private one that snapctl mounts and unmounts itself (in a
mount namespace of its own, so nothing is left mounted if it dies), or with
--mount a running lazyfs mount of the same snapshot, whose cache several
restores then share; blocks stored raw, and with --source direct every
block, come from the snapshot files. The process does not wait for the
private mount: until its helper has mounted, snapctl decodes those blocks
itself from the snapshot files (and goes on so, with a warning, if the
mount cannot be made). Until every page is in, snapctl stays the
process's tracer (signals pass through): if snapctl dies, the process, and
any child it forked meanwhile, dies with it rather than run with memory
missing. A page that cannot be read (a corrupt block, a mount gone) kills
the process: it never runs on wrong bytes.

Working sets: with --lazy --record-working-set, the restore records the
memory the process faults in, in order (the background prefetch waits
meanwhile, so that every page it needs comes by a fault), until --record-for
has passed, --record-faults faults were served, or snapctl receives SIGUSR1
(send it once the process has answered what it should learn, e.g. its first
request: kill -USR1 SNAPCTL_PID); then it writes DIR/workingset-PID.img
(atomically: a restore killed before leaves the previous one, or none) and
streams in the rest. The file holds the touched pages' addresses and a copy
of their bytes, laid out contiguously and checksummed. Every later --lazy
restore of the snapshot maps that copy (no second copy in memory) and
places it first, in the recorded order, while faults are still served at
once (--working-set blocks fetches the snapshot's blocks that hold those
pages instead); --working-set off ignores it. A working set recorded on
another snapshot, or damaged, is ignored with a warning naming it: it only
orders reads, and never changes what the process reads. Each process of a
tree has its own. A snapshot in an object store keeps its working sets in
--cache-dir; without one there are none, and --record-working-set is
refused (status 3).

A sealed snapshot (dump --encrypt-to) needs --identity (or $LAZYFS_IDENTITY)
with an age identity that opens it, a signed one (dump --sign) the signer's
public key (KEY.pub). Without it, or with a key the snapshot does not answer
to (an age identity for a snapshot not sealed, a public key for one not
signed by it), the restore is refused before anything is created (status 8),
as it is when the manifest, state or index fails its authentication (naming
the file); a block that fails (naming the block and address) stops the
restore and kills what it created. Memory is decrypted as it is read, by
every source; a block that fails later, during a lazy restore, kills the
process like a corrupt one.
A sealed snapshot records no working set (--record-working-set is refused,
status 3: it would hold in clear the addresses touched and their memory); a
signed one records addresses only; with either, only a working set's
addresses are used, never its copy of the memory, which nothing
authenticates.

Established TCP connections are closed (their peers see a reset), unless
the dump kept them (dump --tcp-established) and --tcp-established is given:
they then come back connected, their queued bytes in place, and the
network lock that held them since the dump (an nftables table) is
deleted. The lock is deleted once the restore has begun, whether it brings
the connections back or fails; a restore refused before it creates
anything (a pid in use, a descriptor without --inherit-fd) keeps it, so
that it can be tried again. Listening sockets listen again. The kept
connections live in snapctl's network namespace, where their lock is:
--tcp-established with --netns is refused for a snapshot that holds
some.

A descriptor the dump recorded as leading outside the process, or the
tree (dump --external), takes a descriptor of snapctl's: --inherit-fd
fd[N]:KEY gives snapctl's fd N for the descriptor of key KEY, pipe:[INO]
or socket:[INO] as the dump named it, or fd[M] for descriptor M of the
process (of any process of a tree) (the same open file: the other end
still sees it). The keys are checked against every process of a tree
together. Without one, --external-fallback says what it becomes: refuse
(the default: the restore is refused, naming it) or null (/dev/null,
opened for its access mode). With --shell-job, the descriptors on a
terminal outside the tree (dump --shell-job) get snapctl's own terminal:
its standard input, output or error, the first that is a terminal, else
its controlling terminal (/dev/tty), set as the job's terminal was at the
dump (its termios: echo, canonical mode, control characters) just before
the processes run; a snapshot without any is restored as without it.

With --pidns, the process (every process of a tree) is restored into a
new pid namespace where it has its original pid and thread ids, so that
one snapshot restores many times at once. Its parent there is a small init (pid 1: snapctl
re-executed as lazyfs-pidns-init), which passes SIGTERM, SIGINT, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 on to it and exits with its status when it
ends, taking the namespace with it; a process that was pid 1 of its
namespace is the init itself. It also gets a mount namespace of its own
whose /proc is the new pid namespace's. The pid printed and written to
--pidfile (one line) is the process's pid outside (the one to signal);
snapctl prints a second line with its pid inside and the init's. A snapshot of a process that
lived in a pid namespace restores with --pidns only.

With --netns, its sockets are recreated in another network namespace:
new (an empty one with the loopback device up) or the namespace file
PATH (as ip netns add makes, /run/netns/NAME). Reach it with nsenter -t
PID -n, or ip netns exec NAME; a new one goes when the process does.
--pidns and --netns need CAP_SYS_ADMIN.`

// pageSource is where a lazy restore reads memory from: the snapshot's
// files (--source direct), a running lazyfs mount of it (--mount), or a
// private mount that snapctl makes (the default).
func pageSource(snap *image.Snapshot, source, mnt string, threads int, log *slog.Logger) (image.PageSource, error) {
	switch {
	case source == "direct":
		return image.DirectSource, nil
	case mnt != "":
		return fs.MountSource(mnt, snap)
	}
	return fs.PrivateSource(snap, threads, log)
}

// checkWorkingSetFlags refuses the working-set flags without --lazy and
// values that mean nothing.
func checkWorkingSetFlags(fl *cli.FlagSet, lazy bool, mode string, record bool, recordFor time.Duration, faults int) error {
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !lazy && (set["working-set"] || record) {
		return cli.Usagef("--working-set and --record-working-set need --lazy")
	}
	if !record && (set["record-for"] || set["record-faults"]) {
		return cli.Usagef("--record-for and --record-faults need --record-working-set")
	}
	if mode != "auto" && mode != "off" && mode != "blocks" {
		return cli.Usagef("--working-set %q: want auto, blocks or off", mode)
	}
	if recordFor < 0 || faults < 0 {
		return cli.Usagef("--record-for and --record-faults must not be negative")
	}
	return nil
}

// printWorkingSet says what the restore did with working sets.
func printWorkingSet(w io.Writer, ws lazy.WorkingSetResult) {
	switch {
	case ws.Recorded:
		fmt.Fprintf(w, "working set recorded: %s in %d ranges over %s (stopped by %s) in %s\n",
			units.FormatSize(ws.Bytes), ws.Ranges, ws.Span.Round(time.Millisecond), ws.Stop, ws.Path)
	case ws.Used:
		from := "the snapshot's blocks"
		if ws.Copy {
			from = "its copy"
		}
		fmt.Fprintf(w, "working set: %s in %d ranges fetched first from %s, %s\n", units.FormatSize(ws.Bytes), ws.Ranges, from, ws.Path)
	}
}

// checkLazyFlags refuses the lazy restore's flags without --lazy, and
// their combinations that mean nothing.
func checkLazyFlags(fl *cli.FlagSet, lazy bool, source, mount string, prefetchDelay time.Duration) error {
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !lazy && (set["mount"] || set["source"] || set["prefetch-delay"]) {
		return cli.Usagef("--mount, --source and --prefetch-delay need --lazy")
	}
	if source != "mount" && source != "direct" {
		return cli.Usagef("--source %q: want mount or direct", source)
	}
	if mount != "" && source == "direct" {
		return cli.Usagef("--mount and --source direct are exclusive")
	}
	if prefetchDelay < 0 {
		return cli.Usagef("--prefetch-delay must not be negative")
	}
	return nil
}

// printRestored prints the restore's one-line summary, and a line with
// its pid namespace if it has a new one.
func printRestored(w io.Writer, res *engine.RestoreResult, lazy bool) {
	defer func() {
		switch {
		case res.InitPID != 0:
			fmt.Fprintf(w, "pid %d is pid %d in its pid namespace, whose init is pid %d\n", res.PID, res.OwnPID, res.InitPID)
		case res.OwnPID != 0:
			fmt.Fprintf(w, "pid %d is pid %d in the pid namespace it joined\n", res.PID, res.OwnPID)
		}
	}()
	switch {
	case lazy && res.Lazy.Exited:
		fmt.Fprintf(w, "restored pid %d (%s): running after %s; it exited during the lazy phase, after %s\n",
			res.PID, processesThreads(res.Processes, res.Threads), res.ToRunning.Round(time.Millisecond), res.Total.Round(time.Millisecond))
	case lazy:
		l := res.Lazy
		fmt.Fprintf(w, "restored pid %d (%s): running after %s, all memory in after %s (%s served on %d faults, %s prefetched)\n",
			res.PID, processesThreads(res.Processes, res.Threads), res.ToRunning.Round(time.Millisecond), res.Total.Round(time.Millisecond),
			units.FormatSize(l.FaultBytes), l.Faults, units.FormatSize(l.PrefetchBytes))
	default:
		fmt.Fprintf(w, "restored pid %d (%s): %s of memory in %s\n", res.PID, processesThreads(res.Processes, res.Threads), units.FormatSize(res.Filled), res.Total.Round(time.Millisecond))
	}
}

// writePidfile writes pid to path atomically, through a descriptor of
// path's directory: a directory owned by root or the caller and, if group
// or others can write it, sticky (as /tmp), so that no other user can
// rename what is written there. The pid goes to a temporary file of a new,
// random name (O_CREAT|O_EXCL|O_NOFOLLOW: never a link someone planted),
// renamed over the name: rename replaces a link at the name itself, never
// what it points to.
func writePidfile(path string, pid int) error {
	dir, base := filepath.Dir(path), filepath.Base(path)
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("pidfile: %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return fmt.Errorf("pidfile: %s: %w", dir, err)
	}
	if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("pidfile: %w: %s belongs to uid %d, neither the caller (uid %d) nor root", image.ErrUntrusted, dir, st.Uid, euid)
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Errorf("pidfile: %w: %s is writable by group or others and not sticky (mode %04o)", image.ErrUntrusted, dir, st.Mode&0o7777)
	}
	var fd int
	var tmp string
	for range 100 {
		tmp = fmt.Sprintf(".%s.%d.tmp", base, rand.Uint64())
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("pidfile: create a temporary file in %s: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	_, err = f.WriteString(strconv.Itoa(pid) + "\n")
	if err == nil {
		err = f.Chmod(0o644) // whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, base)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("pidfile: %w", err)
	}
	return nil
}

// lazyProgress prints the lazy fill on a terminal without ever making the
// pager wait: the pager stores counters, a ticker prints them.
type lazyProgress struct {
	done, total atomic.Uint64
	quit        chan struct{}
	finished    chan struct{}
	once        sync.Once
}

func newLazyProgress(w io.Writer) *lazyProgress {
	p := &lazyProgress{quit: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(p.finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		printed := false
		show := func() {
			done, total := p.done.Load(), p.total.Load()
			if total == 0 {
				return
			}
			fmt.Fprintf(w, "\rlazy memory: %s of %s in (%.0f%%)  ", units.FormatSize(done), units.FormatSize(total), 100*float64(done)/float64(total))
			printed = true
		}
		for {
			select {
			case <-t.C:
				show()
			case <-p.quit:
				if printed {
					show()
					fmt.Fprintln(w)
				}
				return
			}
		}
	}()
	return p
}

func (p *lazyProgress) update(done, total uint64) {
	p.done.Store(done)
	p.total.Store(total)
}

func (p *lazyProgress) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.finished
}

// ownTerminal returns snapctl's terminal, for --shell-job: a copy of its
// standard input, output or error, the first that is a terminal (the
// same open file), else its controlling terminal opened (/dev/tty).
func ownTerminal() (*os.File, error) {
	for fd := range 3 {
		if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
			nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
			if err != nil {
				return nil, err
			}
			return os.NewFile(uintptr(nfd), "/dev/stdin"), nil
		}
	}
	f, err := os.OpenFile("/dev/tty", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("snapctl has no terminal to give (no standard stream is one, and /dev/tty: %w)", err)
	}
	return f, nil
}
