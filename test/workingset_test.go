package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestWorkingSet records the working set of a modelserver's "touch 1"
// on one lazy restore, then restores it again from each source with it,
// without it (--working-set off), with one whose memory is damaged in
// one entry (that entry read from the snapshot instead, with a
// warning), and with a corrupt, a truncated and a foreign one (each
// ignored with a warning naming the file): the server's answers are
// right every time. inspect, verify and lazyfs show it; a recording
// killed with SIGKILL leaves the previous file or none.
func TestWorkingSet(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	// A dozen restores: twice the other tests' bound.
	ctx, cancel := context.WithTimeout(t.Context(), 2*testTimeout)
	defer cancel()
	p := fixture.Start(t, "modelserver", "64M")
	port := int(p.Ready.MustInt(t, "port"))
	wantTouch := lazyChecksumOf(lazyAsk(t, ctx, port, "touch 1"))
	wantToken := lazyChecksumOf(lazyAsk(t, ctx, port, "token"))
	dir, _ := dumpForRestore(t, ctx, p)
	wsPath := filepath.Join(dir, workingset.Name(p.PID))

	// restore restores lazily with flags, asks "touch 1" (then, if
	// record, tells snapctl to stop recording) and "token", checks the
	// answers, waits for the lazy phase to end and kills the server.
	restore := func(t *testing.T, record bool, flags ...string) cmdResult {
		t.Helper()
		l := startLazy(t, dir, flags...)
		l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		if got := lazyChecksumOf(lazyAsk(t, ctx, port, "touch 1")); got != wantTouch {
			t.Errorf("touch 1 checksum %s, want %s", got, wantTouch)
		}
		if record {
			if err := l.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
		}
		if got := lazyChecksumOf(lazyAsk(t, ctx, port, "token")); got != wantToken {
			t.Errorf("token checksum %s, want %s", got, wantToken)
		}
		r := l.mustFinish(t, ctx, p.PID)
		lazyKill(t, ctx, p)
		return r
	}
	noTemp := func(t *testing.T) {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".tmp") {
				t.Errorf("temporary file %s left in the snapshot", e.Name())
			}
		}
	}

	r := restore(t, true, "--record-working-set", "--record-for", "2m")
	if !strings.Contains(r.Stdout, "working set recorded:") || !strings.Contains(r.Stdout, "stopped by signal") || !strings.Contains(r.Stdout, wsPath) {
		t.Fatalf("no recording in the output:\n%s", r)
	}
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := workingset.Read(snap, p.PID)
	snap.Close()
	if err != nil {
		t.Fatal(err)
	}
	// touch 1 reads one page in a hundred of the mapping: every one of
	// them outside its zero quarter faulted (the prefetcher waited), each
	// in a range of its own, and the working set holds those pages (and
	// the heap's it walks), not the blocks around them.
	pages := int(p.Ready.MustUint(t, "size") / 4096 / 100)
	if uint64(len(ws.Entries)) < 3*uint64(pages)/4 || ws.Bytes() > p.Ready.MustUint(t, "size")/20 || !ws.HasData() {
		t.Errorf("working set of %d ranges, %d bytes: want about the %d pages touch 1 reads, with their bytes", len(ws.Entries), ws.Bytes(), pages)
	}
	t.Logf("working set: %d ranges, %d bytes, over %v", len(ws.Entries), ws.Bytes(), ws.Span)
	noTemp(t)
	good, err := os.ReadFile(wsPath)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("inspect-verify-lazyfs", func(t *testing.T) {
		if r := mustSnapctl(t, "inspect", "-D", dir); !strings.Contains(r.Stdout, fmt.Sprintf("working set: %s", "")) || !strings.Contains(r.Stdout, fmt.Sprintf("%d ranges", len(ws.Entries))) {
			t.Errorf("inspect does not show the working set:\n%s", r.Stdout)
		}
		if r := mustSnapctl(t, "verify", "-D", dir); !strings.Contains(r.Stdout, "working set of") {
			t.Errorf("verify does not mention the working set:\n%s", r.Stdout)
		}
		mnt := lazyMountLazyfs(t, dir)
		b, err := os.ReadFile(filepath.Join(mnt, strconv.Itoa(p.PID), "workingset"))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != len(ws.Entries)+2 {
			t.Fatalf("MNT/PID/workingset has %d lines for %d ranges:\n%.300s", len(lines), len(ws.Entries), b)
		}
		if want := fmt.Sprintf("%x %d ", ws.Entries[0].Addr, ws.Entries[0].Len); !strings.HasPrefix(lines[2], want) {
			t.Errorf("first range %q, want %q...", lines[2], want)
		}
	})

	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"replay-mount", nil},
		{"replay-direct", []string{"--source", "direct"}},
		{"replay-blocks", []string{"--working-set", "blocks"}},
		{"replay-lazyfs-mount", []string{"--mount"}}, // + the mount, made below
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "replay-lazyfs-mount" {
				tc.flags = append(tc.flags, lazyMountLazyfs(t, dir))
			}
			r := restore(t, false, tc.flags...)
			from := "its copy, "
			if tc.name == "replay-blocks" {
				from = "the snapshot's blocks, "
			}
			if !strings.Contains(r.Stdout, "fetched first from "+from+wsPath) {
				t.Errorf("the working set was not used:\n%s", r)
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		r := restore(t, false, "--working-set", "off")
		if strings.Contains(r.Stdout, "working set") {
			t.Errorf("--working-set off used it:\n%s", r)
		}
	})

	foreign := func() []byte {
		w, err := workingset.Parse(good)
		if err != nil {
			t.Fatal(err)
		}
		w.Snapshot.CRC32C ^= 0xdead
		b, err := w.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	// A byte of the last entry's memory: the working set is used, that
	// entry read from the snapshot instead, with a warning naming it.
	t.Run("damaged-entry", func(t *testing.T) {
		damaged := bytes.Clone(good)
		damaged[len(damaged)-7] ^= 0x40
		if err := os.WriteFile(wsPath, damaged, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(wsPath, good, 0o644)
		r := restore(t, false) // checks the answers
		if !strings.Contains(r.Stderr, "working set entry damaged") || !strings.Contains(r.Stderr, wsPath) || !strings.Contains(r.Stderr, "checksum mismatch") {
			t.Errorf("no warning naming the damaged entry of %s:\n%s", wsPath, r)
		}
		if !strings.Contains(r.Stdout, "fetched first from its copy, "+wsPath) {
			t.Errorf("the working set was not used for its other entries:\n%s", r)
		}
		if r := runTool(t, buildTool(t, "snapctl"), commandTimeout, "verify", "-D", dir); r.Code != 0 || !strings.Contains(r.Stdout, "working set ignored") {
			t.Errorf("verify with a damaged working set:\n%s", r)
		}
	})
	// A byte of the table of entries: the whole file is ignored.
	corrupt := bytes.Clone(good)
	corrupt[64+3] ^= 0x40
	for _, tc := range []struct {
		name, why string
		b         []byte
	}{
		{"corrupt", "checksum mismatch", corrupt},
		{"truncated", "truncated", good[:len(good)-10]},
		{"foreign", "another snapshot", foreign},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(wsPath, tc.b, 0o644); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(wsPath, good, 0o644)
			r := restore(t, false)
			if !strings.Contains(r.Stderr, "working set ignored") || !strings.Contains(r.Stderr, wsPath) || !strings.Contains(r.Stderr, tc.why) {
				t.Errorf("no warning naming %s (%s):\n%s", wsPath, tc.why, r)
			}
			if strings.Contains(r.Stdout, "fetched first") {
				t.Errorf("a %s working set was used:\n%s", tc.name, r)
			}
			if r := runTool(t, buildTool(t, "snapctl"), commandTimeout, "verify", "-D", dir); r.Code != 0 || !strings.Contains(r.Stdout, "working set ignored") {
				t.Errorf("verify with a %s working set:\n%s", tc.name, r)
			}
		})
	}

	// SIGKILL during a recording: the previous file stays as it was;
	// without one, none appears.
	for _, prev := range [][]byte{good, nil} {
		t.Run(fmt.Sprintf("sigkill-previous=%v", prev != nil), func(t *testing.T) {
			if prev == nil {
				if err := os.Remove(wsPath); err != nil {
					t.Fatal(err)
				}
				defer os.WriteFile(wsPath, good, 0o644)
			}
			l := startLazy(t, dir, "--record-working-set", "--record-for", "2m")
			l.waitRunning(t, ctx)
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, "touch 1")); got != wantTouch {
				t.Errorf("touch 1 checksum %s, want %s", got, wantTouch)
			}
			l.cmd.Process.Signal(syscall.SIGKILL)
			l.wait(t, ctx)
			if !pidGone(ctx, p.PID) {
				t.Fatalf("pid %d outlived snapctl's SIGKILL", p.PID)
			}
			l.lazyNothingLeft(t, dir)
			b, err := os.ReadFile(wsPath)
			switch {
			case prev == nil && err == nil:
				t.Errorf("a working set of %d bytes appeared", len(b))
			case prev != nil && !bytes.Equal(b, prev):
				t.Errorf("the working set changed: %d bytes, %v; had %d", len(b), err, len(prev))
			}
			noTemp(t)
		})
	}
}
