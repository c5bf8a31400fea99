package e2e

// End-to-end tests of snapshots kept in an object store: a real MinIO
// server on loopback (fixture.StartMinIO), real processes, real mounts.
// Nothing is mocked; what the store was asked is counted from the
// client's request log (LAZYFS_S3_TRACE).

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	// s3:// addresses for image.Open in this test binary.
	"github.com/lazyfs/lazyfs/engine/codec"
	_ "github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// s3Setup starts MinIO with a bucket "snaps" and points the AWS_*
// variables of this process, and so of every command the test runs, at it.
// AWS_ENDPOINT_URL is left unset unless endpointEnv: commands are then
// given --s3-endpoint.
func s3Setup(t *testing.T, endpointEnv bool) (*fixture.MinIO, string) {
	t.Helper()
	m := fixture.StartMinIO(t)
	m.MakeBucket("snaps")
	for _, kv := range m.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	if endpointEnv {
		t.Setenv("AWS_ENDPOINT_URL", m.Endpoint)
	}
	trace := filepath.Join(t.TempDir(), "s3-requests.log")
	t.Setenv("LAZYFS_S3_TRACE", trace)
	return m, trace
}

// s3Gets counts the ranged GETs of the pages file of pid in the request
// log: the reads of block data.
func s3Gets(t *testing.T, trace string, pid int) int {
	t.Helper()
	b, err := os.ReadFile(trace)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for l := range strings.Lines(string(b)) {
		if strings.Contains(l, " GET ") && strings.Contains(l, "/pages-"+strconv.Itoa(pid)+".img bytes=") {
			n++
		}
	}
	return n
}

// TestS3Modelserver dumps a model server to MinIO, verifies and inspects
// it there, mounts it with lazyfs and compares every region with the
// memory of the stopped process, restores it lazily with an empty cache
// directory and checks its answers, then restores it again with the cache
// directory filled: that restore makes no GET of block data.
func TestS3Modelserver(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "cmp", "sha256sum")
	m, trace := s3Setup(t, true)
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "128M")
	port := int(p.Ready.MustInt(t, "port"))
	want := map[string]string{}
	for _, req := range []string{"touch 1", "token"} {
		want[req] = lazyChecksumOf(lazyAsk(t, ctx, port, req))
	}
	addr := "s3://snaps/fleet/modelserver"

	// Dump to the store, the process stopped so that its memory can be
	// recorded and compared.
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rec := takeMemory(t, p.PID)
	r := dumpPID(t, p.PID, addr, "--leave-running", "--s3-endpoint", m.Endpoint)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	si := openImage(t, addr, p.PID)
	checkImage(t, si, rec)
	model := newMemModel(t, rec, si)
	if r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", addr, "--leave-running"); r.Code != 1 || !strings.Contains(r.Stderr, "already holds a snapshot") {
		t.Errorf("a second dump to %s: want exit 1 naming the snapshot there\n%s", addr, r)
	}
	if err := p.Cont(); err != nil {
		t.Fatal(err)
	}

	t.Run("verify and inspect", func(t *testing.T) {
		verifyDir(t, addr)
		r := mustSnapctl(t, "inspect", "-D", addr, "--s3-endpoint", m.Endpoint)
		if !strings.Contains(r.Stdout, addr) || !strings.Contains(r.Stdout, strconv.Itoa(p.PID)) {
			t.Errorf("inspect does not name the snapshot and its process:\n%s", r.Stdout)
		}
	})
	t.Run("lazyfs mount: cmp of every region", func(t *testing.T) {
		mnt := lazyMountLazyfs(t, addr)
		regs := checkRegions(t, si, filepath.Join(mnt, strconv.Itoa(p.PID)), model)
		t.Logf("%d region files equal the memory of the stopped process", len(regs))
	})

	lazyKill(t, ctx, p)
	cache := filepath.Join(t.TempDir(), "cache")
	restore := func(t *testing.T) {
		before := s3Gets(t, trace, p.PID)
		l := startLazy(t, addr, "--cache-dir", cache, "--s3-endpoint", m.Endpoint)
		pid := l.waitRunning(t, ctx)
		if pid != p.PID {
			t.Fatalf("restored pid %d, want %d", pid, p.PID)
		}
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		if a := lazyAsk(t, ctx, port, "ping"); a != "pong" {
			t.Errorf("ping: %q", a)
		}
		for req, sum := range want {
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, req)); got != sum {
				t.Errorf("%s: checksum %s, want %s as before the dump", req, got, sum)
			}
		}
		l.mustFinish(t, ctx, pid)
		t.Logf("%d GETs of block data", s3Gets(t, trace, p.PID)-before)
		lazyKill(t, ctx, p)
	}
	t.Run("restore --lazy, empty cache directory", func(t *testing.T) {
		before := s3Gets(t, trace, p.PID)
		restore(t)
		if s3Gets(t, trace, p.PID) == before {
			t.Errorf("a restore with an empty cache directory made no GET of block data: is the log written?")
		}
	})
	t.Run("restore --lazy again: no GET of block data", func(t *testing.T) {
		before := s3Gets(t, trace, p.PID)
		restore(t)
		if n := s3Gets(t, trace, p.PID) - before; n != 0 {
			t.Errorf("the second restore with --cache-dir made %d GETs of block data, want none", n)
		}
	})
	t.Run("store stopped: restore --lazy from the full cache directory", func(t *testing.T) {
		m.Stop()
		defer m.Start()
		l := startLazy(t, addr, "--cache-dir", cache, "--s3-endpoint", m.Endpoint)
		pid := l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		for req, sum := range want {
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, req)); got != sum {
				t.Errorf("%s: checksum %s, want %s as before the dump", req, got, sum)
			}
		}
		r := l.mustFinish(t, ctx, pid)
		if !strings.Contains(r.Stderr, "cannot be reached") || !strings.Contains(r.Stderr, "listing kept") {
			t.Errorf("the restore does not say it ran from the cache directory alone\n%s", r)
		}
		lazyKill(t, ctx, p)
	})
	t.Run("cached chunks with right trailers and wrong bytes: an eager restore fetches them again", func(t *testing.T) {
		n := damageChunks(t, cache)
		r := restoreAndAdopt(t, p, addr, "--cache-dir", cache, "--s3-endpoint", m.Endpoint)
		for req, sum := range want {
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, req)); got != sum {
				t.Errorf("%s: checksum %s, want %s as before the dump", req, got, sum)
			}
		}
		if !strings.Contains(r.Stderr, "fetched again") {
			t.Errorf("%d chunks damaged: the restore does not say it fetched any again\n%s", n, r)
		}
		lazyKill(t, ctx, p)
	})
	// The cache directory is checked once, then used through that
	// descriptor: a symbolic link renamed over its path afterwards, to a
	// directory of chunks another user planted (garbage under right
	// trailer checksums), changes nothing a restore or a mount reads.
	swapCache := func(t *testing.T) {
		t.Helper()
		evil := filepath.Join(t.TempDir(), "evil")
		plantChunks(t, cache, evil)
		real := cache + ".checked"
		if err := os.Rename(cache, real); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(evil, cache); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			os.Remove(cache)
			os.Rename(real, cache)
		})
	}
	t.Run("restore --lazy, cache directory swapped after the check", func(t *testing.T) {
		l := startLazy(t, addr, "--cache-dir", cache, "--s3-endpoint", m.Endpoint, "--prefetch-delay", "3s")
		pid := l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		swapCache(t)
		for req, sum := range want {
			if got := lazyChecksumOf(lazyAsk(t, ctx, port, req)); got != sum {
				t.Errorf("%s: checksum %s, want %s as before the dump", req, got, sum)
			}
		}
		l.mustFinish(t, ctx, pid)
		lazyKill(t, ctx, p)
	})
	t.Run("lazyfs --cache-dir, swapped after the mount", func(t *testing.T) {
		mnt := lazyMountLazyfs(t, addr, "--cache-dir", cache)
		swapCache(t)
		checkRegions(t, si, filepath.Join(mnt, strconv.Itoa(p.PID)), model)
	})
	t.Run("cached chunks with right trailers and wrong bytes: fetched again", func(t *testing.T) {
		n := damageChunks(t, cache)
		mnt := lazyMountLazyfs(t, addr, "--cache-dir", cache)
		checkRegions(t, si, filepath.Join(mnt, strconv.Itoa(p.PID)), model)
		t.Logf("%d chunks damaged; every region read right", n)
	})
	t.Run("cache directory given as a symbolic link: refused", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), "link")
		if err := os.Symlink(cache, link); err != nil {
			t.Fatal(err)
		}
		r := runSnapctl(t, "restore", "-D", addr, "--cache-dir", link, "--s3-endpoint", m.Endpoint)
		if r.Code == 0 || !strings.Contains(r.Stderr, "symbolic link") || !strings.Contains(r.Stderr, link) {
			t.Errorf("restore with --cache-dir %s (a link): want a refusal naming it\n%s", link, r)
		}
	})
}

// damageChunks flips a byte of every chunk file in dir and rewrites its
// trailer CRC32C to match: damage the cache's own check cannot see, only
// the snapshot's block checksums. It returns how many it damaged.
func damageChunks(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil || !e.Type().IsRegular() || len(b) < 4+4096 {
			continue
		}
		b = b[:len(b)-4]
		b[4096] ^= 0xff
		b = binary.LittleEndian.AppendUint32(b, codec.Checksum(b))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no chunk in %s to damage", dir)
	}
	return n
}

// plantChunks fills dir with a chunk file for every one of from, of the
// same name and size, holding garbage under a right trailer CRC32C: what
// a user who can compute chunk names (from a bucket listing) plants.
func plantChunks(t *testing.T, from, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() < 4 {
			continue
		}
		b := bytes.Repeat([]byte{0xee}, int(info.Size())-4)
		b = binary.LittleEndian.AppendUint32(b, codec.Checksum(b))
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no chunk in %s to plant copies of", from)
	}
}

// TestS3Faults takes the store away under a lazyfs read (EIO, never a
// wrong byte; reads work again once it is back, without remounting) and
// under a lazy restore (the process is killed), and gives commands wrong
// credentials and a missing bucket (one error, an exit status).
func TestS3Faults(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	m, _ := s3Setup(t, true)
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "256M")
	port := int(p.Ready.MustInt(t, "port"))
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rec := takeMemory(t, p.PID)
	addr := "s3://snaps/faults"
	dumpPID(t, p.PID, addr, "--leave-running")
	si := openImage(t, addr, p.PID)
	model := newMemModel(t, rec, si)
	if err := p.Cont(); err != nil {
		t.Fatal(err)
	}

	t.Run("store stopped under a lazyfs read", func(t *testing.T) {
		mnt := lazyMountLazyfs(t, addr, "--s3-read-timeout", "5s")
		// The biggest region: the model's 256 MiB.
		var big regionFile
		for _, r := range listRegions(t, filepath.Join(mnt, strconv.Itoa(p.PID))) {
			if r.End-r.Start > big.End-big.Start {
				big = r
			}
		}
		f, err := os.Open(big.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 1<<20)
		off := int64(0)
		read := func() error {
			n, err := f.ReadAt(buf, off)
			if n > 0 && !bytes.Equal(buf[:n], model.bytes(big.Start+uint64(off), uint64(n))) {
				t.Fatalf("%s at %#x: wrong bytes", big.Path, off)
			}
			off += int64(n)
			return err
		}
		for off < 8<<20 {
			if err := read(); err != nil {
				t.Fatal(err)
			}
		}
		m.Stop()
		start := time.Now()
		var err2 error
		for off < int64(big.End-big.Start) {
			if err2 = read(); err2 != nil {
				break
			}
		}
		if !errors.Is(err2, syscall.EIO) {
			t.Fatalf("read at %#x with the store stopped: %v, want EIO", off, err2)
		}
		t.Logf("EIO at offset %#x, %s after the store stopped", off, time.Since(start).Round(time.Millisecond))
		m.Start()
		for end := off + 8<<20; off < end; {
			if err := read(); err != nil {
				t.Fatalf("read at %#x once the store is back: %v", off, err)
			}
		}
	})

	t.Run("store stopped under a lazy restore", func(t *testing.T) {
		lazyKill(t, ctx, p)
		// Nothing streams for a minute: the faults alone read the store.
		l := startLazy(t, addr, "--prefetch-delay", "1m", "--s3-read-timeout", "5s")
		pid := l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		if a := lazyAsk(t, ctx, port, "ping"); a != "pong" {
			t.Errorf("ping: %q", a)
		}
		m.Stop()
		defer m.Start()
		c, err := fixture.DialLines(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if a, err := c.Ask(ctx, "token"); err == nil {
			t.Errorf("the restored process answered %q with its store gone", a)
		}
		r := l.wait(t, ctx)
		if r.Code == 0 || !strings.Contains(r.Stderr, "connection refused") {
			t.Errorf("snapctl: want a failure naming the store\n%s", r)
		}
		if !lazyDead(ctx, pid) {
			t.Errorf("the restored process outlived its store")
		}
		l.lazyNothingLeft(t, addr)
	})

	t.Run("wrong credentials and a missing bucket", func(t *testing.T) {
		counter := fixture.Start(t, "counter", "4M")
		for _, tc := range []struct {
			name, key, secret string
			args              []string
			code              int
			msg               string
		}{
			{"wrong secret", m.AccessKey, "wrong-secret", []string{"inspect", "-D", addr}, 10, "refused the credentials"},
			{"unknown key", "nobody", m.SecretKey, []string{"verify", "-D", addr}, 10, "refused the credentials"},
			{"missing bucket", m.AccessKey, m.SecretKey, []string{"restore", "-D", "s3://nobucket/x"}, 1, `bucket "nobucket" does not exist`},
			{"dump to a missing bucket", m.AccessKey, m.SecretKey, []string{"dump", "-t", strconv.Itoa(counter.PID), "-D", "s3://nobucket/x"}, 1, `bucket "nobucket" does not exist`},
			{"no snapshot there", m.AccessKey, m.SecretKey, []string{"inspect", "-D", "s3://snaps/none"}, 7, "incomplete snapshot"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Setenv("AWS_ACCESS_KEY_ID", tc.key)
				t.Setenv("AWS_SECRET_ACCESS_KEY", tc.secret)
				r := runSnapctl(t, tc.args...)
				lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
				if r.Code != tc.code || len(lines) != 1 || !strings.Contains(r.Stderr, tc.msg) {
					t.Errorf("want exit %d and one line saying %q\n%s", tc.code, tc.msg, r)
				}
			})
		}
		if !counter.Alive() {
			t.Errorf("a dump refused for its bucket did not leave the process running")
		}
		bin := buildTool(t, "lazyfs")
		mnt := t.TempDir()
		t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
		if r := runTool(t, bin, commandTimeout, addr, mnt); r.Code != 10 || !strings.Contains(r.Stderr, "refused the credentials") {
			t.Errorf("lazyfs with wrong credentials: want exit 10\n%s", r)
		}
	})
}

// TestS3StoreMisbehaves restores a model server lazily from MinIO through
// a proxy that misbehaves as stores do: 503 SlowDown for 3 s (what many
// replicas starting at once provoke) is waited out and the restore
// completes; a store that stops answering (connections open, nothing
// said) is warned about within 5 s and ends the restore cleanly at the
// read timeout, naming the store; and SIGTERM ends a restore stalled so
// within a second, killing the process and leaving nothing behind.
func TestS3StoreMisbehaves(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	m, _ := s3Setup(t, false)
	ctx := testContext(t)
	p := fixture.Start(t, "modelserver", "64M")
	port := int(p.Ready.MustInt(t, "port"))
	want := lazyChecksumOf(lazyAsk(t, ctx, port, "token"))
	addr := "s3://snaps/misbehaves"
	dumpPID(t, p.PID, addr, "--s3-endpoint", m.Endpoint)
	if _, err := p.WaitExit(ctx); err != nil {
		t.Fatal(err)
	}
	proxy := fixture.StartFaultProxy(t, m.Endpoint)

	t.Run("503 SlowDown for 3 s", func(t *testing.T) {
		proxy.Set("503", 3*time.Second)
		l := startLazy(t, addr, "--s3-endpoint", proxy.URL)
		pid := l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		if got := lazyChecksumOf(lazyAsk(t, ctx, port, "token")); got != want {
			t.Errorf("token: checksum %s, want %s", got, want)
		}
		l.mustFinish(t, ctx, pid)
		if proxy.Faulted() == 0 {
			t.Error("no GET met the 503s: the fault did not happen")
		}
		lazyKill(t, ctx, p)
	})

	// stalled starts a lazy restore with nothing prefetched, stalls the
	// store once the process runs and asks for a token in the background.
	stalled := func(t *testing.T, flags ...string) (*lazyRun, int) {
		t.Helper()
		proxy.Set("", 0)
		l := startLazy(t, addr, append([]string{"--s3-endpoint", proxy.URL, "--prefetch-delay", "1m"}, flags...)...)
		pid := l.waitRunning(t, ctx)
		if err := p.Adopt(); err != nil {
			t.Fatal(err)
		}
		proxy.Set("stall", 0)
		go func() {
			if c, err := fixture.DialLines(ctx, port); err == nil {
				c.Ask(ctx, "token")
				c.Close()
			}
		}()
		return l, pid
	}

	t.Run("store stalls: warned, then ended at the read timeout", func(t *testing.T) {
		const timeout = 8 * time.Second
		l, pid := stalled(t, "--s3-read-timeout", timeout.String())
		stalledAt := time.Now()
		r := l.wait(t, ctx)
		took := time.Since(stalledAt)
		t.Logf("snapctl exited %d after %v:\n%s", r.Code, took.Round(time.Millisecond), r.Stderr)
		if r.Code == 0 || !strings.Contains(r.Stderr, "gave up") || !strings.Contains(r.Stderr, proxy.URL) {
			t.Errorf("want a failure naming the store and that it gave up\n%s", r)
		}
		if !strings.Contains(r.Stderr, "slow to answer") || !strings.Contains(r.Stderr, "waiting=5s") {
			t.Errorf("no warning after 5 s of waiting\n%s", r)
		}
		if took > timeout+10*time.Second {
			t.Errorf("ended %v after the store stalled, the read timeout is %v", took, timeout)
		}
		if !lazyDead(ctx, pid) {
			t.Error("the restored process outlived the restore")
		}
		l.lazyNothingLeft(t, addr)
	})

	t.Run("store stalls, SIGTERM: exit 130 within a second", func(t *testing.T) {
		l, pid := stalled(t)
		time.Sleep(2 * time.Second) // the token's faults wait on the store
		if err := l.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		r := l.wait(t, ctx)
		took := time.Since(sent)
		t.Logf("snapctl exited %d %v after SIGTERM", r.Code, took.Round(time.Millisecond))
		if r.Code != 130 {
			t.Errorf("exit %d after SIGTERM, want 130\n%s", r.Code, r)
		}
		if took > time.Second {
			t.Errorf("exited %v after SIGTERM, want within 1 s", took)
		}
		if !lazyDead(ctx, pid) {
			t.Error("the restored process outlived the restore")
		}
		l.lazyNothingLeft(t, addr)
	})
}

// bgSnapctl is a snapctl command running in the background, killed and
// reaped at cleanup if still running.
type bgSnapctl struct {
	cmd            *exec.Cmd
	stdout, stderr testutil.Buffer
	done           chan error
}

func startSnapctl(t *testing.T, args ...string) *bgSnapctl {
	t.Helper()
	b := &bgSnapctl{cmd: exec.Command(buildTool(t, "snapctl"), args...), done: make(chan error, 1)}
	b.cmd.Stdout, b.cmd.Stderr = &b.stdout, &b.stderr
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.done <- b.cmd.Wait() }()
	t.Cleanup(func() {
		b.cmd.Process.Kill()
		<-b.done
		b.done <- nil
	})
	return b
}

// TestS3DumpLeftovers: a dump into an object store killed in the middle of
// its uploads leaves a lock naming it and a multipart upload; the next dump
// there is refused (exit 11) with a message saying that dump is gone and
// how to clear what it left; `snapctl cleanup --dry-run` lists the lock and
// the upload and changes nothing; `snapctl cleanup` aborts the upload and
// removes the lock, after which a dump there succeeds. A lock of a dump
// that runs is called running, by the losing dump and by cleanup, which
// refuses to clear it.
func TestS3DumpLeftovers(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	m, _ := s3Setup(t, false)
	ctx := testContext(t)
	proxy := fixture.StartFaultProxy(t, m.Endpoint)
	p := fixture.Start(t, "modelserver", "64M")
	q := fixture.Start(t, "modelserver", "16M") // the second dump's
	addr := "s3://snaps/leftovers"
	direct := []string{"--s3-endpoint", m.Endpoint}

	// stuckDump starts a dump through the proxy and returns once one of
	// its parts is held there: it has its lock and an upload under way.
	stuckDump := func(t *testing.T) *bgSnapctl {
		t.Helper()
		proxy.Set("stallparts", 0)
		before := proxy.Faulted()
		d := startSnapctl(t, "dump", "--leave-running", "-t", strconv.Itoa(p.PID), "-D", addr, "--s3-endpoint", proxy.URL)
		for proxy.Faulted() == before {
			select {
			case err := <-d.done:
				t.Fatalf("dump ended (%v) before a part reached the store:\n%s", err, d.stderr.String())
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
		return d
	}

	t.Run("running", func(t *testing.T) {
		d := stuckDump(t)
		r := runSnapctl(t, append([]string{"dump", "--leave-running", "-t", strconv.Itoa(q.PID), "-D", addr}, direct...)...)
		want := "the dump of pid " + strconv.Itoa(d.cmd.Process.Pid) + " on host "
		t.Logf("the losing dump: exit %d: %s", r.Code, r.Stderr)
		if r.Code != 11 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "which is running") {
			t.Errorf("a dump into a prefix another runs dump holds: want exit 11 naming %q, running\n%s", want, r)
		}
		r = runSnapctl(t, append([]string{"cleanup", "-D", addr}, direct...)...)
		if r.Code != 11 || !strings.Contains(r.Stderr, "which is running") {
			t.Errorf("cleanup of a running dump's lock: want exit 11, running\n%s", r)
		}
		d.cmd.Process.Kill()
		<-d.done
		d.done <- nil
		proxy.Set("", 0)
		mustSnapctl(t, append([]string{"cleanup", "-D", addr}, direct...)...)
	})

	t.Run("killed", func(t *testing.T) {
		d := stuckDump(t)
		dead := d.cmd.Process.Pid
		d.cmd.Process.Kill()
		<-d.done
		d.done <- nil
		proxy.Set("", 0)

		r := runSnapctl(t, append([]string{"dump", "--leave-running", "-t", strconv.Itoa(q.PID), "-D", addr}, direct...)...)
		want := "the dump of pid " + strconv.Itoa(dead) + " on host "
		t.Logf("the next dump: exit %d: %s", r.Code, r.Stderr)
		if r.Code != 11 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "which is gone") ||
			!strings.Contains(r.Stderr, "snapctl cleanup -D "+addr) {
			t.Errorf("a dump into the prefix of a killed dump: want exit 11 naming %q, gone, and the cleanup\n%s", want, r)
		}

		r = mustSnapctl(t, append([]string{"cleanup", "--dry-run", "-D", addr}, direct...)...)
		if !strings.Contains(r.Stdout, "locked by "+want) || !strings.Contains(r.Stdout, "upload  pages-"+strconv.Itoa(p.PID)+".img") || !strings.Contains(r.Stdout, "dry run") {
			t.Errorf("cleanup --dry-run: want the lock and the upload listed\n%s", r)
		}
		uploads := func() int {
			// MinIO lists uploads of an exact key only.
			key := "leftovers/pages-" + strconv.Itoa(p.PID) + ".img"
			out, err := m.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("snaps"), Prefix: aws.String(key)})
			if err != nil {
				t.Fatal(err)
			}
			return len(out.Uploads)
		}
		objects := func() []string {
			out, err := m.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("snaps"), Prefix: aws.String("leftovers/")})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, o := range out.Contents {
				names = append(names, aws.ToString(o.Key))
			}
			return names
		}
		if uploads() == 0 || !slices.Contains(objects(), "leftovers/.lazyfs-dump.lock") {
			t.Fatalf("after --dry-run: %d uploads, objects %v: want the upload and the lock kept", uploads(), objects())
		}

		r = mustSnapctl(t, append([]string{"cleanup", "-D", addr}, direct...)...)
		t.Logf("cleanup:\n%s", r.Stdout)
		if !strings.Contains(r.Stdout, "aborted the upload of pages-") || !strings.Contains(r.Stdout, "removed the lock") {
			t.Errorf("cleanup: want the upload aborted and the lock removed\n%s", r)
		}
		if n, objs := uploads(), objects(); n != 0 || len(objs) != 0 {
			t.Errorf("after cleanup: %d uploads, objects %v: want none", n, objs)
		}
		r = mustSnapctl(t, append([]string{"cleanup", "-D", addr}, direct...)...)
		if !strings.Contains(r.Stdout, "nothing left by a dump") {
			t.Errorf("cleanup of a clean prefix:\n%s", r)
		}
		dumpPID(t, q.PID, addr, append([]string{"--leave-running"}, direct...)...)
		r = mustSnapctl(t, append([]string{"cleanup", "-D", addr}, direct...)...)
		if !strings.Contains(r.Stdout, "holds a complete snapshot (kept)") || !strings.Contains(r.Stdout, "nothing left") {
			t.Errorf("cleanup of a complete snapshot:\n%s", r)
		}
		mustSnapctl(t, append([]string{"verify", "-D", addr}, direct...)...)
	})
}
