package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/fs"
)

func runRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("restore", "-D DIR [--lazy [--mount MNT] [--source mount|direct]] [options]", `
Rebuild the process of the snapshot in DIR, with its pid, threads, memory,
file descriptors and registers, and let it run (reparented to init, like
criu restore -d). Exits 0 once it runs; with --lazy, once every page is in.

With --lazy, anonymous memory is not filled before the process runs: it is
served on demand through userfaultfd, block by block, read through a lazyfs
mount of the snapshot, while the rest streams in behind. Until every page is
in, snapctl stays the process's tracer: if snapctl dies, the process dies
with it rather than run with memory missing.

Established TCP connections are closed (their peers saw a reset when the
dumped process went away); listening sockets listen again.`, stderr)
	dir := fl.String("D", "", "snapshot directory")
	alias(fl, "images-dir", "D")
	threads := threadsFlag(fl)
	pidfile := fl.String("pidfile", "", "write the restored pid to `FILE` once the process runs")
	lazy := fl.Bool("lazy", false, "serve anonymous memory on demand through userfaultfd")
	mount := fl.String("mount", "", "with --lazy: read pages from this running lazyfs mount (`MNT`) of the same snapshot")
	source := fl.String("source", "mount", "with --lazy: read pages through a FUSE mount, or 'direct' from the snapshot files")
	fl.Bool("tcp-close", true, "close established TCP connections (the only mode)")
	verbose := fl.Bool("v", false, "log each step")
	if err := parse(fl, args); err != nil {
		return err
	}
	if err := requireDir(*dir); err != nil {
		return err
	}
	if !*lazy && (*mount != "" || fl.Lookup("source").Value.String() != "mount") {
		return usagef("--mount and --source need --lazy")
	}
	if *source != "mount" && *source != "direct" {
		return usagef("--source %q: want mount or direct", *source)
	}
	if *mount != "" && *source == "direct" {
		return usagef("--mount and --source direct are exclusive")
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opts := engine.RestoreOptions{Dir: *dir, Threads: *threads, Logger: log}
	if isTerminal(stderr) {
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
	if *lazy {
		src, done, err := lazySource(*dir, *mount, *source, *threads, log)
		if err != nil {
			return err
		}
		defer done()
		opts.Lazy = src
	}
	res, err := engine.Restore(ctx, opts)
	if err != nil {
		return err
	}
	if *lazy {
		l := res.Lazy
		fmt.Fprintf(stdout, "restored pid %d (%d threads): running after %s, all memory in after %s (%s served on %d faults, %s prefetched)\n",
			res.PID, res.Threads, res.ToRunning.Round(time.Millisecond), res.Total.Round(time.Millisecond),
			units.FormatSize(l.FaultBytes), l.Faults, units.FormatSize(l.PrefetchBytes))
	} else {
		fmt.Fprintf(stdout, "restored pid %d (%d threads): %s of memory in %s\n", res.PID, res.Threads, units.FormatSize(res.Filled), res.Total.Round(time.Millisecond))
	}
	return nil
}

// writePidfile writes pid atomically.
func writePidfile(path string, pid int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("pidfile: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("pidfile: %w", err)
	}
	return nil
}

// lazySource returns what a lazy restore reads pages from: a running
// lazyfs mount, a private mount of our own, or the snapshot files.
func lazySource(dir, mnt, source string, threads int, log *slog.Logger) (io.ReaderAt, func(), error) {
	snap, err := image.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	pids := snap.PIDs()
	if len(pids) != 1 {
		return nil, nil, fmt.Errorf("snapshot holds %d processes; this build restores one", len(pids))
	}
	pid := pids[0]
	if source == "direct" {
		r, err := snap.OpenPages(pid, image.ReaderOptions{Threads: threads, Logger: log})
		if err != nil {
			return nil, nil, err
		}
		return r, func() { r.Close() }, nil
	}
	var srv *fs.Server
	if mnt == "" {
		tmp, err := os.MkdirTemp("", "snapctl-lazy-")
		if err != nil {
			return nil, nil, err
		}
		srv, err = fs.Mount(dir, tmp, fs.Options{DecompressThreads: threads, DirectIO: true, Logger: log})
		if err != nil {
			os.Remove(tmp)
			return nil, nil, fmt.Errorf("mount snapshot: %w", err)
		}
		mnt = tmp
	} else if err := sameSnapshot(dir, mnt); err != nil {
		return nil, nil, err
	}
	f, err := os.Open(filepath.Join(mnt, strconv.Itoa(pid), "mem"))
	if err != nil {
		if srv != nil {
			srv.Unmount()
			os.Remove(mnt)
		}
		return nil, nil, fmt.Errorf("open pages through the mount: %w", err)
	}
	return f, func() {
		f.Close()
		if srv != nil {
			if err := srv.Unmount(); err != nil {
				log.Error("unmount private mount", "mountpoint", mnt, "err", err)
			}
			os.Remove(mnt)
		}
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
