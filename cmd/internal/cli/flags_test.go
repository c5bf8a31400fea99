package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testFlags() (*FlagSet, *strings.Builder, *strings.Builder, *string, *Size, *bool) {
	var stdout, stderr strings.Builder
	f := Command{
		Name:     "tool sub",
		Synopsis: []string{"-D DIR [options]", "-u MNT"},
		About:    "Does a thing.",
		Footer:   "Examples:\n  tool sub -D x",
		Exits:    []int{ExitBadSnapshot},
	}.Flags(&stdout, &stderr)
	dir := f.String("D", "", "the snapshot directory `DIR`")
	f.Alias("images-dir", "D")
	size := f.Size("cache-size", 256<<20, "keep up to `SIZE` of blocks")
	u := f.Bool("u", false, "unmount `MNT`")
	return f, &stdout, &stderr, dir, size, u
}

func TestFlagsHelp(t *testing.T) {
	f, stdout, stderr, _, _, _ := testFlags()
	if err := f.Parse([]string{"--help"}); !errors.Is(err, ErrHelp) {
		t.Fatalf("--help: %v, want ErrHelp", err)
	}
	if ExitCode(ErrHelp) != 0 {
		t.Error("--help does not exit 0")
	}
	out := stdout.String()
	for _, want := range []string{
		"usage: tool sub -D DIR [options]\n       tool sub -u MNT\n",
		"Does a thing.",
		"  -D DIR, --images-dir\n      the snapshot directory DIR\n",
		"  --cache-size SIZE\n      keep up to SIZE of blocks (default 256 MiB)\n",
		"  -u MNT\n",
		"Examples:\n  tool sub -D x\n",
		"Exit status:\n  0   success\n  1   failure",
		"\n  7   incomplete or corrupt snapshot",
		"\n  130 interrupted",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "alias for") || strings.Contains(out, "\n  5 ") {
		t.Errorf("help shows an alias as a flag or a status the command does not have:\n%s", out)
	}
	if stderr.Len() > 0 {
		t.Errorf("--help wrote on stderr: %q", stderr.String())
	}
}

func TestFlagsParse(t *testing.T) {
	f, _, stderr, dir, size, _ := testFlags()
	if err := f.Parse([]string{"--images-dir", "/s", "--cache-size", "1G"}); err != nil {
		t.Fatal(err)
	}
	if *dir != "/s" || size.V != 1<<30 || !size.Given {
		t.Errorf("parsed dir %q size %+v", *dir, size)
	}
	for _, args := range [][]string{{"--frobnicate"}, {"--cache-size", "12Q"}, {"-D", "/s", "extra"}} {
		f, _, stderr, _, _, _ = testFlags()
		err := f.Parse(args)
		var ue *UsageError
		if !errors.As(err, &ue) || ExitCode(err) != ExitUsage {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
		if !strings.HasPrefix(stderr.String(), "usage: tool sub -D DIR") || !strings.Contains(stderr.String(), "Run 'tool sub --help'") {
			t.Errorf("%q: stderr %q, want the synopsis", args, stderr.String())
		}
	}
}

func TestParseOperands(t *testing.T) {
	f, _, _, dir, _, u := testFlags()
	ops, err := f.ParseOperands([]string{"a", "-D", "/s", "b", "-u", "--", "-c", "-D"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ops, " ") != "a b -c -D" || *dir != "/s" || !*u {
		t.Errorf("operands %q, dir %q, u %v", ops, *dir, *u)
	}
}

func TestWrap(t *testing.T) {
	got := wrap("aaa bbb ccc ddd", "> ", "  ", 9)
	if want := "> aaa bbb\n  ccc ddd\n"; got != want {
		t.Errorf("wrap: %q, want %q", got, want)
	}
}

// TestHelpOptionsFirst: the synopsis, then the options, then the prose.
func TestHelpOptionsFirst(t *testing.T) {
	f, stdout, _, _, _, _ := testFlags()
	f.Parse([]string{"--help"})
	out := stdout.String()
	opts, about, examples := strings.Index(out, "\nOptions:\n"), strings.Index(out, "\nDescription:\nDoes a thing."), strings.Index(out, "Examples:")
	if !(strings.HasPrefix(out, "usage: ") && opts > 0 && opts < about && about < examples) {
		t.Errorf("want usage, Options, Description, Examples in that order:\n%s", out)
	}
}

// TestDescriber: --help given a Describer records the flag set and
// prints nothing.
func TestDescriber(t *testing.T) {
	d := &Describer{}
	f := Command{Name: "tool"}.Flags(d, io.Discard)
	f.Bool("lazy", false, "be lazy")
	if err := f.Parse([]string{"--help"}); !errors.Is(err, ErrHelp) || d.Set != f {
		t.Fatalf("Describer: %v, set %p, want ErrHelp and %p", err, d.Set, f)
	}
}

// TestManPage: a page from testFlags' set has its sections, its options
// with their aliases and arguments, escaped for roff, and a line that
// starts with a dot kept from being read as a request.
func TestManPage(t *testing.T) {
	f, _, _, _, _, _ := testFlags()
	f.cmd.About = "Does a thing.\n\n.dotfiles are kept; back\\slash.\n\nTable:\n  a   one\n  b   two"
	dir := t.TempDir()
	files, err := Tool{Name: "tool", Summary: "a tool", Version: "tool 1", Top: f, Subs: []Sub{{Name: "sub", Summary: "does a thing", Set: f}}}.WriteManPages(dir)
	if err != nil || len(files) != 2 {
		t.Fatalf("WriteManPages: %v, %v", files, err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "tool-sub.8"))
	page := string(b)
	for _, want := range []string{
		".TH TOOL\\-SUB 8 ",
		".SH NAME\ntool\\-sub \\- does a thing\n",
		".SH SYNOPSIS\n.B tool sub\n\\-D DIR [options]\n.br\n",
		".TP\n\\fB\\-D\\fR \\fIDIR\\fR, \\fB\\-\\-images\\-dir\\fR\nthe snapshot directory DIR\n",
		"(default 256 MiB)",
		"\\&.dotfiles are kept; back\\eslash.\n",
		".RS 2\n.nf\na   one\nb   two\n.fi\n.RE\n",
		".SH EXAMPLES\n",
		".SH \"EXIT STATUS\"\n.TP\n.B 0\nsuccess\n",
		".BR tool (8)",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "alias for") || strings.Count(page, ".B 7\n") != 1 {
		t.Errorf("page shows an alias as an option, or status 7 other than once:\n%s", page)
	}
}

// TestCompletionScripts: each shell's script names the subcommands and
// the options of each; an unknown shell is a usage error.
func TestCompletionScripts(t *testing.T) {
	f, _, _, _, _, _ := testFlags()
	tool := Tool{Name: "tool", Top: f, Subs: []Sub{{Name: "sub", Summary: "does a thing", Set: f}}}
	for shell, wants := range map[string][]string{
		"bash": {"sub)\n\t\topts='-D --images-dir --cache-size -u'\n\t\targs='-D --images-dir --cache-size -u'", "compgen -W 'sub'", "complete -o filenames -F _tool tool"},
		"zsh":  {"#compdef tool", "'sub:does a thing'", "'--cache-size=[keep up to SIZE of blocks]:SIZE: '", "'-D=[the snapshot directory DIR]:DIR:_files'"},
		"fish": {"complete -c tool -f -n 'not __fish_seen_subcommand_from sub' -a sub -d 'does a thing'", "-n '__fish_seen_subcommand_from sub' -s D -l images-dir -r -F"},
	} {
		var b strings.Builder
		if err := tool.WriteCompletion(&b, shell); err != nil {
			t.Fatal(err)
		}
		for _, want := range wants {
			if !strings.Contains(b.String(), want) {
				t.Errorf("%s script lacks %q:\n%s", shell, want, b.String())
			}
		}
	}
	if err := tool.WriteCompletion(io.Discard, "tcsh"); ExitCode(err) != ExitUsage {
		t.Errorf("tcsh: %v, want a usage error", err)
	}
}
