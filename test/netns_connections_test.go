package e2e

// Kept TCP connections and network namespaces: the lock of
// --tcp-established is an nftables table of snapctl's namespace, so a
// dump of connections in another namespace, and a restore of kept
// connections into one (--netns), are refused before anything changes.

import (
	"bufio"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// loopScript, in a network namespace of its own, connects to itself over
// the loopback (brought up by its caller) and says so.
const loopScript = `
import os, socket, time
os.closerange(3, 65536)
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1)
c = socket.create_connection(l.getsockname())
a, _ = l.accept()
print("connected", flush=True)
while True:
    time.sleep(1)
`

// TestTCPEstablishedOtherNetns: a process whose connections are in
// another network namespace is refused by a dump --tcp-established,
// naming it, and runs on; no lock is made.
func TestTCPEstablishedOtherNetns(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	unshare := testutil.RequireCommand(t, "unshare")
	ip := testutil.RequireCommand(t, "ip")
	py := testutil.RequireCommand(t, "python3")
	_ = testContext(t)
	before := lazyfsTables(t)
	cmd := exec.Command(unshare, "-n", "sh", "-c", ip+` link set lo up && exec "$0" -c "$1"`, py, loopScript)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if l != "connected\n" {
			t.Fatalf("the process in its namespace said %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the process in its namespace did not connect")
	}
	dir := filepath.Join(t.TempDir(), "snap")
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(pid), "-D", dir, "--tcp-established")
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "another network namespace") || !strings.Contains(r.Stderr, "pid "+strconv.Itoa(pid)) {
		t.Fatalf("want exit %d naming pid %d and its network namespace:\n%s", exitUnsupported, pid, r)
	}
	if after := lazyfsTables(t); len(after) != len(before) {
		t.Errorf("nftables tables %v after the refused dump, %v before", after, before)
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Errorf("the process did not survive the refused dump: %v", err)
	}
}

// kept is a client that keeps its connection to the test and echoes
// what it reads on it.
const keptScript = `
import os, socket, sys
os.closerange(3, 65536)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"ready\n")
while True:
    d = s.recv(4096)
    if not d:
        break
    s.sendall(d)
`

// TestTCPEstablishedRestoreNetns: a snapshot that kept a connection is
// refused by restore --tcp-established --netns new before it creates
// anything, the lock kept; restored without --netns, the connection goes
// on and the lock goes.
func TestTCPEstablishedRestoreNetns(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireCommand(t, "nft")
	pid, c, rd, cmd := startTCPClient(t, keptScript, 90*time.Second)
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, pid, dir, "--tcp-established")
	cmd.Wait()
	m := regexp.MustCompile(`1 TCP connections held by nftables table inet (lazyfs_\S+)`).FindStringSubmatch(r.Stdout)
	if m == nil {
		t.Fatalf("the dump does not name its network lock:\n%s", r)
	}
	lock := m[1]
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", lock).Run() })

	r = runSnapctl(t, "restore", "-D", dir, "--tcp-established", "--netns", "new")
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "--netns") || !strings.Contains(r.Stderr, "kept by the dump") {
		t.Fatalf("restore --tcp-established --netns new: want exit %d naming the kept connection and --netns:\n%s", exitUnsupported, r)
	}
	if unix.Kill(pid, 0) == nil {
		t.Fatalf("the refused restore left pid %d", pid)
	}
	if !nftTable(t, lock) {
		t.Fatalf("the refused restore released the lock %s", lock)
	}
	mustSnapctl(t, "restore", "-D", dir, "--tcp-established")
	if _, err := io.WriteString(c, "after\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || line != "after\n" {
		t.Errorf("the restored connection answered %q %v", line, err)
	}
	if nftTable(t, lock) {
		t.Errorf("table inet %s left behind by the restore", lock)
	}
}
