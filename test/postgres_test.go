package e2e

// PostgreSQL as its operators run it: Debian's server binaries, a cluster
// made with initdb, started with pg_ctl on loopback, loaded with pgbench.
// Its postmaster and children share a System V segment, anonymous shared
// memory and pipes; the tree is dumped and restored eagerly and lazily,
// and each time pgbench runs again, TPC-B's balances still agree, and
// amcheck finds every pgbench index sound.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// pgServer is a PostgreSQL cluster of a test.
type pgServer struct {
	bin, dir string
	port     int
	cred     *syscall.Credential
	master   int
}

// startPostgres makes a cluster in a directory of its own and starts it
// on a free loopback port; it is stopped (killed) and removed at cleanup,
// with its System V segment.
func startPostgres(t *testing.T, ctx context.Context) *pgServer {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.Sort(bins)
	bin := "/usr/lib/postgresql/15/bin"
	if len(bins) > 0 {
		bin = bins[len(bins)-1]
	}
	if testutil.RequireCommand(t, filepath.Join(bin, "pg_ctl"), filepath.Join(bin, "initdb"), filepath.Join(bin, "pgbench"), filepath.Join(bin, "psql")) == "" {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("PostgreSQL's user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	pg := &pgServer{bin: bin, port: freePort(t), cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	if pg.dir, err = os.MkdirTemp("", "lazyfs-pg-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pg.dir) })
	if err := os.Chown(pg.dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	pg.run(t, ctx, "initdb", "-D", pg.data(), "-A", "trust", "-U", "postgres", "--no-sync")
	// What the test binary inherited must not leak into the server: it
	// would lead outside the tree.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	pg.run(t, ctx, "pg_ctl", "-D", pg.data(), "-l", filepath.Join(pg.dir, "log"), "-w", "start",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", pg.port, pg.dir))
	b, err := os.ReadFile(filepath.Join(pg.data(), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	pg.master, _ = strconv.Atoi(lines[0])
	t.Cleanup(func() {
		killSession(pg.master)
		// Its System V segment outlives it: line 7 of postmaster.pid.
		if len(lines) > 6 {
			if f := strings.Fields(lines[6]); len(f) == 2 {
				id, _ := strconv.Atoi(f[1])
				unix.SysvShmCtl(id, unix.IPC_RMID, nil)
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(pg.dir, "log"))
			t.Logf("PostgreSQL log:\n%s", b)
		}
	})
	return pg
}

func (pg *pgServer) data() string { return filepath.Join(pg.dir, "data") }

// run runs one of the server's programs as its user and returns its
// output, failing the test if it fails.
func (pg *pgServer) run(t *testing.T, ctx context.Context, prog string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(pg.bin, prog), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred, Setsid: true}
	cmd.Dir = pg.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sql runs one statement with psql and returns its unaligned output.
func (pg *pgServer) sql(t *testing.T, ctx context.Context, stmt string) string {
	t.Helper()
	return strings.TrimSpace(pg.run(t, ctx, "psql", "-h", "127.0.0.1", "-p", strconv.Itoa(pg.port), "-U", "postgres", "-Atc", stmt, "postgres"))
}

// bench runs pgbench for a second and checks that no transaction failed.
func (pg *pgServer) bench(t *testing.T, ctx context.Context) {
	t.Helper()
	out := pg.run(t, ctx, "pgbench", "-h", "127.0.0.1", "-p", strconv.Itoa(pg.port), "-U", "postgres", "-c", "2", "-T", "1", "postgres")
	if !strings.Contains(out, "number of failed transactions: 0 ") {
		t.Fatalf("pgbench:\n%s", out)
	}
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "tps") {
			t.Logf("pgbench: %s", strings.TrimSpace(l))
		}
	}
}

// consistent checks TPC-B's invariant (every balance changed by the
// same deltas: the sums of accounts, tellers and branches agree) and the
// pgbench indexes (amcheck), and returns the sums and history count.
func (pg *pgServer) consistent(t *testing.T, ctx context.Context) string {
	t.Helper()
	got := pg.sql(t, ctx, "select (select sum(abalance) from pgbench_accounts)||' '||(select sum(tbalance) from pgbench_tellers)||' '||(select sum(bbalance) from pgbench_branches)||' '||(select count(*) from pgbench_history)")
	f := strings.Fields(got)
	if len(f) != 4 || f[0] != f[1] || f[1] != f[2] {
		t.Fatalf("pgbench balances disagree (accounts, tellers, branches, history): %q", got)
	}
	pg.sql(t, ctx, "create extension if not exists amcheck")
	if n := pg.sql(t, ctx, "select count(bt_index_check(c.oid, true)) from pg_index i join pg_class c on c.oid = i.indexrelid where c.relname like 'pgbench%'"); n != "3" {
		t.Errorf("amcheck checked %s pgbench indexes, want 3", n)
	}
	return got
}

func TestPostgres(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	buildTool(t, "snapctl")
	pg := startPostgres(t, ctx)
	if pg == nil {
		return
	}
	pg.run(t, ctx, "pgbench", "-h", "127.0.0.1", "-p", strconv.Itoa(pg.port), "-U", "postgres", "-i", "-s", "2", "postgres")
	pg.bench(t, ctx)
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			// Each restore from a dump of the server as it runs now: the
			// data directory is the one it had then (a memory snapshot of a
			// database goes with the files it had open; a second restore
			// after the first one's work would find them changed).
			sums := pg.consistent(t, ctx)
			running := treeOf(t, pg.master)
			transient := transientBackends(running)
			dir := filepath.Join(t.TempDir(), "snap")
			r := dumpPID(t, pg.master, dir)
			t.Logf("%s", strings.TrimSpace(r.Stdout))
			// The tree as dumped: a backend that was exiting is left out.
			snap, err := image.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			pids := snap.PIDs()
			snap.Close()
			before := map[int]treeIDs{}
			for pid, ids := range running {
				if slices.Contains(pids, pid) {
					before[pid] = ids
				}
			}
			gctx, gcancel := context.WithTimeout(ctx, 20*time.Second)
			defer gcancel()
			for _, pid := range pids {
				if !pidGone(gctx, pid) {
					t.Fatalf("pid %d outlived the dump", pid)
				}
			}
			if mode == "eager" {
				r := mustSnapctl(t, "restore", "-D", dir)
				t.Logf("%s", strings.TrimSpace(r.Stdout))
			} else {
				l := startLazy(t, dir)
				l.waitRunning(t, ctx)
				if got := pg.consistent(t, ctx); got != sums {
					t.Errorf("during the lazy phase: %s, at the dump %s", got, sums)
				}
				l.mustFinish(t, ctx, pg.master)
			}
			t.Logf("PostgreSQL: %d processes restored, sums %s", len(pids), sums)
			// Every dumped process with its ids; the server may have
			// started others since (a backend, an autovacuum worker).
			after := treeOf(t, pg.master)
			for pid, want := range before {
				got, ok := after[pid]
				if pid == pg.master {
					got.ppid, want.ppid = 0, 0
				}
				if !ok && transient[pid] != "" {
					// Restored (the restore counts it), then done.
					t.Logf("pid %d (%s) exited after the restore", pid, transient[pid])
					continue
				}
				if !ok || got != want {
					t.Errorf("pid %d restored with %+v (present %v), dumped with %+v", pid, got, ok, want)
				}
			}
			if got := pg.consistent(t, ctx); got != sums {
				t.Errorf("after the restore: %s, at the dump %s", got, sums)
			}
			pg.bench(t, ctx)
			pg.consistent(t, ctx)
		})
		if t.Failed() {
			return
		}
	}
	// The restored server shuts down when asked: it waits for every
	// child it counts, and so for those it had not reaped at the dump
	// (TestZombiesRestored), which a restore must give back.
	pg.run(t, ctx, "pg_ctl", "-D", pg.data(), "-m", "fast", "-t", "30", "stop")
}

// transientBackends returns the processes of a PostgreSQL tree that end
// on their own, by pid, with their process title: every child but the
// server's long-lived auxiliary processes (an autovacuum worker ends when
// its table is vacuumed, a client's backend when its client leaves). A
// restored one may be gone by the time the tree is compared with the
// dumped one.
func transientBackends(tree map[int]treeIDs) map[int]string {
	auxiliary := []string{"checkpointer", "background writer", "walwriter", "autovacuum launcher", "logical replication launcher", "archiver", "stats collector"}
	out := map[int]string{}
	for pid := range tree {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		title := strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
		rest, child := strings.CutPrefix(title, "postgres: ")
		if child && !slices.ContainsFunc(auxiliary, func(a string) bool { return strings.HasPrefix(rest, a) }) {
			out[pid] = title
		}
	}
	return out
}
