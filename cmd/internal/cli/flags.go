package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lazyfs/lazyfs/engine/units"
)

// ErrHelp is returned when --help was asked for: the help went to
// standard output, and the exit status is 0.
var ErrHelp = flag.ErrHelp

// UsageError is a mistake in the command line: exit status 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{fmt.Sprintf(format, args...)}
}

// Command is what the help of a command line says besides its options.
type Command struct {
	Name     string   // as typed: "snapctl dump", "lazyfs"
	Synopsis []string // its forms, each after the name: "-t PID -D DIR [options]"
	About    string   // what it does, in paragraphs
	Footer   string   // printed after the options (examples)
	// Exits lists the exit statuses it documents besides 0, 1, 2 and
	// 130, which every command has but a server.
	Exits []int
	// Server: SIGINT and SIGTERM are how it is stopped (lazyfs), not an
	// interruption: it ends as asked and exits 0, never 130.
	Server bool
}

// lineWidth is the width help text is wrapped to.
const lineWidth = 78

// FlagSet is a flag.FlagSet that prints the help of its Command: on
// --help the synopsis, the description, the options with their aliases
// and defaults, the footer and the exit statuses, on standard output; on
// a mistake the synopsis, on standard error.
type FlagSet struct {
	*flag.FlagSet
	cmd            Command
	stdout, stderr io.Writer
}

// Flags returns an empty flag set for c.
func (c Command) Flags(stdout, stderr io.Writer) *FlagSet {
	f := &FlagSet{FlagSet: flag.NewFlagSet(c.Name, flag.ContinueOnError), cmd: c, stdout: stdout, stderr: stderr}
	f.SetOutput(io.Discard) // the messages are ours: see parse
	// flag calls Usage on -h and on every mistake alike: parse prints the
	// help for -h, the synopsis for a mistake.
	f.FlagSet.Usage = func() {}
	return f
}

const aliasPrefix = "alias for "

// Alias registers name as another name of the flag of.
func (f *FlagSet) Alias(name, of string) {
	f.Var(f.Lookup(of).Value, name, aliasPrefix+of)
}

// Size defines a byte-size flag (4K, 256M, 1G or bytes) with default def.
func (f *FlagSet) Size(name string, def int64, usage string) *Size {
	s := &Size{V: def}
	f.Var(s, name, usage)
	return s
}

// Size is the value of a byte-size flag.
type Size struct {
	V     int64
	Given bool // set on the command line
}

func (s *Size) String() string { return units.FormatSize(uint64(s.V)) }

func (s *Size) Set(v string) error {
	n, err := units.ParseSize(v)
	if err != nil {
		return err
	}
	s.V, s.Given = n, true
	return nil
}

// Parse parses args, which must hold options only.
func (f *FlagSet) Parse(args []string) error {
	if err := f.parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return f.Usagef("unexpected argument %q", f.Arg(0))
	}
	return nil
}

// ParseOperands parses args, options and operands in any order ("--"
// ends the options), and returns the operands.
func (f *FlagSet) ParseOperands(args []string) ([]string, error) {
	var ops []string
	for {
		if err := f.parse(args); err != nil {
			return nil, err
		}
		rest := f.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(ops, rest...), nil
		}
		if len(rest) == 0 {
			return ops, nil
		}
		ops, args = append(ops, rest[0]), rest[1:]
	}
}

func (f *FlagSet) parse(args []string) error {
	err := f.FlagSet.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		if d, ok := f.stdout.(*Describer); ok {
			d.Set = f
		} else {
			f.PrintHelp(f.stdout)
		}
		return ErrHelp
	case err != nil:
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			if near := f.nearest(name); near != "" {
				return f.Usagef("unknown option %s: did you mean %s?", dashed(name), dashed(near))
			}
			return f.Usagef("unknown option %s", dashed(name))
		}
		return f.Usagef("%v", err)
	}
	return nil
}

// nearest returns the defined option closest to name, a mistyped one: at
// most two edits away (a letter missed, doubled, swapped or wrong), or
// "" if none is.
func (f *FlagSet) nearest(name string) string {
	best, dist := "", 3
	f.VisitAll(func(fl *flag.Flag) {
		if d := editDistance(name, fl.Name); d < dist && len(fl.Name) > 1 {
			best, dist = fl.Name, d
		}
	})
	return best
}

// editDistance is the Damerau-Levenshtein distance (optimal string
// alignment) between a and b.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// Usagef prints the synopsis on standard error and returns a *UsageError
// saying what is wrong with the command line.
func (f *FlagSet) Usagef(format string, args ...any) error {
	f.printSynopsis(f.stderr)
	fmt.Fprintf(f.stderr, "Run '%s --help' for the options.\n", f.cmd.Name)
	return Usagef(format, args...)
}

func (f *FlagSet) printSynopsis(w io.Writer) {
	for i, s := range f.cmd.Synopsis {
		lead := "usage: "
		if i > 0 {
			lead = "       "
		}
		fmt.Fprintf(w, "%s%s %s\n", lead, f.cmd.Name, s)
	}
}

// PrintHelp prints the whole help on w: the synopsis and the options
// first, for the reader who knows what the command does, then the
// description, the footer and the exit statuses.
func (f *FlagSet) PrintHelp(w io.Writer) {
	f.printSynopsis(w)
	io.WriteString(w, "\nOptions:\n")
	f.PrintOptions(w)
	if about := strings.TrimSpace(f.cmd.About); about != "" {
		fmt.Fprintf(w, "\nDescription:\n%s\n", about)
	}
	if foot := strings.TrimSpace(f.cmd.Footer); foot != "" {
		fmt.Fprintf(w, "\n%s\n", foot)
	}
	fmt.Fprintf(w, "\n%s", StatusTable(f.exits()))
}

// PrintOptions prints the option table on w.
func (f *FlagSet) PrintOptions(w io.Writer) {
	for _, o := range f.options() {
		fmt.Fprintf(w, "  %s\n", o.head())
		io.WriteString(w, wrap(o.usage, "      ", "      ", lineWidth))
	}
}

// exits lists the exit statuses the command documents.
func (f *FlagSet) exits() []int {
	codes := append([]int{ExitOK, ExitFailure, ExitUsage}, f.cmd.Exits...)
	if !f.cmd.Server {
		codes = append(codes, ExitInterrupted)
	}
	return codes
}

// option is one option as help shows it.
type option struct {
	names []string // dashed: the flag's name, then its aliases
	arg   string   // the name of its argument: "" for a switch
	usage string   // with its default, when that is not the zero value
}

// head is the option's first line in help: "-D DIR, --images-dir".
func (o option) head() string {
	h := o.names[0]
	if o.arg != "" {
		h += " " + o.arg
	}
	for _, a := range o.names[1:] {
		h += ", " + a
	}
	return h
}

// options lists the flags in help's order (by name), aliases folded into
// the flag they name.
func (f *FlagSet) options() []option {
	var opts []option
	f.VisitAll(func(fl *flag.Flag) {
		if strings.HasPrefix(fl.Usage, aliasPrefix) {
			return
		}
		arg, usage := flag.UnquoteUsage(fl)
		if def := fl.DefValue; !isZero(fl) && !strings.Contains(usage, "default") {
			usage += " (default " + def + ")"
		}
		o := option{names: []string{dashed(fl.Name)}, arg: arg, usage: usage}
		f.VisitAll(func(g *flag.Flag) {
			if g.Usage == aliasPrefix+fl.Name {
				o.names = append(o.names, dashed(g.Name))
			}
		})
		opts = append(opts, o)
	})
	return opts
}

// isZero reports whether a flag's default is its type's zero value, not
// worth printing.
func isZero(fl *flag.Flag) bool {
	switch fl.DefValue {
	case "", "false", "0", "0s", "0 B":
		return true
	}
	return false
}

// dashed returns -x for a one-letter flag, --name for the others.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// wrap breaks text into lines of at most width columns: the first starts
// with first, the others with indent.
func wrap(text, first, indent string, width int) string {
	var b strings.Builder
	line := first
	empty := true // of words: first may end with the space before them
	for _, w := range strings.Fields(text) {
		if !empty && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line, empty = indent, true
		}
		if !empty {
			line += " "
		}
		line += w
		empty = false
	}
	b.WriteString(line + "\n")
	return b.String()
}
