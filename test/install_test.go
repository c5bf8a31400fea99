package e2e

// make install into a DESTDIR: the binaries run, every manual page
// renders with man(1) without a groff warning and documents every option
// and exit status its command's --help does, and the bash, zsh and fish
// completion scripts complete a subcommand and a flag in the shells
// themselves.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/testutil"
)

func TestInstall(t *testing.T) {
	testutil.RequireCommand(t, "make", "go", "man", "groff", "bash", "zsh", "fish")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dest, bin := t.TempDir(), t.TempDir()
	cmd := exec.CommandContext(ctx, "make", "-C", repoRoot(t), "install", "DESTDIR="+dest, "PREFIX=/usr", "BIN="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	usr := filepath.Join(dest, "usr")
	run := func(name string, args ...string) string {
		t.Helper()
		c := exec.CommandContext(ctx, name, args...)
		c.Env = append(os.Environ(), "MANWIDTH=100", "LC_ALL=C.UTF-8")
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	// The pages: one per tool and one per snapctl command.
	snapctl := filepath.Join(usr, "bin", "snapctl")
	pages := map[string][]string{
		"lazyfs":  {filepath.Join(usr, "bin", "lazyfs"), "--help"},
		"snapctl": {snapctl, "--help"},
	}
	for _, sub := range []string{"dump", "restore", "inspect", "verify", "check", "cleanup", "ls", "rm", "export"} {
		pages["snapctl-"+sub] = []string{snapctl, sub, "--help"}
	}
	optRE := regexp.MustCompile(`(?m)^  (-{1,2}[a-z0-9-]+)`)
	codeRE := regexp.MustCompile(`(?m)^  (\d+) `)
	for page, help := range pages {
		file := filepath.Join(usr, "share", "man", "man8", page+".8")
		if warn := run("groff", "-man", "-Tutf8", "-ww", "-z", file); warn != "" {
			t.Errorf("%s: groff warns:\n%s", page, warn)
		}
		text := run("man", "--nh", "--nj", "-l", file)
		if !strings.Contains(text, "NAME") || !strings.Contains(text, page+" - ") {
			t.Errorf("%s: man -l shows no NAME line:\n%s", page, text)
			continue
		}
		h := run(help[0], help[1:]...)
		opts, codes := optRE.FindAllStringSubmatch(h, -1), codeRE.FindAllStringSubmatch(h, -1)
		if len(opts) < 1 || len(codes) < 3 {
			t.Errorf("%s: --help lists %d options and %d exit statuses:\n%s", page, len(opts), len(codes), h)
		}
		for _, o := range opts {
			if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(o[1]) + `\b`).MatchString(text) {
				t.Errorf("%s: option %s of --help is not in the manual page", page, o[1])
			}
		}
		for _, c := range codes {
			if !regexp.MustCompile(`(?m)^\s+` + c[1] + `\s`).MatchString(text) {
				t.Errorf("%s: exit status %s of --help is not in the manual page", page, c[1])
			}
		}
	}

	// Completion: bash, fish and zsh, each in the shell itself.
	comp := filepath.Join(usr, "share")
	bash := func(file string, words ...string) string {
		script := "source " + file + "; COMP_WORDS=(" + strings.Join(words, " ") + "); COMP_CWORD=" + strconv.Itoa(len(words)-1) +
			"; _" + words[0] + "; printf '%s\\n' \"${COMPREPLY[@]}\""
		return run("bash", "--norc", "--noprofile", "-c", script)
	}
	fish := func(file, line string) string {
		return run("fish", "--no-config", "-c", "source "+file+"; complete -C '"+line+"'")
	}
	for _, c := range []struct {
		tool  string
		words []string
		want  string
	}{
		{"snapctl", []string{"snapctl", "ins"}, "inspect"},
		{"snapctl", []string{"snapctl", "restore", "--la"}, "--lazy"},
		{"snapctl", []string{"snapctl", "dump", "--pre-copy-r"}, "--pre-copy-rounds"},
		{"lazyfs", []string{"lazyfs", "--cache-s"}, "--cache-size"},
	} {
		if got := bash(filepath.Join(comp, "bash-completion", "completions", c.tool), c.words...); !containsLine(got, c.want) {
			t.Errorf("bash: %q completes to %q, want %s", strings.Join(c.words, " "), got, c.want)
		}
		if got := fish(filepath.Join(comp, "fish", "vendor_completions.d", c.tool+".fish"), strings.Join(c.words, " ")); !containsLine(strings.Split(got, "\t")[0], c.want) && !strings.Contains(got, c.want+"\t") {
			t.Errorf("fish: %q completes to %q, want %s", strings.Join(c.words, " "), got, c.want)
		}
	}
	// zsh completes on a terminal only: drive an interactive zsh on a
	// pty (zsh/zpty), type a prefix, a tab and Enter, and see what the
	// command, a function that prints its arguments, was given.
	zsh := func(line, want string) {
		t.Helper()
		script := `zmodload zsh/zpty
zpty z 'zsh -f -i'
zpty -w z 'PS1="> "; fpath=(` + filepath.Join(comp, "zsh", "site-functions") + ` $fpath); autoload -Uz compinit; compinit -u -D'
zpty -w z 'snapctl() { print -r -- "ARGS:$*:" }; lazyfs() { print -r -- "ARGS:$*:" }'
zpty -w -n z '` + line + `'$'\t\n'
zpty -r z out '*ARGS:` + want + `:*' && print -r -- COMPLETED
zpty -d z
`
		zctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		out, err := exec.CommandContext(zctx, "zsh", "-f", "-c", script).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "COMPLETED") {
			t.Errorf("zsh: %q did not complete to %s (%v)", line, want, err)
		}
	}
	zsh("snapctl restore --record-working", "restore --record-working-set")
	zsh("snapctl verif", "verify")
	zsh("lazyfs --decompress-th", "--decompress-threads")
}

func containsLine(out, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == want {
			return true
		}
	}
	return false
}
