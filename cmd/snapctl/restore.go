package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/fs"
)

// init runs the lazy restore's helper when snapctl was re-executed as
// one (see lazyHelper): before anything else, and nothing else.
func init() {
	if filepath.Base(os.Args[0]) == uffd.KeeperArg0 {
		os.Exit(uffd.KeeperMain(os.Args, helperSetup))
	}
}

func runRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("restore", "-D DIR [--lazy [--mount MNT] [--source mount|direct]] [options]", `
Rebuild the process of the snapshot in DIR, with its pid, threads, memory,
file descriptors and registers, and let it run (reparented to init, like
criu restore -d). Exits 0 once it runs; with --lazy, once every page is in.

With --lazy, anonymous memory is not filled before the process runs: it is
served on demand through userfaultfd, a block at a time, while the rest
streams in behind, faults first. Pages are read through a lazyfs mount of
the snapshot: a private one that snapctl mounts and unmounts itself (in a
mount namespace of its own, so nothing is left mounted if it dies), or with
--mount a running lazyfs mount of the same snapshot, whose cache several
restores then share; or with --source direct from the snapshot files. Until
every page is in, snapctl stays the process's tracer (signals pass through):
if snapctl dies, the process, and any child it forked meanwhile, dies with
it rather than run with memory missing. A page that cannot be read (a
corrupt block, a mount gone) kills the process: it never runs on wrong
bytes.

Established TCP connections are closed (their peers saw a reset when the
dumped process went away); listening sockets listen again.`,
		[]int{cli.ExitUnsupported, cli.ExitPIDInUse, cli.ExitOtherKernel, cli.ExitBadSnapshot, cli.ExitFileChanged, cli.ExitNoPrivilege}, stdout, stderr)
	dir := fl.String("D", "", "the snapshot directory `DIR`")
	fl.Alias("images-dir", "D")
	threads := threadsFlag(fl)
	pidfile := fl.String("pidfile", "", "write the restored pid to `FILE` once the process runs")
	lazy := fl.Bool("lazy", false, "serve anonymous memory on demand through userfaultfd")
	mount := fl.String("mount", "", "with --lazy: read pages from this running lazyfs mount (`MNT`) of the same snapshot")
	source := fl.String("source", "mount", "with --lazy: where pages are read, `SOURCE` mount (a FUSE mount of the snapshot) or direct (the snapshot files)")
	prefetchDelay := fl.Duration("prefetch-delay", 0, "with --lazy: start streaming the pages not yet faulted in only after `DELAY` (e.g. 200ms)")
	fl.Bool("tcp-close", true, "close established TCP connections: the only mode, on by default")
	verbose := fl.Bool("v", false, "log each step")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if err := requireDir(*dir); err != nil {
		return err
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !*lazy && (set["mount"] || set["source"] || set["prefetch-delay"]) {
		return cli.Usagef("--mount, --source and --prefetch-delay need --lazy")
	}
	if *source != "mount" && *source != "direct" {
		return cli.Usagef("--source %q: want mount or direct", *source)
	}
	if *mount != "" && *source == "direct" {
		return cli.Usagef("--mount and --source direct are exclusive")
	}
	if *prefetchDelay < 0 {
		return cli.Usagef("--prefetch-delay must not be negative")
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opts := engine.RestoreOptions{Dir: *dir, Threads: *threads, Logger: log}
	tty := isTerminal(stderr)
	if tty {
		opts.Progress = progressPrinter(stderr, "restore", time.Second)
	}
	started := time.Now()
	opts.Running = func(pid int) error {
		if *lazy {
			fmt.Fprintf(stdout, "pid %d running after %s; serving its memory\n", pid, time.Since(started).Round(time.Millisecond))
		}
		if *pidfile == "" {
			return nil
		}
		return writePidfile(*pidfile, pid)
	}
	var progress *lazyProgress
	if *lazy {
		h, err := startLazyHelper(*dir, *mount, *source, *threads, log)
		if err != nil {
			return err
		}
		// After Restore: by then the process tree is fully served or dead.
		defer h.close()
		opts.Lazy = h.src
		opts.LazyOptions.PrefetchDelay = *prefetchDelay
		if h.private {
			// Reads from the private mount wait on the helper's FUSE
			// server (direct I/O: every read goes to it): with a worker
			// per CPU, one reads while another copies. Measured (1 GiB
			// modelserver, 256 KiB blocks, 2 vCPUs, medians of 5 on a
			// busy machine): "touch 1" answered after 1.06 s with two
			// workers against 1.41 s with one, "token" 1.30 s against
			// 1.83 s (with 4 KiB blocks "touch 1" is faster with one,
			// 1.03 s against 1.65 s, but then --source direct answers in
			// 0.27 s).
			opts.LazyOptions.Pager.Workers = min(4, max(2, runtime.GOMAXPROCS(0)))
		}
		if h.keeper != nil {
			opts.LazyOptions.Holder = h.keeper
		}
		if tty {
			progress = newLazyProgress(stderr)
			defer progress.stop()
			opts.LazyOptions.Progress = progress.update
		}
	}
	res, err := engine.Restore(ctx, opts)
	if progress != nil {
		progress.stop() // its last line before the summary
	}
	if err != nil {
		return err
	}
	if *lazy && res.Lazy.Exited {
		fmt.Fprintf(stdout, "restored pid %d (%d threads): running after %s; it exited during the lazy phase, after %s\n",
			res.PID, res.Threads, res.ToRunning.Round(time.Millisecond), res.Total.Round(time.Millisecond))
	} else if *lazy {
		l := res.Lazy
		fmt.Fprintf(stdout, "restored pid %d (%d threads): running after %s, all memory in after %s (%s served on %d faults, %s prefetched)\n",
			res.PID, res.Threads, res.ToRunning.Round(time.Millisecond), res.Total.Round(time.Millisecond),
			units.FormatSize(l.FaultBytes), l.Faults, units.FormatSize(l.PrefetchBytes))
	} else {
		fmt.Fprintf(stdout, "restored pid %d (%d threads): %s of memory in %s\n", res.PID, res.Threads, units.FormatSize(res.Filled), res.Total.Round(time.Millisecond))
	}
	return nil
}

// writePidfile writes pid to path atomically.
func writePidfile(path string, pid int) error {
	// A temporary file of a new, random name (O_CREAT|O_EXCL: never a link
	// someone planted), renamed over path: rename replaces a link at path
	// itself, never what it points to.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("pidfile: %w", err)
	}
	_, err = f.WriteString(strconv.Itoa(pid) + "\n")
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
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

// lazyHelper is what a lazy restore needs besides the engine: the source
// of pages, and a helper process (snapctl re-executed, see uffd.Keeper)
// that holds copies of the userfaultfds while pages are missing and, for
// --source mount without --mount, serves the private mount. The mount
// must be served by another process than the one reading from it: a
// SIGKILLed snapctl whose threads wait on FUSE requests to its own server
// could never exit (they wait uninterruptibly for answers that its dead
// server threads will never send).
type lazyHelper struct {
	src     io.ReaderAt
	private bool // src is the helper's private mount
	keeper  *uffd.Keeper
	closer  func()
	log     *slog.Logger
}

// helperSetupWait bounds how long the helper may take to mount.
const helperSetupWait = 30 * time.Second

// startLazyHelper starts the helper and opens the source: a running
// lazyfs mount (mnt), the helper's private mount, or the snapshot files.
func startLazyHelper(dir, mnt, source string, threads int, log *slog.Logger) (*lazyHelper, error) {
	snap, err := image.Open(dir)
	if err != nil {
		return nil, err
	}
	pids := snap.PIDs()
	if len(pids) != 1 {
		return nil, fmt.Errorf("snapshot holds %d processes; this build restores one", len(pids))
	}
	pid := pids[0]
	h := &lazyHelper{log: log, closer: func() {}}
	exe, err := os.Executable()
	if err == nil {
		var args []string
		if source == "mount" && mnt == "" {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return nil, err
			}
			args = []string{"mount", abs, strconv.Itoa(pid), strconv.Itoa(threads)}
		}
		h.keeper, err = uffd.StartKeeper(exe, args...)
	}
	if err != nil {
		if source == "mount" && mnt == "" {
			return nil, fmt.Errorf("start the private mount: %w", err)
		}
		// Only the safety net is missing.
		log.Warn("no userfaultfd keeper: if snapctl is killed, the process may see zero pages before it dies", "err", err)
	}
	switch {
	case source == "direct":
		r, err := snap.OpenPages(pid, image.ReaderOptions{Threads: threads, Logger: log})
		if err != nil {
			h.close()
			return nil, err
		}
		h.src, h.closer = r, func() { r.Close() }
	case mnt != "":
		if err := sameSnapshot(dir, mnt); err != nil {
			h.close()
			return nil, err
		}
		f, err := os.Open(filepath.Join(mnt, strconv.Itoa(pid), "mem"))
		if err != nil {
			h.close()
			return nil, fmt.Errorf("--mount %s: open pages: %w", mnt, err)
		}
		h.src, h.closer = f, func() { f.Close() }
	default:
		_, fds, err := h.keeper.Setup(helperSetupWait)
		if err == nil && len(fds) != 1 {
			err = fmt.Errorf("the helper sent %d fds, want 1", len(fds))
		}
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			h.close()
			return nil, fmt.Errorf("private mount: %w", err)
		}
		f := os.NewFile(uintptr(fds[0]), "mem")
		h.src, h.closer, h.private = f, func() { f.Close() }, true
	}
	return h, nil
}

// close closes the source, then lets the helper go (it drops its copies
// of the userfaultfds and unmounts).
func (h *lazyHelper) close() {
	h.closer()
	if h.keeper != nil {
		if err := h.keeper.Close(); err != nil {
			h.log.Warn("lazy restore helper", "err", err)
		}
	}
}

// helperSetup is the helper's setup (uffd.SetupFunc): without arguments
// nothing; with "mount DIR PID THREADS" it mounts the snapshot privately
// and sends back an fd of MNT/PID/mem.
func helperSetup(args []string) ([]byte, []int, func(), error) {
	if len(args) == 0 {
		return nil, nil, nil, nil
	}
	if len(args) != 4 || args[0] != "mount" {
		return nil, nil, nil, fmt.Errorf("helper: unknown setup %q", args)
	}
	pid, err1 := strconv.Atoi(args[2])
	threads, err2 := strconv.Atoi(args[3])
	if err := errors.Join(err1, err2); err != nil {
		return nil, nil, nil, fmt.Errorf("helper: %w", err)
	}
	log := slog.New(slog.DiscardHandler)
	// Measured on the 1 GiB modelserver (BenchmarkLazyRestore): direct
	// I/O beats the page cache here (all memory in: 0.7-0.8 s against
	// 1.1-1.4 s; nobody rereads these pages), and a 16 MiB cache beats the
	// default 256 MiB (its buffers are reused while they are warm; no
	// block is read twice).
	f, unmount, err := privateMount(args[1], pid, fs.Options{DecompressThreads: threads, DirectIO: true, CacheSize: 16 << 20, Logger: log}, log)
	if err != nil {
		return nil, nil, nil, err
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unmount()
		return nil, nil, nil, fmt.Errorf("helper: dup: %w", err)
	}
	return nil, []int{fd}, unmount, nil
}

// privateMount mounts the snapshot on a temporary directory and opens
// MNT/<pid>/mem. As root the mount lives in a mount namespace of one
// thread of ours: nobody else sees it, and when the process exits the
// namespace and the mount go with it. The returned func closes the file
// and unmounts.
func privateMount(dir string, pid int, opts fs.Options, log *slog.Logger) (*os.File, func(), error) {
	type result struct {
		f   *os.File
		err error
	}
	res := make(chan result)
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		// The thread never returns to the runtime's pool: it exits with
		// this goroutine, and its mount namespace with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			log.Debug("private mount namespace", "err", err)
		} else if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			// Without it the mount would propagate to the shared parent.
			res <- result{err: fmt.Errorf("private mount namespace: %w", err)}
			return
		}
		tmp, err := os.MkdirTemp("", "snapctl-lazy-")
		if err != nil {
			res <- result{err: err}
			return
		}
		defer os.Remove(tmp)
		srv, err := fs.Mount(dir, tmp, opts)
		if err != nil {
			res <- result{err: fmt.Errorf("mount snapshot: %w", err)}
			return
		}
		defer func() {
			if err := srv.Unmount(); err != nil {
				log.Error("unmount private mount", "mountpoint", tmp, "err", err)
			}
		}()
		f, err := os.Open(srv.MemPath(pid))
		if err != nil {
			res <- result{err: fmt.Errorf("open pages through the mount: %w", err)}
			return
		}
		res <- result{f: f}
		<-quit
		f.Close()
	}()
	r := <-res
	if r.err != nil {
		<-finished
		return nil, nil, r.err
	}
	return r.f, func() {
		close(quit)
		<-finished
	}, nil
}

// sameSnapshot checks that mnt serves the snapshot in dir.
func sameSnapshot(dir, mnt string) error {
	a, err := os.ReadFile(filepath.Join(dir, image.ManifestName))
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(mnt, image.ManifestName))
	if err != nil {
		return fmt.Errorf("--mount %s: not a lazyfs mount: %w", mnt, err)
	}
	if !bytes.Equal(a, b) {
		return fmt.Errorf("--mount %s serves another snapshot than %s", mnt, dir)
	}
	return nil
}
