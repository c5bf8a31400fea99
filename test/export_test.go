package e2e

// snapctl export: a real model server's snapshot, from a directory and
// from MinIO, into one archive file and onto a pipe; the archive read in
// place by verify, a lazyfs mount and eager and lazy restores, whose
// server answers as before the dump; unpacked by tar into a snapshot
// directory; and the archives that must be refused.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

func TestExportArchive(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "tar", "cmp")
	s3Setup(t, true)
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "64M")
	port := int(p.Ready.MustInt(t, "port"))
	want := map[string]string{}
	for _, req := range []string{"touch 1", "token"} {
		want[req] = lazyChecksumOf(lazyAsk(t, ctx, port, req))
	}
	tmp := t.TempDir()
	dir, addr := filepath.Join(tmp, "model"), "s3://snaps/export/model"
	dumpPID(t, p.PID, dir, "--leave-running")
	dumpPID(t, p.PID, addr)
	local, remote := filepath.Join(tmp, "local.tar"), filepath.Join(tmp, "remote.tar")
	r := mustSnapctl(t, "export", "-D", dir, "-o", local)
	if !strings.Contains(r.Stdout, "exported "+dir+" into "+local) {
		t.Errorf("export says %q", r.Stdout)
	}
	mustSnapctl(t, "export", "-D", addr, "-o", remote)
	if r := runSnapctl(t, "export", "-D", dir, "-o", local); r.Code != 1 || !strings.Contains(r.Stderr, local+" exists") {
		t.Errorf("export over an existing file: want exit 1 naming it\n%s", r)
	}
	for _, f := range []string{local, remote} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v: want 0600", f, err, fi.Mode())
		}
		verifyDir(t, f)
	}

	// Streamed onto a pipe and unpacked by tar: a snapshot directory.
	unpacked := filepath.Join(tmp, "unpacked")
	os.Mkdir(unpacked, 0o700)
	export := exec.CommandContext(ctx, buildTool(t, "snapctl"), "export", "-D", dir, "-o", "-")
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", unpacked)
	pipe, err := export.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	export.Stderr = &stderr
	if err := export.Run(); err != nil {
		t.Fatalf("export -o -: %v\n%s", err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("tar -x: %v", err)
	}
	verifyDir(t, filepath.Join(unpacked, "model"))

	// Each archive's mount serves what its snapshot's does: the
	// directory's and its archive's, the store's and its archive's (the
	// two snapshots differ: the server ran between the dumps).
	for _, pair := range [][2]string{{dir, local}, {addr, remote}} {
		mntSnap, mntTar := lazyMountLazyfs(t, pair[0]), lazyMountLazyfs(t, pair[1])
		regions, _ := filepath.Glob(filepath.Join(mntSnap, strconv.Itoa(p.PID), "regions", "*"))
		if len(regions) == 0 {
			t.Fatalf("no regions on the mount of %s", pair[0])
		}
		for _, reg := range regions {
			if out, err := exec.CommandContext(ctx, "cmp", reg, filepath.Join(mntTar, strconv.Itoa(p.PID), "regions", filepath.Base(reg))).CombinedOutput(); err != nil {
				t.Errorf("%s against %s: cmp: %v\n%s", pair[1], pair[0], err, out)
			}
		}
	}

	// Restored from the archives and from the unpacked directory, eagerly
	// and lazily: the server answers as before.
	lazyKill(t, ctx, p)
	for _, c := range []struct {
		name  string
		dir   string
		flags []string
	}{
		{"eager from the local archive", local, nil},
		{"lazy from the store's archive", remote, []string{"--lazy"}},
		{"lazy, direct, from the local archive", local, []string{"--lazy", "--source", "direct"}},
		{"eager from the unpacked archive", filepath.Join(unpacked, "model"), nil},
	} {
		restoreAndAdopt(t, p, c.dir, c.flags...)
		for req, sum := range want {
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, req)); got != sum {
				t.Errorf("%s: %q answers %s, want %s", c.name, req, got, sum)
			}
		}
		lazyKill(t, ctx, p)
	}

	// Refused: an archive others can write, an incremental snapshot.
	os.Chmod(local, 0o666)
	if r := runSnapctl(t, "restore", "-D", local); r.Code != 8 || !strings.Contains(r.Stderr, "writable by group or others") {
		t.Errorf("restore of an archive others can write: want exit 8\n%s", r)
	}
	q := fixture.Start(t, "counter", "4M")
	base, next := filepath.Join(tmp, "base"), filepath.Join(tmp, "next")
	dumpPID(t, q.PID, base, "--leave-running")
	dumpPID(t, q.PID, next, "--leave-running", "--parent", base)
	if r := runSnapctl(t, "export", "-D", next, "-o", filepath.Join(tmp, "next.tar")); r.Code != 1 || !strings.Contains(r.Stderr, "incremental") {
		t.Errorf("export of an incremental snapshot: want exit 1 saying why\n%s", r)
	}
	if _, err := os.Stat(filepath.Join(tmp, "next.tar")); !os.IsNotExist(err) {
		t.Errorf("a refused export left its file: %v", err)
	}
}
