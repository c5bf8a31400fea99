package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"dump", "freeze a process and write its snapshot", runDump},
		{"restore", "rebuild a process from a snapshot, eagerly or --lazy", runRestore},
		{"inspect", "show what a snapshot holds", runInspect},
		{"verify", "check every block of a snapshot against its checksum", runVerify},
		{"check", "check that this machine has what restore needs", runCheck},
		{"cleanup", "list and clear what a dump into an object store left when it died", runCleanup},
		{"ls", "list the snapshots in a directory", runLs},
		{"rm", "remove snapshots, or what a dump that did not finish left", runRm},
		{"export", "write a snapshot into one file, an archive that restore and lazyfs read", runExport},
	}
}

// about is what snapctl does, in a sentence.
const about = "snapctl checkpoints a running Linux process into a compressed snapshot and restores it, eagerly or lazily with userfaultfd."

// topOptions are snapctl's own options, before any command.
type topOptions struct {
	version    bool
	completion string
	manpages   string
}

func topFlags(o *topOptions, stdout, stderr io.Writer) *cli.FlagSet {
	var exits []int
	for _, s := range cli.Statuses {
		if s.Code > cli.ExitUsage && s.Code != cli.ExitInterrupted {
			exits = append(exits, s.Code)
		}
	}
	f := cli.Command{
		Name:     "snapctl",
		Synopsis: []string{"COMMAND [options]", "--completion bash|zsh|fish", "--manpages DIR"},
		About:    about,
		Exits:    exits,
	}.Flags(stdout, stderr)
	f.BoolVar(&o.version, "version", false, "print the version and exit")
	f.StringVar(&o.completion, "completion", "", "print the completion script for `SHELL` (bash, zsh or fish) and exit; make install installs them")
	f.StringVar(&o.manpages, "manpages", "", "write the manual pages, snapctl(8) and one per command, made from this help, into `DIR` and exit")
	return f
}

func mainUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: snapctl COMMAND [options]\n\n%s\n\nCommands:\n", about)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'snapctl COMMAND --help' for the options of a command.\n\nOptions:\n")
	topFlags(&topOptions{}, io.Discard, io.Discard).PrintOptions(w)
	fmt.Fprintf(w, "\n%s", cli.StatusTable(nil))
}

// tool describes snapctl and its commands, for its manual pages and
// completion scripts: each command's options are those its --help shows.
func tool() (cli.Tool, error) {
	t := cli.Tool{
		Name:    "snapctl",
		Summary: "checkpoint and restore Linux processes through compressed snapshots",
		Version: "snapctl " + engine.Version,
		Top:     topFlags(&topOptions{}, io.Discard, io.Discard),
		SeeAlso: []string{"lazyfs(8)"},
	}
	for _, c := range commands() {
		d := &cli.Describer{}
		if err := c.run(context.Background(), []string{"--help"}, d, io.Discard); !errors.Is(err, cli.ErrHelp) || d.Set == nil {
			return t, fmt.Errorf("describe %s: %v", c.name, err)
		}
		t.Subs = append(t.Subs, cli.Sub{Name: c.name, Summary: c.summary, Set: d.Set})
	}
	return t, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		mainUsage(stderr)
		return cli.Usagef("no command given")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		mainUsage(stdout)
		return nil
	case "version":
		fmt.Fprintf(stdout, "snapctl %s\n", engine.Version)
		return nil
	}
	if strings.HasPrefix(args[0], "-") {
		return runTop(args, stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	mainUsage(stderr)
	return cli.Usagef("unknown command %q", args[0])
}

// runTop runs snapctl's own options: --version, --completion, --manpages.
func runTop(args []string, stdout, stderr io.Writer) error {
	var o topOptions
	f := topFlags(&o, stdout, stderr)
	if err := f.Parse(args); err != nil {
		return err
	}
	switch {
	case o.version:
		fmt.Fprintf(stdout, "snapctl %s\n", engine.Version)
		return nil
	case o.completion != "":
		t, err := tool()
		if err != nil {
			return err
		}
		return t.WriteCompletion(stdout, o.completion)
	case o.manpages != "":
		t, err := tool()
		if err != nil {
			return err
		}
		_, err = t.WriteManPages(o.manpages)
		return err
	}
	return f.Usagef("no command given")
}

// newFlags returns the flag set of the subcommand name.
func newFlags(name, synopsis, about string, exits []int, stdout, stderr io.Writer) *cli.FlagSet {
	return cli.Command{Name: "snapctl " + name, Synopsis: []string{synopsis}, About: about, Exits: exits}.Flags(stdout, stderr)
}

// threadsFlag is --decompress-threads: 0 automatic (the default: a
// restore decodes a whole snapshot at once, and nothing else runs yet),
// 1 serial, N a maximum.
func threadsFlag(fs *cli.FlagSet) *int {
	return fs.Int("decompress-threads", 0, "decode with up to `N` threads: 0 automatic from the CPU affinity mask and the work, 1 serial, N > 1 a maximum")
}

// trustFlag is --trust-snapshot (image.OpenOptions.Trust).
func trustFlag(fl *cli.FlagSet) *bool {
	return fl.Bool("trust-snapshot", false, "accept a snapshot that users other than you and root can change (its directory or a file writable by group or others, or owned by another user): a snapshot is memory and code a restore runs")
}

func requireDir(dir string) error {
	if dir == "" {
		return cli.Usagef("-D DIR (--images-dir) is required")
	}
	return nil
}
