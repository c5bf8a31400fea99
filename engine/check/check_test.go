package check

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// On a machine that has them all (CI, as root), every probe succeeds, in
// the order snapctl check prints them, and leaves no process behind.
func TestRun(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	feats := Run(t.Context(), "")
	want := []string{"ptrace", "clone3 set_tid", "PR_SET_MM_MAP", "userfaultfd", "uffd WP_ASYNC", "PAGEMAP_SCAN", "namespaces", "TCP_REPAIR"}
	if len(feats) != len(want) {
		t.Fatalf("%d features, want %d: %+v", len(feats), len(want), feats)
	}
	for i, f := range feats {
		if f.Name != want[i] || !f.OK || f.Needed == "" || f.Detail == "" {
			t.Errorf("feature %d: %+v, want %s OK with what needs it and what was seen", i, f, want[i])
		}
		// What needs write tracking is a pre-copy dump (an incremental
		// one compares blocks with its parent's and needs neither).
		if (f.Name == "uffd WP_ASYNC" || f.Name == "PAGEMAP_SCAN") && f.Needed != "dump --pre-copy" {
			t.Errorf("%s needed by %q, want dump --pre-copy", f.Name, f.Needed)
		}
	}
	children, err := proc.Children(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		if comm, err := proc.ReadComm(c); err == nil {
			t.Errorf("check left child %d (%s)", c, comm)
		}
	}
}

// A stub that cannot start fails ptrace with the reason, and the two
// probes that need it say so instead of a reason of their own.
func TestRunNoStub(t *testing.T) {
	testutil.RequirePtrace(t)
	stub := filepath.Join(t.TempDir(), "missing")
	feats := checkTracing(context.Background(), stub)
	if len(feats) != 3 {
		t.Fatalf("%+v", feats)
	}
	if f := feats[0]; f.Name != "ptrace" || f.OK || !strings.Contains(f.Detail, "missing") {
		t.Errorf("ptrace with a missing stub: %+v", f)
	}
	for _, f := range feats[1:] {
		if f.OK || f.Detail != "not tried: needs ptrace" {
			t.Errorf("%s after ptrace failed: %+v", f.Name, f)
		}
	}
}

func TestFreePID(t *testing.T) {
	pidMax, err := kernel.SysctlInt("kernel.pid_max")
	if err != nil {
		t.Fatal(err)
	}
	if pidMax <= 2300 {
		t.Skipf("kernel.pid_max %d: freePID refuses it", pidMax)
	}
	pid, err := freePID()
	if err != nil {
		t.Fatal(err)
	}
	if pid < 300 || pid >= pidMax {
		t.Errorf("free pid %d outside [300, %d)", pid, pidMax)
	}
	if taken, err := proc.Exists(pid); taken || err != nil {
		t.Errorf("free pid %d exists (%v)", pid, err)
	}
}

func TestFUSE(t *testing.T) {
	ok := FUSE("/dev/fuse opens; /bin/fusermount3", nil)
	if ok != (Feature{Name: "FUSE", Needed: neededMount, OK: true, Detail: "/dev/fuse opens; /bin/fusermount3"}) {
		t.Errorf("FUSE found: %+v", ok)
	}
	missing := FUSE("", errors.New("FUSE unavailable: fusermount3 not found"))
	if missing != (Feature{Name: "FUSE", Needed: neededMount, Detail: "FUSE unavailable: fusermount3 not found"}) {
		t.Errorf("FUSE missing: %+v", missing)
	}
}
