package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
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
			err = rmRemote(ctx, d, *force, dirs, remote.Options(ctx), stdout)
		} else {
			err = rmSnapshot(d, *force, dirs, stdout)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// rmRemote removes the snapshot at addr, an object store's prefix.
func rmRemote(ctx context.Context, addr string, force bool, removing []string, o store.Options, stdout io.Writer) error {
	addr = strings.TrimRight(addr, "/")
	var others []string // removing, spelled as the store lists them
	for _, r := range removing {
		others = append(others, strings.TrimRight(r, "/"))
	}
	removing = others
	p, err := s3.ListPrefix(ctx, addr, o)
	if err != nil {
		return err
	}
	if _, locked := p.Objects[s3.LockName]; locked {
		return fmt.Errorf("%s: %w: a dump's lock is there (a dump running, or one that died: snapctl cleanup -D %s says which, and clears it)", addr, image.ErrLocked, addr)
	}
	r, ok := lsRemoteOne(p, addr, o)
	if !ok {
		return fmt.Errorf("%s is neither a snapshot nor what a dump left: nothing removed", addr)
	}
	if !force && r.State == "complete" {
		child, err := remoteChildOf(ctx, addr, removing, o)
		if err != nil {
			return err
		}
		if child != "" {
			return fmt.Errorf("%s is the parent of incremental snapshot %s, which would not restore without it: remove that one first, or use --force", addr, child)
		}
	}
	var names []string
	if _, ok := p.Objects[image.ManifestName]; ok {
		names = append(names, image.ManifestName) // first: never a snapshot that seems whole
	}
	for _, n := range slices.Sorted(maps.Keys(p.Objects)) {
		if n != image.ManifestName && snapshotFile(n) {
			names = append(names, n)
		}
	}
	if err := p.Remove(ctx, names); err != nil {
		return err
	}
	if left := len(p.Objects); left > 0 {
		fmt.Fprintf(stdout, "removed the snapshot at %s; %d other objects left there\n", addr, left)
		return nil
	}
	fmt.Fprintf(stdout, "removed %s\n", addr)
	return nil
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// snapshotFile reports whether name is a file of a snapshot or of its
// dump, which rm removes.
func snapshotFile(name string) bool {
	return name == image.ManifestName || image.DumpFile(name) || strings.HasPrefix(name, "workingset-") || strings.HasPrefix(name, "."+image.ManifestName)
}

// remoteChildOf returns a snapshot beside addr (under the same prefix),
// not among removing, whose parent is addr; "" if none.
func remoteChildOf(ctx context.Context, addr string, removing []string, o store.Options) (string, error) {
	scheme, rest, _ := strings.Cut(strings.TrimRight(addr, "/"), "://")
	up := scheme + "://" + path.Dir(rest)
	if !strings.Contains(rest, "/") {
		return "", nil // a bucket: nothing beside it
	}
	p, err := s3.ListPrefix(ctx, up, o)
	if err != nil {
		return "", err
	}
	for _, c := range p.Children {
		if c == strings.TrimRight(addr, "/") || slices.Contains(removing, c) {
			continue
		}
		m, err := image.PeekManifest(c, o)
		if err != nil || m.Parent == nil {
			continue
		}
		// A snapshot at an address names its parent by its address (or
		// by a directory's absolute path: not this one).
		if strings.TrimRight(m.Parent.Path, "/") == strings.TrimRight(addr, "/") {
			return c, nil
		}
	}
	return "", nil
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
	// The manifest first: never a snapshot that seems whole.
	slices.SortFunc(names, func(a, b string) int {
		return cmpBool(b == image.ManifestName, a == image.ManifestName)
	})
	left := 0
	for _, n := range names {
		if !snapshotFile(n) {
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
		m, err := image.PeekManifest(c, store.Options{})
		if err != nil || m.Parent == nil || store.IsRemote(m.Parent.Path) {
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
