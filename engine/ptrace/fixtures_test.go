package ptrace

import (
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// start starts fixture name (test/fixtures/<name>.c) for a test that
// traces it from this process: the harness leaves it unreaped until the
// test waits for it or cleanup kills it, so that no wait of the harness
// takes the ptrace stops from the tracer.
func start(t testing.TB, name string) *fixture.Proc {
	t.Helper()
	return fixture.StartWith(t, name, fixture.Options{Traced: true})
}

// newTracer returns a Tracer closed in t.Cleanup, after checking ptrace is
// allowed.
func newTracer(t testing.TB) *Tracer {
	t.Helper()
	testutil.RequirePtrace(t)
	tr, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// taskStates returns tid -> state letter from /proc/PID/task/*/stat.
func taskStates(t testing.TB, pid int) map[int]byte {
	t.Helper()
	states, err := fixture.TaskStates(pid)
	if err != nil {
		t.Fatal(err)
	}
	return states
}

// requireFrozen checks that every task of pid is in tracing stop and held
// by p.
func requireFrozen(t testing.TB, p *Process) {
	t.Helper()
	held := map[int]bool{}
	for _, th := range p.Threads() {
		held[th.Tid()] = true
	}
	for tid, st := range taskStates(t, p.Pid()) {
		if st != 't' {
			t.Errorf("task %d state %c, want t (tracing stop)", tid, st)
		}
		if !held[tid] {
			t.Errorf("task %d not in Threads()", tid)
		}
	}
}

// requireNotTraced checks that no task of pid is in tracing stop (when,
// say "after detach", goes in the message).
func requireNotTraced(t testing.TB, pid int, when string) {
	t.Helper()
	for tid, st := range taskStates(t, pid) {
		if st == 't' {
			t.Errorf("task %d still in tracing stop %s", tid, when)
		}
	}
}

// startSeized starts fixture name (start) and seizes it with o, on a new
// Tracer.
func startSeized(t testing.TB, name string, o SeizeOptions) (*Tracer, *fixture.Proc, *Process) {
	t.Helper()
	tr := newTracer(t)
	c := start(t, name)
	return tr, c, seize(t, tr, c.PID, o)
}

// seize seizes pid, failing the test on error.
func seize(t testing.TB, tr *Tracer, pid int, o SeizeOptions) *Process {
	t.Helper()
	p, err := tr.Seize(pid, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// detachRuns detaches p and checks that the fixture c runs on: it ticks
// again.
func detachRuns(t testing.TB, p *Process, c *fixture.Proc) {
	t.Helper()
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	c.Skip()
	c.Expect(t, "tick", 2*time.Second)
}

// findMapping returns the mapping of pid that holds addr, if any.
func findMapping(t *testing.T, pid int, addr uint64) (proc.Mapping, bool) {
	t.Helper()
	maps, err := proc.ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if addr >= m.Start && addr < m.End {
			return m, true
		}
	}
	return proc.Mapping{}, false
}
