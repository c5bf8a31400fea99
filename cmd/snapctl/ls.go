package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/engine/units"
)

func runLs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := newFlags("ls", "[--json] [DIR|s3://BUCKET[/PREFIX]...]", `
List the snapshots in each DIR (the current directory by default): DIR
itself if it is one, else the directories in it that are; in an object
store, the prefix itself if it is one, else the prefixes right below it
that are. For each: its
processes, the memory dumped, the bytes it stores, when it was dumped, the
snapshot it takes unchanged blocks from (an incremental one's parent),
whether it is sealed or signed, and its state: complete, or the files of a
dump that did not finish (a dump killed, or a machine that went down),
which take room and which a new dump refuses (remove them with snapctl
rm; in an object store, snapctl cleanup also aborts the dump's uploads).
Nothing is opened but the manifests; nothing is checked (snapctl verify
does that).`, nil, stdout, stderr)
	asJSON := fl.Bool("json", false, "print JSON instead of a table")
	remote := cli.RemoteFlags(fl, false)
	dirs, err := fl.ParseOperands(args)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	if err := checkRemoteOperands(remote, dirs); err != nil {
		return err
	}
	var rows []lsRow
	for _, d := range dirs {
		var r []lsRow
		if store.IsRemote(d) {
			r, err = listRemote(ctx, d, remote.Options(ctx))
		} else {
			r, err = listSnapshots(d)
		}
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if rows == nil {
			rows = []lsRow{}
		}
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPROCESSES\tMEMORY\tSTORED\tCREATED\tPARENT\tPROTECTED\tSTATE")
	for _, r := range rows {
		created, procs, mem := "-", "-", "-"
		if !r.Created.IsZero() {
			created = r.Created.Local().Format("2006-01-02 15:04:05")
			procs = fmt.Sprint(r.Processes)
			mem = units.FormatSize(r.Memory)
		}
		parent, prot := r.Parent, r.Protected
		if parent == "" {
			parent = "-"
		}
		if prot == "" {
			prot = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, procs, mem, units.FormatSize(r.Stored), created, parent, prot, r.State)
	}
	return tw.Flush()
}

// lsRow is one snapshot of snapctl ls.
type lsRow struct {
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

// listSnapshots lists dir if it is a snapshot (or a dump's leftovers),
// else the directories in it that are.
func listSnapshots(dir string) ([]lsRow, error) {
	if r, ok, err := lsOne(dir, dir); err != nil || ok {
		if ok {
			return []lsRow{r}, nil
		}
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []lsRow
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
func lsOne(dir, name string) (r lsRow, ok bool, err error) {
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
func describeManifest(r *lsRow, dir string, o store.Options) {
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

// checkRemoteOperands refuses the object store's flags when no operand
// is in one.
func checkRemoteOperands(remote *cli.Remote, dirs []string) error {
	for _, d := range dirs {
		if store.IsRemote(d) {
			return remote.Check(d)
		}
	}
	return remote.Check(dirs[0])
}

// listRemote lists addr if it is a snapshot (or a dump's leftovers),
// else the prefixes right below it that are.
func listRemote(ctx context.Context, addr string, o store.Options) ([]lsRow, error) {
	p, err := s3.ListPrefix(ctx, addr, o)
	if err != nil {
		return nil, err
	}
	if r, ok := lsRemoteOne(p, addr, o); ok {
		return []lsRow{r}, nil
	}
	var out []lsRow
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
func lsRemoteOne(p *s3.Prefix, addr string, o store.Options) (r lsRow, ok bool) {
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
