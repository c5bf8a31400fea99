package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/fs"
)

// run is lazyfs: mount, serve until a signal or an external unmount, and
// unmount cleanly on every way out.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseArgs(args, stdout, stderr)
	if err != nil {
		return err
	}
	if c.version {
		fmt.Fprintf(stdout, "lazyfs %s\n", engine.Version)
		return nil
	}
	if c.completion != "" {
		return tool().WriteCompletion(stdout, c.completion)
	}
	if c.manpages != "" {
		_, err := tool().WriteManPages(c.manpages)
		return err
	}
	if c.unmount && c.force {
		return fs.ForceUnmount(c.mountpoint)
	}
	if c.unmount {
		return fs.Unmount(c.mountpoint)
	}
	if c.background && !isBackgroundChild() {
		return startBackground(ctx, args)
	}
	ready := readiness() // reports to the waiting parent under --background
	logger, closeLog, err := newLogger(c, stderr)
	if err != nil {
		ready(err)
		return err
	}
	defer closeLog()
	opts := c.options(ctx)
	opts.Logger = logger
	if opts.Keys, err = c.identity(); err != nil {
		ready(err)
		return err
	}
	srv, err := fs.Mount(c.snapshot, c.mountpoint, opts)
	ready(err)
	if err != nil {
		return err
	}
	defer srv.Unmount() // also on the error paths
	logger.Info("serving", "snapshot", c.snapshot, "mountpoint", srv.Mountpoint())
	select {
	case <-ctx.Done():
		logger.Info("unmounting", "mountpoint", srv.Mountpoint(), "cause", context.Cause(ctx))
		return srv.Unmount()
	case <-srv.Done():
		logger.Info("unmounted", "mountpoint", srv.Mountpoint())
		return nil
	}
}

// newLogger returns the logger of the mount: text records on stderr or
// appended to --log FILE; debug level with --debug.
func newLogger(c *config, stderr io.Writer) (*slog.Logger, func(), error) {
	level := slog.LevelInfo
	if c.debug {
		level = slog.LevelDebug
	}
	w, closeFn := stderr, func() {}
	if c.logFile != "" {
		f, err := os.OpenFile(c.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("open log: %w", err)
		}
		w, closeFn = f, func() { f.Close() }
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), closeFn, nil
}
