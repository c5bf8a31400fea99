package e2e

// lazyfs -u while snapctl's own mount namespaces exist: a replica's
// (restore --pidns) and a lazy restore's private-mount helper's. On a
// host whose / is a private mount (this machine's kind), an unmount
// outside never reaches a namespace's copy of a mount: each namespace
// must drop the copies of other lazyfs mounts when it is made, so that
// lazyfs -u ends the file system and its server. And when something else
// holds a copy, lazyfs -u says what.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// lazyfsServer mounts dir on a new directory with a lazyfs of its own in
// the foreground, and returns the mount point and a channel closed when
// that server exits.
func lazyfsServer(t *testing.T, dir string) (string, <-chan struct{}) {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(buildTool(t, "lazyfs"), dir, mnt)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		if mountedAt(t, mnt) {
			runTool(t, buildTool(t, "lazyfs"), commandTimeout, "-u", "--force", mnt)
		}
		cmd.Process.Kill()
		<-done
	})
	for deadline := time.Now().Add(10 * time.Second); !mountedAt(t, mnt); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lazyfs %s %s: not mounted after 10 s", dir, mnt)
		}
	}
	return mnt, done
}

// mountDev is the major:minor of the file system mounted on mnt.
func mountDev(t *testing.T, mnt string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
}

// devHolders lists a pid of each mount namespace that has a mount of dev.
func devHolders(dev string) []int {
	ents, _ := os.ReadDir("/proc")
	seen := map[string]bool{}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		ms, _ := kernel.Mounts(pid)
		for _, m := range ms {
			if m.Dev == dev {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func TestUnmountWithReplica(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	unshare := testutil.RequireCommand(t, "unshare")
	ctx := testContext(t)

	// The snapshot mounted, and two processes to restore while it is.
	m := fixture.Start(t, "counter", "1M")
	mdir := filepath.Join(t.TempDir(), "mounted")
	dumpPID(t, m.PID, mdir, "--leave-running")
	mnt, served := lazyfsServer(t, mdir)
	dev := mountDev(t, mnt)

	p := fixture.Start(t, "counter", "4M")
	pdir := filepath.Join(t.TempDir(), "replica")
	dumpPID(t, p.PID, pdir, "--leave-running")
	rep := &replica{run: startLazy(t, pdir, "--source", "direct", "--pidns", "--netns", "new")}
	rep.waitRunning(t, ctx, p.PID)
	rep.run.mustFinish(t, ctx, rep.pid)

	q := fixture.Start(t, "counter", "4M")
	qdir := filepath.Join(t.TempDir(), "private")
	dumpPID(t, q.PID, qdir)
	// Its lazy phase, and so its private mount's helper, lasts while the
	// prefetch waits.
	lz := startLazy(t, qdir, "--prefetch-delay", "60s")
	lz.waitRunning(t, ctx)
	if err := q.Adopt(); err != nil {
		t.Fatal(err)
	}

	// The private mount's helper is set up in the background while the
	// process runs: between its unshare and its detaching of the copies
	// of other lazyfs mounts, its new namespace holds one for a moment.
	h := devHolders(dev)
	for deadline := time.Now().Add(5 * time.Second); (len(h) != 1 || h[0] == rep.pid) && time.Now().Before(deadline); h = devHolders(dev) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(h) != 1 || h[0] == rep.pid {
		t.Errorf("mount namespaces holding %s: pids %v, want only ours", mnt, h)
	}
	r := runTool(t, buildTool(t, "lazyfs"), commandTimeout, "-u", mnt)
	if r.Code != 0 {
		t.Fatalf("lazyfs -u with a replica and a private mount running: %s", r)
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatalf("lazyfs -u %s returned, but its server still runs; held by %v", mnt, devHolders(dev))
	}
	if err := q.Kill(ctx); err != nil {
		t.Fatal(err)
	}

	// A namespace snapctl did not make holds a copy: lazyfs -u says so.
	mnt2, served2 := lazyfsServer(t, mdir)
	hold := exec.Command(unshare, "-m", "--propagation", "private", "sleep", "60")
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Process.Kill(); hold.Wait() })
	for deadline := time.Now().Add(5 * time.Second); len(devHolders(mountDev(t, mnt2))) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("unshare: no second mount namespace holds the mount")
		}
	}
	r = runTool(t, buildTool(t, "lazyfs"), commandTimeout, "-u", mnt2)
	want := fmt.Sprintf("pid %d (sleep)", hold.Process.Pid)
	if r.Code == 0 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "nsenter") {
		t.Errorf("lazyfs -u of a mount another namespace holds: want a failure naming %s and what to do\n%s", want, r)
	}
	hold.Process.Kill()
	hold.Wait()
	select {
	case <-served2:
	case <-ctx.Done():
		t.Fatal("the server did not exit once the namespace holding its mount was gone")
	}
}
