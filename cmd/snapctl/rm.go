package main

import (
	"context"
	"io"

	"github.com/lazyfs/lazyfs/cmd/internal/catalog"
	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

func runRm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("rm", "[--force] DIR|s3://BUCKET/PREFIX...", `
Remove snapshots, or what a dump that did not finish left (snapctl ls
shows both): the files a dump writes, its working sets, then the directory
if nothing else is in it. The manifest goes first: a removal cut short
leaves a dump's leftovers, never a snapshot that seems whole. A snapshot
that an incremental snapshot beside it (in the same directory, or under
the same prefix) takes blocks from is refused, naming it, unless --force:
that one would not restore any more. A directory that is neither is
refused, and so is one a dump is writing now; in an object store, so is a
prefix a dump's lock holds (a dump running, or one that died: snapctl
cleanup clears what it left). Nothing but those files is removed: a
directory or prefix that holds others is left, and said.`,
		[]int{cli.ExitLocked}, stdout, stderr)
	force := fl.Bool("force", false, "remove a snapshot even if an incremental snapshot beside it takes blocks from it")
	remote := cli.RemoteFlags(fl, false)
	dirs, err := fl.ParseOperands(args)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		return fl.Usagef("want a snapshot DIR")
	}
	if err := checkRemoteOperands(remote, dirs); err != nil {
		return err
	}
	for _, d := range dirs {
		if store.IsRemote(d) {
			err = catalog.RemoveRemote(ctx, d, *force, dirs, remote.Options(ctx), stdout)
		} else {
			err = catalog.Remove(d, *force, dirs, stdout)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
