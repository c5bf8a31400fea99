package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// The tests of what a root dump or restore does to paths that another
// user controls. Each one stands for a defect a review reproduced on an
// earlier build; "nobody" (uid 65534) is the other user, and the test does
// as root what that user could do in a directory of theirs.

// nobodyUID owns the directories another user controls.
const nobodyUID = 65534

// userDir makes dir (under a root-only temporary directory) owned by
// nobody, as a directory of an ordinary user's would be.
func userDir(t *testing.T, parent, name string) string {
	t.Helper()
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobodyUID, nobodyUID); err != nil {
		t.Fatal(err)
	}
	return dir
}

// wantGone checks that no process holds pid after a refused restore, and
// that no restore stub is left.
func wantGone(t *testing.T, ctx context.Context, pid int) {
	t.Helper()
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !pidGone(gctx, pid) {
		t.Errorf("a process holds pid %d after the refused restore", pid)
	}
	if s := stubLeft(t); len(s) > 0 {
		t.Errorf("restore stubs left behind: %v", s)
	}
}

// rootSecret writes a root-only file and returns its path and contents.
func rootSecret(t *testing.T, dir, name string) (string, []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	data := []byte("root:secret:" + name + "\n")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// wantUntouched checks that path is still the regular file holding data.
func wantUntouched(t *testing.T, path string, data []byte) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if !fi.Mode().IsRegular() {
		t.Fatalf("%s is now %v, not the regular file it was", path, fi.Mode())
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, data) {
		t.Fatalf("%s now holds %q, want %q", path, b, data)
	}
}

// TestRestoreSocketPathSwapped: a root process listens on a unix socket
// in a directory of an ordinary user; after the dump, the user makes a
// component of that path a link to a root-only directory holding a file
// of the socket's name. The restore must neither remove that file nor
// bind anything there.
func TestRestoreSocketPathSwapped(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	base := t.TempDir()
	u := userDir(t, base, "u")
	tdir := userDir(t, u, "tdir")
	sock := filepath.Join(tdir, "passwd")
	p := fixture.StartPython(t, "holder.py", "--listen", sock)
	dir, _ := dumpForRestore(t, ctx, p)

	secret, data := rootSecret(t, filepath.Join(base, "rootonly"), "passwd")
	if err := os.RemoveAll(tdir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(secret), tdir); err != nil {
		t.Fatal(err)
	}
	r := runSnapctl(t, "restore", "-D", dir)
	if r.Code != exitUntrusted {
		t.Errorf("restore exit %d, want %d (untrusted path)\n%s", r.Code, exitUntrusted, r)
	}
	wantUntouched(t, secret, data)
	if !strings.Contains(r.Stderr, tdir) {
		t.Errorf("the error does not name %s:\n%s", tdir, r.Stderr)
	}
	wantGone(t, ctx, p.PID)
}

// TestRestoreSocketInUserDir: the same root process and socket, path
// untouched: the user could still swap it at any moment, so the restore
// refuses to remove or create a file there; a process of that user
// binding in its own directory is another matter (see TestRestoreFDKinds
// and the servers' tests).
func TestRestoreSocketInUserDir(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	u := userDir(t, t.TempDir(), "u")
	p := fixture.StartPython(t, "holder.py", "--listen", filepath.Join(u, "s"))
	dir, _ := dumpForRestore(t, ctx, p)
	r := runSnapctl(t, "restore", "-D", dir)
	if r.Code != exitUntrusted {
		t.Errorf("restore exit %d, want %d (untrusted path)\n%s", r.Code, exitUntrusted, r)
	}
	wantGone(t, ctx, p.PID)
}

// TestRestoreOpenFileThroughLink: a file the process held read-write, in
// a user's directory, is replaced by a symbolic link after the dump. The
// restore opens no path through a link (here to the very file, moved: a
// check by path would pass, and a link swapped in between a check and
// the open could point anywhere), and refuses.
func TestRestoreOpenFileThroughLink(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	u := userDir(t, t.TempDir(), "u")
	data := filepath.Join(u, "data")
	if err := os.WriteFile(data, []byte("the process's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := fixture.StartPython(t, "holder.py", "--open", data)
	dir, _ := dumpForRestore(t, ctx, p)
	moved := filepath.Join(u, "moved")
	if err := os.Rename(data, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, data); err != nil {
		t.Fatal(err)
	}
	r := runSnapctl(t, "restore", "-D", dir)
	if r.Code != exitFileChanged {
		t.Errorf("restore exit %d, want %d (file changed)\n%s", r.Code, exitFileChanged, r)
	}
	if !strings.Contains(r.Stderr, data) {
		t.Errorf("the error does not name %s:\n%s", data, r.Stderr)
	}
	wantGone(t, ctx, p.PID)

	// The file back in place: the same restore succeeds.
	if err := os.Remove(data); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved, data); err != nil {
		t.Fatal(err)
	}
	restoreAndAdopt(t, p, dir)
	answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
}

// TestDumpIntoUserDir: a user pre-creates the snapshot directory,
// writable by all, with links under the names the dump writes pointing
// at root files. The dump refuses the directory and writes nothing; the
// process is left running.
func TestDumpIntoUserDir(t *testing.T) {
	testutil.RequirePtrace(t)
	base := t.TempDir()
	secrets := filepath.Join(base, "rootonly")
	s1, d1 := rootSecret(t, secrets, "one")
	s2, d2 := rootSecret(t, secrets, "two")
	p := fixture.Start(t, "counter", "4M")
	snap := userDir(t, base, "snap")
	if err := os.Chmod(snap, 0o777); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"process-" + strconv.Itoa(p.PID) + ".json": s1, ".snapshot.json.tmp": s2} {
		if err := os.Symlink(target, filepath.Join(snap, name)); err != nil {
			t.Fatal(err)
		}
	}
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", snap)
	if r.Code != exitUntrusted {
		t.Errorf("dump exit %d, want %d (untrusted directory)\n%s", r.Code, exitUntrusted, r)
	}
	wantUntouched(t, s1, d1)
	wantUntouched(t, s2, d2)
	if _, err := os.Lstat(filepath.Join(snap, "snapshot.json")); err == nil {
		t.Error("a manifest was written into the refused directory")
	}
	if st := p.ExitState(); st != nil {
		t.Errorf("the process did not survive the refused dump: %v", st)
	}
}

// TestDumpTwiceIntoOneDir: two dumps into one directory at once. One
// writes its snapshot; the other is refused and leaves its process
// running; the snapshot written is whole.
func TestDumpTwiceIntoOneDir(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	big := fixture.Start(t, "counter", "256M")
	small := fixture.Start(t, "counter", "4M")
	snap := filepath.Join(t.TempDir(), "snap")
	var wg sync.WaitGroup
	var first cmdResult
	wg.Go(func() { first = runSnapctl(t, "dump", "-t", strconv.Itoa(big.PID), "-D", snap) })
	// The big dump is in its memory step once its pages file exists.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(snap, "pages-"+strconv.Itoa(big.PID)+".img")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			wg.Wait()
			t.Fatalf("the first dump never wrote its pages file:\n%s", first)
		}
		time.Sleep(time.Millisecond)
	}
	second := runSnapctl(t, "dump", "-t", strconv.Itoa(small.PID), "-D", snap)
	wg.Wait()
	if first.Code != 0 {
		t.Fatalf("the first dump failed:\n%s", first)
	}
	if second.Code == 0 {
		t.Fatalf("the second dump into the same directory succeeded too:\n%s", second)
	}
	if !strings.Contains(second.Stderr, "locked by another dump") {
		t.Errorf("the second dump's error does not say the directory is in use:\n%s", second.Stderr)
	}
	if st := small.ExitState(); st != nil {
		t.Errorf("the refused dump's process is gone: %v", st)
	}
	if _, err := big.WaitExit(ctx); err != nil {
		t.Fatalf("the dumped process outlived its dump: %v", err)
	}
	mustSnapctl(t, "verify", "-D", snap)
}

// TestDumpKernelThread: a kernel thread is refused by name, as an
// unsupported resource, before anything is written.
func TestDumpKernelThread(t *testing.T) {
	snap := filepath.Join(t.TempDir(), "snap")
	r := runSnapctl(t, "dump", "-t", "2", "-D", snap)
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "kernel thread") {
		t.Errorf("dump -t 2: exit %d, want %d naming a kernel thread\n%s", r.Code, exitUnsupported, r)
	}
	if _, err := os.Stat(snap); err == nil {
		t.Error("the refused dump created its directory")
	}
}

// TestRestoreUntrustedSnapshot: a snapshot another user could have
// changed (here handed to nobody, then made writable by all) is refused by
// restore, inspect, verify and lazyfs with status 8, and restored with
// --trust-snapshot.
func TestRestoreUntrustedSnapshot(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "4M")
	dir, _ := dumpForRestore(t, ctx, p)
	if err := filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(path, nobodyUID, nobodyUID)
	}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"restore", "-D", dir}, {"inspect", "-D", dir}, {"verify", "-D", dir}} {
		if r := runSnapctl(t, args...); r.Code != exitUntrusted || !strings.Contains(r.Stderr, dir) {
			t.Errorf("snapctl %s: exit %d, want %d naming %s\n%s", args[0], r.Code, exitUntrusted, dir, r)
		}
	}
	mnt := t.TempDir()
	if r := runTool(t, buildTool(t, "lazyfs"), commandTimeout, "--background", dir, mnt); r.Code != exitUntrusted {
		t.Errorf("lazyfs: exit %d, want %d\n%s", r.Code, exitUntrusted, r)
		runTool(t, buildTool(t, "lazyfs"), commandTimeout, "-u", mnt)
	}
	wantGone(t, ctx, p.PID)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	restoreAndAdopt(t, p, dir, "--trust-snapshot")
	answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
}

// TestLazyHelperKilled: whichever helper of a lazy restore dies (the
// keeper of the userfaultfds, the private mount's FUSE server) while the
// process is still being served, nothing hangs: snapctl exits non-zero
// within seconds naming what died, the restored process is gone, and no
// mount or helper is left.
func TestLazyHelperKilled(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	for _, helper := range []string{"lazyfs-uffd-keeper", "lazyfs-private-mount"} {
		t.Run(helper, func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.Start(t, "modelserver", "2G")
			dir, _ := dumpForRestore(t, ctx, p)
			l := startLazy(t, dir, "--prefetch-delay", "1m")
			l.waitRunning(t, ctx)
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(150 * time.Millisecond)
			if !l.running() {
				t.Fatalf("the lazy phase ended before the helper could be killed\n%s", l.res)
			}
			pids := lazyProcs(t, []byte(fmt.Sprintf("%s\x00%d\x00", helper, l.cmd.Process.Pid)))
			if len(pids) != 1 {
				t.Fatalf("%d %s processes of snapctl %d, want 1", len(pids), helper, l.cmd.Process.Pid)
			}
			if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			select {
			case <-l.done:
			case <-time.After(5 * time.Second):
				t.Fatalf("snapctl still runs 5 s after its %s was killed", helper)
			}
			t.Logf("snapctl exited %v after SIGKILL of %s: %d %s", time.Since(killed), helper, l.res.Code, strings.TrimSpace(l.res.Stderr))
			if l.res.Code == 0 {
				t.Errorf("snapctl exited 0 after its %s died", helper)
			}
			if !strings.Contains(l.res.Stderr, helper) {
				t.Errorf("snapctl's error does not name the %s:\n%s", helper, l.res.Stderr)
			}
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if !lazyDead(gctx, p.PID) {
				t.Errorf("the restored process still runs 5 s after its %s died", helper)
			}
			l.lazyNothingLeft(t, dir)
		})
	}
}

// TestPrivateMountCloseOnExec: the private mount's helper mounts with
// mount(2) as root, and go-fuse opens /dev/fuse for that without
// O_CLOEXEC; the descriptor must be close-on-exec all the same, so that
// no program the helper starts (fusermount3 to detach a busy mount) holds
// the connection open. Meanwhile the process runs before the mount is up,
// and its memory is right. (go-fuse's splice pipes and its /dev/null,
// opened later, are none of the connection.)
func TestPrivateMountCloseOnExec(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p, dir, atDump := lazyCounterDumped(t, ctx, "64M")
	// The helper is looked at before the prefetch starts and ends it.
	l := startLazy(t, dir, "--prefetch-delay", "3s")
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	helper := []byte(fmt.Sprintf("lazyfs-private-mount\x00%d\x00", l.cmd.Process.Pid))
	pids := lazyProcs(t, helper)
	if len(pids) != 1 {
		t.Fatalf("%d private mount helpers of snapctl %d, want 1", len(pids), l.cmd.Process.Pid)
	}
	// fds lists the helper's descriptors but the standard ones: target
	// and fdinfo flags.
	fds := func() map[int]string {
		out := map[int]string{}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pids[0]))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			fd, _ := strconv.Atoi(e.Name())
			target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pids[0], fd))
			if fd >= 3 && target != "" {
				out[fd] = target
			}
		}
		return out
	}
	mounted := func() bool { return slices.Contains(slices.Collect(maps.Values(fds())), "/dev/fuse") }
	for deadline := time.Now().Add(10 * time.Second); !mounted(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the helper holds no /dev/fuse descriptor 10 s after the process ran")
		}
	}
	time.Sleep(200 * time.Millisecond) // the helper has answered by now
	for fd, target := range fds() {
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pids[0], fd))
		if err != nil {
			continue // closed meanwhile
		}
		var flags uint64
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, _ = strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			}
		}
		if target == "/dev/fuse" && flags&syscall.O_CLOEXEC == 0 {
			t.Errorf("helper %d: fd %d (%s) is not close-on-exec (flags %o)", pids[0], fd, target, flags)
		}
	}
	lazyCheckCounter(t, ctx, p, atDump)
	l.mustFinish(t, ctx, p.PID)
	lazyKill(t, ctx, p)
	l.lazyNothingLeft(t, dir)
}

// TestLazyMountNotLazyfs: --mount of a plain directory that holds the
// snapshot's manifest and a mem file with a page changed is refused: the
// process never runs on bytes a lazyfs mount of the snapshot did not serve.
func TestLazyMountNotLazyfs(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "4M")
	dir, _ := dumpForRestore(t, ctx, p)
	fake := t.TempDir()
	b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, "snapshot.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(fake, strconv.Itoa(p.PID)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, strconv.Itoa(p.PID), "mem"), []byte("not the memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runSnapctl(t, "restore", "-D", dir, "--lazy", "--mount", fake)
	if r.Code == 0 || !strings.Contains(r.Stderr, "not a lazyfs mount") {
		t.Errorf("restore --mount of a plain directory: exit %d, want a refusal naming it\n%s", r.Code, r)
	}
	wantGone(t, ctx, p.PID)
}

// fingerprint describes every file under dir (name, type, mode, owner,
// inode, size, contents' checksum), to tell whether anything changed.
func fingerprint(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %o %d %d %d", path, st.Mode, st.Uid, st.Ino, st.Size)
		if d.Type().IsRegular() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %08x", codec.Checksum(data))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// rewriteState edits the process state of the snapshot in dir and fixes
// the manifest's size and checksum of it, as someone who can write the
// snapshot (and so is trusted with it) could.
func rewriteState(t *testing.T, dir string, pid int, edit func(*image.Process)) {
	t.Helper()
	name := fmt.Sprintf("process-%d.json", pid)
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	var st image.Process
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	edit(&st)
	if b, err = json.MarshalIndent(&st, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
	mb, err := os.ReadFile(filepath.Join(dir, image.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	var m image.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	m.Files[name] = image.FileSum{Size: int64(len(b)), CRC32C: fmt.Sprintf("%08x", codec.Checksum(b))}
	if mb, err = json.MarshalIndent(&m, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, image.ManifestName), mb, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreCraftedPaths is a property test over crafted process state:
// whatever paths a snapshot names for its open files, mapped files, unix
// sockets and working directory, when they lead outside a test directory
// through a directory another user controls (a link they planted, a
// relative path from a directory of theirs), a root restore changes
// nothing outside: no file written, removed, replaced or created. The
// file identities are crafted to be the outside files' own, as someone
// who knows their inodes would.
func TestRestoreCraftedPaths(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	outside := t.TempDir()
	secret, _ := rootSecret(t, outside, "secret")
	oldSock := filepath.Join(outside, "old.sock")
	mkStaleSocket(t, oldSock)
	var sst syscall.Stat_t
	if err := syscall.Stat(secret, &sst); err != nil {
		t.Fatal(err)
	}
	before := fingerprint(t, outside)

	inside := t.TempDir()
	u := userDir(t, inside, "u")
	link := filepath.Join(u, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	sock, data := filepath.Join(inside, "s.sock"), filepath.Join(inside, "data")
	if err := os.WriteFile(data, []byte("the process's own\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := fixture.StartPython(t, "holder.py", "--listen", sock, "--open", data)
	dir, _ := dumpForRestore(t, ctx, p)

	secretID := func(f *image.FileID) {
		f.Dev, f.Ino, f.Size = uint64(sst.Dev), sst.Ino, sst.Size
		f.MtimeNs = sst.Mtim.Nano()
	}
	mutations := []struct {
		name string
		edit func(*image.Process)
	}{
		{"socket through a link", func(st *image.Process) { setSocket(st, sock, filepath.Join(link, "old.sock")) }},
		{"socket relative to a user's directory", func(st *image.Process) { st.Cwd = u; setSocket(st, sock, "link/old.sock") }},
		{"socket from a working directory through a link", func(st *image.Process) { st.Cwd = link; setSocket(st, sock, "old.sock") }},
		{"socket up from a user's directory", func(st *image.Process) { setSocket(st, sock, filepath.Join(link, "..", "link", "old.sock")) }},
		{"file through a link", func(st *image.Process) {
			for i := range st.FDs {
				if f := &st.FDs[i]; f.Path == data {
					f.Path = filepath.Join(link, "secret")
					secretID(f.File)
				}
			}
		}},
		{"mapping through a link", func(st *image.Process) {
			for i := range st.VMAs {
				if v := &st.VMAs[i]; v.File != nil && v.Kind == image.VMAFile {
					v.File.Path = filepath.Join(link, "secret")
					secretID(v.File)
					return
				}
			}
		}},
		{"executable through a link", func(st *image.Process) { st.Exe.Path = filepath.Join(link, "secret"); secretID(&st.Exe) }},
	}
	rng := rand.New(rand.NewPCG(20, 26))
	for i := range 10 {
		// One to three mutations at once, drawn at random (seeded).
		var names []string
		var edits []func(*image.Process)
		for _, k := range rng.Perm(len(mutations))[:1+rng.IntN(3)] {
			names = append(names, mutations[k].name)
			edits = append(edits, mutations[k].edit)
		}
		crafted := filepath.Join(t.TempDir(), "snap")
		copySnapshot(t, dir, crafted)
		rewriteState(t, crafted, p.PID, func(st *image.Process) {
			for _, e := range edits {
				e(st)
			}
		})
		r := runSnapctl(t, "restore", "-D", crafted)
		t.Logf("case %d %v: exit %d %s", i, names, r.Code, strings.TrimSpace(r.Stderr))
		if r.Code == 0 {
			t.Errorf("case %d %v: a restore of crafted state succeeded", i, names)
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
		if after := fingerprint(t, outside); after != before {
			t.Fatalf("case %d %v: the restore changed files outside:\nbefore:\n%safter:\n%s", i, names, before, after)
		}
		wantGone(t, ctx, p.PID)
	}
}

// setSocket gives the socket bound at from the address to.
func setSocket(st *image.Process, from, to string) {
	for i := range st.FDs {
		if s := st.FDs[i].Socket; s != nil && s.Local == from {
			s.Local = to
		}
	}
}

// mkStaleSocket leaves a socket file at path that nobody listens on.
func mkStaleSocket(t *testing.T, path string) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
}

// copySnapshot copies the files of the snapshot in from into a new
// directory to, with their modes.
func copySnapshot(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Mkdir(to, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
