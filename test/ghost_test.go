package e2e

// Deleted files: a process holding open a file it deleted (two open file
// descriptions of one inode, test/fixtures/ghost.py) gets back, eager or
// lazy, a file of the same contents, mode and offsets, still one inode for
// both, still deleted; a shared library deleted while mapped (a package
// upgrade's) is mapped again from a file of its contents and its code
// runs; one over --ghost-limit is refused at dump, naming it and the flag,
// and kept with the limit raised; --ghost-limit 0 keeps none.

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

func TestRestoreDeletedFiles(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	buildTool(t, "snapctl")
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.StartPython(t, "ghost.py", t.TempDir())
			before := request(t, ctx, p, syscall.SIGUSR1, "report")
			wantField(t, before, "same", "1")
			wantField(t, before, "nlink", "0")
			dir, si := dumpForRestore(t, ctx, p)
			ghosts := 0
			for _, f := range si.State.FDs {
				if f.Ghost != nil {
					ghosts++
				}
			}
			if ghosts != 2 {
				t.Errorf("%d descriptors on deleted files in the snapshot, want 2", ghosts)
			}
			mapped, kept := 0, 0
			for _, v := range si.State.VMAs {
				if v.Ghost != nil {
					mapped++
					if len(v.Ghost.Data) > 0 {
						kept++
					}
				}
			}
			if mapped < 2 || kept != 1 {
				t.Errorf("%d mappings of deleted files in the snapshot, %d holding contents: want the library's, its contents once", mapped, kept)
			}
			var flags []string
			if mode == "lazy" {
				flags = append(flags, "--lazy")
			}
			restoreAndAdopt(t, p, dir, flags...)
			after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			wantField(t, after, "libdeleted", "1")
			for _, k := range []string{"sum", "pos_rw", "pos_ro", "same", "nlink", "mode", "libcrc"} {
				if a, b := after.Fields[k], before.Fields[k]; a != b {
					t.Errorf("%s: %s after the restore, %s before (%q, %q)", k, a, b, after.Text, before.Text)
				}
			}
			fd := p.Ready.Fields["fd_rw"]
			link := readProcLink(t, p.PID, fd)
			if !strings.HasSuffix(link, " (deleted)") {
				t.Errorf("fd %s of the restored process is %q, not a deleted file", fd, link)
			}
		})
	}
	t.Run("over the limit", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.StartPython(t, "ghost.py", t.TempDir(), "--big", strconv.Itoa(3<<20))
		r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", t.TempDir()+"/snap")
		if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "big.tmp") || !strings.Contains(r.Stderr, "--ghost-limit") {
			t.Fatalf("dump of a 3 MiB deleted file: want exit %d naming it and --ghost-limit\n%s", exitUnsupported, r)
		}
		r = runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", t.TempDir()+"/snap", "--ghost-limit", "0")
		if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "--ghost-limit 0 keeps none") {
			t.Fatalf("dump with --ghost-limit 0: want exit %d saying it keeps none\n%s", exitUnsupported, r)
		}
		before := request(t, ctx, p, syscall.SIGUSR1, "report")
		dir, _ := dumpForRestore(t, ctx, p, "--ghost-limit", "4M")
		restoreAndAdopt(t, p, dir)
		after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
		wantField(t, after, "sum", before.Fields["sum"])
	})
}

// TestRestoreDeletedProgram: a program deleted while it runs (replaced by
// an upgrade) is kept whole in the snapshot, and the restored process runs
// from a file made of it, its exe.
func TestRestoreDeletedProgram(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p, path := fixture.StartCopy(t, "counter", "1M")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	before := request(t, ctx, p, syscall.SIGUSR1, "report")
	dir, _ := dumpForRestore(t, ctx, p)
	restoreAndAdopt(t, p, dir)
	after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	if after.MustUint(t, "counter") < before.MustUint(t, "counter") {
		t.Errorf("counter %s after the restore, %s before", after.Fields["counter"], before.Fields["counter"])
	}
	if exe := readProcLink(t, p.PID, "../exe"); !strings.HasSuffix(exe, " (deleted)") {
		t.Errorf("the restored process's exe is %q, not a deleted file", exe)
	}
}

// readProcLink reads /proc/PID/fd/FD.
func readProcLink(t *testing.T, pid int, fd string) string {
	t.Helper()
	link, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd)
	if err != nil {
		t.Fatal(err)
	}
	return link
}
