package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// testTimeout bounds each dump test.
const testTimeout = 2 * time.Minute

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// request and wantField are the e2e tests' short names for the harness's
// Proc.MustRequest and Line.CheckField.
func request(t *testing.T, ctx context.Context, p *fixture.Proc, sig syscall.Signal, event string) fixture.Line {
	t.Helper()
	return p.MustRequest(t, ctx, sig, event)
}

func wantField(t *testing.T, l fixture.Line, key, want string) {
	t.Helper()
	l.CheckField(t, key, want)
}

// dumpStopped stops p, records it, dumps it with --leave-running (plus
// flags), checks that it is still stopped and that the image matches it
// exactly (checkImage), verifies the snapshot, and resumes p.
func dumpStopped(t *testing.T, ctx context.Context, p *fixture.Proc, flags ...string) *snapImage {
	t.Helper()
	si, _ := dumpRecorded(t, ctx, p, flags...)
	return si
}

// dumpRecorded is dumpStopped, and also returns the record of the process
// taken while it was stopped.
func dumpRecorded(t *testing.T, ctx context.Context, p *fixture.Proc, flags ...string) (*snapImage, *memRecord) {
	t.Helper()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rec := takeMemory(t, p.PID)
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, p.PID, dir, append([]string{"--leave-running"}, flags...)...)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if !allStopped(t, p.PID) {
		t.Errorf("a SIGSTOPped process is no longer stopped after dump --leave-running")
	}
	si := openImage(t, dir, p.PID)
	c := checkImage(t, si, rec)
	t.Logf("image = memory: %d runs, %d bytes; shared objects %d bytes", c.Runs, c.RunBytes, c.ShmemBytes)
	verifyDir(t, dir)
	if err := p.Cont(); err != nil {
		t.Fatal(err)
	}
	return si, rec
}

// answersNormally checks that p runs untraced and unstopped and answers a
// request.
func answersNormally(t *testing.T, ctx context.Context, p *fixture.Proc, sig syscall.Signal, event string) fixture.Line {
	t.Helper()
	if !p.Alive() {
		t.Fatalf("%s (%d) is gone", p.Name, p.PID)
	}
	st := procStatus(t, p.PID)
	if st["TracerPid"] != "0" {
		t.Errorf("%s (%d) still traced by %s", p.Name, p.PID, st["TracerPid"])
	}
	if strings.HasPrefix(st["State"], "T") || strings.HasPrefix(st["State"], "t") {
		t.Errorf("%s (%d) left stopped: %s", p.Name, p.PID, st["State"])
	}
	return request(t, ctx, p, sig, event)
}

// procStatus returns the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func TestDumpCounter(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "16M")
	addr, size := p.Ready.MustUint(t, "addr"), p.Ready.MustUint(t, "size")
	sum := p.Ready.MustUint(t, "checksum")

	si := dumpStopped(t, ctx, p)

	v := si.vma(addr)
	if v == nil || v.Start != addr || v.End != addr+size || v.Kind != image.VMAAnon || !v.Dumped {
		t.Errorf("counter mapping %#x+%d in the image: %+v", addr, size, v)
	}
	if got := fixture.Checksum(si.read(t, addr, size)); got != sum {
		t.Errorf("image checksum of the mapping %#x, fixture says %#x", got, sum)
	}
	marker, _ := p.Ready.Value("marker")
	if got := string(si.read(t, p.Ready.MustUint(t, "marker_addr"), uint64(len(marker)))); got != marker {
		t.Errorf("marker in the image %q, want %q", got, marker)
	}
	if len(si.State.Threads) != 1 || si.State.Threads[0].TID != p.PID {
		t.Errorf("threads %+v, want one, %d", si.State.Threads, p.PID)
	}
	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	if got := l.MustUint(t, "checksum"); got != sum {
		t.Errorf("after the dump the fixture reports checksum %#x, want %#x", got, sum)
	}
}

func TestDumpKillsProcess(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "8M")
	addr, size := p.Ready.MustUint(t, "addr"), p.Ready.MustUint(t, "size")
	dir := filepath.Join(t.TempDir(), "snap")

	r := dumpPID(t, p.PID, dir) // running, no --leave-running
	if !strings.Contains(r.Stdout, "dumped pid "+strconv.Itoa(p.PID)) {
		t.Errorf("dump output: %q", r.Stdout)
	}
	st, err := p.WaitExit(ctx)
	if err != nil {
		t.Fatalf("the process outlived its dump: %v", err)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the dumped process ended with %v, want SIGKILL", st)
	}
	verifyDir(t, dir)
	si := openImage(t, dir, p.PID)
	if got, want := fixture.Checksum(si.read(t, addr, size)), p.Ready.MustUint(t, "checksum"); got != want {
		t.Errorf("image checksum of the mapping %#x, fixture says %#x", got, want)
	}
}

func TestDumpThreads(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "threads")
	before := request(t, ctx, p, syscall.SIGUSR1, "report")
	// Let the main thread, which has just answered, go back to sigsuspend.
	time.Sleep(50 * time.Millisecond)

	si := dumpStopped(t, ctx, p)

	want := []int{p.PID}
	tids, _ := p.Ready.Value("tids")
	for _, s := range strings.Split(tids, ",") {
		tid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("ready tids=%q", tids)
		}
		want = append(want, tid)
	}
	slices.Sort(want)
	var got []int
	for _, th := range si.State.Threads {
		got = append(got, th.TID)
		if th.Regs.Rip == 0 || th.Regs.Rsp == 0 || len(th.XState) == 0 && len(th.FPRegs) == 0 {
			t.Errorf("thread %d: empty registers or FPU state", th.TID)
		}
		if th.Regs.FsBase == 0 {
			t.Errorf("thread %d: no TLS base", th.TID)
		}
		if th.TID == p.PID && th.Syscall != unix.SYS_RT_SIGSUSPEND {
			t.Errorf("main thread frozen in system call %d, want rt_sigsuspend (%d)", th.Syscall, unix.SYS_RT_SIGSUSPEND)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("image threads %v, fixture threads %v", got, want)
	}

	after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	for i := 0; after.MustUint(t, "t0") <= before.MustUint(t, "t0")+2 && i < 100; i++ {
		time.Sleep(20 * time.Millisecond)
		after = request(t, ctx, p, syscall.SIGUSR1, "report")
	}
	wantField(t, after, "ring_ok", "1")
	wantField(t, after, "state_ok", "1")
	if after.MustUint(t, "t0") <= before.MustUint(t, "t0")+2 {
		t.Errorf("workers did not run on after the dump: %q then %q", before.Text, after.Text)
	}
}

func TestDumpMappings(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "mappings")
	rep := request(t, ctx, p, syscall.SIGUSR1, "report")

	si := dumpStopped(t, ctx, p)

	region := func(name string) (uint64, uint64) {
		return p.Ready.MustUint(t, name+"_addr"), p.Ready.MustUint(t, name+"_len")
	}
	dir, _ := p.Ready.Value("dir")
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(p.Dir, dir)
	}
	cases := []struct {
		name string
		kind string
	}{
		{"private", image.VMAFile},
		{"shared_ro", image.VMAFileShared},
		{"memfd", image.VMAShmem},
		{"shared_anon", image.VMAShmem},
		{"madv", image.VMAAnon},
		{"mlock", image.VMAAnon},
	}
	for _, c := range cases {
		addr, n := region(c.name)
		v := si.vma(addr)
		if v == nil || v.Kind != c.kind {
			t.Errorf("%s at %#x: VMA %+v, want kind %s", c.name, addr, v, c.kind)
			continue
		}
		want := rep.MustUint(t, c.name)
		var got uint64
		switch c.name {
		case "private":
			// Clean pages come from the file, the written ones from the
			// image: every other page, and only those.
			if v.File == nil || v.File.Path != filepath.Join(dir, "private.dat") {
				t.Errorf("private mapping file %+v", v.File)
			}
			file, err := os.ReadFile(filepath.Join(dir, "private.dat"))
			if err != nil {
				t.Fatal(err)
			}
			for pg := uint64(0); pg < n/pageSize; pg++ {
				a := addr + pg*pageSize
				_, dumped := si.Pages.BlockAt(a)
				if dumped != (pg%2 == 0) {
					t.Errorf("private page %d dumped=%v; only the written (even) pages should be", pg, dumped)
				}
				if dumped {
					copy(file[pg*pageSize:], si.read(t, a, pageSize))
				}
			}
			got = fixture.Checksum(file[:n])
		case "shared_ro":
			if v.Dumped {
				t.Errorf("shared file mapping dumped")
			}
			continue
		case "memfd", "shared_anon":
			if v.Shmem == nil || v.Shmem.Size != n {
				t.Errorf("%s: shmem %+v, want an object of %d bytes", c.name, v.Shmem, n)
			}
			got = fixture.Checksum(si.read(t, addr, n))
		default:
			got = fixture.Checksum(si.read(t, addr, n))
		}
		if got != want {
			t.Errorf("%s: image checksum %#x, fixture says %#x", c.name, got, want)
		}
	}
	memfd := p.Ready.MustInt(t, "memfd_fd")
	var found bool
	for _, fd := range si.State.FDs {
		if fd.FD == int(memfd) {
			found = true
			if fd.Kind != image.FDMemfd {
				t.Errorf("fd %d kind %q, want memfd", fd.FD, fd.Kind)
			}
		}
	}
	if !found {
		t.Errorf("memfd fd %d not in the image", memfd)
	}

	after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	for _, c := range cases {
		if a, b := after.MustUint(t, c.name), rep.MustUint(t, c.name); a != b {
			t.Errorf("%s changed across the dump: %#x, was %#x", c.name, a, b)
		}
	}
	wantField(t, after, "memfd_read_ok", "1")
}

func TestDumpSignals(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "signals")
	rt1 := int(p.Ready.MustInt(t, "rt1_signo"))

	si := dumpStopped(t, ctx, p)

	bit := func(sig int) uint64 { return 1 << (sig - 1) }
	// sa_flags bits of x86-64 Linux (asm-generic/signal-defs.h).
	const (
		saSiginfo   = 0x4
		saOnstack   = 0x08000000
		saRestart   = 0x10000000
		saNodefer   = 0x40000000
		saResethand = 0x80000000
		relevant    = saSiginfo | saRestart | saOnstack | saNodefer | saResethand
	)
	want := map[int]struct {
		flags uint64
		mask  uint64
	}{
		int(unix.SIGUSR1): {saSiginfo | saRestart, bit(int(unix.SIGUSR2))},
		int(unix.SIGUSR2): {saSiginfo | saOnstack, bit(int(unix.SIGHUP))},
		int(unix.SIGHUP):  {saRestart | saNodefer, 0},
		rt1:               {saSiginfo | saRestart, bit(int(unix.SIGUSR1)) | bit(int(unix.SIGHUP))},
	}
	acts := map[int]image.SigAction{}
	for _, a := range si.State.SigActions {
		acts[a.Signal] = a
	}
	for sig, w := range want {
		a, ok := acts[sig]
		switch {
		case !ok:
			t.Errorf("signal %d: no action in the image", sig)
		case a.Handler <= 1:
			t.Errorf("signal %d: handler %#x, want the fixture's", sig, a.Handler)
		case a.Flags&relevant != w.flags || a.Mask != w.mask:
			t.Errorf("signal %d: flags %#x mask %#x, want flags %#x mask %#x", sig, a.Flags&relevant, a.Mask, w.flags, w.mask)
		}
	}
	if a := acts[int(unix.SIGPIPE)]; a.Handler != 1 {
		t.Errorf("SIGPIPE handler %#x, want SIG_IGN", a.Handler)
	}
	if a, ok := acts[int(unix.SIGTERM)]; ok && a.Handler != 0 {
		t.Errorf("SIGTERM handler %#x, want SIG_DFL", a.Handler)
	}
	th := si.State.Threads[0]
	if th.SigMask != bit(int(unix.SIGWINCH)) {
		t.Errorf("signal mask %#x, want SIGWINCH only (%#x)", th.SigMask, bit(int(unix.SIGWINCH)))
	}
	if th.AltStack.SP != p.Ready.MustUint(t, "altstack") || th.AltStack.Size != p.Ready.MustUint(t, "altstack_size") {
		t.Errorf("altstack %+v, fixture says %s", th.AltStack, p.Ready.Text)
	}

	after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	for _, k := range []string{"actions_ok", "mask_ok", "altstack_ok"} {
		wantField(t, after, k, "1")
	}
	wantField(t, after, "stack_errors", "0")
}

func TestDumpGenerations(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	// The writer never sleeps: it rewrites the 64 MiB buffer several times
	// while one dump reads it, so only a frozen copy is one instant.
	p := fixture.Start(t, "generations", "64M", "256", "0")
	addr, size := p.Ready.MustUint(t, "addr"), p.Ready.MustUint(t, "size")
	// Wait until the whole buffer was written once.
	for request(t, ctx, p, syscall.SIGUSR1, "report").MustUint(t, "gen") == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	var last uint64
	for i := range 5 {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("snap%d", i))
		r := dumpPID(t, p.PID, dir, "--leave-running")
		t.Logf("dump %d: %s", i, strings.TrimSpace(r.Stdout))
		si := openImage(t, dir, p.PID)
		g, err := fixture.CheckGenerations(si.read(t, addr, size), pageSize)
		if err != nil {
			t.Fatalf("dump %d: %v", i, err)
		}
		t.Logf("dump %d: generations %d/%d, boundary at page %d, torn %d", i, g.New, g.Old, g.Boundary, g.Torn)
		if g.New <= last {
			t.Errorf("dump %d: generation %d, not after the previous dump's %d: did the writer run on?", i, g.New, last)
		}
		last = g.New
	}
	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	if l.MustUint(t, "gen") < last {
		t.Errorf("fixture at generation %d, the last dump saw %d", l.MustUint(t, "gen"), last)
	}
}

func TestDumpPython(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.StartPython(t, "pystate.py")
	sum, _ := p.Ready.Value("checksum")
	if want := fixture.PyStateChecksum(int(p.Ready.MustInt(t, "entries"))); sum != want {
		t.Fatalf("pystate checksum %s, want %s", sum, want)
	}

	dumpStopped(t, ctx, p)

	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	wantField(t, l, "checksum", sum)
}

func TestDumpRedis(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.StartRedis(t)
	const keys = 20000
	for lo := 0; lo < keys; lo += 2000 {
		args := []string{"MSET"}
		for i := lo; i < lo+2000; i++ {
			args = append(args, fmt.Sprintf("key-%06d", i), fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", i%200)))
		}
		if r, err := fixture.Redis(ctx, p.Port, args...); err != nil || r != "OK" {
			t.Fatalf("MSET: %q %v", r, err)
		}
	}
	// A client stays connected through the dump.
	c := dialRedis(t, ctx, p.Port)
	if r := c.do(t, "PING"); r != "+PONG" {
		t.Fatalf("PING: %q", r)
	}

	si := dumpStopped(t, ctx, p)

	states := map[string]int{}
	for _, fd := range si.State.FDs {
		if fd.Socket != nil {
			states[fd.Socket.State]++
		}
	}
	if states["listen"] != 1 || states["established"] != 1 {
		t.Errorf("redis sockets by state %v, want one listening and one established", states)
	}
	if r := c.do(t, "GET key-000042"); r != "$"+strconv.Itoa(len("value-42-")+42) {
		t.Errorf("GET after the dump on the client's connection: %q", r)
	}
	if r, err := fixture.Redis(ctx, p.Port, "DBSIZE"); err != nil || r != strconv.Itoa(keys) {
		t.Errorf("DBSIZE after the dump: %q %v", r, err)
	}
}

// redisConn is a client connection kept open across a dump.
type redisConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRedis(t *testing.T, ctx context.Context, port int) *redisConn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &redisConn{c: c, r: bufio.NewReader(c)}
}

// do sends an inline command and returns the first line of the reply.
func (rc *redisConn) do(t *testing.T, cmd string) string {
	t.Helper()
	rc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := rc.c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatalf("redis %s: %v", cmd, err)
	}
	line, err := rc.r.ReadString('\n')
	if err != nil {
		t.Fatalf("redis %s: %v", cmd, err)
	}
	if strings.HasPrefix(line, "$") {
		rc.r.ReadString('\n') // the bulk string itself
	}
	return strings.TrimRight(line, "\r\n")
}
