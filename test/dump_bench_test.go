package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

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
	// Traced: engine.Dump traces it from this process, its parent.
	pid := fixture.StartWith(b, "counter", fixture.Options{Args: []string{size}, Traced: true}).PID
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
