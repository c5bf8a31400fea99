package e2e

import (
	"strconv"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestZombiesRestored dumps a parent with three children it has not
// reaped (fixtures/zombies.c: one exited 42, one killed by SIGTERM, one
// exited 0), as PostgreSQL's postmaster is between a backend's exit and
// its SIGCHLD handler. Each restore, eager and lazy, gives them back as
// zombies of the parent with their pids, and the parent reaps each by
// pid with the status it ended with, then finds no child left. Before,
// they were left out of the snapshot: waitpid failed with ECHILD, and a
// postmaster restored so waited for them forever when asked to shut
// down.
func TestZombiesRestored(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.Start(t, "zombies")
	t.Cleanup(func() { killSession(p.PID) })
	kids := map[string]int{}
	for _, k := range []string{"exit42", "term", "exit0"} {
		kids[k] = int(p.Ready.MustInt(t, k))
	}
	dir, img := dumpForRestore(t, ctx, p)
	if n := len(img.State.Zombies); n != 3 {
		t.Fatalf("the snapshot holds %d unreaped children of pid %d, want 3: %+v", n, p.PID, img.State.Zombies)
	}
	want := map[string]int{"exit42": 42 << 8, "term": int(syscall.SIGTERM), "exit0": 0}
	restoreEachWay(t, ctx, p, dir, func(t *testing.T, when string) {
		for name, pid := range kids {
			st, err := proc.ReadStat(pid)
			switch {
			case err != nil:
				t.Errorf("%s: child %s (pid %d): %v", when, name, pid, err)
			case !st.Exited() || st.PPid != p.PID || st.ExitCode != want[name]:
				t.Errorf("%s: child %s (pid %d): state %c, parent %d, status %#x; want a zombie of %d with status %#x",
					when, name, pid, st.State, st.PPid, st.ExitCode, p.PID, want[name])
			}
		}
	}, func(t *testing.T, mode string) {
		l := request(t, ctx, p, syscall.SIGUSR2, "reaped")
		for name := range kids {
			wantField(t, l, name, strconv.Itoa(want[name]))
		}
		wantField(t, l, "echild", "1")
		if t.Failed() {
			t.Logf("%s: the parent reaped %q", mode, l.Text)
		}
	})
}
