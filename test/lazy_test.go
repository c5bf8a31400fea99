package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// Lazy restore tests: `snapctl restore --lazy` runs in the background
// while the test talks to the restored process during the lazy phase
// (--prefetch-delay keeps pages unserved for as long as a test needs),
// then checks that snapctl exits 0 with everything in and the process
// detached.

// lazyRun is a `snapctl restore --lazy` running in the background.
type lazyRun struct {
	cmd            *exec.Cmd
	dir            string
	pidfile        string
	start          time.Time
	stdout, stderr testutil.Buffer
	done           chan struct{}
	res            cmdResult
}

// startLazy starts `snapctl restore -D dir --lazy --pidfile F flags...`.
// At cleanup a snapctl still running is killed (its process with it) and
// reaped.
func startLazy(t testing.TB, dir string, flags ...string) *lazyRun {
	t.Helper()
	bin := buildTool(t, "snapctl")
	l := &lazyRun{dir: dir, pidfile: filepath.Join(t.TempDir(), "pid"), done: make(chan struct{})}
	args := append([]string{"restore", "-D", dir, "--lazy", "--pidfile", l.pidfile}, flags...)
	l.cmd = exec.Command(bin, args...)
	l.cmd.Stdout, l.cmd.Stderr = &l.stdout, &l.stderr
	l.res.Args = append([]string{"snapctl"}, args...)
	l.start = time.Now()
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := l.cmd.Wait()
		l.res.Elapsed = time.Since(l.start)
		l.res.Stdout, l.res.Stderr = l.stdout.String(), l.stderr.String()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			l.res.Code = ee.ExitCode()
		case err != nil:
			l.res.Code = -2
		}
		close(l.done)
	}()
	t.Cleanup(func() {
		if l.running() {
			l.cmd.Process.Kill()
		}
		<-l.done
	})
	return l
}

func (l *lazyRun) running() bool {
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}

// waitRunning waits until the pidfile names the restored process and
// returns the pid; snapctl must not have exited first unless it succeeded.
func (l *lazyRun) waitRunning(t testing.TB, ctx context.Context) int {
	t.Helper()
	for {
		if b, err := os.ReadFile(l.pidfile); err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("pidfile holds %q", b)
			}
			return pid
		}
		select {
		case <-l.done:
			t.Fatalf("snapctl exited before writing the pidfile:\n%s", l.res)
		case <-ctx.Done():
			t.Fatalf("no pidfile: %v\nstdout: %s\nstderr: %s", ctx.Err(), l.stdout.String(), l.stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// wait waits for snapctl to exit and returns how.
func (l *lazyRun) wait(t testing.TB, ctx context.Context) cmdResult {
	t.Helper()
	select {
	case <-l.done:
		return l.res
	case <-ctx.Done():
		t.Fatalf("snapctl still running: %v\nstdout: %s\nstderr: %s", ctx.Err(), l.stdout.String(), l.stderr.String())
	}
	return cmdResult{}
}

// mustFinish waits for snapctl to exit 0 and checks that it left the
// process detached, and no helper or private mount behind.
func (l *lazyRun) mustFinish(t testing.TB, ctx context.Context, pid int) cmdResult {
	t.Helper()
	r := l.wait(t, ctx)
	if r.Code != 0 {
		t.Fatalf("lazy restore failed:\n%s", r)
	}
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if !strings.Contains(r.Stdout, "all memory in after") {
		t.Errorf("no summary of the lazy phase:\n%s", r)
	}
	if tp := lazyTracerOf(t, pid); tp != 0 {
		t.Errorf("pid %d still traced by %d after snapctl exited", pid, tp)
	}
	l.lazyNothingLeft(t, l.dir)
	return r
}

// lazyTracerOf returns the TracerPid of pid (0: not traced; -1: gone).
func lazyTracerOf(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}

// lazyTracedBy reports whether pid is traced by a thread of process tracer.
func lazyTracedBy(t testing.TB, pid, tracer int) bool {
	t.Helper()
	tp := lazyTracerOf(t, pid)
	if tp <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tp))
	return err == nil && strings.Contains(string(b), fmt.Sprintf("\nTgid:\t%d\n", tracer))
}

// lazyNothingLeft checks that snapctl's helpers (the keeper, which holds
// the userfaultfds, and the private mount's server) did not outlive it,
// and that nothing of the snapshot is mounted in our mount namespace (the
// private mount lives in a namespace of its helper's).
func (l *lazyRun) lazyNothingLeft(t testing.TB, dir string) {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(dir, "s3://") { // a mount's source is the address
		abs = dir
	}
	var helpers [][]byte
	for _, arg0 := range []string{"lazyfs-uffd-keeper", "lazyfs-private-mount"} {
		helpers = append(helpers, []byte(fmt.Sprintf("%s\x00%d\x00", arg0, l.cmd.Process.Pid)))
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		var mounted []string
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for line := range strings.Lines(string(b)) {
			if _, rest, ok := strings.Cut(line, " - "); ok {
				if f := strings.Fields(rest); len(f) > 1 && f[1] == abs && strings.Contains(line, "lazyfs-private-") {
					mounted = append(mounted, line)
				}
			}
		}
		var left []int
		for _, h := range helpers {
			left = append(left, lazyProcs(t, h)...)
		}
		if len(mounted) == 0 && len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			if len(mounted) > 0 {
				t.Errorf("the private mount of snapctl is visible or left behind: %q", mounted)
			}
			if len(left) > 0 {
				t.Errorf("snapctl's helpers outlived it: %v", left)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lazyProcs lists the processes whose command line starts with prefix.
func lazyProcs(t testing.TB, prefix []byte) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.HasPrefix(b, prefix) {
			out = append(out, pid)
		}
	}
	return out
}

// lazyMountLazyfs mounts dir with `lazyfs --background` on a fresh directory
// and unmounts it at cleanup.
func lazyMountLazyfs(t testing.TB, dir string, flags ...string) string {
	t.Helper()
	bin := buildTool(t, "lazyfs")
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	r := runTool(t, bin, commandTimeout, append(append([]string{"--background"}, flags...), dir, mnt)...)
	if r.Code != 0 {
		t.Fatalf("%s", r)
	}
	t.Cleanup(func() {
		if r := runTool(t, bin, commandTimeout, "-u", mnt); r.Code != 0 {
			t.Errorf("%s", r)
		}
		if mountedAt(t, mnt) {
			t.Errorf("%s still mounted after lazyfs -u", mnt)
		}
	})
	return mnt
}

// lazyCounterDumped starts a counter fixture of size, dumps it (which kills
// it) and returns it, its snapshot and the counter value in the image.
func lazyCounterDumped(t *testing.T, ctx context.Context, size string) (*fixture.Proc, string, uint64) {
	t.Helper()
	p := fixture.Start(t, "counter", size)
	dir, si := dumpForRestore(t, ctx, p)
	return p, dir, binary.LittleEndian.Uint64(si.read(t, p.Ready.MustUint(t, "counter_addr"), 8))
}

// lazyCheckCounter checks that a restored counter answers with the checksum
// of its whole mapping as it was, and carries on counting from the dump.
func lazyCheckCounter(t *testing.T, ctx context.Context, p *fixture.Proc, atDump uint64) {
	t.Helper()
	l := request(t, ctx, p, syscall.SIGUSR1, "report")
	if got, want := l.MustUint(t, "checksum"), p.Ready.MustUint(t, "checksum"); got != want {
		t.Errorf("restored checksum %#x, want %#x", got, want)
	}
	if c := l.MustUint(t, "counter"); c < atDump || c > atDump+1_000_000 {
		t.Errorf("restored counter %d, dumped at %d", c, atDump)
	}
	// During the lazy phase the marker's page may not be in yet: the
	// kernel does not wait on a userfaultfd for another process's access
	// to /proc/PID/mem, which then fails with EIO. The pager places every
	// page in the end: ask again until it is in, for a bounded time.
	marker, _ := p.Ready.Value("marker")
	var m []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m, err = p.ReadMemory(p.Ready.MustUint(t, "marker_addr"), len(marker))
		if !errors.Is(err, syscall.EIO) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	if err != nil || string(m) != marker {
		t.Errorf("marker on the restored heap %q (%v), want %q", m, err, marker)
	}
}

// lazyRestoreCounter restores the counter fixture p lazily from dir with
// startLazy's flags, checks it while its memory comes in and once all of
// it is in, and kills it.
func lazyRestoreCounter(t *testing.T, ctx context.Context, p *fixture.Proc, dir string, atDump uint64, flags ...string) {
	t.Helper()
	l := startLazy(t, dir, flags...)
	if pid := l.waitRunning(t, ctx); pid != p.PID {
		t.Fatalf("pidfile names %d, want %d", pid, p.PID)
	}
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	lazyCheckCounter(t, ctx, p, atDump)
	l.mustFinish(t, ctx, p.PID)
	lazyCheckCounter(t, ctx, p, atDump)
	lazyKill(t, ctx, p)
}

// lazyKill kills the adopted process and waits until its pid is free.
func lazyKill(t *testing.T, ctx context.Context, p *fixture.Proc) {
	t.Helper()
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if !pidGone(ctx, p.PID) {
		t.Fatalf("pid %d still taken", p.PID)
	}
}

// TestLazyCounter restores a 256 MiB counter lazily from each source:
// through a private mount, from the snapshot files, and twice in a row
// through one running lazyfs mount.
func TestLazyCounter(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p, dir, atDump := lazyCounterDumped(t, ctx, "256M")
	mnt := lazyMountLazyfs(t, dir)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"private-mount", nil},
		{"direct", []string{"--source", "direct"}},
		{"lazyfs-mount", []string{"--mount", mnt}},
		{"lazyfs-mount-again", []string{"--mount", mnt}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lazyRestoreCounter(t, ctx, p, dir, atDump, tc.flags...)
		})
	}
	if t.Failed() {
		return
	}
	// The mount served both restores from its cache.
	if st, err := os.ReadFile(filepath.Join(mnt, strconv.Itoa(p.PID), "stats")); err == nil {
		t.Logf("lazyfs stats after two restores:\n%s", st)
	}
}

// TestLazySignalsPassThrough checks that while pages are missing the
// process runs traced by snapctl, gets its signals promptly, and that the
// pidfile is written as soon as it runs.
func TestLazySignalsPassThrough(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx := testContext(t)
	p, dir, atDump := lazyCounterDumped(t, ctx, "16M")
	const delay = 3 * time.Second
	l := startLazy(t, dir, "--source", "direct", "--prefetch-delay", delay.String())
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	if !l.running() {
		t.Fatalf("snapctl exited before the prefetch delay:\n%s", l.res)
	}
	if !lazyTracedBy(t, p.PID, l.cmd.Process.Pid) {
		t.Errorf("during the lazy phase pid %d is not traced by snapctl (%d): TracerPid %d", p.PID, l.cmd.Process.Pid, lazyTracerOf(t, p.PID))
	}
	// The counter's handler counts the signal; its main loop answers.
	sent := time.Now()
	l1 := request(t, ctx, p, syscall.SIGUSR1, "report")
	took := time.Since(sent)
	if took >= delay || !l.running() {
		t.Errorf("the answer to a signal sent during the lazy phase came after %v (snapctl running: %v)", took, l.running())
	}
	if got, want := l1.MustUint(t, "checksum"), p.Ready.MustUint(t, "checksum"); got != want {
		t.Errorf("checksum during the lazy phase %#x, want %#x", got, want)
	}
	t.Logf("signal answered during the lazy phase in %v", took)
	l.mustFinish(t, ctx, p.PID)
	lazyCheckCounter(t, ctx, p, atDump)
}

// TestLazyOps follows the memory operations of the lazyops fixture during
// the lazy phase: MADV_DONTNEED of memory not served yet must read as
// zeros (not snapshot data), munmap and mremap must keep contents right,
// and a child forked meanwhile must see its memory.
func TestLazyOps(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.Start(t, "lazyops", "16M")
	aAddr, aSize := p.Ready.MustUint(t, "a_addr"), p.Ready.MustUint(t, "a_size")
	bAddr, slice := p.Ready.MustUint(t, "b_addr"), p.Ready.MustUint(t, "slice")
	dir, si := dumpForRestore(t, ctx, p)
	a := si.read(t, aAddr, aSize)
	b := si.read(t, bAddr, 16*slice)

	l := startLazy(t, dir, "--prefetch-delay", "4s")
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	// DONTNEED of A's first MiB, not served yet (nothing touched it and
	// the prefetcher waits): zeros from now on.
	d := request(t, ctx, p, syscall.SIGUSR2, "dontneed")
	wantField(t, d, "zero", "1")
	a0 := bytes.Clone(a)
	clear(a0[:slice])
	if got, want := d.MustUint(t, "a_checksum"), fixture.Checksum(a0); got != want {
		t.Errorf("A after DONTNEED of its first MiB: checksum %#x, want %#x (snapshot data where zeros belong?)", got, want)
	}
	// munmap of slice 15 (unserved), mremap of slice 0.
	u := request(t, ctx, p, syscall.SIGHUP, "munmap")
	wantField(t, u, "slice", "15")
	live := func(from, to int) uint64 {
		h := fixture.NewHash()
		for i := from; i < to; i++ {
			h.Write(b[uint64(i)*slice : uint64(i+1)*slice])
		}
		return h.Sum64()
	}
	if got, want := u.MustUint(t, "b_checksum"), live(0, 15); got != want {
		t.Errorf("B after munmap: checksum %#x, want %#x", got, want)
	}
	m := request(t, ctx, p, syscall.SIGWINCH, "mremap")
	wantField(t, m, "ok", "1")
	if got, want := m.MustUint(t, "b_checksum"), live(0, 15); got != want {
		t.Errorf("B after mremap: checksum %#x, want %#x", got, want)
	}
	// A second DONTNEED, of A's second MiB, then a fork: the child
	// computes A and B from its own memory.
	d2 := request(t, ctx, p, syscall.SIGUSR2, "dontneed")
	wantField(t, d2, "zero", "1")
	clear(a0[slice : 2*slice])
	f := request(t, ctx, p, syscall.SIGURG, "fork")
	wantField(t, f, "match", "1")
	wantField(t, f, "status", "0")
	if got, want := f.MustUint(t, "child_a"), fixture.Checksum(a0); got != want {
		t.Errorf("forked child's A: checksum %#x, want %#x", got, want)
	}
	if got, want := f.MustUint(t, "child_b"), live(0, 15); got != want {
		t.Errorf("forked child's B: checksum %#x, want %#x", got, want)
	}
	if !l.running() {
		t.Errorf("snapctl finished before the operations: they did not run during the lazy phase")
	}
	l.mustFinish(t, ctx, p.PID)
	r := request(t, ctx, p, syscall.SIGUSR1, "report")
	if got, want := r.MustUint(t, "a_checksum"), fixture.Checksum(a0); got != want {
		t.Errorf("A after the lazy phase: checksum %#x, want %#x", got, want)
	}
	if got, want := r.MustUint(t, "b_checksum"), live(0, 15); got != want {
		t.Errorf("B after the lazy phase: checksum %#x, want %#x", got, want)
	}
	wantField(t, r, "b_live", "15")
	wantField(t, r, "b_moved", "1")
}

// TestLazyRedis restores redis-server with 200k keys lazily: GETs answer
// right at once, and a BGSAVE during the lazy phase (a fork) writes an
// RDB that a fresh redis-server loads with every key.
func TestLazyRedis(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.StartRedis(t)
	const keys = 200_000
	if err := redisLoad(ctx, p.Port, keys); err != nil {
		t.Fatal(err)
	}
	rdbDir, err := fixture.Redis(ctx, p.Port, "CONFIG", "GET", "dir")
	if err != nil {
		t.Fatal(err)
	}
	rdbDir = strings.TrimPrefix(strings.TrimSpace(rdbDir), "dir\n")
	dir, _ := dumpForRestore(t, ctx, p)

	l := startLazy(t, dir, "--prefetch-delay", "3s")
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	if err := redisSample(ctx, p.Port, keys, 97); err != nil {
		t.Fatalf("GET right after the lazy restore: %v", err)
	}
	if r, err := fixture.Redis(ctx, p.Port, "BGSAVE"); err != nil || !strings.Contains(r, "started") {
		t.Fatalf("BGSAVE: %q, %v", r, err)
	}
	if !l.running() {
		t.Errorf("snapctl finished before BGSAVE: the fork was not during the lazy phase")
	}
	ok, last := srvEventually(ctx, 60*time.Second, func() (bool, string) {
		info, err := redisInfo(ctx, p.Port, "persistence")
		if err != nil {
			return false, err.Error()
		}
		return info["rdb_bgsave_in_progress"] == "0" && info["rdb_last_bgsave_status"] == "ok" && info["rdb_changes_since_last_save"] == "0",
			fmt.Sprint(info)
	})
	if !ok {
		t.Fatalf("BGSAVE did not finish well: %s", last)
	}
	l.mustFinish(t, ctx, p.PID)
	if err := redisSample(ctx, p.Port, keys, 97); err != nil {
		t.Errorf("GET after the lazy phase: %v", err)
	}
	port := lazyRedisOn(t, ctx, rdbDir)
	if n, err := fixture.Redis(ctx, port, "DBSIZE"); err != nil || n != strconv.Itoa(keys) {
		t.Fatalf("fresh redis-server loaded DBSIZE %q (%v) from the BGSAVE, want %d", n, err, keys)
	}
	if err := redisSample(ctx, port, keys, 1); err != nil {
		t.Errorf("fresh redis-server from the BGSAVE: %v", err)
	}
}

// lazyRedisOn starts a redis-server that loads dir/dump.rdb and returns
// its port; it is killed at cleanup.
func lazyRedisOn(t *testing.T, ctx context.Context, dir string) int {
	t.Helper()
	bin := testutil.RequireCommand(t, "redis-server")
	port, err := fixture.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--dbfilename", "dump.rdb",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "")
	var out testutil.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ok, last := srvEventually(ctx, 30*time.Second, func() (bool, string) {
		r, err := fixture.Redis(ctx, port, "PING")
		if err != nil {
			return false, err.Error()
		}
		// PING answers LOADING while the RDB loads.
		return r == "PONG", r
	})
	if !ok {
		t.Fatalf("redis-server on %s: %s\n%s", dir, last, out.String())
	}
	return port
}

// TestLazyKillSnapctl kills snapctl with SIGKILL during the lazy phase of
// a 2 GiB server, after its first answer: the server must be gone within a
// second, and must never answer with memory missing meanwhile.
func TestLazyKillSnapctl(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "2G")
	port := int(p.Ready.MustInt(t, "port"))
	want := lazyAsk(t, ctx, port, "touch 1")
	dir, _ := dumpForRestore(t, ctx, p)

	l := startLazy(t, dir)
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	c, err := fixture.DialLines(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := c.Ask(ctx, "ping"); err != nil || r != "pong" {
		t.Fatalf("first request: %q, %v", r, err)
	}
	// Keep it busy reading its memory while snapctl dies.
	answers := make(chan string, 64)
	go func() {
		defer close(answers)
		for {
			r, err := c.Ask(ctx, "touch 1")
			if err != nil {
				return
			}
			answers <- r
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if !l.running() {
		t.Fatalf("the lazy phase of 2 GiB ended within 50 ms of the first answer: nothing to test\n%s", l.res)
	}
	l.cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	gctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	dead := lazyDead(gctx, p.PID)
	t.Logf("restored process dead %v after SIGKILL of snapctl", time.Since(killed))
	if !dead {
		t.Errorf("the restored process is still running 1s after snapctl was killed: %s", readProcFile(t, "%d/stat", p.PID))
	}
	for r := range answers {
		if lazyChecksumOf(r) != lazyChecksumOf(want) {
			t.Errorf("the server answered with memory missing: %q, want %q", r, want)
		}
	}
	l.wait(t, ctx)
	l.lazyNothingLeft(t, dir)
}

// lazyDead waits until pid has exited (a zombie its parent has not reaped
// yet counts as dead), and reports whether it did.
func lazyDead(ctx context.Context, pid int) bool {
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if s := string(b); strings.Contains(s[strings.LastIndexByte(s, ')')+1:], " Z ") {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lazyAsk asks a modelserver one request.
func lazyAsk(t *testing.T, ctx context.Context, port int, req string) string {
	t.Helper()
	c, err := fixture.DialLines(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Ask(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// lazyChecksumOf returns the checksum= field of an answer.
func lazyChecksumOf(answer string) string {
	v, _ := fixture.ParseLine(answer).Value("checksum")
	return v
}

// TestLazyCorruptBlock flips a byte in a block of lazily served memory:
// the restore must fail naming the block, and the process must be killed
// without ever running on the wrong bytes.
func TestLazyCorruptBlock(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	for _, source := range []string{"mount", "direct"} {
		t.Run(source, func(t *testing.T) {
			p := fixture.Start(t, "counter", "16M")
			dir, si := dumpForRestore(t, ctx, p)
			// A raw block in the random quarter of the mapping.
			lo := p.Ready.MustUint(t, "addr") + p.Ready.MustUint(t, "random_off")
			var bad image.Block
			for b := range si.Pages.Blocks() {
				if b.Addr >= lo && b.Kind == codec.Raw {
					bad = b
					break
				}
			}
			if bad.Len == 0 {
				t.Fatal("no raw block in the random part")
			}
			lazyFlipByte(t, filepath.Join(dir, fmt.Sprintf("pages-%d.img", p.PID)), int64(bad.Off)+100)

			l := startLazy(t, dir, "--source", source)
			l.waitRunning(t, ctx)
			r := l.wait(t, ctx)
			if r.Code != exitBadSnapshot {
				t.Fatalf("lazy restore of a corrupt block: exit %d, want %d\n%s", r.Code, exitBadSnapshot, r)
			}
			t.Logf("%s", strings.TrimSpace(r.Stderr))
			for _, want := range []string{fmt.Sprintf("block %d at %#x", bad.Index, bad.Addr)} {
				if !strings.Contains(r.Stderr, want) {
					t.Errorf("the error does not name %q:\n%s", want, r.Stderr)
				}
			}
			if !pidGone(ctx, p.PID) {
				t.Errorf("pid %d still there after the failed lazy restore", p.PID)
			}
			lines, err := p.Lines()
			if err != nil {
				t.Fatal(err)
			}
			for _, ln := range lines[1:] {
				if ln.Event == "report" {
					t.Errorf("the process ran on with a corrupt block: %q", ln.Text)
				}
			}
			l.lazyNothingLeft(t, dir)
		})
	}
}

// TestLazyMountGone takes the lazyfs mount away during the lazy phase:
// the next fault cannot be served, so the process must be killed, with an
// error that says the page source failed (the snapshot itself is fine).
func TestLazyMountGone(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p, dir, _ := lazyCounterDumped(t, ctx, "16M")
	bin := buildTool(t, "lazyfs")
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, bin, commandTimeout, "--background", dir, mnt); r.Code != 0 {
		t.Fatalf("%s", r)
	}
	t.Cleanup(func() { runTool(t, bin, commandTimeout, "-u", "--force", mnt) })
	l := startLazy(t, dir, "--mount", mnt, "--prefetch-delay", "1m")
	l.waitRunning(t, ctx)
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	if r := runTool(t, bin, commandTimeout, "-u", "--force", mnt); r.Code != 0 {
		t.Fatalf("%s", r)
	}
	// The report reads all memory: the first missing page faults.
	p.Signal(syscall.SIGUSR1)
	r := l.wait(t, ctx)
	t.Logf("%s", strings.TrimSpace(r.Stderr))
	// Not exitBadSnapshot: the snapshot is fine. The status is the generic
	// one, so the message is what blames the source.
	if r.Code != exitFailure || !strings.Contains(r.Stderr, "the page source failed") {
		t.Errorf("lazy restore whose mount went away: exit %d, want %d and an error blaming the page source\n%s", r.Code, exitFailure, r)
	}
	if !lazyDead(ctx, p.PID) {
		t.Errorf("pid %d still running after its page source failed", p.PID)
	}
	lines, err := p.Lines()
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range lines[1:] {
		if ln.Event == "report" {
			t.Errorf("the process ran on without its memory: %q", ln.Text)
		}
	}
	l.lazyNothingLeft(t, dir)
}

// lazyFlipByte inverts the byte at off of the file at path.
func lazyFlipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
