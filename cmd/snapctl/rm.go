package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image"
)

func runRm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rm", "[--force] DIR...", `
Remove snapshots, or what a dump that did not finish left (snapctl ls
shows both): the files a dump writes, its working sets, then the directory
if nothing else is in it. A snapshot that an incremental snapshot beside
it (in the same directory) takes blocks from is refused, naming it, unless
--force: that one would not restore any more. A directory that is neither
is refused, and so is one a dump is writing now. Nothing but those files
is removed: a directory that holds others is left, and said.`,
		[]int{cli.ExitLocked}, stdout, stderr)
	force := fs.Bool("force", false, "remove a snapshot even if an incremental snapshot beside it takes blocks from it")
	dirs, err := fs.ParseOperands(args)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		return fs.Usagef("want a snapshot DIR")
	}
	for _, d := range dirs {
		if err := rmSnapshot(d, *force, dirs, stdout); err != nil {
			return err
		}
	}
	return nil
}

// rmSnapshot removes snapshot dir; removing are all the ones asked for
// (a child removed with its parent does not hold it).
func rmSnapshot(dir string, force bool, removing []string, stdout io.Writer) error {
	r, ok, err := lsOne(dir, dir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is neither a snapshot nor what a dump left: nothing removed", dir)
	}
	if !force && r.State == "complete" {
		if child := childOf(dir, removing); child != "" {
			return fmt.Errorf("%s is the parent of incremental snapshot %s, which would not restore without it: remove that one first, or use --force", dir, child)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// A dump writing into it holds it locked.
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%s: %w", dir, image.ErrLocked)
		}
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	names, err := dirNames(dir)
	if err != nil {
		return err
	}
	left := 0
	for _, n := range names {
		if n != image.ManifestName && !image.DumpFile(n) && !strings.HasPrefix(n, "workingset-") && !strings.HasPrefix(n, "."+image.ManifestName) {
			left++
			continue
		}
		if err := unix.Unlinkat(int(d.Fd()), n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove %s: %w", filepath.Join(dir, n), err)
		}
	}
	if left > 0 {
		fmt.Fprintf(stdout, "removed the snapshot in %s; %d other files left there\n", dir, left)
		return nil
	}
	if err := os.Remove(dir); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed %s\n", dir)
	return nil
}

// childOf returns a snapshot beside dir (in its parent directory), not
// among removing, whose parent is dir; "" if none.
func childOf(dir string, removing []string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	skip := map[string]bool{}
	for _, r := range removing {
		if a, err := filepath.Abs(r); err == nil {
			skip[a] = true
		}
	}
	up := filepath.Dir(abs)
	ents, err := os.ReadDir(up)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		c := filepath.Join(up, e.Name())
		if !e.IsDir() || c == abs || skip[c] {
			continue
		}
		m, err := image.PeekManifest(c, image.RemoteOptions{})
		if err != nil || m.Parent == nil || image.IsRemote(m.Parent.Path) {
			continue
		}
		p := m.Parent.Path
		if !filepath.IsAbs(p) {
			p = filepath.Join(c, p)
		}
		if filepath.Clean(p) == abs {
			return c
		}
	}
	return ""
}
