package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// BenchmarkLazyRestore times `snapctl restore` to the first answer of a
// 1 GiB modelserver (½ bf16-like weights, ¼ zeros, ¼ random: 768 MiB of
// non-zero memory, stored Raw; plus 32 MiB of heap records), eagerly and
// lazily:
//
//	go test -run '^$' -bench BenchmarkLazyRestore -benchtime 5x ./test/
//
// Sub-benchmarks are BLOCKS/REQUEST/MODE. BLOCKS is the snapshot's block
// size: 256K (the default) or 4K (--compress). REQUEST is the first
// request sent once the restored server accepts connections: ping (no
// memory), touch1 ("touch 1": one page in a hundred, spread over the whole
// mapping: with 256 KiB blocks it needs two blocks in three, with 4 KiB
// blocks one in a hundred) or token (reads every byte of the mapping and
// walks the heap). MODE is eager; lazy-mount (--lazy: the private mount of
// snapctl's helper); lazy-direct (--lazy --source direct); lazy-lazyfs
// (--lazy --mount of a lazyfs started for the benchmark: its page cache
// is warm after the first run, as for a second replica). Each run reads
// the pages file first (the page cache is warm), restores, asks, checks
// the answer against the original server's, waits for snapctl to exit
// and kills the server. Reported: first-s, the median time from starting
// snapctl to the answer; all-in-s, the median until snapctl exited (for
// a lazy restore: every page in). Memory is not pre-touched: the previous
// run's server is killed just before. LAZYFS_BENCH_SIZE overrides the
// size; LAZYFS_BENCH_FIXTURE=weightserver benchmarks the weightserver
// instead (its weights in 16 MiB arrays advised MADV_HUGEPAGE, as numpy
// lays them out; weightserver-none: the same without the advice).
func BenchmarkLazyRestore(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequirePtrace(b)
	testutil.RequireUserfaultfd(b)
	testutil.RequireFUSE(b)
	size := "1G"
	if s := os.Getenv("LAZYFS_BENCH_SIZE"); s != "" {
		size = s
	}
	// Restored servers are reparented to us: we reap them at once, and
	// their pid is free for the next restore.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })

	name, args := "modelserver", []string{size}
	switch f := os.Getenv("LAZYFS_BENCH_FIXTURE"); f {
	case "", "modelserver":
	case "weightserver":
		name, args = f, []string{size, "0", "42", "hugepage"}
	case "weightserver-none":
		name, args = "weightserver", []string{size, "0", "42", "none"}
	default:
		b.Fatalf("LAZYFS_BENCH_FIXTURE=%s: want modelserver, weightserver or weightserver-none", f)
	}
	p := fixture.Start(b, name, args...)
	pid, port := p.PID, int(p.Ready.MustInt(b, "port"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	want := map[string]string{}
	for _, req := range []string{"ping", "touch 1", "token"} {
		a, err := lazyBenchAsk(ctx, port, req, time.Now().Add(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		want[req] = a
	}
	dirs := map[string]string{"256K": filepath.Join(b.TempDir(), "snap-256K"), "4K": filepath.Join(b.TempDir(), "snap-4K")}
	dumpPID(b, pid, dirs["256K"], "--leave-running")
	dumpPID(b, pid, dirs["4K"], "--compress")
	if _, err := p.WaitExit(ctx); err != nil {
		b.Fatal(err)
	}
	bin := buildTool(b, "snapctl")
	for _, blocks := range []string{"256K", "4K"} {
		dir := dirs[blocks]
		mnt := lazyMountLazyfs(b, dir)
		for _, req := range []string{"ping", "touch1", "token"} {
			request := map[string]string{"ping": "ping", "touch1": "touch 1", "token": "token"}[req]
			for _, mode := range []struct {
				name  string
				flags []string
			}{
				{"eager", nil},
				{"lazy-mount", []string{"--lazy"}},
				{"lazy-direct", []string{"--lazy", "--source", "direct"}},
				{"lazy-lazyfs", []string{"--lazy", "--mount", mnt}},
			} {
				b.Run(blocks+"/"+req+"/"+mode.name, func(b *testing.B) {
					var first, all []time.Duration
					for range b.N {
						f, a, err := lazyBenchRun(ctx, bin, dir, pid, port, request, want[request], mode.flags)
						if err != nil {
							b.Fatal(err)
						}
						first, all = append(first, f), append(all, a)
					}
					b.ReportMetric(lazyMedian(first).Seconds(), "first-s")
					b.ReportMetric(lazyMedian(all).Seconds(), "all-in-s")
				})
			}
		}
	}
}

// lazyBenchRun restores once and returns the time to the answer of
// request and the time until snapctl exited.
func lazyBenchRun(ctx context.Context, bin, dir string, pid, port int, request, want string, flags []string) (time.Duration, time.Duration, error) {
	pidfile := filepath.Join(os.TempDir(), fmt.Sprintf("lazy-bench-%d.pid", os.Getpid()))
	defer os.Remove(pidfile)
	if err := lazyWarm(dir); err != nil {
		return 0, 0, err
	}
	args := append([]string{"restore", "-D", dir, "--pidfile", pidfile}, flags...)
	cmd := exec.Command(bin, args...)
	var out testutil.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, 0, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
	}()
	answer, err := lazyBenchAsk(ctx, port, request, start.Add(2*time.Minute))
	first := time.Since(start)
	if err != nil {
		cmd.Process.Kill()
		<-exited
		return 0, 0, fmt.Errorf("%w\n%s", err, out.String())
	}
	if err := <-exited; err != nil {
		return 0, 0, fmt.Errorf("snapctl %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	all := time.Since(start)
	if lazyChecksumOf(answer) != lazyChecksumOf(want) {
		return 0, 0, fmt.Errorf("restored server answered %q, the original %q", answer, want)
	}
	return first, all, nil
}

// lazyBenchAsk connects to the server as soon as it listens (polling every
// 200 µs until deadline) and returns its answer to request.
func lazyBenchAsk(ctx context.Context, port int, request string, deadline time.Time) (string, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			defer c.Close()
			c.SetDeadline(deadline)
			if _, err := fmt.Fprintf(c, "%s\n", request); err != nil {
				return "", err
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			return strings.TrimSpace(line), err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("connect %s: %w", addr, err)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// lazyWarm reads the pages files of dir, so that the page cache holds
// them.
func lazyWarm(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		for off := int64(0); ; off += int64(len(buf)) {
			n, err := f.ReadAt(buf, off)
			if n < len(buf) || err != nil {
				break
			}
		}
		f.Close()
	}
	return nil
}

func lazyMedian(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
