package e2e

// Every restore feature on process trees, through the one pipeline a
// single process takes too: nginx (a master and two workers of another
// uid) and the modelserver fixture as a pre-fork server (a parent that
// builds its weights and heap, listens, and forks two workers answering
// on the shared socket: laid out as gunicorn --preload or a model server
// that loads its weights once and forks its workers). Each is restored
// eagerly, lazily through the private mount, as three replicas at once
// (--pidns --netns new) lazily through one lazyfs mount, with a working
// set recorded and replayed, and lazily from MinIO (its working set kept
// in the cache directory); each time a client checks its answers.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// treeServer is a process tree that serves, dumped and restored in turn.
type treeServer struct {
	name   string
	root   int
	before map[int]treeIDs
	// ask checks, from the caller's network namespace, that the tree
	// answers as it did before its dump.
	ask func(ctx context.Context) error
	// dumpTo dumps the running tree to addr and waits until it is gone.
	dumpTo func(t *testing.T, ctx context.Context, addr string)
}

// httpGetHere returns the body of GET url (http://HOST:PORT/) asked on a
// connection made by the calling thread: net/http dials on threads of its
// own, outside the network namespace inNetns put the caller in.
func httpGetHere(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", host); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	head, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.1 200 ") {
		return "", fmt.Errorf("answer %q", b)
	}
	return body, nil
}

// treeContext bounds a test of every restore of a tree: about ten
// restores, each of which may wait for the pids of the one before to be
// reaped.
func treeContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// killTree kills the restored tree (its root leads its session) and waits
// until every process of it is gone.
func (s *treeServer) killTree(t *testing.T, ctx context.Context) {
	t.Helper()
	killSession(s.root)
	s.gone(t, ctx)
}

// gone waits until every process of the tree is gone.
func (s *treeServer) gone(t *testing.T, ctx context.Context) {
	t.Helper()
	gctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for pid := range s.before {
		if !pidGone(gctx, pid) {
			t.Fatalf("%s: pid %d still there", s.name, pid)
		}
	}
}

// mustAsk checks the tree's answers from our network namespace.
func (s *treeServer) mustAsk(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if err := s.ask(ctx); err != nil {
		t.Fatalf("%s %s: %v", s.name, when, err)
	}
}

// firstAnswer asks until the tree answers and returns how long after
// start it did.
func (s *treeServer) firstAnswer(t *testing.T, ctx context.Context, start time.Time) time.Duration {
	t.Helper()
	var last error
	for ctx.Err() == nil {
		if last = s.ask(ctx); last == nil {
			return time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s: no answer: %v", s.name, last)
	return 0
}

// server is nginx as a treeServer: asked for its page on a connection of
// the calling thread (httpGetHere), dumped by its master.
func (n *nginxTree) server() *treeServer {
	s := &treeServer{name: "nginx", root: n.master, before: n.before,
		ask: func(ctx context.Context) error {
			got, err := httpGetHere(ctx, n.url)
			if err == nil && got != n.page {
				err = fmt.Errorf("served %q, want %q", got, n.page)
			}
			return err
		}}
	s.dumpTo = func(t *testing.T, ctx context.Context, addr string) {
		r := dumpPID(t, n.master, addr)
		t.Logf("%s", strings.TrimSpace(r.Stdout))
		s.gone(t, ctx)
	}
	return s
}

func TestTreeRestoresNginx(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := treeContext(t)
	n := startNginx(t, ctx)
	s := n.server()
	dir := n.dump(t, ctx)
	treeRestores(t, ctx, s, dir)
}

func TestTreeRestoresPreforkServer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := treeContext(t)
	buildTool(t, "snapctl")
	p := fixture.Start(t, "modelserver", "64M", "0", "42", "2")
	port := int(p.Ready.MustInt(t, "port"))
	workers := strings.Split(p.Ready.Fields["workers"], ",")
	if len(workers) != 2 {
		t.Fatalf("ready line %q: want 2 workers", p.Ready.Text)
	}
	s := &treeServer{name: "pre-fork modelserver", root: p.PID, before: waitTree(t, ctx, p.PID, 3)}
	t.Cleanup(func() { killSession(p.PID) })
	// What the workers answer before the dump: the same memory in each.
	want := map[string]string{}
	for _, req := range []string{"touch 1", "token"} {
		want[req] = lazyChecksumOf(lazyAsk(t, ctx, port, req))
	}
	s.ask = func(ctx context.Context) error {
		c, err := fixture.DialLines(ctx, port)
		if err != nil {
			return err
		}
		defer c.Close()
		for _, req := range []string{"touch 1", "token"} {
			got, err := c.Ask(ctx, req)
			if err != nil {
				return err
			}
			if sum := lazyChecksumOf(got); sum != want[req] {
				return fmt.Errorf("%s: checksum %s, want %s (%q)", req, sum, want[req], got)
			}
		}
		return nil
	}
	s.dumpTo = func(t *testing.T, ctx context.Context, addr string) {
		r := dumpPID(t, s.root, addr)
		t.Logf("%s", strings.TrimSpace(r.Stdout))
		s.gone(t, ctx)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	s.dumpTo(t, ctx, dir)
	if _, err := p.WaitExit(ctx); err != nil {
		t.Fatalf("the parent outlived its dump: %v", err)
	}
	treeRestores(t, ctx, s, dir)
}

// treeRestores restores the tree dumped in dir every way a tree restores,
// killing it between two, and checks it each time: its pids and links
// (sameTree), and a client's answers.
func treeRestores(t *testing.T, ctx context.Context, s *treeServer, dir string) {
	procs := fmt.Sprintf("(%d processes,", len(s.before))
	t.Run("eager", func(t *testing.T) {
		r := mustSnapctl(t, "restore", "-D", dir)
		t.Logf("%s", strings.TrimSpace(r.Stdout))
		if !strings.Contains(r.Stdout, procs) {
			t.Errorf("summary does not count the processes: %q", r.Stdout)
		}
		sameTree(t, s.root, s.before)
		s.mustAsk(t, ctx, "after an eager restore")
		s.killTree(t, ctx)
	})
	if t.Failed() {
		return
	}
	t.Run("lazy, private mount", func(t *testing.T) {
		l := startLazy(t, dir, "--prefetch-delay", "1s")
		if pid := l.waitRunning(t, ctx); pid != s.root {
			t.Fatalf("pidfile names %d, want the root %d", pid, s.root)
		}
		s.mustAsk(t, ctx, "during the lazy phase")
		l.mustFinish(t, ctx, s.root)
		sameTree(t, s.root, s.before)
		s.mustAsk(t, ctx, "after the lazy phase")
		s.killTree(t, ctx)
	})
	if t.Failed() {
		return
	}
	t.Run("replicas through one mount", func(t *testing.T) {
		mnt := lazyMountLazyfs(t, dir)
		reps := make([]*replica, 3)
		for i := range reps {
			reps[i] = &replica{index: i, run: startLazy(t, dir, "--mount", mnt, "--pidns", "--netns", "new")}
		}
		for _, r := range reps {
			r.waitRunning(t, ctx, s.root)
		}
		replicasApart(t, reps)
		for _, r := range reps {
			if err := inNetns(r.pid, func() error { return s.ask(ctx) }); err != nil {
				t.Errorf("replica %d: %v", r.index, err)
			}
			// The whole tree in the copy's pid namespace, each process
			// with the pid it had there.
			tree := treeOf(t, r.pid)
			if len(tree) != len(s.before) {
				t.Errorf("replica %d: %d processes, want %d: %v", r.index, len(tree), len(s.before), tree)
			}
			for pid := range tree {
				st := readProcFile(t, "%d/status", pid)
				i := strings.Index(st, "NSpid:")
				f := strings.Fields(st[i+len("NSpid:"):])
				own, _ := strconv.Atoi(f[1])
				if _, ok := s.before[own]; !ok || f[0] != strconv.Itoa(pid) {
					t.Errorf("replica %d: pid %d has ids %v in its namespaces, not one of the dumped pids", r.index, pid, f[:2])
				}
			}
		}
		for _, r := range reps {
			res := r.run.mustFinish(t, ctx, r.pid)
			if !strings.Contains(res.Stdout, procs) {
				t.Errorf("replica %d: summary does not count the processes: %q", r.index, res.Stdout)
			}
			if err := inNetns(r.pid, func() error { return s.ask(ctx) }); err != nil {
				t.Errorf("replica %d after its lazy phase: %v", r.index, err)
			}
		}
		for _, r := range reps {
			r.killed = ticksNow(t)
			if err := unix.Kill(r.init, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			replicaGone(t, ctx, r)
		}
	})
	if t.Failed() {
		return
	}
	t.Run("working set recorded and replayed", func(t *testing.T) {
		// Recorded until the first answer (SIGUSR1 to snapctl).
		l := startLazy(t, dir, "--record-working-set", "--record-for", "60s")
		l.waitRunning(t, ctx)
		s.firstAnswer(t, ctx, l.start)
		if err := l.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		r := l.mustFinish(t, ctx, s.root)
		if got := strings.Count(r.Stdout, "working set recorded:"); got != len(s.before) {
			t.Errorf("%d working sets recorded, want one per process (%d):\n%s", got, len(s.before), r.Stdout)
		}
		s.killTree(t, ctx)
		// Without, then with it: a client asks as soon as it can.
		var took [2]time.Duration
		for i, mode := range []string{"off", "auto"} {
			l := startLazy(t, dir, "--working-set", mode)
			took[i] = s.firstAnswer(t, ctx, l.start)
			r := l.mustFinish(t, ctx, s.root)
			used := strings.Count(r.Stdout, "working set: ")
			if mode == "off" && used != 0 || mode == "auto" && used == 0 {
				t.Errorf("--working-set %s: %d working sets fetched first:\n%s", mode, used, r.Stdout)
			}
			sameTree(t, s.root, s.before)
			s.mustAsk(t, ctx, "after a restore with --working-set "+mode)
			s.killTree(t, ctx)
		}
		t.Logf("first answer after the start of snapctl: %v without the working set, %v with it", took[0], took[1])
	})
	if t.Failed() {
		return
	}
	t.Run("lazy from MinIO", func(t *testing.T) {
		s3Setup(t, true)
		addr := "s3://snaps/trees/" + strings.ReplaceAll(s.name, " ", "-")
		// Back, to be dumped to the store.
		r := mustSnapctl(t, "restore", "-D", dir)
		t.Logf("%s", strings.TrimSpace(r.Stdout))
		s.mustAsk(t, ctx, "restored to be dumped to the store")
		s.dumpTo(t, ctx, addr)
		cache := filepath.Join(t.TempDir(), "cache")
		l := startLazy(t, addr, "--cache-dir", cache, "--record-working-set", "--record-for", "60s")
		if pid := l.waitRunning(t, ctx); pid != s.root {
			t.Fatalf("pidfile names %d, want the root %d", pid, s.root)
		}
		s.firstAnswer(t, ctx, l.start)
		if err := l.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		r = l.mustFinish(t, ctx, s.root)
		if got := strings.Count(r.Stdout, "working set recorded:"); got != len(s.before) || !strings.Contains(r.Stdout, cache) {
			t.Errorf("want a working set recorded per process (%d) in the cache directory %s:\n%s", len(s.before), cache, r.Stdout)
		}
		sameTree(t, s.root, s.before)
		s.mustAsk(t, ctx, "after a lazy restore from the store")
		s.killTree(t, ctx)
		// Again, its working set from the cache directory.
		l = startLazy(t, addr, "--cache-dir", cache)
		l.waitRunning(t, ctx)
		s.mustAsk(t, ctx, "during a lazy restore from the store")
		if r = l.mustFinish(t, ctx, s.root); !strings.Contains(r.Stdout, "working set: ") {
			t.Errorf("no working set fetched first from the cache directory:\n%s", r.Stdout)
		}
		s.killTree(t, ctx)
		// Without a cache directory there is none, and nothing to say.
		l = startLazy(t, addr)
		l.waitRunning(t, ctx)
		s.mustAsk(t, ctx, "during a lazy restore from the store without a cache directory")
		if r = l.mustFinish(t, ctx, s.root); strings.Contains(r.Stderr, "working set") {
			t.Errorf("a restore from the store without a cache directory speaks of working sets:\n%s", r.Stderr)
		}
		s.killTree(t, ctx)
		if r := runSnapctl(t, "restore", "-D", addr, "--lazy", "--record-working-set"); r.Code != 3 || !strings.Contains(r.Stderr, "--cache-dir") {
			t.Errorf("--record-working-set from the store without --cache-dir: want exit 3 naming --cache-dir\n%s", r)
		}
	})
}

// TestTreeRestoreOptions restores nginx with the options the other tree
// tests leave out: --leave-stopped, --netns PATH, a sealed snapshot
// (eagerly and lazily through the private mount) and a signed one
// (lazily from the snapshot's files, --source direct).
func TestTreeRestoreOptions(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ip := testutil.RequireCommand(t, "ip")
	ctx := treeContext(t)
	n := startNginx(t, ctx)
	s := n.server()
	plain := n.dump(t, ctx)
	// restore restores plain eagerly, $LAZYFS_IDENTITY unset (a key
	// refuses a snapshot that is neither sealed nor signed).
	restore := func(t *testing.T, flags ...string) {
		t.Helper()
		r := runSnapctlEnv(t, "", append([]string{"restore", "-D", plain}, flags...)...)
		if r.Code != 0 {
			t.Fatalf("%s", r)
		}
		sameTree(t, s.root, s.before)
	}

	t.Run("leave stopped", func(t *testing.T) {
		restore(t, "--leave-stopped")
		for pid := range s.before {
			states, err := fixture.TaskStates(pid)
			if err != nil {
				t.Fatal(err)
			}
			for tid, st := range states {
				if st != 'T' {
					t.Errorf("pid %d thread %d in state %c, want stopped (T)", pid, tid, st)
				}
			}
		}
		for pid := range s.before {
			if err := unix.Kill(pid, unix.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		s.mustAsk(t, ctx, "after SIGCONT")
		s.killTree(t, ctx)
	})
	t.Run("netns PATH", func(t *testing.T) {
		name := fmt.Sprintf("lazyfs-tree-%d", os.Getpid())
		testutil.Output(t, ip, "netns", "add", name)
		t.Cleanup(func() { exec.Command(ip, "netns", "delete", name).Run() })
		testutil.Output(t, ip, "-n", name, "link", "set", "lo", "up")
		restore(t, "--netns", "/run/netns/"+name)
		for pid := range s.before {
			if got, want := nsInode(t, pid, "net"), nsInode(t, s.root, "net"); got != want || got == nsInode(t, os.Getpid(), "net") {
				t.Errorf("pid %d: network namespace %d, want %s's (%d), not ours", pid, got, name, want)
			}
		}
		if err := inNetns(s.root, func() error { return s.ask(ctx) }); err != nil {
			t.Errorf("in %s: %v", name, err)
		}
		if err := s.ask(ctx); err == nil {
			t.Errorf("nginx answers in our network namespace too")
		}
		s.killTree(t, ctx)
	})
	t.Run("sealed", func(t *testing.T) {
		recipient, _, _ := sealKeys(t)
		restore(t)
		sealed := filepath.Join(t.TempDir(), "sealed")
		r := dumpPID(t, s.root, sealed, "--encrypt-to", recipient)
		t.Logf("%s", strings.TrimSpace(r.Stdout))
		s.gone(t, ctx)
		r = mustSnapctl(t, "restore", "-D", sealed)
		sameTree(t, s.root, s.before)
		s.mustAsk(t, ctx, "after an eager restore of the sealed snapshot")
		s.killTree(t, ctx)
		l := startLazy(t, sealed)
		l.waitRunning(t, ctx)
		s.mustAsk(t, ctx, "during a lazy restore of the sealed snapshot")
		l.mustFinish(t, ctx, s.root)
		sameTree(t, s.root, s.before)
		s.killTree(t, ctx)
	})
	t.Run("signed", func(t *testing.T) {
		key, _ := signKeys(t)
		restore(t)
		signed := filepath.Join(t.TempDir(), "signed")
		dumpPID(t, s.root, signed, "--sign", key)
		s.gone(t, ctx)
		l := startLazy(t, signed, "--source", "direct")
		l.waitRunning(t, ctx)
		s.mustAsk(t, ctx, "during a lazy restore of the signed snapshot")
		l.mustFinish(t, ctx, s.root)
		sameTree(t, s.root, s.before)
		s.mustAsk(t, ctx, "after a lazy restore of the signed snapshot")
		s.killTree(t, ctx)
	})
}
