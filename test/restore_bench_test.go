package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// BenchmarkRestore restores a 1 GiB counter fixture (1/4 zero, 1/4 random,
// 1/2 bf16-like: 768 MiB of non-zero memory, stored Raw) eagerly with
// engine.Restore, timing the restore until the process runs
// (RestoreResult.ToRunning), with --decompress-threads 1, 2 and 0, with a
// warm page cache and a cold one (drop_caches before each restore). Beside
// it, the baseline: reading the pages file to memory, warm and cold.
//
//	go test -run '^$' -bench BenchmarkRestore -benchtime 5x ./test/
//
// Each sub-benchmark reports the median time (median-s), the mean as
// ns/op, and the pages file's size over the median as MB/s; the reference
// to hold them against is CRIU's eager restore of the same process on the
// same machine. Memory is not pre-touched: the restored process's pages
// are freed (the previous restore killed) just before each restore, so the
// guest has them at hand; with free page reporting, memory the host took
// back is slow at first touch and swings timings (see
// test/bench/BENCHMARKS.md).
func BenchmarkRestore(b *testing.B) {
	testutil.RequirePtrace(b)
	size := "1G"
	if s := os.Getenv("LAZYFS_BENCH_SIZE"); s != "" {
		size = s
	}
	// The restored process is reparented to us, so that we reap it at
	// once and its pid is free for the next restore.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })

	p := fixture.Start(b, "counter", size)
	dir := filepath.Join(b.TempDir(), "snap")
	dumpPID(b, p.PID, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := p.WaitExit(ctx); err != nil {
		b.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil || len(pages) != 1 {
		b.Fatalf("pages file in %s: %v %v", dir, pages, err)
	}
	st, err := os.Stat(pages[0])
	if err != nil {
		b.Fatal(err)
	}
	canDrop := dropCaches() == nil

	for _, cache := range []string{"warm", "cold"} {
		if cache == "cold" && !canDrop {
			b.Logf("cannot drop the page cache: cold runs skipped")
			continue
		}
		b.Run("read-pages/"+cache, func(b *testing.B) {
			benchTimed(b, cache, st.Size(), func() (time.Duration, error) {
				t0 := time.Now()
				err := readAll(pages[0])
				return time.Since(t0), err
			})
		})
		for _, threads := range []int{1, 2, 0} {
			b.Run(fmt.Sprintf("threads=%d/%s", threads, cache), func(b *testing.B) {
				benchTimed(b, cache, st.Size(), func() (time.Duration, error) {
					snap, err := image.Open(dir)
					if err != nil {
						return 0, err
					}
					defer snap.Close()
					res, err := engine.Restore(ctx, engine.RestoreOptions{Snapshot: snap, Threads: threads})
					if err != nil {
						return 0, err
					}
					if err := killChild(p.PID); err != nil {
						return 0, err
					}
					return res.ToRunning, nil
				})
			})
		}
	}
}

// benchTimed runs op b.N times (dropping the page cache first for a cold
// run), uses the durations it reports as the benchmark's time and reports
// their median, and the median rate over n bytes.
func benchTimed(b *testing.B, cache string, n int64, op func() (time.Duration, error)) {
	b.Helper()
	var runs []time.Duration
	b.ResetTimer()
	b.StopTimer()
	for range b.N {
		if cache == "cold" {
			if err := dropCaches(); err != nil {
				b.Fatal(err)
			}
		}
		d, err := op()
		if err != nil {
			b.Fatal(err)
		}
		runs = append(runs, d)
	}
	var total time.Duration
	for _, d := range runs {
		total += d
	}
	// The measured durations stand in for the benchmark's own clock.
	b.ReportMetric(float64(total.Nanoseconds())/float64(len(runs)), "ns/op")
	slices.Sort(runs)
	med := runs[len(runs)/2]
	b.ReportMetric(med.Seconds(), "median-s")
	b.ReportMetric(float64(n)/med.Seconds()/1e6, "MB/s")
}

// readAll reads path to the end in 1 MiB reads, like cat to /dev/null.
func readAll(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, make([]byte, 1<<20))
	return err
}

// dropCaches writes back dirty pages and drops the page cache.
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// killChild kills pid, a restored process reparented to us, and reaps it.
func killChild(pid int) error {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		return fmt.Errorf("kill restored %d: %w", pid, err)
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reap restored %d (not our child? %s): %w", pid, strconv.Itoa(pid), err)
		}
		return nil
	}
}
