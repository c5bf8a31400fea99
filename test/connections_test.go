package e2e

// What leads outside a process: an established TCP connection kept with
// TCP_REPAIR across dump and restore (--tcp-established, the test itself
// the client), and a daemon's stdout that is a pipe to its starter
// (--external, --inherit-fd, the test itself the starter).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// nftTable reports whether the nftables table inet name exists.
func nftTable(t *testing.T, name string) bool {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return strings.Contains(string(out), "table inet "+name+"\n")
}

// lazyfsTables lists the nftables tables a dump made (lazyfs_*).
func lazyfsTables(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	return regexp.MustCompile(`table inet (lazyfs_[0-9]+_[0-9a-f]+)`).FindAllString(string(out), -1)
}

// TestTCPEstablishedRedis: a client connected to redis-server over TCP
// during the dump (the process killed) sends a command while the server
// is gone, and after restore --tcp-established gets its answer and the
// next one on the same connection. A dump that leaves the server running
// gives the connection back at once. No nftables table is left behind.
func TestTCPEstablishedRedis(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	ctx := testContext(t)
	before := lazyfsTables(t)
	p := fixture.StartRedis(t)
	c := dialRedis(t, ctx, p.Port)
	if r := c.do(t, "SET greeting hello"); r != "+OK" {
		t.Fatalf("SET: %q", r)
	}

	// --leave-running: the connection goes on, the lock is gone.
	srvDump(t, ctx, p, "--leave-running", "--tcp-established")
	if r := c.do(t, "INCR n"); r != ":1" {
		t.Fatalf("INCR after dump --leave-running --tcp-established: %q", r)
	}

	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, p.PID, dir, "--tcp-established")
	m := regexp.MustCompile(`1 TCP connections held by nftables table inet (lazyfs_\S+)`).FindStringSubmatch(r.Stdout)
	if m == nil {
		t.Fatalf("the dump does not name its network lock:\n%s", r)
	}
	lock := m[1]
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", lock).Run() })
	wantFeature(t, dir, "tcp-repair")
	if r := mustSnapctl(t, "inspect", "-D", dir); !strings.Contains(r.Stdout, "kept, held by nftables table inet "+lock) {
		t.Errorf("inspect does not show the kept connection:\n%s", r.Stdout)
	}
	if _, err := p.WaitExit(ctx); err != nil {
		t.Fatalf("redis outlived its dump: %v", err)
	}
	if !nftTable(t, lock) {
		t.Fatalf("table inet %s missing while the connection waits for its restore", lock)
	}
	// Sent while the server is gone: the lock drops the segments, the
	// client's kernel sends them again after the restore.
	c.c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.c.Write([]byte("INCR n\r\n")); err != nil {
		t.Fatalf("write while the server is dumped: %v", err)
	}
	time.Sleep(300 * time.Millisecond)

	rr := mustSnapctl(t, "restore", "-D", dir, "--tcp-established")
	t.Logf("%s", strings.TrimSpace(rr.Stdout))
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(context.Background()) })
	t0 := time.Now()
	line, err := c.r.ReadString('\n')
	t.Logf("the command sent during the dump answered %v after the restore", time.Since(t0).Round(time.Millisecond))
	if err != nil || line != ":2\r\n" {
		t.Fatalf("the command sent during the dump answered %q (%v), want :2", line, err)
	}
	if r := c.do(t, "GET greeting"); r != "$5" {
		t.Errorf("GET on the same connection after restore: %q", r)
	}
	if r := c.do(t, "INCR n"); r != ":3" {
		t.Errorf("INCR on the same connection after restore: %q", r)
	}
	if nftTable(t, lock) {
		t.Errorf("table inet %s left behind by the restore", lock)
	}
	// The restored server still accepts new clients.
	if r, err := fixture.Redis(ctx, p.Port, "GET", "n"); err != nil || r != "3" {
		t.Errorf("GET n on a new connection: %q %v", r, err)
	}
	srvKill(t, ctx, p)
	if after := lazyfsTables(t); len(after) != len(before) {
		t.Errorf("nftables tables %v after the test, %v before", after, before)
	}
}

// TestTCPEstablishedRestoreClosed: a connection the dump kept but the
// restore is not asked to bring back is closed, the restore says so, and
// the lock is released: the client sees its connection end.
func TestTCPEstablishedRestoreClosed(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	ctx := testContext(t)
	p := fixture.StartRedis(t)
	c := dialRedis(t, ctx, p.Port)
	if r := c.do(t, "PING"); r != "+PONG" {
		t.Fatalf("PING: %q", r)
	}
	dir := srvDump(t, ctx, p, "--tcp-established")
	r := mustSnapctl(t, "restore", "-D", dir)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.Stderr, "connection closed by restore") || !strings.Contains(r.Stderr, "--tcp-established") {
		t.Errorf("the restore does not say it closed the kept connection:\n%s", r)
	}
	if tables := strings.Join(lazyfsTables(t), " "); strings.Contains(tables, "lazyfs_"+strconv.Itoa(p.PID)+"_") {
		t.Errorf("the lock of pid %d is left behind: %s", p.PID, tables)
	}
	c.c.SetDeadline(time.Now().Add(20 * time.Second))
	c.c.Write([]byte("PING\r\n"))
	if line, err := c.r.ReadString('\n'); err == nil {
		t.Errorf("the closed connection answered %q", line)
	}
	srvKill(t, ctx, p)
}

// counterScript prints 0, 1, 2... one a line, every 20 ms. It closes
// the descriptors above stdio it may have inherited from whatever ran the
// tests.
const counterScript = `
import os, sys, time
os.closerange(3, 65536)
i = 0
while True:
    print(i, flush=True)
    i += 1
    time.sleep(0.02)
`

// TestInheritFDStdoutPipe: a daemon whose stdout is a pipe to its starter
// (the test) is refused by a plain dump, dumped with --external stdio,
// refused by a restore that has no descriptor for it, and restored with
// --inherit-fd: the starter reads its later output on the same pipe,
// every number once and in order.
func TestInheritFDStdoutPipe(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	py := testutil.RequireCommand(t, "python3")
	_ = testContext(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	pr.SetReadDeadline(time.Now().Add(90 * time.Second))
	cmd := exec.Command(py, "-c", counterScript)
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	var restored bool
	t.Cleanup(func() {
		unix.Kill(pid, unix.SIGKILL)
		if !restored {
			cmd.Wait()
		}
	})
	lc := countLines(t, pr, pw)
	key, expect := lc.key, lc.expect
	expect(5, 60*time.Second)

	dir := filepath.Join(t.TempDir(), "snap")
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(pid), "-D", dir)
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "pid "+strconv.Itoa(pid)+" fd 1") || !strings.Contains(r.Stderr, key) ||
		!strings.Contains(r.Stderr, "--external") {
		t.Fatalf("a dump without --external: want exit %d naming pid %d fd 1 %s and --external:\n%s", exitUnsupported, pid, key, r)
	}
	expect(3, 30*time.Second) // it runs on
	dumpPID(t, pid, dir, "--external", "stdio")
	cmd.Wait()
	wantFeature(t, dir, "external-fds")
	if r := mustSnapctl(t, "inspect", "-D", dir); !strings.Contains(r.Stdout, "fd 1 leads outside: "+key) {
		t.Errorf("inspect does not show fd 1 leading outside:\n%s", r.Stdout)
	}
	// The starter still holds the pipe (as a shell would): what the
	// daemon wrote before it was killed waits in it.

	r = runSnapctl(t, "restore", "-D", dir)
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "fd 1 of pid "+strconv.Itoa(pid)) || !strings.Contains(r.Stderr, key) ||
		!strings.Contains(r.Stderr, "--inherit-fd") {
		t.Fatalf("a restore without --inherit-fd: want exit %d naming pid %d fd 1 and %s:\n%s", exitUnsupported, pid, key, r)
	}
	if unix.Kill(pid, 0) == nil {
		t.Fatalf("the refused restore left pid %d", pid)
	}

	rr := restoreWithFiles(t, []*os.File{pw}, "restore", "-D", dir, "--inherit-fd", "fd[3]:"+key)
	if rr.Code != 0 {
		t.Fatalf("%s", rr)
	}
	restored = true
	pw.Close() // the restored daemon holds the only write end now
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", pid))
	if err != nil || link != key {
		t.Errorf("fd 1 of the restored daemon is %q (%v), want %s", link, err, key)
	}
	expect(20, 30*time.Second)
	unix.Kill(pid, unix.SIGKILL)
	// Killed, the daemon closes the last write end: the starter reads
	// the end of its output.
	lc.expectEnd(30 * time.Second)
}

// lineCounter reads the lines "0", "1", "2"... that processes write on
// a pipe leading outside them, and fails the test on a line lost or
// doubled across a dump and a restore.
type lineCounter struct {
	t     *testing.T
	key   string // the pipe's key as a dump names it: pipe:[INO]
	lines chan string
	next  int
}

// countLines reads pr, the read end of the pipe whose write end pw the
// processes hold.
func countLines(t *testing.T, pr, pw *os.File) *lineCounter {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(pw.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	c := &lineCounter{t: t, key: fmt.Sprintf("pipe:[%d]", st.Ino), lines: make(chan string, 4096)}
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
	}()
	return c
}

// expect reads the next n lines, each within the time given.
func (c *lineCounter) expect(n int, within time.Duration) {
	c.t.Helper()
	deadline := time.After(within)
	for range n {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("the pipe closed after %d lines", c.next)
			}
			if l != strconv.Itoa(c.next) {
				c.t.Fatalf("read %q, want %d: a line lost or doubled", l, c.next)
			}
			c.next++
		case <-deadline:
			c.t.Fatalf("no line %d after %v", c.next, within)
		}
	}
}

// expectEnd reads the lines left until the pipe closes, within the time
// given.
func (c *lineCounter) expectEnd(within time.Duration) {
	c.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return
			}
			if l != strconv.Itoa(c.next) {
				c.t.Fatalf("read %q, want %d", l, c.next)
			}
			c.next++
		case <-deadline:
			c.t.Fatal("the pipe did not close after its last writer was killed")
		}
	}
}

// TestInheritFDFallbackNull: --external-fallback null puts /dev/null in
// place of a descriptor leading outside that no --inherit-fd gives.
func TestInheritFDFallbackNull(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	py := testutil.RequireCommand(t, "python3")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	pr.SetReadDeadline(time.Now().Add(90 * time.Second))
	cmd := exec.Command(py, "-c", counterScript)
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	pid := cmd.Process.Pid
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
	if _, err := bufio.NewReader(pr).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, pid, dir, "--external", "fd[1]")
	cmd.Wait()
	r := mustSnapctl(t, "restore", "-D", dir, "--external-fallback", "null")
	if !strings.Contains(r.Stderr, "/dev/null") {
		t.Errorf("the restore does not say fd 1 is /dev/null:\n%s", r)
	}
	time.Sleep(100 * time.Millisecond)
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", pid))
	if err != nil || link != "/dev/null" {
		t.Errorf("fd 1 of the restored daemon is %q (%v), want /dev/null", link, err)
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Errorf("the restored daemon died writing to /dev/null: %v", err)
	}
}

// wantFeature fails the test unless the manifest of the snapshot in dir
// lists format feature f.
func wantFeature(t *testing.T, dir, f string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"`+f+`"`) {
		t.Errorf("snapshot.json does not list feature %s:\n%s", f, b)
	}
}

// restoreWithFiles runs snapctl with files as its descriptors 3, 4...
func restoreWithFiles(t *testing.T, files []*os.File, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	var stdout, stderr strings.Builder
	cmd := exec.CommandContext(ctx, buildTool(t, "snapctl"), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.ExtraFiles = files
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	res := cmdResult{Args: append([]string{"snapctl"}, args...), Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s: timed out\n%s", strings.Join(res.Args, " "), res)
	case errors.As(err, &ee):
		res.Code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return res
}

// TestInheritFDStdoutSocket: a daemon whose stdout is a unix stream socket
// (as under systemd, whose journal reads the other end) is dumped with
// --external stdio, and restored with --inherit-fd handing it a socket of
// a new pair: what it wrote before the dump is read from the old socket,
// what it writes after from the new one, every number once and in order.
func TestInheritFDStdoutSocket(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	py := testutil.RequireCommand(t, "python3")
	pair := func() (*os.File, *os.File) {
		t.Helper()
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(p[0]), "daemon end"), os.NewFile(uintptr(p[1]), "reader end")
	}
	a, b := pair()
	defer b.Close()
	cmd := exec.Command(py, "-c", counterScript)
	cmd.Stdout = a
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	pid := cmd.Process.Pid
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", pid))
	if err != nil || !strings.HasPrefix(link, "socket:[") {
		t.Fatalf("fd 1 of the daemon: %q %v", link, err)
	}
	next := 0
	// readFrom reads numbers from s (reading r) until EOF or until n
	// were read.
	readFrom := func(r *os.File, s *bufio.Scanner, n int) {
		t.Helper()
		r.SetReadDeadline(time.Now().Add(60 * time.Second))
		for n < 0 || n > 0 {
			if !s.Scan() {
				if n < 0 && s.Err() == nil {
					return // EOF
				}
				t.Fatalf("after %d lines: %v", next, s.Err())
			}
			if s.Text() != strconv.Itoa(next) {
				t.Fatalf("read %q, want %d: a line lost or doubled", s.Text(), next)
			}
			next++
			n--
		}
	}
	sb := bufio.NewScanner(b)
	readFrom(b, sb, 3)
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, pid, dir, "--external", "stdio")
	cmd.Wait()
	readFrom(b, sb, -1) // all it wrote before the dump, then EOF
	c, d := pair()
	defer d.Close()
	r := restoreWithFiles(t, []*os.File{c}, "restore", "-D", dir, "--inherit-fd", "fd[3]:"+link)
	c.Close()
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	readFrom(d, bufio.NewScanner(d), 20)
}

// echoScript connects to the port in argv[1], opens an inotify descriptor
// (which a dump refuses) after the connection, says ready and echoes
// what it receives.
const echoScript = `
import ctypes, os, socket, sys
os.closerange(3, 65536)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
libc = ctypes.CDLL(None, use_errno=True)
if libc.inotify_init1(os.O_CLOEXEC) < 0:
    sys.exit("inotify_init1 errno %d" % ctypes.get_errno())
s.sendall(b"ready\n")
while True:
    d = s.recv(4096)
    if not d:
        break
    s.sendall(d)
`

// TestTCPEstablishedDumpRefused: a dump --tcp-established that fails
// after it took a connection (a descriptor after it is refused) gives the
// connection back: the process answers on it, and no lock is left.
func TestTCPEstablishedDumpRefused(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	pid, c, rd, _ := startTCPClient(t, echoScript, 60*time.Second)
	dir := filepath.Join(t.TempDir(), "snap")
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(pid), "-D", dir, "--tcp-established")
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "inotify") || !strings.Contains(r.Stderr, "pid "+strconv.Itoa(pid)) {
		t.Fatalf("want exit %d naming pid %d and inotify:\n%s", exitUnsupported, pid, r)
	}
	t.Logf("refused in %v", r.Elapsed)
	if tables := strings.Join(lazyfsTables(t), " "); strings.Contains(tables, "lazyfs_"+strconv.Itoa(pid)+"_") {
		t.Errorf("the refused dump left its lock: %s", tables)
	}
	if _, err := io.WriteString(c, "still there?\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || line != "still there?\n" {
		t.Errorf("after the refused dump the connection answered %q %v", line, err)
	}
}

// startTCPClient starts python3 running script, a client that connects
// to a listener of the test (its port as argv[1]) and says "ready", and
// returns its pid, the test's end of the connection (its deadline
// within from now), a reader of it past "ready", and the command, whose
// process is killed at cleanup.
func startTCPClient(t *testing.T, script string, within time.Duration) (int, net.Conn, *bufio.Reader, *exec.Cmd) {
	t.Helper()
	py := testutil.RequireCommand(t, "python3")
	l, err := (&net.ListenConfig{}).Listen(testContext(t), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := exec.Command(py, "-c", script, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL); cmd.Wait() })
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(within))
	rd := bufio.NewReader(c)
	if line, err := rd.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("the client said %q %v", line, err)
	}
	return pid, c, rd, cmd
}

// echoServerScript listens on 127.0.0.1:argv[1] without SO_REUSEADDR at
// a descriptor above the one its first client gets, and echoes each
// client's lines, one client at a time.
const echoServerScript = `
import os, socket, sys
os.closerange(3, 65536)
spare = os.open("/dev/null", os.O_RDONLY)
l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(8)
os.close(spare)
print("listening", flush=True)
while True:
    c, _ = l.accept()
    while True:
        d = c.recv(4096)
        if not d:
            break
        c.sendall(d)
    c.close()
`

// startPyServer starts python3 script with port as its argument, killed
// when the test ends, and returns it and its stdout (reads time out after
// 90 s).
func startPyServer(t *testing.T, py, script string, port int) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	pr.SetReadDeadline(time.Now().Add(90 * time.Second))
	cmd := exec.Command(py, "-c", script, strconv.Itoa(port))
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	pid := cmd.Process.Pid
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
	return cmd, bufio.NewReader(pr)
}

// TestTCPEstablishedBeforeListener: a connection at a lower descriptor
// than its listener, which has no SO_REUSEADDR, comes back connected, and
// the listener listens again on the port the connection holds.
func TestTCPEstablishedBeforeListener(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	py := testutil.RequireCommand(t, "python3")
	ctx := testContext(t)
	port := freePort(t)
	cmd, out := startPyServer(t, py, echoServerScript, port)
	pid := cmd.Process.Pid
	if line, err := out.ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("the server said %q %v", line, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	rd := bufio.NewReader(c)
	echo := func(what string) {
		t.Helper()
		if _, err := io.WriteString(c, what+"\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := rd.ReadString('\n'); err != nil || line != what+"\n" {
			t.Fatalf("echo of %q: %q %v", what, line, err)
		}
	}
	echo("before")
	var fds []string
	for _, n := range []int{3, 4} {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, n))
		fds = append(fds, l)
	}
	if !strings.HasPrefix(fds[0], "socket:") || !strings.HasPrefix(fds[1], "socket:") {
		t.Fatalf("fds 3 and 4 of the server: %v, want the connection and the listener", fds)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, pid, dir, "--tcp-established", "--external", "stdio")
	cmd.Wait()
	r := restoreWithFiles(t, nil, "restore", "-D", dir, "--tcp-established", "--external-fallback", "null")
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	echo("after")
	c.Close()
	// The server goes back to accept: a new client is served.
	c2, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("the restored listener: %v", err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c2, "new\n")
	if line, err := bufio.NewReader(c2).ReadString('\n'); err != nil || line != "new\n" {
		t.Errorf("a new client after the restore: %q %v", line, err)
	}
}

// queueServerScript accepts one client on 127.0.0.1:argv[1], sends it
// the pattern (byte i is i mod 251) until the socket takes no more,
// says how much on stdout, waits for SIGUSR1, then reads the client's
// request line (sent before the dump: it waited in the receive queue) and
// answers it.
const queueServerScript = `
import os, signal, socket, sys, time
os.closerange(3, 65536)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(1)
print("listening", flush=True)
c, _ = l.accept()
data = (bytes(range(251)) * ((16 << 20) // 251 + 1))[:16 << 20]
c.setblocking(False)
sent = 0
while True:
    try:
        n = c.send(data[sent:sent + (1 << 20)])
    except BlockingIOError:
        break
    sent += n
print("sent", sent, flush=True)
signal.sigwait([signal.SIGUSR1])
c.setblocking(True)
req = b""
while not req.endswith(b"\n"):
    req += c.recv(1)
c.sendall(b"answer to " + req)
time.sleep(60)
`

// TestTCPEstablishedQueues: a connection dumped with bytes in both of its
// queues (the server's send queue full behind a client that reads
// nothing, a request waiting unread in its receive queue) gives the
// client every byte once and in order after the restore, then the answer
// to the request.
func TestTCPEstablishedQueues(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	py := testutil.RequireCommand(t, "python3")
	ctx := testContext(t)
	port := freePort(t)
	cmd, out := startPyServer(t, py, queueServerScript, port)
	pid := cmd.Process.Pid
	if line, err := out.ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("the server said %q %v", line, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "the request\n"); err != nil {
		t.Fatal(err)
	}
	line, err := out.ReadString('\n')
	var sent int
	if _, err2 := fmt.Sscanf(line, "sent %d\n", &sent); err != nil || err2 != nil || sent == 0 {
		t.Fatalf("the server said %q %v %v", line, err, err2)
	}
	t.Logf("the server filled its send queue")
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, pid, dir, "--tcp-established", "--external", "stdio")
	cmd.Wait()
	t.Logf("dumped")
	si := srvImageFDs(t, dir, pid)
	var conn string
	for _, f := range si.FDs {
		if f.Socket != nil && f.Socket.TCP != nil {
			tc := f.Socket.TCP
			conn = fmt.Sprintf("send queue %d bytes (%d unsent), receive queue %d bytes", len(tc.SendQueue), tc.Unsent, len(tc.RecvQueue))
			if len(tc.SendQueue) == 0 || len(tc.RecvQueue) != len("the request\n") {
				t.Errorf("the dump kept %s: want both queues", conn)
			}
		}
	}
	t.Logf("%d bytes sent by the server; its connection: %s", sent, conn)
	r := restoreWithFiles(t, nil, "restore", "-D", dir, "--tcp-established", "--external-fallback", "null")
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	if err := unix.Kill(pid, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, sent)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %d bytes: %v", sent, err)
	}
	t.Logf("%d bytes read %v after the restore", sent, time.Since(t0).Round(time.Millisecond))
	for i, b := range got {
		if b != byte(i%251) {
			t.Fatalf("byte %d is %d, want %d", i, b, i%251)
		}
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "answer to the request\n" {
		t.Errorf("after the bytes: %q %v", line, err)
	}
}
