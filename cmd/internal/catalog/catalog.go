// Package catalog finds the snapshots a directory or an object store's
// prefix holds, and removes them: what snapctl ls lists and snapctl rm
// removes. It reads manifests only (image.PeekManifest), never a
// snapshot's pages, and removes a snapshot's manifest first, so that a
// removal cut short leaves a dump's leftovers, never a snapshot that
// seems whole.
package catalog

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
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
)

// Entry is one snapshot, or what a dump left: a row of snapctl ls.
type Entry struct {
	Name      string    `json:"name"`
	Processes int       `json:"processes"`
	Memory    uint64    `json:"memory_bytes"`
	Stored    uint64    `json:"stored_bytes"`
	Created   time.Time `json:"created,omitzero"`
	Parent    string    `json:"parent,omitempty"`
	// Protected: "sealed", "signed", "sealed, signed" or "".
	Protected string `json:"protected,omitempty"`
	// State: "complete", or "incomplete: ..." for a dump's leftovers.
	State string `json:"state"`
}

// List lists dir if it is a snapshot (or a dump's leftovers),
// else the directories in it that are.
func List(dir string) ([]Entry, error) {
	if r, ok, err := lsOne(dir, dir); err != nil || ok {
		if ok {
			return []Entry{r}, nil
		}
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, ok, err := lsOne(filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// lsOne describes dir, named name, if it is a snapshot or holds what a
// dump left; ok is false for any other directory.
func lsOne(dir, name string) (r Entry, ok bool, err error) {
	r.Name = name
	names, err := dirNames(dir)
	if err != nil {
		return r, false, err
	}
	for _, n := range names {
		if fi, err := os.Lstat(filepath.Join(dir, n)); err == nil && fi.Mode().IsRegular() {
			r.Stored += uint64(fi.Size())
		}
	}
	if !slices.Contains(names, image.ManifestName) {
		for _, n := range names {
			if image.DumpFile(n) {
				r.State = "incomplete: a dump that did not finish (rm -r " + dir + ")"
				return r, true, nil
			}
		}
		return r, false, nil
	}
	describeManifest(&r, dir, store.Options{})
	return r, true, nil
}

// describeManifest fills r from the manifest of the snapshot at dir.
func describeManifest(r *Entry, dir string, o store.Options) {
	m, err := image.PeekManifest(dir, o)
	if err != nil {
		r.State = "damaged: " + err.Error()
		return
	}
	r.Created, r.Processes, r.State = m.Created, len(m.Processes), "complete"
	for _, p := range m.Processes {
		r.Memory += p.Pages4K * image.PageSize
	}
	if m.Parent != nil {
		r.Parent = m.Parent.Path
	}
	var prot []string
	if m.Seal != nil {
		prot = append(prot, "sealed")
	}
	if m.Signature != nil {
		prot = append(prot, "signed")
	}
	r.Protected = strings.Join(prot, ", ")
}

// ListRemote lists addr if it is a snapshot (or a dump's leftovers),
// else the prefixes right below it that are.
func ListRemote(ctx context.Context, addr string, o store.Options) ([]Entry, error) {
	p, err := s3.ListPrefix(ctx, addr, o)
	if err != nil {
		return nil, err
	}
	if r, ok := lsRemoteOne(p, addr, o); ok {
		return []Entry{r}, nil
	}
	var out []Entry
	for _, child := range p.Children {
		q, err := s3.ListPrefix(ctx, child, o)
		if err != nil {
			return nil, err
		}
		if r, ok := lsRemoteOne(q, child, o); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// lsRemoteOne describes the prefix p at addr if it is a snapshot or
// holds what a dump left.
func lsRemoteOne(p *s3.Prefix, addr string, o store.Options) (r Entry, ok bool) {
	r.Name = addr
	for _, size := range p.Objects {
		r.Stored += uint64(size)
	}
	if _, ok := p.Objects[image.ManifestName]; ok {
		describeManifest(&r, addr, o)
		if _, locked := p.Objects[s3.LockName]; locked && r.State == "complete" {
			r.State = "complete, locked: a dump died as it committed (snapctl cleanup -D " + addr + ")"
		}
		return r, true
	}
	_, locked := p.Objects[s3.LockName]
	for n := range p.Objects {
		if locked || image.DumpFile(n) {
			r.State = "incomplete: a dump that did not finish, or one running (snapctl cleanup -D " + addr + ")"
			return r, true
		}
	}
	return r, false
}

// dirNames lists the names in dir.
func dirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	return names, nil
}

// RemoveRemote removes the snapshot at addr, an object store's prefix.
func RemoveRemote(ctx context.Context, addr string, force bool, removing []string, o store.Options, stdout io.Writer) error {
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

// Remove removes snapshot dir; removing are all the ones asked for
// (a child removed with its parent does not hold it).
func Remove(dir string, force bool, removing []string, stdout io.Writer) error {
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
