package e2e

// The container fixture (test/fixture/container) that the container
// tests build on: a root file system assembled from the host's files, a
// real server in a runc container with namespaces of its own, and fresh
// containers of the same file system (what a restore goes into), none of
// which leaves a process, cgroup, mount or runc state behind.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/fixture/container"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// containerWait bounds each wait for a container's server.
const containerWait = 30 * time.Second

func TestContainerFixture(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireCommand(t, "runc", "nsenter", "busybox")
	redisServer := testutil.RequireCommand(t, "redis-server")
	redisCli := testutil.RequireCommand(t, "redis-cli")
	began := time.Now()

	rootfs := container.Rootfs(t, redisServer, redisCli)
	t.Logf("rootfs %s in %v", rootfs, time.Since(began).Round(time.Millisecond))
	for _, p := range []string{"/bin/busybox", "/bin/sh", "/bin/sleep", "/etc/passwd", "/etc/group", redisServer, redisCli} {
		if _, err := os.Stat(rootfs + p); err != nil {
			t.Errorf("rootfs: %v", err)
		}
	}

	// A redis-server listening on the loopback of the container's own
	// network namespace.
	redisArgs := []string{redisServer, "--port", "6379", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", "/tmp"}
	start := time.Now()
	c1 := container.Start(t, container.Spec{Rootfs: rootfs, Args: redisArgs})
	pingContainer(t, c1)
	t.Logf("container %s (init %d) answered PING %v after start", c1.ID, c1.InitPID, time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(t.Context(), containerWait)
	defer cancel()
	ourNet := nsOf(t, os.Getpid(), "net")
	// SET from the test's own code in the container's namespace, GET with
	// the container's redis-cli through runc exec.
	if err := c1.InNetns(func() error {
		r, err := fixture.Redis(ctx, 6379, "SET", "lazyfs-key", "in-a-container")
		if err == nil && r != "OK" {
			err = fmt.Errorf("SET answered %q", r)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(c1.Exec(t, redisCli, "-p", "6379", "GET", "lazyfs-key")); got != "in-a-container" {
		t.Errorf("GET in the container = %q, want %q", got, "in-a-container")
	}
	if now := nsOf(t, os.Getpid(), "net"); now != ourNet {
		t.Errorf("after InNetns our network namespace is %s, was %s", now, ourNet)
	}

	// Namespaces: pid 1 of a pid namespace of its own, a network
	// namespace other than ours.
	for _, ns := range []string{"pid", "net", "mnt", "uts", "ipc"} {
		if nsOf(t, os.Getpid(), ns) == nsOf(t, c1.InitPID, ns) {
			t.Errorf("init %d shares our %s namespace", c1.InitPID, ns)
		}
	}
	checkNSpid(t, c1.InitPID)
	pids, err := c1.Pids()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, c1.InitPID) {
		t.Errorf("Pids() = %v, without the init %d (cgroup %s)", pids, c1.InitPID, c1.CgroupDir())
	}
	t.Logf("cgroups of %s: %v", c1.ID, c1.Cgroups)

	// A fresh container of the same file system, with a placeholder init,
	// while the first runs.
	c2 := container.Start(t, container.Spec{Rootfs: rootfs})
	if !c2.Alive() {
		t.Fatalf("placeholder container %s: init %d not running", c2.ID, c2.InitPID)
	}
	checkNSpid(t, c2.InitPID)
	if nsOf(t, c1.InitPID, "pid") == nsOf(t, c2.InitPID, "pid") || nsOf(t, c1.InitPID, "net") == nsOf(t, c2.InitPID, "net") {
		t.Errorf("containers %s and %s share namespaces", c1.ID, c2.ID)
	}
	if out := c2.Exec(t, "/bin/ps"); !strings.Contains(out, "sleep infinity") {
		t.Errorf("ps in %s:\n%s", c2.ID, out)
	}
	// The first container's server is not on the second's loopback.
	if out, err := c2.NetnsCommand(ctx, redisCli, "-p", "6379", "PING").CombinedOutput(); err == nil && strings.Contains(string(out), "PONG") {
		t.Errorf("redis-server of %s answers in %s's network namespace", c1.ID, c2.ID)
	}

	// Stopping one leaves nothing of it, and the other running.
	stopStart := time.Now()
	stopContainer(t, c1)
	t.Logf("container %s stopped in %v", c1.ID, time.Since(stopStart).Round(time.Millisecond))
	if !c2.Alive() {
		t.Errorf("container %s died with %s", c2.ID, c1.ID)
	}

	// After the first: the same server in another fresh container.
	c3 := container.Start(t, container.Spec{Rootfs: rootfs, Args: redisArgs})
	pingContainer(t, c3)
	checkNSpid(t, c3.InitPID)
	// Both at once (Stop waits for the inits to be reaped by the host's
	// init, which may take a while), then the checks.
	stopStart = time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- c2.Stop() }()
	c3.Stop()
	<-stopped
	t.Logf("containers %s and %s stopped together in %v", c2.ID, c3.ID, time.Since(stopStart).Round(time.Millisecond))
	stopContainer(t, c3)
	stopContainer(t, c2)
	if m := mountsOf(t, rootfs); len(m) > 0 {
		t.Errorf("mounts left under the rootfs: %v", m)
	}
	t.Logf("whole test %v", time.Since(began).Round(time.Millisecond))
}

// pingContainer waits until redis-server in c answers PING on port 6379
// of the container's loopback, asked by the host's redis-cli in c's
// network namespace (nsenter).
func pingContainer(t *testing.T, c *container.Container) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), containerWait)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := c.NetnsCommand(pctx, "redis-cli", "-p", "6379", "PING").CombinedOutput()
		pcancel()
		if err == nil && strings.TrimSpace(string(out)) == "PONG" {
			return
		}
		if !c.Alive() {
			b, _ := os.ReadFile(c.LogPath)
			t.Fatalf("container %s: init %d exited before answering PING; log:\n%s", c.ID, c.InitPID, b)
		}
		select {
		case <-ctx.Done():
			b, _ := os.ReadFile(c.LogPath)
			t.Fatalf("container %s: no PONG within %v (last: %v %q); log:\n%s", c.ID, containerWait, err, out, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stopContainer stops c (if not yet) and checks that nothing of it is left.
func stopContainer(t *testing.T, c *container.Container) {
	t.Helper()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(c.InitPID)); err == nil {
		// Another process may have taken the PID; the init must not hold it.
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(c.InitPID) + "/status"); strings.Contains(string(st), "\nNSpid:\t"+strconv.Itoa(c.InitPID)+"\t1\n") {
			t.Errorf("container %s: init %d still there", c.ID, c.InitPID)
		}
	}
	if left := c.Leftovers(); len(left) > 0 {
		t.Errorf("container %s left: %v", c.ID, left)
	}
	if out, err := c.Runc(t.Context(), "list", "--quiet"); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("runc --root %s list after stop: %q %v", c.Root, out, err)
	}
}

// nsOf returns the identity of pid's namespace of kind ns ("pid:[4026531836]").
func nsOf(t *testing.T, pid int, ns string) string {
	t.Helper()
	s, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkNSpid checks that pid is 1 in the innermost of its pid namespaces
// and pid in ours (the NSpid line of its status).
func checkNSpid(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) < 2 || f[0] != strconv.Itoa(pid) || f[len(f)-1] != "1" {
				t.Errorf("pid %d: NSpid:%s, want %d ... 1", pid, rest, pid)
			}
			return
		}
	}
	t.Errorf("pid %d: no NSpid in status", pid)
}

// mountsOf returns the mount points of our mount namespace under dir.
func mountsOf(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}
