package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/units"
)

func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("cleanup", "-D s3://BUCKET/PREFIX [--dry-run] [--force]", `
List and clear what a dump into an object store left when it died (killed,
or its host lost): the lock object that keeps other dumps out of the
prefix, the objects it wrote if it never committed the snapshot, and
multipart uploads it never completed, which the store keeps (and bills)
until they are aborted. A complete snapshot's objects are never removed;
objects that no lock marks as a dump's are listed, never removed.

The lock names the dump's host, pid and start time. A dump that runs on
this host is never cleared; one on another host (or with an older lock
that says too little) only with --force, once you know it is gone.
A directory needs no cleanup: its lock goes with the dump that held it.`,
		[]int{cli.ExitLocked, cli.ExitNoPrivilege}, stdout, stderr)
	dir := fl.String("D", "", "the snapshot's address `s3://BUCKET/PREFIX`")
	fl.Alias("images-dir", "D")
	dry := fl.Bool("dry-run", false, "list what would be cleared; change nothing")
	fl.Alias("n", "dry-run")
	force := fl.Bool("force", false, "clear a lock whose dump ran on another host: make sure that dump no longer runs")
	remote := cli.RemoteFlags(fl, false)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if err := requireDir(*dir); err != nil {
		return err
	}
	if !store.IsRemote(*dir) {
		return cli.Usagef("cleanup is for a snapshot in an object store (s3://BUCKET/PREFIX); %s is a directory, whose lock goes with the dump that held it", *dir)
	}
	l, err := s3.FindLeftovers(ctx, *dir, remote.Options(ctx))
	if err != nil {
		return err
	}
	addr := l.Addr.String()
	if l.Lock != nil {
		fmt.Fprintf(stdout, "%s: locked by %s\n", addr, l.Lock.Describe())
	}
	if l.Complete {
		fmt.Fprintf(stdout, "%s: holds a complete snapshot (kept)\n", addr)
	}
	for _, u := range l.Uploads {
		when := ""
		if !u.Initiated.IsZero() {
			when = " started " + u.Initiated.UTC().Format(time.RFC3339) + ","
		}
		fmt.Fprintf(stdout, "upload  %s %s never completed\n", u.Name, when)
	}
	for _, o := range l.Objects {
		fmt.Fprintf(stdout, "object  %s  %s, of the dump that holds the lock\n", o.Name, units.FormatSize(uint64(o.Size)))
	}
	for _, u := range l.OtherUploads {
		fmt.Fprintf(stdout, "other   upload of %s, not a dump's (no lock, no marker): kept\n", u.Name)
	}
	for _, m := range l.Stale {
		fmt.Fprintf(stdout, "marker  %s, whose upload is gone already\n", m)
	}
	for _, o := range l.Others {
		fmt.Fprintf(stdout, "other   %s  %s, not a dump's (no lock): kept\n", o.Name, units.FormatSize(uint64(o.Size)))
	}
	if l.Empty() {
		fmt.Fprintf(stdout, "%s: nothing left by a dump\n", addr)
		return nil
	}
	if *dry {
		fmt.Fprintf(stdout, "%s: dry run: nothing changed\n", addr)
		return nil
	}
	if err := l.Clear(ctx, *force, func(what string) { fmt.Fprintf(stdout, "%s\n", what) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: cleared\n", addr)
	return nil
}
