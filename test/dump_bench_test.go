package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// BenchmarkDump dumps a 1 GiB counter fixture (¼ zero, ¼ random, ½
// bf16-like; all pages present) with LeaveRunning, calling engine.Dump in
// the test process so that -cpuprofile sees the dump. The image goes to a
// fresh directory under the benchmark's temporary directory (page cache,
// then disk through the writer's fsync) and is removed, untimed, after
// each iteration. Metrics: MB/s of memory dumped, freeze_ms (median time
// the process was stopped), p50_ms (median time of a whole dump: ns/op is
// the mean), ratio (pages file size / memory). LAZYFS_BENCH_DUMP_SIZE
// changes the size (e.g. 64M for a quick run).
//
// On a VM guest with free page reporting, the host takes back memory the
// guest has left unused, and the first touch of such a page (here, the
// image's page cache) is slow, so timings swing between runs (see
// test/bench/BENCHMARKS.md); run it several times and compare medians.
//
//	go test -run '^$' -bench BenchmarkDump -benchtime 3x -count 3 ./test/
func BenchmarkDump(b *testing.B) {
	testutil.RequirePtrace(b)
	size := "1G"
	if s := os.Getenv("LAZYFS_BENCH_DUMP_SIZE"); s != "" {
		size = s
	}
	pid, _ := startOrphan(b, "counter", size)
	for _, c := range []struct {
		name string
		mode codec.Mode
	}{
		{"block=256K", codec.Compress},
		{"no-compress", codec.NoCompress},
	} {
		b.Run(c.name, func(b *testing.B) {
			var freezes, totals []time.Duration
			var ratio float64
			for i := 0; b.Loop(); i++ {
				dir := filepath.Join(b.TempDir(), strconv.Itoa(i))
				start := time.Now()
				res, err := engine.Dump(context.Background(), engine.DumpOptions{PID: pid, Dir: dir, LeaveRunning: true,
					BlockSize: 256 << 10, Mode: c.mode})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				totals = append(totals, time.Since(start))
				freezes = append(freezes, res.Freeze)
				ratio = float64(res.Stats.FileSize) / float64(res.MemoryBytes)
				b.SetBytes(int64(res.MemoryBytes))
				if err := os.RemoveAll(dir); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(median(freezes).Seconds()*1e3, "freeze_ms")
			b.ReportMetric(median(totals).Seconds()*1e3, "p50_ms")
			b.ReportMetric(ratio, "ratio")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// startOrphan starts fixture name through the launcher as an orphan (its
// parent, a shell, exits at once), so that the test process can trace it
// without its own wait for a child taking the ptrace stops. It waits for
// the ready line and kills the process at cleanup.
func startOrphan(tb testing.TB, name string, args ...string) (int, fixture.Line) {
	tb.Helper()
	sh := testutil.RequireCommand(tb, "sh")
	launch, bin := fixture.Build(tb, "launch"), fixture.Build(tb, name)
	log := filepath.Join(tb.TempDir(), name+".log")
	words := []string{launch, bin}
	words = append(words, args...)
	for i, w := range words {
		words[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	script := fmt.Sprintf("%s </dev/null >>'%s' 2>&1 & echo $!", strings.Join(words, " "), log)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sh, "-c", script)
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		tb.Fatalf("start %s: shell printed %q", name, out)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		tb.Fatalf("start %s: pidfd of %d: %v", name, pid, err)
	}
	tb.Cleanup(func() {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		unix.Poll(fds, 10_000) // readable once it exited
		unix.Close(pidfd)
	})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if l, ok := readyLine(log); ok {
			if got := l.Fields["pid"]; got != strconv.Itoa(pid) {
				tb.Fatalf("start %s: ready line %q, started pid %d", name, l.Text, pid)
			}
			return pid, l
		}
		if fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}; func() bool { n, _ := unix.Poll(fds, 0); return n > 0 }() {
			b, _ := os.ReadFile(log)
			tb.Fatalf("start %s: exited before ready:\n%s", name, b)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("start %s: not ready in time", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readyLine returns the ready line of a fixture log, if written.
func readyLine(path string) (fixture.Line, bool) {
	f, err := os.Open(path)
	if err != nil {
		return fixture.Line{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ready ") {
			return fixture.ParseLine(sc.Text()), true
		}
	}
	return fixture.Line{}, false
}
