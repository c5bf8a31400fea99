package e2e

// Shared memory of a tree (test/fixtures/shmtree.c: a shared anonymous
// mapping and a memfd, mapped by a parent and three children, as
// PostgreSQL's buffer pool) comes back with every byte it had, eagerly
// and lazily. A lazy restore leaves it out of what it writes before the
// processes run: the children read it through page faults their pagers
// serve (with the background streaming held back, they read all of it
// that way), or as the streamer places it.

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// shmtreeData is the non-zero memory of shmtree's shared objects: 8 MiB
// but the control page, a page per MiB of the 16 after, and 2 MiB of
// the memfd.
const shmtreeData = 8<<20 + 16*4096 + 2<<20

func TestTreeSharedMemoryLazy(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	buildTool(t, "snapctl")
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"eager", nil},
		{"lazy", []string{"--source", "direct"}},
		{"lazy-faults", []string{"--prefetch-delay", "5s"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if mode.name != "eager" {
				testutil.RequireKernel(t, "userfaultfd on shared memory (UFFD_FEATURE_MISSING_SHMEM)", probeMissingShmem())
			}
			ctx := testContext(t)
			p := fixture.Start(t, "shmtree")
			t.Cleanup(func() { killSession(p.PID) })
			waitTree(t, ctx, p.PID, 4)
			before := request(t, ctx, p, syscall.SIGUSR1, "report")
			shmtreeAgree(t, before, before)
			dir, _ := dumpForRestore(t, ctx, p)
			file := filepath.Join(t.TempDir(), "restore.json")
			flags := append([]string{"--stats", file}, mode.flags...)
			if mode.name == "eager" {
				restoreAndAdopt(t, p, dir, flags...)
			} else {
				l := startLazy(t, dir, flags...)
				l.waitRunning(t, ctx)
				if err := p.Adopt(); err != nil {
					t.Fatal(err)
				}
				// The children read all of both objects now: with the
				// streaming held back (lazy-faults, for longer than
				// they take), every page of them through a fault.
				shmtreeAgree(t, request(t, ctx, p, syscall.SIGUSR1, "report"), before)
				l.mustFinish(t, ctx, p.PID)
			}
			shmtreeAgree(t, answersNormally(t, ctx, p, syscall.SIGUSR1, "report"), before)
			var r struct {
				Filled        uint64 `json:"filled_bytes"`
				FaultBytes    uint64 `json:"fault_bytes"`
				PrefetchBytes uint64 `json:"prefetch_bytes"`
			}
			readStats(t, file, &r)
			t.Logf("filled %d, on faults %d, prefetched %d", r.Filled, r.FaultBytes, r.PrefetchBytes)
			switch {
			case mode.name == "eager" && r.Filled < shmtreeData:
				t.Errorf("eager: filled %d bytes, less than the %d of shared data", r.Filled, shmtreeData)
			case mode.name != "eager" && r.Filled >= shmtreeData:
				t.Errorf("lazy: filled %d bytes before the processes ran, the %d of shared data among them", r.Filled, shmtreeData)
			case mode.name != "eager" && r.FaultBytes+r.PrefetchBytes < shmtreeData:
				t.Errorf("lazy: %d bytes on faults and %d prefetched, less than the %d of shared data", r.FaultBytes, r.PrefetchBytes, shmtreeData)
			case mode.name == "lazy-faults" && r.FaultBytes < shmtreeData:
				t.Errorf("lazy, streaming held back: %d bytes on faults, less than the %d of shared data the children read", r.FaultBytes, shmtreeData)
			}
			lazyKill(t, ctx, p)
		})
	}
}

// shmtreeAgree checks that every child of a shmtree report read both
// objects as the parent does, and that they hold what they held before
// the dump.
func shmtreeAgree(t *testing.T, got, before fixture.Line) {
	t.Helper()
	want := before.Fields["sum"] + "/" + before.Fields["msum"]
	if s := got.Fields["sum"] + "/" + got.Fields["msum"]; s != want {
		t.Errorf("the parent reads %s, want %s\n%s", s, want, got.Text)
	}
	for _, c := range []string{"c0", "c1", "c2"} {
		if got.Fields[c] != want {
			t.Errorf("child %s read %s, want %s\n%s", c, got.Fields[c], want, got.Text)
		}
	}
}

// TestRestoreMappingsLazy: a single process's mappings restored lazily
// (test/fixtures/mappings.c): its shared anonymous mapping is served on
// demand, its memfd, which it holds a descriptor of, is filled before it
// runs (a read(2) of it must see its data), and every region reads as it
// did, during the lazy phase and after.
func TestRestoreMappingsLazy(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx := testContext(t)
	p := fixture.Start(t, "mappings")
	before := request(t, ctx, p, syscall.SIGUSR1, "report")
	dir, _ := dumpForRestore(t, ctx, p)
	l := startLazy(t, dir, "--source", "direct", "--prefetch-delay", "2s")
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	check := func(when string, got fixture.Line) {
		for _, k := range []string{"private", "shared_ro", "memfd", "shared_anon", "madv", "mlock"} {
			if got.Fields[k] != before.Fields[k] {
				t.Errorf("%s: %s %s, want %s", when, k, got.Fields[k], before.Fields[k])
			}
		}
		wantField(t, got, "memfd_read_ok", "1")
	}
	check("during the lazy phase", request(t, ctx, p, syscall.SIGUSR1, "report"))
	l.mustFinish(t, ctx, p.PID)
	check("restored", answersNormally(t, ctx, p, syscall.SIGUSR1, "report"))
	lazyKill(t, ctx, p)
}

// TestTreeSharedMemoryLazyRemove: a process that frees pages of shared
// memory served lazily (madvise MADV_REMOVE) ends the restore, naming
// what it did, and the tree is killed: the event does not say whether
// the pages were freed or only unmapped from that process, and guessing
// wrong would serve the snapshot's data where the object now reads zeros,
// or the reverse.
func TestTreeSharedMemoryLazyRemove(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireKernel(t, "userfaultfd on shared memory (UFFD_FEATURE_MISSING_SHMEM)", probeMissingShmem())
	ctx := testContext(t)
	p := fixture.Start(t, "shmtree")
	t.Cleanup(func() { killSession(p.PID) })
	waitTree(t, ctx, p.PID, 4)
	dir, _ := dumpForRestore(t, ctx, p)
	// Streaming held back: the page advised is still to be served.
	l := startLazy(t, dir, "--source", "direct", "--prefetch-delay", "20s")
	l.waitRunning(t, ctx)
	if err := syscall.Kill(p.PID, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	r := l.wait(t, ctx)
	if r.Code == 0 || !strings.Contains(r.Stderr, "madvise of lazily served shared memory") {
		t.Fatalf("snapctl restore --lazy after a MADV_REMOVE of shared memory: exit %d, want a failure that names it\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if !pidGone(ctx, p.PID) {
		t.Errorf("pid %d runs on after the restore failed", p.PID)
	}
}

// probeMissingShmem asks the kernel whether a userfaultfd serves missing
// pages of shared memory (UFFD_FEATURE_MISSING_SHMEM, Linux 4.11): without
// it, restore --lazy fills shared memory before the processes run.
func probeMissingShmem() error {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		return fmt.Errorf("userfaultfd: %w", e)
	}
	defer unix.Close(int(fd))
	_, _, err := uffdio.API(int(fd), uffdio.FeatureMissingShmem)
	return err
}
