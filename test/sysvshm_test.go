package e2e

// System V shared memory: a parent and a child sharing a keyed segment
// and an IPC_PRIVATE one marked for destruction (test/fixtures/sysvshm.c,
// laid out as PostgreSQL's postmaster and backends share theirs) come back
// attached to segments of the same contents, key, ids, owner and mode,
// still shared: the child's writes show in the parent. A restore whose
// segment key another process has attached now is refused, naming it.

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

func TestRestoreSysVShm(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	buildTool(t, "snapctl")
	for i, mode := range []string{"eager", "lazy", "key in use"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			key := 0x1a2f0000 + os.Getpid()%0x10000*8 + i
			p := fixture.Start(t, "sysvshm", strconv.Itoa(key))
			id, _ := strconv.Atoi(p.Ready.Fields["id"])
			t.Cleanup(func() {
				killSession(p.PID)
				// The keyed segment outlives its processes, as PostgreSQL's.
				for _, s := range sysvSegments(t) {
					if s.Key == int32(key) {
						unix.SysvShmCtl(s.ID, unix.IPC_RMID, nil)
					}
				}
			})
			waitTree(t, ctx, p.PID, 2)
			before := request(t, ctx, p, syscall.SIGUSR1, "report")
			wantField(t, before, "nattch", "2")
			wantField(t, before, "dest", "1")
			dir, si := dumpForRestore(t, ctx, p)
			segs := 0
			for _, v := range si.State.VMAs {
				if v.Shmem != nil && v.Shmem.SysV != nil {
					segs++
				}
			}
			if segs != 2 {
				t.Errorf("%d System V attaches in the parent's state, want 2", segs)
			}
			if mode == "key in use" {
				// Another process attaches the leftover segment.
				addr, err := unix.SysvShmAttach(id, 0, unix.SHM_RDONLY)
				if err != nil {
					t.Fatal(err)
				}
				defer unix.SysvShmDetach(addr)
				r := runSnapctl(t, "restore", "-D", dir)
				wantRefused(t, ctx, r, exitUnsupported, p.PID, fmt.Sprintf("key %#x", key), "attached 1 times")
				// What the refused restore made is gone.
				for _, s := range sysvSegments(t) {
					if s.CPID == p.PID && s.Key != int32(key) {
						t.Errorf("the refused restore left segment %+v", s)
					}
				}
				return
			}
			var flags []string
			if mode == "lazy" {
				flags = append(flags, "--lazy")
			}
			restoreAndAdopt(t, p, dir, flags...)
			after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			for _, k := range []string{"sum", "private_sum", "nattch", "mode", "uid", "dest"} {
				if a, b := after.Fields[k], before.Fields[k]; a != b {
					t.Errorf("%s: %s after the restore, %s before\n%s\n%s", k, a, b, after.Text, before.Text)
				}
			}
			// Still shared: the restored child's writes show in the parent.
			time.Sleep(100 * time.Millisecond)
			later := request(t, ctx, p, syscall.SIGUSR1, "report")
			if later.MustUint(t, "counter") <= after.MustUint(t, "counter") {
				t.Errorf("the child's counter stopped in the parent's view: %q then %q", after.Text, later.Text)
			}
			found := false
			for _, s := range sysvSegments(t) {
				if s.Key == int32(key) {
					found = s.ID == id && s.UID == 65534 && s.Mode&0o777 == 0o640
					if !found {
						t.Errorf("segment of key %#x now %+v, want id %d, uid 65534, mode 640", key, s, id)
					}
				}
			}
			if !found {
				t.Errorf("no segment of key %#x after the restore", key)
			}
			lazyKill(t, ctx, p)
		})
	}
}

// sysvSegments lists the System V segments of our IPC namespace.
func sysvSegments(t *testing.T) []kernel.SysVShm {
	t.Helper()
	m, err := kernel.ReadSysVShm()
	if err != nil {
		t.Fatal(err)
	}
	var out []kernel.SysVShm
	for _, s := range m {
		out = append(out, s)
	}
	return out
}
