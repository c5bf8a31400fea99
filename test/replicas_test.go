package e2e

// Replicas: one snapshot restored many times at once, each in new pid,
// mount and network namespaces (restore --pidns --netns new), lazily
// through one lazyfs mount.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// replica is one restored copy: its pid outside, its init's, the
// inodes of its namespaces.
type replica struct {
	run           *lazyRun
	pid, init     int
	pidns, netns  uint64
	mntns         uint64
	ownPID, index int
	killed        uint64 // ticksNow when it was killed
}

// nsInode is the inode of /proc/PID/ns/KIND.
func nsInode(t testing.TB, pid int, kind string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// nsHolders lists the processes in the namespace ino of kind that
// started before tick (clock ticks after boot, as /proc/PID/stat counts):
// a namespace's inode number is reused once it is freed, and a process
// started after its owner was killed holds a new namespace, not a
// leftover of the old one.
func nsHolders(kind string, ino, tick uint64) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), &st) != nil || st.Ino != ino {
			continue
		}
		if s, err := proc.ReadStat(pid); err == nil && s.StartTime <= tick {
			out = append(out, pid)
		}
	}
	return out
}

// ticksNow is the time since boot in clock ticks (USER_HZ, 100 on Linux),
// less one: what started by then started before now.
func ticksNow(t testing.TB) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Sec)*100 + uint64(ts.Nsec)/10_000_000 - 1
}

// inNetns runs fn on a thread in the network namespace of pid: sockets
// fn creates live there. The thread goes back to ours after, or is not
// reused (a locked goroutine that ends takes its thread with it, but for
// the main thread, which would stay where it is: hence the way back).
func inNetns(pid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ours, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer ours.Close()
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		err = fn()
		if unix.Setns(int(ours.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// redisIn runs one redis command in pid's network namespace.
func redisIn(ctx context.Context, pid, port int, args ...string) (string, error) {
	var out string
	err := inNetns(pid, func() error {
		var err error
		out, err = fixture.Redis(ctx, port, args...)
		return err
	})
	return out, err
}

// TestReplicasRedis dumps a redis-server holding data and restores it four
// times at once with --pidns --netns new, lazily through one lazyfs
// mount: each copy has the dumped pid in its own pid namespace, answers
// the dumped keys on the dumped port in its own network namespace, takes
// writes of its own, and goes with its namespaces when it ends. A copy is
// then dumped in turn (a process in a pid namespace below ours) and
// restored.
func TestReplicasRedis(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	nsenter := testutil.RequireCommand(t, "nsenter", "redis-cli")
	ctx := testContext(t)
	p := fixture.StartRedis(t)
	const keys = 20_000
	if err := redisLoad(ctx, p.Port, keys); err != nil {
		t.Fatal(err)
	}
	dir := srvDump(t, ctx, p)
	mnt := lazyMountLazyfs(t, dir)

	const n = 4
	reps := make([]*replica, n)
	for i := range reps {
		reps[i] = &replica{index: i, run: startLazy(t, dir, "--mount", mnt, "--pidns", "--netns", "new")}
	}
	for _, r := range reps {
		r.waitRunning(t, ctx, p.PID)
	}
	replicasApart(t, reps)
	// Every copy, in its namespace, on the dumped port: the dumped keys,
	// its own pid as it had it, and a write of its own.
	var wg sync.WaitGroup
	for _, r := range reps {
		wg.Go(func() {
			err := inNetns(r.pid, func() error { return redisSample(ctx, p.Port, keys, 7) })
			if err != nil {
				t.Errorf("replica %d: %v", r.index, err)
				return
			}
			info, err := redisIn(ctx, r.pid, p.Port, "INFO", "server")
			if want := fmt.Sprintf("process_id:%d\r", p.PID); err != nil || !strings.Contains(info, want) {
				t.Errorf("replica %d: INFO has no %q: %v", r.index, want, err)
			}
			if v, err := redisIn(ctx, r.pid, p.Port, "SET", "replica", strconv.Itoa(r.index)); err != nil || v != "OK" {
				t.Errorf("replica %d: SET answered %q, %v", r.index, v, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, r := range reps {
		// nsenter, as a user would, and /proc in the copy's mount
		// namespace shows its own pid namespace.
		out := string(testutil.Output(t, nsenter, "-t", strconv.Itoa(r.pid), "-n", "redis-cli", "-p", strconv.Itoa(p.Port), "GET", "replica"))
		if strings.TrimSpace(out) != strconv.Itoa(r.index) {
			t.Errorf("replica %d: GET replica = %q: the copies share their data", r.index, out)
		}
		out = string(testutil.Output(t, nsenter, "-t", strconv.Itoa(r.pid), "-m", "-p", "cat", fmt.Sprintf("/proc/%d/comm", p.PID), "/proc/1/cmdline"))
		if !strings.HasPrefix(out, "redis-server\n") || !strings.Contains(out, "lazyfs-pidns-init") {
			t.Errorf("replica %d: its /proc shows %q, want redis-server at %d and the init at 1", r.index, out, p.PID)
		}
	}
	// Nothing listens on our side of the port.
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)))
	if err != nil {
		t.Fatalf("port %d taken in our namespace: %v", p.Port, err)
	}
	l.Close()
	for _, r := range reps {
		res := r.run.mustFinish(t, ctx, r.pid)
		want := fmt.Sprintf("pid %d is pid %d in its pid namespace, whose init is pid %d", r.pid, p.PID, r.init)
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("replica %d: output lacks %q:\n%s", r.index, want, res.Stdout)
		}
	}

	// SIGTERM to the copy: redis shuts down, its init exits with it and
	// the namespaces go. SIGKILL to an init: the copy dies with it.
	reps[0].killed, reps[1].killed = ticksNow(t), ticksNow(t)
	if err := unix.Kill(reps[0].pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(reps[1].init, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, r := range reps[:2] {
		replicaGone(t, ctx, r)
	}

	// A copy dumped in turn records its pid in its namespace; its
	// snapshot restores into a new one only.
	dir2 := filepath.Join(t.TempDir(), "snap2")
	reps[3].killed = ticksNow(t)
	dumpPID(t, reps[3].pid, dir2)
	replicaGone(t, ctx, reps[3])
	si := openImage(t, dir2, reps[3].pid)
	if !slices.Equal(si.State.NSPID, []int{reps[3].pid, p.PID}) {
		t.Fatalf("snapshot of a copy: ns_pid %v, want [%d %d]", si.State.NSPID, reps[3].pid, p.PID)
	}
	if !si.Snap.Manifest.HasFeature(image.FeaturePIDNS) {
		t.Errorf("snapshot of a copy lacks the %q feature", image.FeaturePIDNS)
	}
	if r := runSnapctl(t, "restore", "-D", dir2); r.Code != 3 || !strings.Contains(r.Stderr, "--pidns") {
		t.Errorf("restore without --pidns of a snapshot from a pid namespace: want exit 3 naming --pidns\n%s", r)
	}
	again := &replica{index: n, run: startLazy(t, dir2, "--source", "direct", "--pidns", "--netns", "new")}
	again.waitRunning(t, ctx, p.PID)
	again.run.mustFinish(t, ctx, again.pid)
	if v, err := redisIn(ctx, again.pid, p.Port, "GET", "replica"); err != nil || v != "3" {
		t.Errorf("copy of copy 3: GET replica = %q, %v; want 3", v, err)
	}
	if err := inNetns(again.pid, func() error { return redisSample(ctx, p.Port, keys, 101) }); err != nil {
		t.Errorf("copy of copy 3: %v", err)
	}
	for _, r := range []*replica{reps[2], again} {
		r.killed = ticksNow(t)
		if err := unix.Kill(r.pid, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		replicaGone(t, ctx, r)
	}
}

// waitRunning waits until the copy runs (its snapctl wrote the pidfile),
// has it killed at cleanup, checks that it has the dumped pid in a pid
// namespace of its own whose init is its parent, and notes its init and
// namespaces.
func (r *replica) waitRunning(t *testing.T, ctx context.Context, dumped int) {
	t.Helper()
	r.pid = r.run.waitRunning(t, ctx)
	t.Cleanup(func() { replicaKill(r) })
	st, err := proc.ReadStatus(r.pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.NSpid) != 2 || st.NSpid[0] != r.pid || st.NSpid[1] != dumped {
		t.Fatalf("replica %d: NSpid %v, want [%d %d]", r.index, st.NSpid, r.pid, dumped)
	}
	stat, err := proc.ReadStat(r.pid)
	if err != nil {
		t.Fatal(err)
	}
	r.init, r.ownPID = stat.PPid, st.NSpid[1]
	if ist, err := proc.ReadStatus(r.init); err != nil || len(ist.NSpid) != 2 || ist.NSpid[1] != 1 {
		t.Fatalf("replica %d: parent %d is not the init of its namespace: %+v %v", r.index, r.init, ist, err)
	}
	r.pidns, r.netns, r.mntns = nsInode(t, r.pid, "pid_for_children"), nsInode(t, r.pid, "net"), nsInode(t, r.pid, "mnt")
}

// replicasApart checks that no two copies share a namespace, and that
// none is in our network namespace.
func replicasApart(t *testing.T, reps []*replica) {
	t.Helper()
	for i, r := range reps {
		for _, o := range reps[:i] {
			if r.pidns == o.pidns || r.netns == o.netns || r.mntns == o.mntns {
				t.Fatalf("replicas %d and %d share a namespace", o.index, r.index)
			}
		}
		if r.netns == nsInode(t, os.Getpid(), "net") {
			t.Fatalf("replica %d is in our network namespace", r.index)
		}
	}
}

// replicaKill kills a copy's init, and with it the copy (at cleanup).
func replicaKill(r *replica) {
	if r.init > 0 {
		unix.Kill(r.init, unix.SIGKILL)
	}
	if r.pid > 0 {
		unix.Kill(r.pid, unix.SIGKILL)
	}
}

// replicaGone waits until a copy, its init and its namespaces are gone.
func replicaGone(t *testing.T, ctx context.Context, r *replica) {
	t.Helper()
	for _, pid := range []int{r.pid, r.init} {
		if !pidGone(ctx, pid) {
			t.Fatalf("replica %d: pid %d still there", r.index, pid)
		}
	}
	for _, ns := range []struct {
		kind string
		ino  uint64
	}{{"pid", r.pidns}, {"net", r.netns}, {"mnt", r.mntns}} {
		if h := nsHolders(ns.kind, ns.ino, r.killed); len(h) > 0 {
			t.Errorf("replica %d: its %s namespace is still held by %v", r.index, ns.kind, h)
		}
	}
}

// TestDumpAsUser: a user who runs snapctl on a process they may not
// trace is told to run it as root (exit 10).
func TestDumpAsUser(t *testing.T) {
	testutil.RequireRoot(t)
	setpriv := testutil.RequireCommand(t, "setpriv")
	p := fixture.Start(t, "sleeper")
	snapctl := buildTool(t, "snapctl")
	dir := filepath.Join(t.TempDir(), "snap")
	if err := os.Chmod(filepath.Dir(dir), 0o777); err != nil {
		t.Fatal(err)
	}
	r := runTool(t, setpriv, commandTimeout, "--reuid", "65534", "--regid", "65534", "--clear-groups", "--",
		snapctl, "dump", "-t", strconv.Itoa(p.PID), "-D", dir)
	if r.Code != 10 || !strings.Contains(r.Stderr, "run it as root") {
		t.Errorf("dump of root's process as nobody: want exit 10 saying to run it as root\n%s", r)
	}
}

// TestReplicasNoPrivilege: --pidns and --netns without CAP_SYS_ADMIN
// (dropped from the bounding set, as a container would) exit 10 with a
// message naming it, and leave nothing: the snapshot then restores.
func TestReplicasNoPrivilege(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	setpriv := testutil.RequireCommand(t, "setpriv")
	ctx := testContext(t)
	p := fixture.Start(t, "sleeper")
	dir, _ := dumpForRestore(t, ctx, p)
	snapctl := buildTool(t, "snapctl")
	for _, flags := range [][]string{{"--pidns"}, {"--netns", "new"}, {"--pidns", "--netns", "new"}} {
		args := append([]string{"--bounding-set", "-sys_admin", "--", snapctl, "restore", "-D", dir}, flags...)
		r := runTool(t, setpriv, commandTimeout, args...)
		if r.Code != 10 || !strings.Contains(r.Stderr, "CAP_SYS_ADMIN") {
			t.Errorf("restore %v without CAP_SYS_ADMIN: want exit 10 naming CAP_SYS_ADMIN\n%s", flags, r)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", p.PID)); err == nil {
			t.Fatalf("restore %v without CAP_SYS_ADMIN left pid %d", flags, p.PID)
		}
	}
	if r := runSnapctl(t, "restore", "-D", dir, "--netns", filepath.Join(dir, "snapshot.json")); r.Code != 2 || !strings.Contains(r.Stderr, "not a namespace") {
		t.Errorf("--netns of a file that is no namespace: want exit 2\n%s", r)
	}
	restoreAndAdopt(t, p, dir)
	if err := p.Signal(syscall.Signal(0)); err != nil {
		t.Fatal(err)
	}
	lazyKill(t, ctx, p)
}

// TestReplicasPIDNSInit: a process that was pid 1 of its pid namespace
// (sleep under unshare -pf) is dumped with its pid there, restored only
// with --pidns, and then as the init of each new namespace: two copies at
// once.
func TestReplicasPIDNSInit(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	unshare := testutil.RequireCommand(t, "unshare", "sleep")
	ctx := testContext(t)
	// Through launch: no descriptor of ours leaks into sleep.
	cmd := exec.Command(fixture.Build(t, "launch"), unshare, "--pid", "--fork", "--kill-child", "--mount-proc", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var pid int
	if ok, msg := srvEventually(ctx, 10*time.Second, func() (bool, string) {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		f := strings.Fields(string(kids))
		if len(f) != 1 {
			return false, fmt.Sprintf("unshare's children: %q", kids)
		}
		pid, _ = strconv.Atoi(f[0])
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return string(comm) == "sleep\n", fmt.Sprintf("child %d is %q", pid, comm)
	}); !ok {
		t.Fatal(msg)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, pid, dir)
	si := openImage(t, dir, pid)
	if !slices.Equal(si.State.NSPID, []int{pid, 1}) {
		t.Fatalf("ns_pid %v, want [%d 1]", si.State.NSPID, pid)
	}
	if r := runSnapctl(t, "restore", "-D", dir); r.Code != 3 {
		t.Errorf("restore without --pidns: want exit 3\n%s", r)
	}
	var copies []int
	for i := range 2 {
		pidfile := filepath.Join(t.TempDir(), "pid")
		r := mustSnapctl(t, "restore", "-D", dir, "--pidns", "--pidfile", pidfile)
		b, err := os.ReadFile(pidfile)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		t.Cleanup(func() { unix.Kill(c, unix.SIGKILL) })
		copies = append(copies, c)
		if want := fmt.Sprintf("pid %d is pid 1 in its pid namespace, whose init is pid %d", c, c); !strings.Contains(r.Stdout, want) {
			t.Errorf("copy %d: output lacks %q:\n%s", i, want, r.Stdout)
		}
		st, err := proc.ReadStatus(c)
		if err != nil || !slices.Equal(st.NSpid, []int{c, 1}) {
			t.Fatalf("copy %d: NSpid %+v (%v), want [%d 1]", i, st, err, c)
		}
	}
	for _, c := range copies {
		ns, killed := nsInode(t, c, "pid"), ticksNow(t)
		if err := unix.Kill(c, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if !pidGone(ctx, c) {
			t.Fatalf("copy %d still there", c)
		}
		if h := nsHolders("pid", ns, killed); len(h) > 0 {
			t.Errorf("the pid namespace of copy %d is held by %v", c, h)
		}
	}
}

// TestReplicasNetnsPath: --netns PATH joins a network namespace that ip
// netns add made: redis listens there, on its dumped port, and not here.
func TestReplicasNetnsPath(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ip := testutil.RequireCommand(t, "ip")
	ctx := testContext(t)
	name := fmt.Sprintf("lazyfs-test-%d", os.Getpid())
	if r := runTool(t, ip, commandTimeout, "netns", "add", name); r.Code != 0 {
		t.Fatalf("%s", r)
	}
	t.Cleanup(func() {
		if r := runTool(t, ip, commandTimeout, "netns", "delete", name); r.Code != 0 {
			t.Errorf("%s", r)
		}
	})
	if r := runTool(t, ip, commandTimeout, "-n", name, "link", "set", "lo", "up"); r.Code != 0 {
		t.Fatalf("%s", r)
	}
	p := fixture.StartRedis(t)
	if v, err := fixture.Redis(ctx, p.Port, "SET", "where", "netns"); err != nil || v != "OK" {
		t.Fatalf("SET: %q, %v", v, err)
	}
	dir := srvDump(t, ctx, p)
	restoreAndAdopt(t, p, dir, "--netns", filepath.Join("/run/netns", name))
	t.Cleanup(func() { p.Kill(ctx) })
	if nsInode(t, p.PID, "net") == nsInode(t, os.Getpid(), "net") {
		t.Fatal("the restored redis is in our network namespace")
	}
	if v, err := redisIn(ctx, p.PID, p.Port, "GET", "where"); err != nil || v != "netns" {
		t.Errorf("GET in the namespace: %q, %v", v, err)
	}
	out := testutil.Output(t, ip, "netns", "exec", name, "redis-cli", "-p", strconv.Itoa(p.Port), "GET", "where")
	if strings.TrimSpace(string(out)) != "netns" {
		t.Errorf("ip netns exec redis-cli GET: %q", out)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)))
	if err != nil {
		t.Fatalf("port %d taken in our namespace: %v", p.Port, err)
	}
	l.Close()
	srvKill(t, ctx, p)
}

// askIn asks a modelserver one request in pid's network namespace.
func askIn(ctx context.Context, pid, port int, req string) (string, error) {
	var out string
	err := inNetns(pid, func() error {
		var err error
		out, err = fixture.Ask(ctx, port, req)
		return err
	})
	return out, err
}

// TestReplicasWorkingSet: the first copy of a modelserver, restored with
// --pidns --netns new through one lazyfs mount, records its working set
// until it answered "touch 1"; the file is named by the dumped pid (the
// copy's pid in its namespace, not the one outside), and two copies
// restored at once after it, in namespaces of their own, fetch it first
// and answer right.
func TestReplicasWorkingSet(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "32M")
	port := int(p.Ready.MustInt(t, "port"))
	want := map[string]string{}
	for _, req := range []string{"touch 1", "token"} {
		want[req] = lazyChecksumOf(lazyAsk(t, ctx, port, req))
	}
	dir, _ := dumpForRestore(t, ctx, p)
	wsPath := filepath.Join(dir, workingset.Name(p.PID))
	mnt := lazyMountLazyfs(t, dir)
	flags := []string{"--mount", mnt, "--pidns", "--netns", "new"}
	ask := func(r *replica, req string) {
		a, err := askIn(ctx, r.pid, port, req)
		if got := lazyChecksumOf(a); err != nil || got != want[req] {
			t.Errorf("replica %d: %s answered %q, %v; want checksum %s", r.index, req, a, err, want[req])
		}
	}

	first := &replica{index: 0, run: startLazy(t, dir, append(flags, "--record-working-set", "--record-for", "2m")...)}
	first.waitRunning(t, ctx, p.PID)
	ask(first, "touch 1")
	if err := first.run.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	ask(first, "token")
	res := first.run.mustFinish(t, ctx, first.pid)
	if !strings.Contains(res.Stdout, "working set recorded:") || !strings.Contains(res.Stdout, "stopped by signal") || !strings.Contains(res.Stdout, wsPath) {
		t.Fatalf("no working set recorded in %s:\n%s", wsPath, res)
	}
	if _, err := os.Stat(filepath.Join(dir, workingset.Name(first.pid))); err == nil {
		t.Errorf("the working set is also named by the copy's pid outside, %d", first.pid)
	}
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := workingset.Read(snap, p.PID)
	snap.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(ws.Entries) == 0 || !ws.HasData() {
		t.Fatalf("working set of %d ranges, with data %v", len(ws.Entries), ws.HasData())
	}
	// The mount, made before the recording, shows it under the dumped pid.
	b, err := os.ReadFile(filepath.Join(mnt, strconv.Itoa(p.PID), "workingset"))
	if n := strings.Count(string(b), "\n"); err != nil || n != len(ws.Entries)+2 {
		t.Errorf("MNT/%d/workingset: %d lines for %d ranges (%v):\n%.300s", p.PID, n, len(ws.Entries), err, b)
	}

	reps := []*replica{first}
	for i := 1; i <= 2; i++ {
		reps = append(reps, &replica{index: i, run: startLazy(t, dir, flags...)})
	}
	for _, r := range reps[1:] {
		r.waitRunning(t, ctx, p.PID)
	}
	replicasApart(t, reps)
	var wg sync.WaitGroup
	for _, r := range reps[1:] {
		wg.Go(func() {
			ask(r, "touch 1")
			ask(r, "token")
		})
	}
	wg.Wait()
	for _, r := range reps[1:] {
		res := r.run.mustFinish(t, ctx, r.pid)
		if !strings.Contains(res.Stdout, "fetched first from its copy, "+wsPath) {
			t.Errorf("replica %d did not use the working set:\n%s", r.index, res)
		}
	}
	// The first copy still answers from its own memory.
	ask(first, "touch 1")
	for _, r := range reps {
		r.killed = ticksNow(t)
		if err := unix.Kill(r.init, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		replicaGone(t, ctx, r)
	}
}
