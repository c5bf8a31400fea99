package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lazyfs/lazyfs/engine/units"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// errHelp is returned when --help was asked for: exit code 0.
var errHelp = flag.ErrHelp

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
	}
}

const version = "0.1.0"

func mainUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: snapctl COMMAND [options]\n\nsnapctl %s checkpoints a running Linux process into a compressed snapshot\nand restores it, eagerly or lazily with userfaultfd.\n\nCommands:\n", version)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'snapctl COMMAND --help' for the options of a command.\nExit status: 0 success, 1 failure, 2 usage error.\n")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		mainUsage(stderr)
		return usagef("no command given")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		mainUsage(stdout)
		return nil
	case "--version", "version":
		fmt.Fprintf(stdout, "snapctl %s\n", version)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	mainUsage(stderr)
	return usagef("unknown command %q", args[0])
}

// report prints err and returns the exit code for it.
func report(w io.Writer, err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(w, "snapctl: %v\n", err)
		return exitUsage
	default:
		fmt.Fprintf(w, "snapctl: %v\n", err)
		return exitFailure
	}
}

// newFlags returns a flag set whose usage prints the synopsis, the
// description and the options.
func newFlags(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("snapctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: snapctl %s %s\n\n%s\n\nOptions:\n", name, synopsis, strings.TrimSpace(about))
		fs.VisitAll(func(f *flag.Flag) {
			if strings.HasPrefix(f.Usage, "alias") {
				return
			}
			dash := "--"
			if len(f.Name) == 1 {
				dash = "-"
			}
			arg, usage := flag.UnquoteUsage(f)
			if arg != "" {
				arg = " " + arg
			}
			if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" && f.Name != "tcp-close" && !strings.Contains(usage, "default") {
				usage += " (default " + def + ")"
			}
			fmt.Fprintf(fs.Output(), "  %s%s%s%s\n      %s\n", dash, f.Name, arg, aliasOf(fs, f), usage)
		})
	}
	return fs
}

// aliasOf lists the other names of a flag (flags whose usage is "alias for -x").
func aliasOf(fs *flag.FlagSet, f *flag.Flag) string {
	var out string
	fs.VisitAll(func(g *flag.Flag) {
		if g.Usage == "alias for "+f.Name {
			dash := "--"
			if len(g.Name) == 1 {
				dash = "-"
			}
			out += ", " + dash + g.Name
		}
	})
	return out
}

// alias registers another name for an existing flag.
func alias(fs *flag.FlagSet, name, of string) {
	fs.Var(fs.Lookup(of).Value, name, "alias for "+of)
}

// parse parses args and refuses positional arguments.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// sizeFlag is a byte size flag (256K, 1M...).
type sizeFlag struct {
	v   int64
	set bool
}

func (s *sizeFlag) String() string { return units.FormatSize(uint64(s.v)) }
func (s *sizeFlag) Set(v string) error {
	n, err := units.ParseSize(v)
	if err != nil {
		return err
	}
	s.v, s.set = n, true
	return nil
}

// threadsFlag is --decompress-threads: 1 serial, 0 automatic, N a maximum.
func threadsFlag(fs *flag.FlagSet) *int {
	return fs.Int("decompress-threads", 1, "decode with up to `N` threads: 1 serial, 0 automatic from the CPU\n      affinity mask and the work, N > 1 a maximum")
}

func requireDir(dir string) error {
	if dir == "" {
		return usagef("-D DIR (--images-dir) is required")
	}
	return nil
}
