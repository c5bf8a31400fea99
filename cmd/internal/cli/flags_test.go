package cli

import (
	"errors"
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
