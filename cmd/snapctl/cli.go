package main

import (
	"context"
	"fmt"
	"io"

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
	}
}

func mainUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: snapctl COMMAND [options]\n\nsnapctl %s checkpoints a running Linux process into a compressed snapshot\nand restores it, eagerly or lazily with userfaultfd.\n\nCommands:\n", engine.Version)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'snapctl COMMAND --help' for the options of a command.\n\n%s", cli.StatusTable(nil))
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
	case "--version", "version":
		fmt.Fprintf(stdout, "snapctl %s\n", engine.Version)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	mainUsage(stderr)
	return cli.Usagef("unknown command %q", args[0])
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
