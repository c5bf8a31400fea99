package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// requireTracking checks that pid carries no write tracking of ours: no
// range registered with a userfaultfd (VmFlags "uw" or "um") and no
// userfaultfd among its descriptors.
func requireNoTracking(t *testing.T, pid int, when string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			for _, f := range strings.Fields(rest) {
				if f == "uw" || f == "um" {
					t.Errorf("%s: a mapping of %d is still registered with a userfaultfd (VmFlags%s)", when, pid, rest)
				}
			}
		}
	}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range ents {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); strings.Contains(l, "userfaultfd") {
			t.Errorf("%s: fd %s of %d is a userfaultfd", when, e.Name(), pid)
		}
	}
}

// tracked reports whether a mapping of pid is registered for write
// tracking (VmFlags "uw").
func tracked(pid int) bool {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok && strings.Contains(" "+rest+" ", " uw ") {
			return true
		}
	}
	return false
}

// TestDumpPreCopyExact: a pre-copy dump of a stopped process is the
// process's memory exactly (every kind of mapping of the mappings
// fixture), and leaves no write tracking behind.
func TestDumpPreCopyExact(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx := testContext(t)
	p := fixture.Start(t, "mappings")
	dumpStopped(t, ctx, p, "--pre-copy")
	requireNoTracking(t, p.PID, "after the dump")
}

// TestDumpPreCopyGenerations is TestDumpGenerations with --pre-copy: the
// writer rewrites the buffer while the rounds copy it, and the image must
// still be one instant, the freeze, every time. With a writer that never
// sleeps the rounds cannot converge; with one that pauses they do.
func TestDumpPreCopyGenerations(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	for _, c := range []struct{ name, burst, sleep string }{
		{"busy", "256", "0"},
		{"paced", "64", "2000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.Start(t, "generations", "32M", c.burst, c.sleep)
			addr, size := p.Ready.MustUint(t, "addr"), p.Ready.MustUint(t, "size")
			for request(t, ctx, p, syscall.SIGUSR1, "report").MustUint(t, "gen") == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			var last uint64
			for i := range 3 {
				// The writer finishes a generation after the last dump
				// saw, so that each dump must see a newer one.
				for deadline := time.Now().Add(30 * time.Second); request(t, ctx, p, syscall.SIGUSR1, "report").MustUint(t, "gen") <= last; {
					if time.Now().After(deadline) {
						t.Fatalf("the writer made no progress past generation %d in 30 s", last)
					}
					time.Sleep(10 * time.Millisecond)
				}
				dir := filepath.Join(t.TempDir(), fmt.Sprintf("snap%d", i))
				r := dumpPID(t, p.PID, dir, "--leave-running", "--pre-copy")
				t.Logf("dump %d: %s", i, strings.TrimSpace(r.Stdout))
				if !strings.Contains(r.Stdout, "pre-copy:") {
					t.Errorf("dump %d printed no pre-copy figures", i)
				}
				requireNoTracking(t, p.PID, fmt.Sprintf("after dump %d", i))
				si := openImage(t, dir, p.PID)
				g, err := fixture.CheckGenerations(si.read(t, addr, size), pageSize)
				if err != nil {
					t.Fatalf("dump %d: %v", i, err)
				}
				t.Logf("dump %d: generations %d/%d, boundary at page %d, torn %d", i, g.New, g.Old, g.Boundary, g.Torn)
				if g.New <= last {
					t.Errorf("dump %d: generation %d, not after the previous dump's %d", i, g.New, last)
				}
				last = g.New
				verifyDir(t, dir)
			}
			answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
		})
	}
}

// TestDumpPreCopyKilled: snapctl killed by SIGKILL in the middle of the
// rounds leaves the process running, untraced, and without write
// tracking (the kernel drops it with snapctl's userfaultfd).
func TestDumpPreCopyKilled(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx := testContext(t)
	p := fixture.Start(t, "generations", "16M", "256", "0")
	dir := filepath.Join(t.TempDir(), "snap")
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, buildTool(t, "snapctl"), "dump", "-t", strconv.Itoa(p.PID), "-D", dir,
		"--leave-running", "--pre-copy", "--pre-copy-rounds", "1000", "--pre-copy-time", "1m")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !tracked(p.PID) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the process was never registered for write tracking; snapctl said:\n%s", out.String())
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	// The tracer's exit detaches the process; the userfaultfd's release
	// follows the last close, in snapctl's exit.
	deadline = time.Now().Add(10 * time.Second)
	for tracked(p.PID) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	requireNoTracking(t, p.PID, "after snapctl was killed")
	gen := answersNormally(t, ctx, p, syscall.SIGUSR1, "report").MustUint(t, "gen")
	deadline = time.Now().Add(30 * time.Second)
	for request(t, ctx, p, syscall.SIGUSR1, "report").MustUint(t, "gen") <= gen {
		if time.Now().After(deadline) {
			t.Fatalf("the writer made no progress in 30 s after snapctl was killed (generation %d)", gen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(dir, "snapshot.json")); err == nil {
		t.Errorf("a killed dump left a manifest")
	}
}

// TestDumpPreCopyUsage: the pre-copy bounds need --pre-copy.
func TestDumpPreCopyUsage(t *testing.T) {
	r := runSnapctl(t, "dump", "-t", "1", "-D", filepath.Join(t.TempDir(), "s"), "--pre-copy-rounds", "3")
	if r.Code != 2 {
		t.Errorf("--pre-copy-rounds without --pre-copy: exit %d, want 2\n%s", r.Code, r)
	}
}
