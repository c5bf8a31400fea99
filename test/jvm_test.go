package e2e

// A JVM as its operators run it: OpenJDK's java with the default (G1)
// collector, JIT compiler threads and the JDK's HTTP server
// (test/fixtures/JvmServer.java). It is dumped and restored eagerly, then
// dumped again and restored lazily; each time it answers with its request
// count carried on, its 64 MiB array and map intact, and survives a full
// collection that walks its whole heap.

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// jvmState asks the server for path and returns its count and the rest of
// the answer (checksum and map size), which no request changes.
func jvmState(t *testing.T, ctx context.Context, p *fixture.Proc, path string) (int, string) {
	t.Helper()
	s, err := fixture.JVMGet(ctx, p.Port, path)
	if err != nil {
		t.Fatalf("GET %s: %v (log %s)", path, err, p.LogPath)
	}
	f := strings.Fields(s)
	if len(f) != 6 || f[0] != "count" || f[2] != "sum" || f[4] != "entries" || f[5] != "100000" {
		t.Fatalf("GET %s answered %q", path, s)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("GET %s answered %q", path, s)
	}
	return n, strings.Join(f[2:], " ")
}

func TestRestoreJVM(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.StartJVM(t)
	if p == nil {
		return
	}
	n, state := jvmState(t, ctx, p, "/")
	threads := len(srvTasks(t, p.PID))
	if threads < 10 {
		t.Fatalf("the JVM runs %d threads; a JVM runs its collector and compiler threads beside main", threads)
	}
	// After each restore the server goes on counting from the snapshot,
	// holds the same data, and collects its whole heap.
	check := func(when string) {
		t.Helper()
		got, st := jvmState(t, ctx, p, "/")
		if got != n+1 || st != state {
			t.Fatalf("%s: count %d, %s; want count %d, %s", when, got, st, n+1, state)
		}
		got, st = jvmState(t, ctx, p, "/gc")
		if got != n+2 || st != state {
			t.Fatalf("%s, after a full collection: count %d, %s; want count %d, %s", when, got, st, n+2, state)
		}
		n += 2
		if k := len(srvTasks(t, p.PID)); k < threads {
			t.Errorf("%s: %d threads, %d at the dump", when, k, threads)
		}
	}

	dir := srvDump(t, ctx, p)
	srvRestore(t, p, dir)
	check("eager restore")

	dir = srvDump(t, ctx, p)
	l := startLazy(t, dir)
	if pid := l.waitRunning(t, ctx); pid != p.PID {
		t.Fatalf("lazy restore ran pid %d, want %d", pid, p.PID)
	}
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	check("lazy restore")
	l.mustFinish(t, ctx, p.PID)
	check("lazy restore, all memory in")
	srvKill(t, ctx, p)
}
