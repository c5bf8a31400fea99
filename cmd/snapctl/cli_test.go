package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
)

// snapctl runs the command line args in process and returns its exit
// status, standard output and standard error as snapctl would print them.
func snapctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	err := run(t.Context(), args, &stdout, &stderr)
	code := cli.Report(&stderr, "snapctl", err, false)
	return code, stdout.String(), stderr.String()
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"dump", "-D", "/x"}, "-t PID (--tree) is required"},
		{[]string{"dump", "-t", "1"}, "-D DIR (--images-dir) is required"},
		{[]string{"dump", "-t", "1", "-D", "/x", "--compress", "--no-compress"}, "exclusive"},
		{[]string{"dump", "-t", "1", "-D", "/x", "--compress-block", "3K"}, "power of two"},
		{[]string{"dump", "-t", "1", "-D", "/x", "--bogus"}, "flag provided but not defined"},
		{[]string{"inspect", "-D", "/x", "extra"}, `unexpected argument "extra"`},
		{[]string{"restore", "-D", "/x", "--mount", "/m"}, "need --lazy"},
		{[]string{"restore", "-D", "/x", "--lazy", "--source", "disk"}, "want mount or direct"},
		{[]string{"verify"}, "-D DIR (--images-dir) is required"},
	} {
		code, _, stderr := snapctl(t, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("snapctl %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, cli.ExitUsage, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"dump", "--help"}, {"restore", "-h"}, {"inspect", "--help"}, {"verify", "--help"}, {"check", "--help"}} {
		code, stdout, stderr := snapctl(t, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "usage: snapctl") || !strings.Contains(stdout, "\nExit status:\n  0   success\n") {
			t.Errorf("snapctl %q: exit %d, stderr %q, stdout:\n%s", args, code, stderr, stdout)
		}
	}
	_, stdout, _ := snapctl(t, "restore", "--help")
	for _, want := range []string{"-D DIR, --images-dir", "\n  5   ", "\n  9   ", "\n  10  "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("restore --help lacks %q:\n%s", want, stdout)
		}
	}
	if code, stdout, _ := snapctl(t, "--version"); code != 0 || stdout != "snapctl "+engine.Version+"\n" {
		t.Errorf("--version: exit %d, %q", code, stdout)
	}
}

// TestSnapshotErrors: a missing or unfinished snapshot gets its status,
// and the message names it once.
func TestSnapshotErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	incomplete := t.TempDir()
	if err := os.WriteFile(filepath.Join(incomplete, "pages-5.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"inspect", "verify", "restore"} {
		for _, tc := range []struct {
			dir  string
			code int
			want string
		}{
			{missing, cli.ExitFailure, "snapctl: open snapshot: stat " + missing + ": no such file or directory\n"},
			{incomplete, cli.ExitBadSnapshot, "snapctl: open snapshot: " + incomplete + ": incomplete snapshot: no snapshot.json\n"},
		} {
			code, _, stderr := snapctl(t, cmd, "-D", tc.dir)
			if code != tc.code || stderr != tc.want {
				t.Errorf("snapctl %s -D %s: exit %d, stderr %q; want exit %d, %q", cmd, tc.dir, code, stderr, tc.code, tc.want)
			}
		}
	}
}
