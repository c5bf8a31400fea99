package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// pagesBytes returns the size of the pages file of pid in the snapshot at
// dir, from its manifest.
func pagesBytes(t *testing.T, dir string, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, image.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	var m image.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	e, ok := m.Process(pid)
	if !ok {
		t.Fatalf("%s: no process %d", dir, pid)
	}
	return m.Files[e.Pages].Size
}

// dirtyFor has a modelserver write pct% of its mapping's pages per second
// for d, then stop.
func dirtyFor(t *testing.T, ctx context.Context, port, pct int, d time.Duration) {
	t.Helper()
	if a := lazyAsk(t, ctx, port, "dirty "+strconv.Itoa(pct)); !strings.HasPrefix(a, "dirty pct=") {
		t.Fatalf("dirty: %q", a)
	}
	time.Sleep(d)
	if a := lazyAsk(t, ctx, port, "dirty 0"); a != "dirty pct=0" {
		t.Fatalf("dirty 0: %q", a)
	}
}

// TestIncremental: a modelserver is dumped whole, then, after it wrote 1%
// of its memory, against that snapshot (--parent), then once more against
// the second: each incremental dump stores at most 5% of the first's
// pages bytes and equals the memory of the process exactly (read through
// the chain); a lazyfs mount of the last serves that memory; a third,
// with --pre-copy, kills it, and restores of that one, eager and lazy
// from either source, bring the process back as it was;
// a parent gone or replaced is refused with its exit status.
func TestIncremental(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "cmp", "sha256sum")
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "64M")
	port := int(p.Ready.MustInt(t, "port"))

	base, _ := dumpRecorded(t, ctx, p)
	full := pagesBytes(t, base.Dir, p.PID)

	dirtyFor(t, ctx, port, 1, 1100*time.Millisecond)
	child, _ := dumpRecorded(t, ctx, p, "--parent", base.Dir)
	if n := pagesBytes(t, child.Dir, p.PID); n*20 > full {
		t.Errorf("incremental dump after 1%% written: pages file %d bytes, more than 5%% of the full dump's %d", n, full)
	} else {
		t.Logf("incremental pages file %d bytes, %.2f%% of the full dump's %d", n, 100*float64(n)/float64(full), full)
	}

	dirtyFor(t, ctx, port, 1, 600*time.Millisecond)
	grand, rec := dumpRecorded(t, ctx, p, "--parent", child.Dir)
	if n := pagesBytes(t, grand.Dir, p.PID); n*20 > full {
		t.Errorf("second incremental dump: pages file %d bytes, more than 5%% of %d", n, full)
	}
	r := mustSnapctl(t, "inspect", "-D", grand.Dir)
	if !strings.Contains(r.Stdout, "incremental") || !strings.Contains(r.Stdout, base.Dir) || !strings.Contains(r.Stdout, child.Dir) {
		t.Errorf("inspect of the grandchild does not show its chain:\n%s", r.Stdout)
	}

	t.Run("lazyfs mount of the grandchild", func(t *testing.T) {
		model := newMemModel(t, rec, grand)
		mnt := lazyMountLazyfs(t, grand.Dir)
		regs := checkRegions(t, grand, filepath.Join(mnt, strconv.Itoa(p.PID)), model)
		t.Logf("%d region files equal the memory of the stopped process", len(regs))
	})

	want := map[string]string{}
	for _, req := range []string{"touch 1", "token"} {
		want[req] = lazyChecksumOf(lazyAsk(t, ctx, port, req))
	}
	// The last dump, with --pre-copy, kills the process.
	last, _ := dumpForRestore(t, ctx, p, "--parent", grand.Dir, "--pre-copy")
	check := func(t *testing.T) {
		for req, sum := range want {
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, req)); got != sum {
				t.Errorf("%s: checksum %s, want %s as before the dump", req, got, sum)
			}
		}
	}
	t.Run("restore", func(t *testing.T) {
		restoreAndAdopt(t, p, last)
		check(t)
		lazyKill(t, ctx, p)
	})
	for _, source := range []string{"mount", "direct"} {
		t.Run("restore --lazy --source "+source, func(t *testing.T) {
			l := startLazy(t, last, "--source", source)
			pid := l.waitRunning(t, ctx)
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
			check(t)
			l.mustFinish(t, ctx, pid)
			lazyKill(t, ctx, p)
		})
	}

	t.Run("parent missing", func(t *testing.T) {
		moved := base.Dir + ".moved"
		if err := os.Rename(base.Dir, moved); err != nil {
			t.Fatal(err)
		}
		defer os.Rename(moved, base.Dir)
		for _, args := range [][]string{{"verify", "-D", last}, {"inspect", "-D", last}, {"restore", "-D", last}} {
			r := runSnapctl(t, args...)
			if r.Code != 7 || !strings.Contains(r.Stderr, base.Dir) || !strings.Contains(r.Stderr, "parent snapshot missing") {
				t.Errorf("want exit 7 naming %s:\n%s", base.Dir, r)
			}
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(p.PID)); err == nil {
			t.Error("a refused restore left a process")
		}
	})
	t.Run("parent replaced", func(t *testing.T) {
		// The child's place taken by the base, another snapshot.
		aside := child.Dir + ".aside"
		if err := os.Rename(child.Dir, aside); err != nil {
			t.Fatal(err)
		}
		defer os.Rename(aside, child.Dir)
		copySnapshot(t, base.Dir, child.Dir)
		defer os.RemoveAll(child.Dir)
		for _, args := range [][]string{{"verify", "-D", last}, {"restore", "-D", last}, {"restore", "-D", last, "--lazy", "--source", "direct"}} {
			r := runSnapctl(t, args...)
			if r.Code != 9 || !strings.Contains(r.Stderr, filepath.Join(child.Dir, image.ManifestName)) {
				t.Errorf("want exit 9 naming %s:\n%s", filepath.Join(child.Dir, image.ManifestName), r)
			}
		}
		lazyfs := buildTool(t, "lazyfs")
		mnt := t.TempDir()
		if r := runTool(t, lazyfs, commandTimeout, "--background", last, mnt); r.Code != 9 {
			t.Errorf("lazyfs of a snapshot whose grandparent was replaced: want exit 9\n%s", r)
		}
	})
	t.Run("dump refusals", func(t *testing.T) {
		q := fixture.Start(t, "counter", "4M")
		for _, c := range []struct {
			args []string
			code int
		}{
			{[]string{"--parent", filepath.Join(t.TempDir(), "nothing")}, 7},
			{[]string{"--parent", base.Dir, "--sign", "/nonexistent"}, 2},
			{[]string{"--parent", base.Dir, "--compress"}, 3},
		} {
			dir := filepath.Join(t.TempDir(), "snap")
			r := runSnapctl(t, append([]string{"dump", "-t", strconv.Itoa(q.PID), "-D", dir, "--leave-running"}, c.args...)...)
			if r.Code != c.code {
				t.Errorf("want exit %d:\n%s", c.code, r)
			}
			if hasManifest(t, dir) {
				t.Errorf("a refused dump left a snapshot in %s", dir)
			}
		}
		answersNormally(t, ctx, q, syscall.SIGUSR1, "report")
	})
}

// TestIncrementalS3: incremental snapshots in an object store, with the
// parent there, and in a directory with the parent in the store; both
// equal the memory of the stopped process. A relative parent for a
// snapshot at an address is refused.
func TestIncrementalS3(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	s3Setup(t, true)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "16M")
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cont()
	rec := takeMemory(t, p.PID)
	base, child, local := "s3://snaps/inc/base", "s3://snaps/inc/child", filepath.Join(t.TempDir(), "local")
	dumpPID(t, p.PID, base, "--leave-running")
	for _, c := range []struct{ dir, parent string }{{child, base}, {local, base}} {
		r := dumpPID(t, p.PID, c.dir, "--leave-running", "--parent", c.parent)
		t.Logf("%s", strings.TrimSpace(r.Stdout))
		if !strings.Contains(r.Stdout, "incremental: ") || strings.Contains(r.Stdout, " 0 blocks taken") {
			t.Errorf("%s took nothing from %s:\n%s", c.dir, c.parent, r.Stdout)
		}
		checkImage(t, openImage(t, c.dir, p.PID), rec)
		verifyDir(t, c.dir)
	}
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", "s3://snaps/inc/rel", "--leave-running", "--parent", "some/dir")
	if r.Code != 3 {
		t.Errorf("a relative parent for a snapshot at an address: want exit 3\n%s", r)
	}
}

// TestIncrementalTree: a pipeline of three processes dumped whole
// (--leave-running), then against that snapshot: every process takes
// blocks from its own pages in the parent, and the tree restored from the
// incremental snapshot loses or doubles no number.
func TestIncrementalTree(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	sh, out, done, before := startPipeline(t, ctx, pipelineNumbers)
	time.Sleep(300 * time.Millisecond)
	base := filepath.Join(t.TempDir(), "base")
	dumpPID(t, sh, base, "--leave-running")
	dir := filepath.Join(t.TempDir(), "child")
	r := dumpPID(t, sh, dir, "--parent", base)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	<-done
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range snap.PIDs() {
		pr, err := snap.OpenPages(pid, image.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st := pr.Stats(); st.Parent.Blocks == 0 {
			t.Errorf("pid %d took no block from the parent: %+v", pid, st)
		}
		pr.Close()
	}
	snap.Close()
	verifyDir(t, dir)
	r = mustSnapctl(t, "restore", "-D", dir)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	sameTree(t, sh, before)
	if got, want := waitFile(t, ctx, out, 60*time.Second), fmt.Sprintf("ok %d", pipelineNumbers); got != want {
		t.Errorf("consumer says %q, want %q", got, want)
	}
}
