package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
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
		{[]string{"dump", "-t", "1", "-D", "/x", "--bogus"}, "unknown option --bogus\n"},
		{[]string{"dump", "-t", "1", "-D", "/x", "--leave-runing"}, "unknown option --leave-runing: did you mean --leave-running?"},
		{[]string{"restore", "-D", "/x", "--lazzy"}, "did you mean --lazy?"},
		{[]string{"restore", "-D", "/x", "-x"}, "unknown option -x\n"},
		{[]string{"inspect", "-D", "/x", "extra"}, `unexpected argument "extra"`},
		{[]string{"restore", "-D", "/x", "--mount", "/m"}, "need --lazy"},
		{[]string{"restore", "-D", "/x", "--lazy", "--source", "disk"}, "want mount or direct"},
		{[]string{"restore", "-D", "/x", "--record-working-set"}, "need --lazy"},
		{[]string{"restore", "-D", "/x", "--working-set", "off"}, "need --lazy"},
		{[]string{"restore", "-D", "/x", "--lazy", "--record-for", "1s"}, "need --record-working-set"},
		{[]string{"restore", "-D", "/x", "--lazy", "--working-set", "first"}, "want auto, blocks or off"},
		{[]string{"restore", "-D", "/x", "--lazy", "--record-working-set", "--record-faults", "-1"}, "must not be negative"},
		{[]string{"restore", "-D", "/x", "--lazy", "--leave-stopped"}, "--leave-stopped and --lazy are exclusive"},
		{[]string{"verify"}, "-D DIR (--images-dir) is required"},
	} {
		code, _, stderr := snapctl(t, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("snapctl %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, cli.ExitUsage, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"dump", "--help"}, {"restore", "-h"}, {"inspect", "--help"}, {"verify", "--help"}, {"check", "--help"}, {"ls", "--help"}, {"rm", "--help"}} {
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
			{missing, cli.ExitFailure, "snapctl: open snapshot: open " + missing + ": no such file or directory\n"},
			{incomplete, cli.ExitBadSnapshot, "snapctl: open snapshot: " + incomplete + ": incomplete snapshot: no snapshot.json\n"},
		} {
			code, _, stderr := snapctl(t, cmd, "-D", tc.dir)
			if code != tc.code || stderr != tc.want {
				t.Errorf("snapctl %s -D %s: exit %d, stderr %q; want exit %d, %q", cmd, tc.dir, code, stderr, tc.code, tc.want)
			}
		}
	}
}

// TestVerifyCorrupt: verify and inspect of a damaged snapshot exit 7 and
// name the file (and the block) that is wrong.
func TestVerifyCorrupt(t *testing.T) {
	const pid = 31
	write := func(t *testing.T) string {
		s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: 64 << 10, Mode: codec.NoCompress},
			imagetest.Process{PID: pid, Seed: 4, VMAs: []imagetest.VMA{
				{Start: 0x7f0000000000, End: 0x7f0000000000 + 64<<12, Prot: unix.PROT_READ | unix.PROT_WRITE, Content: imagetest.Patchwork, Name: "[heap]"},
			}})
		if err != nil {
			t.Fatal(err)
		}
		return s.Dir
	}
	pages := fmt.Sprintf("pages-%d.img", pid)

	t.Run("block", func(t *testing.T) {
		dir := write(t)
		if code, stdout, stderr := snapctl(t, "verify", "-D", dir); code != 0 {
			t.Fatalf("verify of a good snapshot: exit %d\n%s%s", code, stdout, stderr)
		}
		// The last byte of the pages file is in its last raw block.
		f, err := os.OpenFile(filepath.Join(dir, pages), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		b := make([]byte, 1)
		f.ReadAt(b, st.Size()-1)
		b[0] ^= 0xff
		_, err = f.WriteAt(b, st.Size()-1)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		code, _, stderr := snapctl(t, "verify", "-D", dir)
		t.Logf("%s", stderr)
		if code != cli.ExitBadSnapshot || !strings.Contains(stderr, pages+": block ") {
			t.Errorf("verify of a flipped byte: exit %d, stderr %q; want %d naming %s and the block", code, stderr, cli.ExitBadSnapshot, pages)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		dir := write(t)
		if err := os.Truncate(filepath.Join(dir, pages), 4096); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range []string{"verify", "inspect"} {
			code, _, stderr := snapctl(t, cmd, "-D", dir)
			t.Logf("%s", stderr)
			if code != cli.ExitBadSnapshot || !strings.Contains(stderr, pages) {
				t.Errorf("%s of a truncated pages file: exit %d, stderr %q; want %d naming %s", cmd, code, stderr, cli.ExitBadSnapshot, pages)
			}
		}
	})
}

// TestDecompressThreadsDefault: restore and verify decode with as many
// threads as the machine gives them (0, automatic) unless told.
func TestDecompressThreadsDefault(t *testing.T) {
	var out strings.Builder
	fl := newFlags("restore", "-D DIR", "", nil, &out, &out)
	threads := threadsFlag(fl)
	if err := fl.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if *threads != 0 {
		t.Errorf("--decompress-threads defaults to %d, want 0 (automatic)", *threads)
	}
}

// TestToolDescribesEveryCommand: the manual pages and completion scripts
// see every command with the options its --help prints.
func TestToolDescribesEveryCommand(t *testing.T) {
	tl, err := tool()
	if err != nil {
		t.Fatal(err)
	}
	if len(tl.Subs) != len(commands()) {
		t.Fatalf("%d commands described, want %d", len(tl.Subs), len(commands()))
	}
	for _, s := range tl.Subs {
		var help strings.Builder
		for _, c := range commands() {
			if c.name == s.Name {
				c.run(context.Background(), []string{"--help"}, &help, io.Discard)
			}
		}
		var opts strings.Builder
		s.Set.PrintOptions(&opts)
		if opts.Len() == 0 || !strings.Contains(help.String(), "Options:\n"+opts.String()) {
			t.Errorf("%s: the described options differ from --help's:\n%s", s.Name, opts.String())
		}
	}
}
