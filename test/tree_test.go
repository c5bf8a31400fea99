package e2e

// Dump and restore of process trees: a shell pipeline with bytes in
// flight between its two ends, a Python multiprocessing pool with work
// submitted before the dump, nginx (a master and two workers of another
// uid). Each tree comes back with its pids, its parent links, its
// sessions and process groups, and finishes or serves what it was doing;
// a restore that fails part way kills every process it made.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// treeIDs are what a process of a tree must get back: its parent, process
// group, session and uid.
type treeIDs struct{ ppid, pgid, sid, uid int }

// treeOf returns root and every descendant of it, with their ids.
func treeOf(t *testing.T, root int) map[int]treeIDs {
	t.Helper()
	out := map[int]treeIDs{}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		b, serr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		st, err := proc.ReadStatus(pid)
		kids, kerr := proc.Children(pid)
		if err = errors.Join(serr, err, kerr); err != nil {
			if pid != root && !procLive(pid) {
				continue // a child that exited while the tree was walked (a reload)
			}
			t.Fatal(err)
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		ppid, _ := strconv.Atoi(f[1])
		pgid, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		out[pid] = treeIDs{ppid, pgid, sid, int(st.Uid[0])}
		queue = append(queue, kids...)
	}
	return out
}

// procLive reports whether pid is a process that has not exited (no
// zombie).
func procLive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// sameTree checks that the restored tree of root is the dumped one: the
// same pids with the same ids (but the root's parent, which is now init
// or a subreaper).
func sameTree(t *testing.T, root int, before map[int]treeIDs) {
	t.Helper()
	after := treeOf(t, root)
	for pid, want := range before {
		got, ok := after[pid]
		if pid == root {
			got.ppid, want.ppid = 0, 0
		}
		if !ok {
			t.Errorf("pid %d is not in the restored tree %v", pid, after)
		} else if got != want {
			t.Errorf("pid %d restored with %+v, dumped with %+v", pid, got, want)
		}
	}
	if len(after) != len(before) {
		t.Errorf("restored tree %v, dumped %v", after, before)
	}
}

// killSession kills every process of session sid.
func killSession(sid int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// startSession starts argv in a session of its own, stdin /dev/null,
// stdout and stderr log, no other descriptor; the session is killed at
// cleanup. The command is reaped when it exits.
func startSession(t *testing.T, log string, argv ...string) (*exec.Cmd, <-chan error) {
	t.Helper()
	// What the test binary inherited from whatever started it must not
	// leak into the tree: it would lead outside it.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		close(done) // the cleanup's receive returns even once the test took the error
	}()
	sid := cmd.Process.Pid
	t.Cleanup(func() {
		killSession(sid)
		select {
		case <-done:
		case <-time.After(cleanupWait):
		}
	})
	return cmd, done
}

const cleanupWait = 15 * time.Second

// waitFile waits until path holds a line and returns it.
func waitFile(t *testing.T, ctx context.Context, path string, within time.Duration) string {
	t.Helper()
	ok, msg := srvEventually(ctx, within, func() (bool, string) {
		b, err := os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(b), "\n"), string(b)
	})
	if !ok {
		t.Fatalf("%s: nothing after %v (%q)", path, within, msg)
	}
	return strings.TrimSpace(msg)
}

// waitTree waits until root has n processes in its tree.
func waitTree(t *testing.T, ctx context.Context, root, n int) map[int]treeIDs {
	t.Helper()
	var tree map[int]treeIDs
	ok, _ := srvEventually(ctx, 10*time.Second, func() (bool, string) {
		tree = treeOf(t, root)
		return len(tree) == n, ""
	})
	if !ok {
		t.Fatalf("pid %d has %d processes in its tree, want %d: %v", root, len(tree), n, tree)
	}
	return tree
}

// pipelineNumbers is how many 8-byte numbers the pipeline passes: the
// consumer reads 512 bytes every 2 ms, about 3 s for all.
const pipelineNumbers = 100000

// startPipeline starts sh -c 'seqpipe produce N | seqpipe consume N OUT'
// and waits for its three processes.
func startPipeline(t *testing.T, ctx context.Context, n int) (sh int, out string, done <-chan error, tree map[int]treeIDs) {
	t.Helper()
	buildTool(t, "snapctl") // before the clock starts
	bin := fixture.Build(t, "seqpipe")
	dir := t.TempDir()
	out = filepath.Join(dir, "out")
	script := fmt.Sprintf("%s produce %d | %s consume %d %s", bin, n, bin, n, out)
	log := filepath.Join(dir, "log")
	cmd, done := startSession(t, log, "/bin/sh", "-c", script)
	sh = cmd.Process.Pid
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("pipeline log:\n%s", b)
		}
	})
	tree = waitTree(t, ctx, sh, 3)
	return sh, out, done, tree
}

func TestTreePipeline(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	sh, out, done, before := startPipeline(t, ctx, pipelineNumbers)
	time.Sleep(300 * time.Millisecond) // the consumer is behind: the pipe is full
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, sh, dir)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if !strings.Contains(r.Stdout, "(3 processes, 3 threads)") {
		t.Errorf("dump output does not count 3 processes: %q", r.Stdout)
	}
	<-done
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("the pipeline finished before the dump")
	}
	// The bytes in flight are in the snapshot, with the consumer's end.
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Manifest.HasFeature(image.FeatureTree) {
		t.Errorf("manifest features %v, want %q", snap.Manifest.Features, image.FeatureTree)
	}
	inFlight := 0
	for _, pid := range snap.PIDs() {
		st, err := snap.State(pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range st.FDs {
			if f.Pipe != nil && f.Tree != nil && f.Tree.Shared {
				inFlight += len(f.Pipe.Buffered)
			}
		}
	}
	snap.Close()
	if inFlight == 0 {
		t.Fatalf("no bytes in flight in the pipe between the processes at the dump")
	}
	t.Logf("%d bytes in flight in the pipe", inFlight)

	// lazyfs shows every process of the tree, its memory as dumped.
	mnt := lazyMountLazyfs(t, dir)
	for pid := range before {
		si := openImage(t, dir, pid)
		var blk image.Block
		for b := range si.Pages.Blocks() {
			if b.Kind != codec.Zero {
				blk = b
				break
			}
		}
		f, err := os.Open(filepath.Join(mnt, strconv.Itoa(pid), "mem"))
		if err != nil {
			t.Fatalf("lazyfs does not show pid %d of the tree: %v", pid, err)
		}
		got := make([]byte, blk.Len)
		_, err = f.ReadAt(got, int64(blk.Addr))
		f.Close()
		if want := si.read(t, blk.Addr, uint64(blk.Len)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("lazyfs %d/mem at %#x: %v, or not the dumped bytes", pid, blk.Addr, err)
		}
	}

	r = mustSnapctl(t, "restore", "-D", dir)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	sameTree(t, sh, before)
	// Every number once, in order: none lost or doubled across the dump.
	if got, want := waitFile(t, ctx, out, 60*time.Second), fmt.Sprintf("ok %d", pipelineNumbers); got != want {
		t.Errorf("consumer says %q, want %q", got, want)
	}
}

func TestTreePool(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	buildTool(t, "snapctl") // before the clock starts
	out := filepath.Join(t.TempDir(), "out")
	const tasks = 160 // 50 ms each on 4 workers: 2 s
	p := fixture.StartPython(t, "pool.py", out, strconv.Itoa(tasks))
	workers := strings.Split(p.Ready.Fields["workers"], ",")
	if len(workers) != 4 {
		t.Fatalf("ready line %q: want 4 workers", p.Ready.Text)
	}
	before := waitTree(t, ctx, p.PID, 5)
	time.Sleep(300 * time.Millisecond)
	dir := srvDump(t, ctx, p)
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("the pool finished its work before the dump")
	}
	srvRestore(t, p, dir)
	sameTree(t, p.PID, before)
	// The work submitted before the dump is finished by the same workers.
	got := waitFile(t, ctx, out, 60*time.Second)
	f := strings.Fields(got)
	if len(f) < 4 || f[0] != "ok" || f[1] != strconv.Itoa(tasks) || f[2] != "workers" {
		t.Fatalf("pool says %q, want ok %d workers ...", got, tasks)
	}
	for _, w := range f[3:] {
		if !slices.Contains(workers, w) {
			t.Errorf("result computed by pid %s, not one of the dumped workers %v", w, workers)
		}
	}
}

// nginxConf is the configuration of the nginx of TestTreeNginx: a master
// and two workers (nobody, as nginx started by root has them) serving dir.
const nginxConf = `daemon on;
master_process on;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 64; }
http {
	access_log %[1]s/access.log;
	client_body_temp_path %[1]s/tmp;
	proxy_temp_path %[1]s/tmp;
	fastcgi_temp_path %[1]s/tmp;
	uwsgi_temp_path %[1]s/tmp;
	scgi_temp_path %[1]s/tmp;
	server { listen 127.0.0.1:%[2]d; root %[1]s/www; }
}
`

// freePort returns a TCP port free on the loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// httpGet returns the body of GET url, or an error.
func httpGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return "", err
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("HTTP %s", resp.Status)
	}
	return string(b), err
}

// nginxTree is a running nginx: its master, what it serves where, and
// its tree as started.
type nginxTree struct {
	dir, url, page string
	master         int
	before         map[int]treeIDs
}

// startNginx starts nginx (daemonized: its master leads a session of its
// own) with two workers, checks that it serves its page and returns it;
// its session is killed at cleanup.
func startNginx(t *testing.T, ctx context.Context) *nginxTree {
	t.Helper()
	nginx := testutil.RequireCommand(t, "nginx")
	buildTool(t, "snapctl")
	t0 := time.Now()
	// The workers run as nobody: the directory must be theirs to read.
	dir, err := os.MkdirTemp("", "lazyfs-nginx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{dir, filepath.Join(dir, "www"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o755)
	}
	n := &nginxTree{dir: dir, page: fmt.Sprintf("served by the nginx tree of %s at %d\n", t.Name(), time.Now().UnixNano())}
	if err := os.WriteFile(filepath.Join(dir, "www", "index.html"), []byte(n.page), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	n.url = fmt.Sprintf("http://127.0.0.1:%d/", port)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, port), 0o644); err != nil {
		t.Fatal(err)
	}
	_, done := startSession(t, filepath.Join(dir, "start.log"), nginx, "-c", conf, "-p", dir)
	if err := <-done; err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		t.Fatalf("nginx: %v\n%s", err, b)
	}
	if ok, _ := srvEventually(ctx, 10*time.Second, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(dir, "nginx.pid"))
		n.master, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && n.master > 0, ""
	}); !ok {
		t.Fatal("no nginx.pid")
	}
	master := n.master
	t.Cleanup(func() { killSession(master) })
	// Both workers up, and past their setuid to nginx's unprivileged
	// user.
	if ok, msg := srvEventually(ctx, 10*time.Second, func() (bool, string) {
		n.before = treeOf(t, n.master)
		for pid, ids := range n.before {
			if pid != n.master && ids.uid == 0 {
				return false, fmt.Sprint(n.before)
			}
		}
		return len(n.before) == 3, fmt.Sprint(n.before)
	}); !ok {
		t.Fatalf("nginx's tree: %s, want a master and two workers of another uid", msg)
	}
	t.Logf("nginx started after %v", time.Since(t0))
	n.mustServe(t, ctx, "before the dump")
	return n
}

// mustServe checks that nginx serves its page.
func (n *nginxTree) mustServe(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if got, err := httpGet(ctx, n.url); err != nil || got != n.page {
		t.Fatalf("%s: %q, %v", when, got, err)
	}
}

// dump dumps the tree, checks that it is gone and serves no more, and
// returns the snapshot directory.
func (n *nginxTree) dump(t *testing.T, ctx context.Context) string {
	t.Helper()
	snap := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, n.master, snap)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for pid := range n.before {
		if !pidGone(gctx, pid) {
			t.Fatalf("pid %d outlived the dump", pid)
		}
	}
	if _, err := httpGet(ctx, n.url); err == nil {
		t.Fatalf("something still serves %s after the dump", n.url)
	}
	return snap
}

func TestTreeNginx(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	n := startNginx(t, ctx)
	snap := n.dump(t, ctx)
	r := mustSnapctl(t, "restore", "-D", snap)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	sameTree(t, n.master, n.before)
	for i := range 6 {
		n.mustServe(t, ctx, fmt.Sprintf("after the restore, request %d", i))
	}
	// The master still commands its workers through the socket pairs
	// between them: a reload replaces them.
	if err := syscall.Kill(n.master, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	ok, msg := srvEventually(ctx, 20*time.Second, func() (bool, string) {
		now := treeOf(t, n.master)
		for pid := range n.before {
			if _, old := now[pid]; old && pid != n.master {
				return false, fmt.Sprint(now)
			}
		}
		return len(now) == 3, fmt.Sprint(now)
	})
	if !ok {
		t.Fatalf("the restored master did not replace its workers on SIGHUP: %s", msg)
	}
	n.mustServe(t, ctx, "after the reload")
}

// TestTreeNginxLazy restores nginx lazily through a private mount: each
// process's memory faulted in by a pager of its own, the page served
// during the lazy phase (the prefetch held back) and after it, the same
// pids, and no process left traced.
func TestTreeNginxLazy(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	n := startNginx(t, ctx)
	snap := n.dump(t, ctx)
	l := startLazy(t, snap, "--prefetch-delay", "2s")
	if pid := l.waitRunning(t, ctx); pid != n.master {
		t.Fatalf("pidfile names %d, want the master %d", pid, n.master)
	}
	n.mustServe(t, ctx, "during the lazy phase")
	if !l.running() {
		t.Errorf("the lazy phase ended before the first request")
	}
	r := l.mustFinish(t, ctx, n.master)
	if !strings.Contains(r.Stdout, "3 processes") {
		t.Errorf("summary does not count 3 processes: %q", r.Stdout)
	}
	sameTree(t, n.master, n.before)
	for pid := range n.before {
		if tp := lazyTracerOf(t, pid); tp != 0 {
			t.Errorf("pid %d still traced by %d after snapctl exited", pid, tp)
		}
	}
	n.mustServe(t, ctx, "after the lazy phase")
	l.lazyNothingLeft(t, snap)
}

// TestTreeNginxLazyKill kills snapctl with SIGKILL during the lazy phase
// of nginx: every process of the tree must die with it (none runs on with
// memory missing), and no helper stays.
func TestTreeNginxLazyKill(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	n := startNginx(t, ctx)
	snap := n.dump(t, ctx)
	l := startLazy(t, snap, "--prefetch-delay", "60s")
	l.waitRunning(t, ctx)
	n.mustServe(t, ctx, "during the lazy phase")
	if !l.running() {
		t.Fatalf("the lazy phase ended within its prefetch delay: nothing to test\n%s", l.res)
	}
	l.cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for pid := range n.before {
		if !lazyDead(gctx, pid) {
			t.Errorf("pid %d still running 2s after snapctl was killed: %s", pid, readProcFile(t, "%d/stat", pid))
		}
	}
	t.Logf("the tree dead %v after SIGKILL of snapctl", time.Since(killed))
	l.wait(t, ctx)
	l.lazyNothingLeft(t, snap)
}

// TestTreeRestoreFailureKillsAll: a restore that fails in the last
// process of the tree (a corrupt block of its memory) kills every process
// it made, the first ones included, and leaves no stub.
func TestTreeRestoreFailureKillsAll(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	sh, _, done, before := startPipeline(t, ctx, 100*pipelineNumbers)
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, sh, dir)
	<-done
	var last int
	for pid := range before {
		last = max(last, pid) // the consumer: last in tree order
	}
	si := openImage(t, dir, last)
	corruptBlock(t, si)
	r := runSnapctl(t, "restore", "-D", dir)
	wantRefused(t, ctx, r, exitBadSnapshot, sh, fmt.Sprintf("fill memory of pid %d", last))
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for pid := range before {
		if !pidGone(gctx, pid) {
			t.Errorf("pid %d left by the failed restore", pid)
		}
	}
}

// corruptBlock flips a byte of a stored block of si that its checksum
// sees.
func corruptBlock(t *testing.T, si *snapImage) {
	t.Helper()
	for b := range si.Pages.Blocks() {
		if b.Kind != codec.Raw && b.Kind != codec.LZ4 {
			continue
		}
		path := filepath.Join(si.Dir, si.Pages.Name())
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		stored := make([]byte, b.StoredLen)
		if _, err := f.ReadAt(stored, int64(b.Off)); err != nil {
			t.Fatal(err)
		}
		for i := len(stored) / 2; i < len(stored); i++ {
			stored[i] ^= 0x40
			if codec.DecodeChecked(make([]byte, b.Len), b.Kind, stored, b.CRC) != nil {
				if _, err := f.WriteAt(stored[i:i+1], int64(b.Off)+int64(i)); err != nil {
					t.Fatal(err)
				}
				return
			}
			stored[i] ^= 0x40
		}
	}
	t.Fatal("no block to corrupt")
}

// TestDumpChurningTree dumps a parent whose children live 5 ms each (a
// pre-fork server respawning workers, a shell pipeline) 20 times: a child
// that has exited when the tree is frozen is kept as the parent's
// unreaped child (or left out, if already gone), never a failed dump;
// every dump restores, and the restored parent goes on forking and
// reaping, no child ending other than it should (exit 7: one restored
// unreaped is reaped with its status).
func TestDumpChurningTree(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	const dumps = 20
	leftOut := 0
	for i := range dumps {
		ctx := testContext(t)
		p := fixture.Start(t, "forker", "5")
		time.Sleep(20 * time.Millisecond)
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("snap-%d", i))
		r := runSnapctl(t, "dump", "-v", "-t", strconv.Itoa(p.PID), "-D", dir)
		if r.Code != 0 {
			t.Fatalf("dump %d of a churning tree:\n%s", i, r)
		}
		if strings.Contains(r.Stderr, "left out") || strings.Contains(r.Stderr, "not reaped") {
			leftOut++
		}
		if _, err := p.WaitExit(ctx); err != nil {
			t.Fatal(err)
		}
		restoreAndAdopt(t, p, dir)
		first := request(t, ctx, p, syscall.SIGUSR1, "report")
		time.Sleep(30 * time.Millisecond)
		second := request(t, ctx, p, syscall.SIGUSR1, "report")
		if second.MustUint(t, "reaped") <= first.MustUint(t, "reaped") || second.MustUint(t, "bad") != 0 {
			t.Errorf("restore %d: %q then %q: the parent does not go on reaping its children, or one ended badly", i, first.Text, second.Text)
		}
		lazyKill(t, ctx, p)
	}
	t.Logf("%d dumps of %d found exited children", leftOut, dumps)
	if leftOut == 0 {
		// Children living 5 ms exit during most freezes (13 of 20 when
		// first measured): none in 20 means the path went untested.
		t.Errorf("no dump of %d found an exited child: the churn this test is about did not happen", dumps)
	}
}
