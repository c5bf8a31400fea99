package e2e

// What leads outside a process tree: a pipe from the tree to its starter
// (--external, --inherit-fd), while a pipe between two processes of the
// tree is not outside; and established TCP connections held by several
// processes of a tree (--tcp-established), one lock for all of them.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestTreeExternalStdout: sh -c 'python3 counter | cat' whose stdout is a
// pipe to its starter (the test). The pipe between python3 and cat is in
// the tree; the one to the test, sh's stdout that cat inherited, leads
// outside it: a plain dump is refused naming it, --external stdio records
// it alone, a restore refuses a missing key or one no process has, and
// --inherit-fd hands the test's end back to sh and cat: the test reads on
// every number once and in order.
func TestTreeExternalStdout(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	py := testutil.RequireCommand(t, "python3")
	ctx := testContext(t)
	buildTool(t, "snapctl") // before the clock starts
	// What the test binary inherited must not leak into the tree.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	script := filepath.Join(tmp, "counter.py")
	if err := os.WriteFile(script, []byte(counterScript), 0o644); err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	pr.SetReadDeadline(time.Now().Add(3 * time.Minute))
	logf, err := os.Create(filepath.Join(tmp, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf("%s %s | cat", py, script))
	cmd.Stdout, cmd.Stderr = pw, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sh := cmd.Process.Pid
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		killSession(sh)
		select {
		case <-done:
		case <-time.After(cleanupWait):
		}
	})
	lc := countLines(t, pr, pw)
	key, expect := lc.key, lc.expect
	expect(5, 60*time.Second)
	before := waitTree(t, ctx, sh, 3)

	dir := filepath.Join(tmp, "snap")
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(sh), "-D", dir)
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, fmt.Sprintf("pid %d fd 1", sh)) || !strings.Contains(r.Stderr, key) ||
		!strings.Contains(r.Stderr, "outside the tree") {
		t.Fatalf("a dump without --external: want exit %d naming pid %d fd 1 %s, outside the tree:\n%s", exitUnsupported, sh, key, r)
	}
	r = runSnapctl(t, "dump", "-t", strconv.Itoa(sh), "-D", dir, "--external", "stdio,fd[7]")
	if r.Code == 0 || !strings.Contains(r.Stderr, "fd[7]") || !strings.Contains(r.Stderr, "no process of the tree") {
		t.Fatalf("a dump with --external fd[7] that no process has: want a refusal naming it:\n%s", r)
	}
	expect(3, 30*time.Second) // it runs on
	r = dumpPID(t, sh, dir, "--external", "stdio")
	if !strings.Contains(r.Stdout, "(3 processes") {
		t.Errorf("dump output does not count 3 processes: %q", r.Stdout)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("sh outlived its dump")
	}
	wantFeature(t, dir, image.FeatureExternalFDs)
	wantFeature(t, dir, image.FeatureTree)
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	var outside, shared []string
	for _, pid := range snap.PIDs() {
		st, err := snap.State(pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range st.FDs {
			if f.External != "" {
				outside = append(outside, fmt.Sprintf("%d/%d %s", pid, f.FD, f.External))
			}
			if f.Tree != nil && f.Tree.Shared && f.Pipe != nil {
				shared = append(shared, fmt.Sprintf("%d/%d", pid, f.FD))
			}
		}
	}
	snap.Close()
	if want := fmt.Sprintf("%d/1 %s", sh, key); len(outside) != 1 || outside[0] != want {
		t.Errorf("descriptors leading outside %v, want only %s (cat's inherits it, the pipe to cat is in the tree)", outside, want)
	}
	if len(shared) != 2 {
		t.Errorf("ends of the pipe between python3 and cat %v, want 2", shared)
	}

	r = runSnapctl(t, "restore", "-D", dir)
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, fmt.Sprintf("fd 1 of pid %d", sh)) || !strings.Contains(r.Stderr, key) ||
		!strings.Contains(r.Stderr, "outside the tree") {
		t.Fatalf("a restore without --inherit-fd: want exit %d naming pid %d fd 1 and %s:\n%s", exitUnsupported, sh, key, r)
	}
	r = restoreWithFiles(t, []*os.File{pw, pw}, "restore", "-D", dir, "--inherit-fd", "fd[3]:"+key, "--inherit-fd", "fd[4]:fd[9]")
	if r.Code == 0 || !strings.Contains(r.Stderr, "fd[9]") || !strings.Contains(r.Stderr, "no process of the tree") {
		t.Fatalf("a restore with an --inherit-fd for no descriptor: want a refusal naming it:\n%s", r)
	}
	if unix.Kill(sh, 0) == nil {
		t.Fatalf("a refused restore left pid %d", sh)
	}
	r = restoreWithFiles(t, []*os.File{pw}, "restore", "-D", dir, "--inherit-fd", "fd[3]:"+key)
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	sameTree(t, sh, before)
	// sh and cat hold the test's pipe again, python3 the pipe to cat.
	holders := 0
	for pid := range before {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", pid))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case target == key:
			holders++
		case pid == sh || !strings.HasPrefix(target, "pipe:["):
			t.Errorf("fd 1 of pid %d is %s", pid, target)
		}
	}
	if holders != 2 {
		t.Errorf("%d processes of the tree hold %s as fd 1, want 2 (sh and cat)", holders, key)
	}
	expect(20, 60*time.Second)
}

// forkServerScript listens on 127.0.0.1:argv[1] and forks a child for
// each client, which answers each line with its pid and the line; a
// line "inotify" makes the child open an inotify instance first, which
// no dump can describe.
const forkServerScript = `
import ctypes, os, signal, socket, sys
os.closerange(3, 65536)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(8)
print("listening", flush=True)
while True:
    c, _ = srv.accept()
    if os.fork() == 0:
        srv.close()
        f = c.makefile("rb")
        for line in f:
            if line == b"inotify\n":
                ctypes.CDLL(None).inotify_init1(os.O_CLOEXEC)
            c.sendall(b"%d %s" % (os.getpid(), line))
        os._exit(0)
    c.close()
`

// treeClient is a client of the forking server: the pid of the child
// serving it, and its connection.
type treeClient struct {
	pid int
	c   net.Conn
	r   *bufio.Reader
}

func dialTree(t *testing.T, ctx context.Context, port int) *treeClient {
	t.Helper()
	var c net.Conn
	ok, msg := srvEventually(ctx, 20*time.Second, func() (bool, string) {
		var err error
		c, err = net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
		return err == nil, fmt.Sprint(err)
	})
	if !ok {
		t.Fatalf("dial the forking server: %s", msg)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(90 * time.Second))
	tc := &treeClient{c: c, r: bufio.NewReader(c)}
	tc.pid = tc.ask(t, "hello")
	return tc
}

// ask sends line and returns the pid that answered it.
func (tc *treeClient) ask(t *testing.T, line string) int {
	t.Helper()
	if _, err := tc.c.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
	return tc.answer(t, line)
}

func (tc *treeClient) answer(t *testing.T, line string) int {
	t.Helper()
	got, err := tc.r.ReadString('\n')
	f := strings.Fields(got)
	if err != nil || len(f) != 2 || f[1] != line {
		t.Fatalf("answer to %q: %q %v", line, got, err)
	}
	pid, _ := strconv.Atoi(f[0])
	if tc.pid != 0 && pid != tc.pid {
		t.Fatalf("answer to %q from pid %d, want %d", line, pid, tc.pid)
	}
	return pid
}

// TestTreeTCPEstablished: a forking server whose two children each hold
// a client's connection. A dump --tcp-established refused by the second
// child (an inotify instance) after the connections were taken gives
// them all back and leaves no lock. Then a dump of the root, a server
// child and a new one takes both connections under one lock; a line sent
// while the tree is gone is answered after restore --tcp-established by
// the same child, the other connection goes on, the lock is gone, and
// the restored root still forks for a new client.
func TestTreeTCPEstablished(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	py := testutil.RequireCommand(t, "python3")
	ctx := testContext(t)
	buildTool(t, "snapctl") // before the clock starts
	tablesBefore := lazyfsTables(t)
	tmp := t.TempDir()
	script := filepath.Join(tmp, "server.py")
	if err := os.WriteFile(script, []byte(forkServerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd, done := startSession(t, filepath.Join(tmp, "log"), py, script, strconv.Itoa(port))
	root := cmd.Process.Pid
	c1 := dialTree(t, ctx, port)
	c2 := dialTree(t, ctx, port)
	if c1.pid == c2.pid || c1.pid == root {
		t.Fatalf("clients served by %d and %d, root %d", c1.pid, c2.pid, root)
	}
	waitTree(t, ctx, root, 3)

	// Refused in a process after the one whose connection was taken
	// (children in pid order): every connection comes back.
	later := c1
	if c2.pid > c1.pid {
		later = c2
	}
	later.ask(t, "inotify")
	dir := filepath.Join(tmp, "snap")
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(root), "-D", dir, "--tcp-established")
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "inotify") || !strings.Contains(r.Stderr, fmt.Sprintf("pid %d", later.pid)) {
		t.Fatalf("want exit %d naming pid %d and inotify:\n%s", exitUnsupported, later.pid, r)
	}
	if tables := strings.Join(lazyfsTables(t), " "); strings.Contains(tables, "lazyfs_"+strconv.Itoa(root)+"_") {
		t.Errorf("the refused dump left its lock: %s", tables)
	}
	c1.ask(t, "still-there")
	c2.ask(t, "still-there")
	// The child with the inotify instance goes away with its client.
	later.c.Close()
	c3 := dialTree(t, ctx, port)
	first := c1
	if later == c1 {
		first = c2
	}
	before := waitTree(t, ctx, root, 3)

	r = dumpPID(t, root, dir, "--tcp-established")
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	m := regexp.MustCompile(`2 TCP connections held by nftables table inet (lazyfs_` + strconv.Itoa(root) + `_\S+)`).FindStringSubmatch(r.Stdout)
	if m == nil || !strings.Contains(r.Stdout, "(3 processes") {
		t.Fatalf("the dump does not name one lock for the 2 connections of its 3 processes:\n%s", r)
	}
	lock := m[1]
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", lock).Run() })
	wantFeature(t, dir, image.FeatureTCPRepair)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the server outlived its dump")
	}
	if !nftTable(t, lock) {
		t.Fatalf("table inet %s missing while the connections wait for their restore", lock)
	}
	if _, err := c3.c.Write([]byte("while-gone\n")); err != nil {
		t.Fatalf("write while the tree is dumped: %v", err)
	}
	time.Sleep(300 * time.Millisecond)

	rr := mustSnapctl(t, "restore", "-D", dir, "--tcp-established")
	t.Logf("%s", strings.TrimSpace(rr.Stdout))
	sameTree(t, root, before)
	t0 := time.Now()
	c3.answer(t, "while-gone")
	t.Logf("the line sent during the dump answered %v after the restore", time.Since(t0).Round(time.Millisecond))
	first.ask(t, "after")
	c3.ask(t, "after")
	if nftTable(t, lock) {
		t.Errorf("table inet %s left behind by the restore", lock)
	}
	c4 := dialTree(t, ctx, port)
	if c4.pid == first.pid || c4.pid == c3.pid {
		t.Errorf("a new client served by pid %d, a restored child's", c4.pid)
	}
	killSession(root)
	if after := lazyfsTables(t); len(after) != len(tablesBefore) {
		t.Errorf("nftables tables %v after the test, %v before", after, tablesBefore)
	}
}
