package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/lazyfs/lazyfs/cmd/internal/catalog"
	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine/image/store"
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
	var rows []catalog.Entry
	for _, d := range dirs {
		var r []catalog.Entry
		if store.IsRemote(d) {
			r, err = catalog.ListRemote(ctx, d, remote.Options(ctx))
		} else {
			r, err = catalog.List(d)
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
			rows = []catalog.Entry{}
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
