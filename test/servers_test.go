package e2e

// Dump and restore of real servers (redis-server, memcached, python3 -m
// http.server) and of a fixture holding one descriptor of each kind they
// use (fdkinds.c): pipes with buffered bytes, eventfd, epoll, timerfd,
// signalfd, TCP and UDP sockets over IPv4 and IPv6, unix sockets and
// socket pairs with queued data. A client connected at dump time never
// blocks the dump, and the restored server has no stale connection.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/sockdiag"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// srvDump dumps p (killing it, or leaving it running with flags) into a
// new directory and returns it.
func srvDump(t *testing.T, ctx context.Context, p *fixture.Proc, flags ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, p.PID, dir, flags...)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if !slices.Contains(flags, "--leave-running") {
		if _, err := p.WaitExit(ctx); err != nil {
			t.Fatalf("the process outlived its dump: %v", err)
		}
	}
	return dir
}

// srvRestore restores the snapshot in dir and makes p control the
// restored process (killed at cleanup).
func srvRestore(t *testing.T, p *fixture.Proc, dir string) {
	t.Helper()
	r := mustSnapctl(t, "restore", "-D", dir)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
}

// srvKill kills a restored server and checks that neither it nor its
// port is left behind.
func srvKill(t *testing.T, ctx context.Context, p *fixture.Proc) {
	t.Helper()
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Alive() {
		t.Fatalf("%s (%d) alive after SIGKILL", p.Name, p.PID)
	}
	if p.Port != 0 {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Port)))
		if err != nil {
			t.Fatalf("port %d still taken after the restored %s was killed: %v", p.Port, p.Name, err)
		}
		l.Close()
	}
}

// srvEventually polls cond every 20 ms until it holds or ctx ends, and
// returns its last message.
func srvEventually(ctx context.Context, within time.Duration, cond func() (bool, string)) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		ok, msg := cond()
		if ok {
			return true, msg
		}
		select {
		case <-ctx.Done():
			return false, msg
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// srvHold connects to 127.0.0.1:port, sends hello and keeps the
// connection open until the test ends: a client connected at dump time.
// It returns the connection's local address.
func srvHold(t *testing.T, ctx context.Context, port int, hello string, answer bool) string {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, hello); err != nil {
		t.Fatal(err)
	}
	if answer {
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatalf("held connection: %v", err)
		}
	}
	return c.LocalAddr().String()
}

// ---------------------------------------------------------------------
// fdkinds: every kind, compared from inside and from /proc.

// fdkindsVarying are report fields that change with time or with the
// restore by design, checked apart.
var fdkindsVarying = map[string]bool{"seq": true, "t15_val": true, "t19_val": true, "s22": true, "s41": true}

func TestRestoreFDKinds(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "fdkinds")
	before := request(t, ctx, p, syscall.SIGUSR1, "report")
	info0 := srvFDState(t, p.PID)
	diag0 := srvBacklogs(t, p)
	t0 := time.Now()

	// A dump that leaves the process running takes nothing from it: the
	// pipe and socket pairs still hold their bytes (all of them, in order:
	// the second dump, restored below, has them).
	srvDump(t, ctx, p, "--leave-running")
	srvCompareReports(t, "after dump --leave-running", before, request(t, ctx, p, syscall.SIGUSR1, "report"), time.Since(t0))
	dir := srvDump(t, ctx, p)
	st := srvImageFDs(t, dir, p.PID)

	srvRestore(t, p, dir)
	after := request(t, ctx, p, syscall.SIGUSR1, "report")
	srvCompareReports(t, "after restore", before, after, time.Since(t0))
	for _, k := range []string{"s22", "s41"} {
		if _, s, _ := strings.Cut(after.Fields[k], "/"); !strings.HasPrefix(s, "1/0/") {
			t.Errorf("established TCP %s after restore: %q, want a stream socket", k, s)
		}
	}
	info2 := srvFDState(t, p.PID)
	srvCompareFDInfo(t, info0, info2, st)
	if got := srvBacklogs(t, p); !equalMaps(got, diag0) {
		t.Errorf("listener backlogs after restore %v, before %v", got, diag0)
	}
	srvPoke(t, ctx, p)
	srvCheckDrained(t, "restored", p, request(t, ctx, p, syscall.SIGUSR2, "drained"))
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
}

func equalMaps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// srvCompareReports compares two reports field by field; the first
// timer's remaining time must have gone down by about the time elapsed.
func srvCompareReports(t *testing.T, when string, a, b fixture.Line, elapsed time.Duration) {
	t.Helper()
	for k, v := range a.Fields {
		if fdkindsVarying[k] {
			continue
		}
		if w, ok := b.Fields[k]; !ok || w != v {
			t.Errorf("%s: %s=%q, before the dump %q", when, k, w, v)
		}
	}
	for k := range b.Fields {
		if _, ok := a.Fields[k]; !ok {
			t.Errorf("%s: new field %s=%q", when, k, b.Fields[k])
		}
	}
	for _, k := range []string{"t15_val", "t19_val"} {
		v0, v1 := a.MustUint(t, k), b.MustUint(t, k)
		if v1 > v0 || v0-v1 > uint64(elapsed+2*time.Second) {
			t.Errorf("%s: timerfd %s has %v left, had %v %v earlier", when, k, time.Duration(v1), time.Duration(v0), elapsed)
		}
	}
}

// srvPoke sends a datagram to each bound socket and connects to each
// listener of the fdkinds fixture, as its drain request expects.
func srvPoke(t *testing.T, ctx context.Context, p *fixture.Proc) {
	t.Helper()
	send := func(network, addr, msg string) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			t.Fatalf("dial %s %s: %v", network, addr, err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatalf("send to %s %s: %v", network, addr, err)
		}
	}
	port := func(k string) string { return strconv.FormatUint(p.Ready.MustUint(t, k), 10) }
	send("udp4", net.JoinHostPort("127.0.0.1", port("udp4")), "udp4-ping")
	send("udp6", net.JoinHostPort("::1", port("udp6")), "udp6-ping")
	abstract, _ := p.Ready.Value("abstract")
	send("unixgram", "@"+abstract, "uxd-ping")
	for _, a := range [][2]string{
		{"tcp4", net.JoinHostPort("127.0.0.1", port("tcp4"))},
		{"tcp6", net.JoinHostPort("::1", port("tcp6"))},
		{"unix", filepath.Join(p.Dir, "fdk.sock")},
	} {
		var d net.Dialer
		c, err := d.DialContext(ctx, a[0], a[1])
		if err != nil {
			t.Fatalf("connect %s %s: %v", a[0], a[1], err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// srvCheckDrained checks what the restored fixture read from every
// descriptor.
func srvCheckDrained(t *testing.T, when string, p *fixture.Proc, d fixture.Line) {
	t.Helper()
	sum, _ := p.Ready.Value("pipe_sum")
	pipeLen, _ := p.Ready.Value("pipe_bytes")
	rt2, _ := p.Ready.Value("rt2")
	want := map[string]string{
		"pipe_len": pipeLen, "pipe_sum": sum, "efd12_reads": "5", "efd_shared": "1",
		"efd13": "0x1234567", "sfd_sig": rt2,
		"sp30": "hello-from-31", "sp31": "hi-from-30", "sp32_1": "m1", "sp32_2": "message-2",
		"udp4": "udp4-ping", "udp6": "udp6-ping", "uxd": "uxd-ping", "uxd18": "via-18/6",
		"acc20": "1", "acc21": "1", "acc25": "1", "est": "0", "est22": "0", // end of file: closed by the restore
	}
	for k, v := range want {
		if got := d.Fields[k]; got != v {
			t.Errorf("%s: %s=%q, want %q", when, k, got, v)
		}
	}
	if n := d.MustUint(t, "t16_ticks"); n == 0 {
		t.Errorf("%s: the periodic timerfd 16 has no expirations", when)
	}
	if n := d.MustUint(t, "t16_again"); n == 0 {
		t.Errorf("%s: the periodic timerfd 16 stopped: no expiration in 60 ms", when)
	}
	// Edge-triggered targets (the TCP listener, the UDP socket) fire once
	// for the data the test sent; level-triggered ones stay ready.
	ep1, ep2 := strings.Split(d.Fields["ep1"], ","), strings.Split(d.Fields["ep2"], ",")
	for _, e := range []string{"0x2000000000000020:0x1", "0x2300000000000023:0x1", "0x1000000000000010:0x1", "0x1100000000000011:0x4"} {
		if !slices.Contains(ep1, e) {
			t.Errorf("%s: first epoll_wait %v lacks %s", when, ep1, e)
		}
	}
	for _, e := range ep2 {
		if strings.HasPrefix(e, "0x20000") || strings.HasPrefix(e, "0x23000") {
			t.Errorf("%s: edge-triggered target fired twice: %v", when, ep2)
		}
	}
	if !slices.Contains(ep2, "0x1000000000000010:0x1") {
		t.Errorf("%s: level-triggered pipe not ready in the second epoll_wait %v", when, ep2)
	}
}

// srvFD is what /proc/PID/fdinfo says of one descriptor.
type srvFD struct {
	Target string
	Kind   proc.FDKind
	Flags  uint32
	Info   *proc.FDInfo
}

// srvFDState reads every descriptor of pid from /proc.
func srvFDState(t *testing.T, pid int) map[int]srvFD {
	t.Helper()
	fds, err := proc.ReadFDs(pid)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]srvFD{}
	for _, f := range fds {
		target := f.Target
		if f.Kind == proc.FDPipe || f.Kind == proc.FDSocket {
			target = f.Kind.String() // inode numbers differ
		}
		out[f.Num] = srvFD{Target: target, Kind: f.Kind, Flags: f.Info.Flags, Info: f.Info}
	}
	return out
}

// srvCompareFDInfo compares the descriptors of the process before the
// dump and after the restore as /proc shows them.
func srvCompareFDInfo(t *testing.T, a, b map[int]srvFD, st *image.Process) {
	t.Helper()
	for n, x := range a {
		y, ok := b[n]
		if !ok {
			t.Errorf("fd %d (%s) missing after restore", n, x.Target)
			continue
		}
		if x.Target != y.Target || x.Flags != y.Flags {
			t.Errorf("fd %d: %s flags %#o after restore, was %s flags %#o", n, y.Target, y.Flags, x.Target, x.Flags)
		}
		xi, yi := x.Info, y.Info
		switch x.Kind {
		case proc.FDEventfd:
			if xi.Eventfd == nil || yi.Eventfd == nil || xi.Eventfd.Count != yi.Eventfd.Count || xi.Eventfd.Semaphore != yi.Eventfd.Semaphore {
				t.Errorf("fd %d: eventfd %+v after restore, was %+v", n, yi.Eventfd, xi.Eventfd)
			}
		case proc.FDEpoll:
			key := func(ts []proc.EpollTarget) []string {
				var s []string
				for _, e := range ts {
					s = append(s, fmt.Sprintf("%d:%#x:%#x", e.TFD, e.Events, e.Data))
				}
				slices.Sort(s)
				return s
			}
			if !slices.Equal(key(xi.Epoll), key(yi.Epoll)) {
				t.Errorf("fd %d: epoll watches %v after restore, was %v", n, key(yi.Epoll), key(xi.Epoll))
			}
		case proc.FDTimerfd:
			if xi.Timerfd == nil || yi.Timerfd == nil || xi.Timerfd.ClockID != yi.Timerfd.ClockID ||
				xi.Timerfd.Interval != yi.Timerfd.Interval || xi.Timerfd.SettimeFlags != yi.Timerfd.SettimeFlags {
				t.Errorf("fd %d: timerfd %+v after restore, was %+v", n, yi.Timerfd, xi.Timerfd)
			}
		case proc.FDSignalfd:
			if xi.Signalfd == nil || yi.Signalfd == nil || xi.Signalfd.Mask != yi.Signalfd.Mask {
				t.Errorf("fd %d: signalfd %+v after restore, was %+v", n, yi.Signalfd, xi.Signalfd)
			}
		}
	}
	for n, y := range b {
		if _, ok := a[n]; !ok {
			t.Errorf("fd %d (%s) appeared after restore", n, y.Target)
		}
	}
	// The snapshot holds what it saw: dumped ticks of the fast timer, the
	// pipe's bytes, the dup, the queued messages.
	for _, f := range st.FDs {
		switch {
		case f.FD == 16 && (f.Timerfd == nil || f.Timerfd.Ticks == 0):
			t.Errorf("snapshot: timerfd 16 %+v without pending ticks", f.Timerfd)
		case f.FD == 10 && (f.Pipe == nil || len(f.Pipe.Buffered) != 150000):
			t.Errorf("snapshot: pipe read end without its 150000 bytes")
		case f.FD == 40 && (f.SameAs == nil || *f.SameAs != 12):
			t.Errorf("snapshot: fd 40 same_as %v, want 12", f.SameAs)
		case f.FD == 32 && (f.Socket == nil || len(f.Socket.Queued) != 2):
			t.Errorf("snapshot: socket 32 without its 2 queued messages")
		}
	}
	if ticks := b[16].Info.Timerfd; ticks == nil || ticks.Ticks == 0 && ticks.Value == (proc.Timespec{}) {
		t.Errorf("timerfd 16 after restore neither armed nor expired: %+v", ticks)
	}
}

// srvBacklogs returns the backlog of each listener of the fixture, from
// sock_diag.
func srvBacklogs(t *testing.T, p *fixture.Proc) map[string]int {
	t.Helper()
	out := map[string]int{}
	ports := map[uint16]string{uint16(p.Ready.MustUint(t, "tcp4")): "tcp4", uint16(p.Ready.MustUint(t, "tcp6")): "tcp6"}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		ds, err := sockdiag.QueryInet(p.PID, fam, unix.IPPROTO_TCP)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if name, ok := ports[d.Local.Port()]; ok && d.State == sockdiag.TCPListen {
				out[name] = int(d.WQueue)
			}
		}
	}
	us, err := sockdiag.QueryUnix(p.PID)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if strings.HasSuffix(u.Path, "/fdk.sock") || u.Path == "fdk.sock" {
			out["unix"] = int(u.WQueue)
		}
	}
	if out["tcp4"] != 37 || out["tcp6"] != 12 || out["unix"] != 5 {
		t.Errorf("listener backlogs %v, want tcp4 37, tcp6 12, unix 5", out)
	}
	return out
}

// srvImageFDs reads the process state of a snapshot.
func srvImageFDs(t *testing.T, dir string, pid int) *image.Process {
	t.Helper()
	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := snap.State(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ---------------------------------------------------------------------
// redis-server

// respConn is a pipelining RESP client.
type respConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dialRESP(ctx context.Context, port int) (*respConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	return &respConn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}, nil
}

func (rc *respConn) send(args ...string) {
	fmt.Fprintf(rc.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(rc.w, "$%d\r\n%s\r\n", len(a), a)
	}
}

// reply reads one reply: simple strings, integers and bulk strings as
// they are; a nil bulk string as errNil.
func (rc *respConn) reply() (string, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis error: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n > 16<<20 {
			return "", fmt.Errorf("bulk length %q", line)
		}
		if n < 0 {
			return "", errRESPNil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

var errRESPNil = errors.New("nil reply")

func (rc *respConn) Close() error { return rc.c.Close() }

func redisKey(i int) string   { return fmt.Sprintf("key:%06d", i) }
func redisValue(i int) string { return fmt.Sprintf("value-%d-%016x", i, uint64(i)*0x9E3779B97F4A7C15) }

// redisLoad sets n keys through one pipelined connection, in batches.
func redisLoad(ctx context.Context, port, n int) error {
	rc, err := dialRESP(ctx, port)
	if err != nil {
		return err
	}
	defer rc.Close()
	const batch = 2000
	for i := 0; i < n; i += batch {
		m := min(batch, n-i)
		for j := i; j < i+m; j++ {
			rc.send("SET", redisKey(j), redisValue(j))
		}
		if err := rc.w.Flush(); err != nil {
			return err
		}
		for range m {
			if r, err := rc.reply(); err != nil || r != "OK" {
				return fmt.Errorf("SET answered %q, %v", r, err)
			}
		}
	}
	return nil
}

// redisSample checks every step-th key through one pipelined connection.
func redisSample(ctx context.Context, port, n, step int) error {
	rc, err := dialRESP(ctx, port)
	if err != nil {
		return err
	}
	defer rc.Close()
	var keys []int
	for i := step / 3; i < n; i += step {
		keys = append(keys, i)
		rc.send("GET", redisKey(i))
	}
	if err := rc.w.Flush(); err != nil {
		return err
	}
	for _, i := range keys {
		v, err := rc.reply()
		if err != nil || v != redisValue(i) {
			return fmt.Errorf("GET %s = %q, %v; want %q", redisKey(i), v, err, redisValue(i))
		}
	}
	return nil
}

// redisInfo returns the fields of INFO section.
func redisInfo(ctx context.Context, port int, section string) (map[string]string, error) {
	s, err := fixture.Redis(ctx, port, "INFO", section)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out, nil
}

func TestRestoreRedis(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.StartRedis(t)
	const keys = 200_000
	if err := redisLoad(ctx, p.Port, keys); err != nil {
		t.Fatal(err)
	}
	// A set too large to free inline: UNLINK hands it to the lazy-free
	// thread.
	rc, err := dialRESP(ctx, p.Port)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5000; i += 500 {
		args := []string{"SADD", "bigset"}
		for j := i; j < i+500; j++ {
			args = append(args, "member-"+strconv.Itoa(j))
		}
		rc.send(args...)
	}
	rc.w.Flush()
	for range 10 {
		if _, err := rc.reply(); err != nil {
			t.Fatal(err)
		}
	}
	rc.Close()
	if n, err := fixture.Redis(ctx, p.Port, "DBSIZE"); err != nil || n != strconv.Itoa(keys+1) {
		t.Fatalf("DBSIZE %q, %v", n, err)
	}
	// A client connected at dump time.
	held := srvHold(t, ctx, p.Port, "PING\r\n", true)
	clients, err := fixture.Redis(ctx, p.Port, "CLIENT", "LIST")
	if err != nil || !strings.Contains(clients, "addr="+held+" ") {
		t.Fatalf("CLIENT LIST before the dump lacks the held client %s: %q %v", held, clients, err)
	}

	dir := srvDump(t, ctx, p)
	srvRestore(t, p, dir)

	if err := redisSample(ctx, p.Port, keys, 97); err != nil {
		t.Fatalf("after restore: %v", err)
	}
	if n, err := fixture.Redis(ctx, p.Port, "DBSIZE"); err != nil || n != strconv.Itoa(keys+1) {
		t.Errorf("DBSIZE after restore %q, %v", n, err)
	}
	info, err := redisInfo(ctx, p.Port, "server")
	if err != nil || info["process_id"] != strconv.Itoa(p.PID) {
		t.Errorf("INFO server after restore: process_id %q, %v", info["process_id"], err)
	}
	// The held client is gone: only the asking connection is listed.
	ok, last := srvEventually(ctx, 5*time.Second, func() (bool, string) {
		s, err := fixture.Redis(ctx, p.Port, "CLIENT", "LIST")
		if err != nil {
			return false, err.Error()
		}
		lines := strings.Split(strings.TrimSpace(s), "\n")
		return len(lines) == 1 && !strings.Contains(s, "addr="+held+" "), s
	})
	if !ok {
		t.Errorf("CLIENT LIST after restore still lists more than the asking client (held %s):\n%s", held, last)
	}
	if r, err := fixture.Redis(ctx, p.Port, "SET", "after", "restore"); err != nil || r != "OK" {
		t.Errorf("SET after restore: %q, %v", r, err)
	}
	if r, err := fixture.Redis(ctx, p.Port, "GET", "after"); err != nil || r != "restore" {
		t.Errorf("GET after restore: %q, %v", r, err)
	}
	// The lazy-free thread frees the set.
	before, err := redisInfo(ctx, p.Port, "memory")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := fixture.Redis(ctx, p.Port, "UNLINK", "bigset"); err != nil || r != "1" {
		t.Fatalf("UNLINK bigset: %q, %v", r, err)
	}
	freed0, err := strconv.Atoi(before["lazyfreed_objects"])
	if err != nil {
		t.Fatalf("INFO memory: lazyfreed_objects %q", before["lazyfreed_objects"])
	}
	ok, last = srvEventually(ctx, 10*time.Second, func() (bool, string) {
		mem, err := redisInfo(ctx, p.Port, "memory")
		if err != nil {
			return false, err.Error()
		}
		n, err := strconv.Atoi(mem["lazyfreed_objects"])
		return err == nil && n == freed0+1 && mem["lazyfree_pending_objects"] == "0",
			fmt.Sprintf("lazyfreed_objects %q (was %d), lazyfree_pending_objects %q", mem["lazyfreed_objects"], freed0, mem["lazyfree_pending_objects"])
	})
	if !ok {
		t.Errorf("the restored lazy-free thread did not free the set: %s", last)
	}
	srvKill(t, ctx, p)
}

// ---------------------------------------------------------------------
// memcached

// mcLoad stores n items through one pipelined connection.
func mcLoad(ctx context.Context, port, n int) error {
	c, err := fixture.DialLines(ctx, port)
	if err != nil {
		return err
	}
	defer c.Close()
	var sb strings.Builder
	for i := range n {
		v := mcValue(i)
		fmt.Fprintf(&sb, "set item:%05d 0 0 %d noreply\r\n%s\r\n", i, len(v), v)
	}
	sb.WriteString("mn") // meta no-op: answered "MN" once everything before it is done
	r, err := c.Ask(ctx, sb.String())
	if err != nil || r != "MN" {
		return fmt.Errorf("loading %d items: %q, %v", n, r, err)
	}
	return nil
}

func mcValue(i int) string { return fmt.Sprintf("mc-%d-%x", i, uint64(i)*0x51afd7ed558ccd) }

// mcCheck gets every item with multi-gets of 100 keys.
func mcCheck(ctx context.Context, port, n int) error {
	for i := 0; i < n; i += 100 {
		var keys []string
		for j := i; j < min(n, i+100); j++ {
			keys = append(keys, fmt.Sprintf("item:%05d", j))
		}
		r, err := fixture.Memcached(ctx, port, "get "+strings.Join(keys, " "))
		if err != nil {
			return err
		}
		for j := i; j < min(n, i+100); j++ {
			v := mcValue(j)
			want := fmt.Sprintf("VALUE item:%05d 0 %d\r\n%s\r\n", j, len(v), v)
			if !strings.Contains(r, want) {
				return fmt.Errorf("item:%05d missing or wrong in %.200q", j, r)
			}
		}
	}
	return nil
}

// mcStat returns one field of memcached's stats.
func mcStat(ctx context.Context, port int, name string) (int, error) {
	r, err := fixture.Memcached(ctx, port, "stats")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(r, "\r\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "STAT" && f[1] == name {
			return strconv.Atoi(f[2])
		}
	}
	return 0, fmt.Errorf("no stat %s", name)
}

// mcSettled returns curr_connections once two readings 100 ms apart
// agree.
func mcSettled(t *testing.T, ctx context.Context, port int) int {
	t.Helper()
	last := -1
	for range 50 {
		n, err := mcStat(ctx, port, "curr_connections")
		if err != nil {
			t.Fatal(err)
		}
		if n == last {
			return n
		}
		last = n
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("curr_connections never settled (last %d)", last)
	return 0
}

func TestRestoreMemcached(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.StartMemcached(t)
	const items = 10_000
	if err := mcLoad(ctx, p.Port, items); err != nil {
		t.Fatal(err)
	}
	// Connections as one asking client sees them, with nothing else open
	// (once memcached has seen earlier clients go).
	base := mcSettled(t, ctx, p.Port)
	srvHold(t, ctx, p.Port, "version\r\n", true)
	if n := mcSettled(t, ctx, p.Port); n != base+1 {
		t.Fatalf("curr_connections with a held client %d, want %d", n, base+1)
	}

	dir := srvDump(t, ctx, p)
	srvRestore(t, p, dir)

	if err := mcCheck(ctx, p.Port, items); err != nil {
		t.Fatalf("after restore: %v", err)
	}
	ok, last := srvEventually(ctx, 5*time.Second, func() (bool, string) {
		n, err := mcStat(ctx, p.Port, "curr_connections")
		return err == nil && n == base, fmt.Sprint(n, err)
	})
	if !ok {
		t.Errorf("curr_connections after restore %s, want %d: the held connection is still counted", last, base)
	}
	if r, err := fixture.Memcached(ctx, p.Port, "set fresh 0 0 5\r\nhello"); err != nil || r != "STORED\r\n" {
		t.Errorf("set after restore: %q, %v", r, err)
	}
	if r, err := fixture.Memcached(ctx, p.Port, "get fresh"); err != nil || r != "VALUE fresh 0 5\r\nhello\r\nEND\r\n" {
		t.Errorf("get after restore: %q, %v", r, err)
	}
	srvKill(t, ctx, p)
}

// ---------------------------------------------------------------------
// python3 -m http.server

func TestRestoreHTTPServer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	www := t.TempDir()
	body := "served after restore\n"
	if err := os.WriteFile(filepath.Join(www, "f.txt"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := fixture.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := fixture.StartPython(t, filepath.Join(srvHTTPScript(t), "serve.py"), www, strconv.Itoa(port))
	p.Port = port
	get := func() (string, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/f.txt", port), nil)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("status %s", resp.Status)
		}
		return string(b), err
	}
	if s, err := get(); err != nil || s != body {
		t.Fatalf("GET before the dump: %q, %v", s, err)
	}
	// A client half-way through its request: a handler thread waits in
	// recv for the rest.
	srvHold(t, ctx, port, "GET /f.txt HTTP/1.1\r\n", false)
	ok, _ := srvEventually(ctx, 5*time.Second, func() (bool, string) {
		return len(srvTasks(t, p.PID)) == 2, ""
	})
	if !ok {
		t.Fatalf("no handler thread for the held connection: tasks %v", srvTasks(t, p.PID))
	}

	dir := srvDump(t, ctx, p)
	srvRestore(t, p, dir)

	if s, err := get(); err != nil || s != body {
		t.Fatalf("GET after restore: %q, %v", s, err)
	}
	// The handler thread reads end-of-file on the closed connection and
	// ends; only the listener is left.
	ok, last := srvEventually(ctx, 5*time.Second, func() (bool, string) {
		fds := srvFDState(t, p.PID)
		sockets := 0
		for _, f := range fds {
			if f.Kind == proc.FDSocket {
				sockets++
			}
		}
		tasks := srvTasks(t, p.PID)
		return sockets == 1 && len(tasks) == 1, fmt.Sprintf("%d sockets, tasks %v", sockets, tasks)
	})
	if !ok {
		t.Errorf("stale connection after restore: %s", last)
	}
	srvKill(t, ctx, p)
}

// srvHTTPScript writes a launcher that runs python3 -m http.server (the
// module as __main__, through runpy) and prints the fixture protocol's
// ready line once the server listens.
func srvHTTPScript(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	script := `import os, runpy, socketserver, sys
root, port = sys.argv[1], sys.argv[2]
activate = socketserver.TCPServer.server_activate
def ready(self):
    activate(self)
    os.write(1, b"ready pid=%d port=%d\n" % (os.getpid(), self.server_address[1]))
socketserver.TCPServer.server_activate = ready
sys.argv = ["http.server", "--bind", "127.0.0.1", "--directory", root, port]
runpy.run_module("http.server", run_name="__main__", alter_sys=True)
`
	if err := os.WriteFile(filepath.Join(dir, "serve.py"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// srvTasks lists the thread ids of pid.
func srvTasks(t *testing.T, pid int) []string {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
