package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/helper"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
)

// The benchmarks read a ~1 GiB snapshot of model-server-like memory
// (1/4 zero, 1/4 random, 1/2 bf16-like, 256 KiB blocks, 8 VMAs) through a
// mount, beside a plain read of the same decoded bytes from a regular file
// in the same run. "cold" means a fresh mount (empty block cache) with the
// kernel's caches dropped (root only: echo 3 > /proc/sys/vm/drop_caches);
// "warm" rereads with everything cached. Set LAZYFS_BENCH_MB to change the
// size.

const benchPID = 1000

// benchSnapshot is built once per test binary run.
type benchSnapshot struct {
	once  sync.Once
	dir   string
	snap  *imagetest.Snapshot
	plain string // the dumped memory, decoded, as a regular file
	vmas  []imagetest.VMA
	err   error
}

var bench benchSnapshot

func (bs *benchSnapshot) get(b *testing.B) *benchSnapshot {
	b.Helper()
	bs.once.Do(func() {
		mb := 1024
		if v := os.Getenv("LAZYFS_BENCH_MB"); v != "" {
			fmt.Sscan(v, &mb)
		}
		bs.dir, bs.err = os.MkdirTemp("", "lazyfs-bench-")
		if bs.err != nil {
			return
		}
		bs.vmas = bigLayout(8, uint64(mb)<<20/8)
		bs.snap, bs.err = imagetest.Write(filepath.Join(bs.dir, "snap"), image.Options{BlockSize: 256 << 10, Mode: codec.Compress},
			imagetest.Process{PID: benchPID, Seed: 11, VMAs: bs.vmas})
		if bs.err != nil {
			return
		}
		bs.plain = filepath.Join(bs.dir, "plain")
		bs.err = writePlain(bs.plain, bs.snap, bs.vmas)
	})
	if bs.err != nil {
		b.Fatal(bs.err)
	}
	return bs
}

// writePlain writes the memory of the benchmark's VMAs back to back.
func writePlain(path string, s *imagetest.Snapshot, vmas []imagetest.VMA) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	for _, v := range vmas {
		for a := v.Start; a < v.End; a += uint64(len(buf)) {
			n := min(uint64(len(buf)), v.End-a)
			s.Fill(benchPID, buf[:n], a)
			if _, err := f.Write(buf[:n]); err != nil {
				f.Close()
				return err
			}
		}
	}
	return f.Close()
}

func TestMain(m *testing.M) {
	helper.Main() // the private mount's helper, this test binary executed again
	if dir := os.Getenv(privateChildEnv); dir != "" {
		os.Exit(privateChildMain(dir))
	}
	if path := os.Getenv(preadWorkerEnv); path != "" {
		os.Exit(preadMain(path))
	}
	code := m.Run()
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	os.Exit(code)
}

// dropCaches empties the kernel's page cache; it reports false when not
// permitted (not root).
func dropCaches() bool {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0) == nil
}

// mustDropCaches drops the page cache or skips a cold benchmark.
func mustDropCaches(b *testing.B) {
	b.Helper()
	if !dropCaches() {
		b.Skip("cold benchmark needs root to drop the page cache")
	}
}

// readSeq reads [lo, hi) of the file at path sequentially with 1 MiB
// reads, as dd does it in its own process (a reader inside the serving
// process would share its two Ps with the server).
func readSeq(b *testing.B, path string, lo, hi int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "dd", "if="+path, "of=/dev/null", "bs=1M", "iflag=skip_bytes,count_bytes",
		fmt.Sprintf("skip=%d", lo), fmt.Sprintf("count=%d", hi-lo), "status=none").CombinedOutput()
	if err != nil {
		b.Fatalf("dd %s: %v\n%s", path, err, out)
	}
}

func BenchmarkSequentialRead(b *testing.B) {
	bs := bench.get(b)
	lo, hi := int64(bs.vmas[0].Start), int64(bs.vmas[len(bs.vmas)-1].End)
	st, err := os.Stat(bs.plain)
	if err != nil {
		b.Fatal(err)
	}
	for _, cold := range []bool{true, false} {
		temp := map[bool]string{true: "cold", false: "warm"}[cold]
		b.Run("plain-file/"+temp, func(b *testing.B) {
			b.SetBytes(st.Size())
			readSeq(b, bs.plain, 0, st.Size()) // warm it (or check it)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if cold {
					b.StopTimer()
					mustDropCaches(b)
					b.StartTimer()
				}
				readSeq(b, bs.plain, 0, st.Size())
			}
		})
		for _, direct := range []bool{false, true} {
			mode := map[bool]string{false: "keep-cache", true: "direct-io"}[direct]
			b.Run(fmt.Sprintf("lazyfs-mem-%s/%s", mode, temp), func(b *testing.B) {
				b.SetBytes(hi - lo)
				srv, _ := mount(b, bs.snap.Dir, Options{DirectIO: direct})
				readSeq(b, srv.MemPath(benchPID), lo, hi)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if cold {
						b.StopTimer()
						srv.Unmount()
						mustDropCaches(b)
						srv, _ = mount(b, bs.snap.Dir, Options{DirectIO: direct})
						b.StartTimer()
					}
					readSeq(b, srv.MemPath(benchPID), lo, hi)
				}
			})
		}
	}
}

// BenchmarkRandomPread reads 4 KiB at one random page of every block of
// the dumped memory, in random order, from a separate process (as
// snapctl's fault handler does), and reports latency percentiles:
//
//	cold      fresh mount, kernel caches dropped (root): the block is
//	          read from disk and decoded
//	uncached  fresh mount, snapshot files in the page cache: the block is
//	          decoded (the first touch of every block)
//	cached    the same offsets again: page cache (keep-cache) or block
//	          cache (direct-io)
func BenchmarkRandomPread(b *testing.B) {
	bs := bench.get(b)
	r := rand.New(rand.NewPCG(1, 2))
	var offs []int64
	for _, v := range bs.vmas {
		for a := v.Start; a+4096 <= v.End; a += 256 << 10 {
			offs = append(offs, int64(a+uint64(r.IntN(64))*4096))
		}
	}
	r.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
	offs = offs[:min(len(offs), 512)] // 128 MiB of blocks: they fit the block cache
	pct := func(lat []time.Duration, p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3
	}
	for _, direct := range []bool{false, true} {
		mode := map[bool]string{false: "keep-cache", true: "direct-io"}[direct]
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if dropCaches() {
					srv, _ := mount(b, bs.snap.Dir, Options{DirectIO: direct})
					cold := preadWorker(b, srv.MemPath(benchPID), offs)
					srv.Unmount()
					b.ReportMetric(pct(cold, 0.5), "cold-p50-µs")
					b.ReportMetric(pct(cold, 0.99), "cold-p99-µs")
				}
				srv, _ := mount(b, bs.snap.Dir, Options{DirectIO: direct, CacheSize: benchCacheSize()})
				unc := preadWorker(b, srv.MemPath(benchPID), offs)
				cached := preadWorker(b, srv.MemPath(benchPID), offs)
				srv.Unmount()
				b.ReportMetric(pct(unc, 0.5), "uncached-p50-µs")
				b.ReportMetric(pct(unc, 0.99), "uncached-p99-µs")
				b.ReportMetric(pct(cached, 0.5), "cached-p50-µs")
				b.ReportMetric(pct(cached, 0.99), "cached-p99-µs")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// benchCacheSize is the block cache of the random-read benchmark
// (LAZYFS_BENCH_CACHE, default the mount's default).
func benchCacheSize() int64 {
	var n int64
	fmt.Sscan(os.Getenv("LAZYFS_BENCH_CACHE"), &n)
	return n
}

// preadWorkerEnv makes the test binary a pread worker (see preadMain).
const preadWorkerEnv = "LAZYFS_BENCH_PREAD_FILE"

// preadWorker runs this test binary as a separate process that preads
// 4 KiB at each offset of path and returns the sorted latencies.
func preadWorker(b *testing.B, path string, offs []int64) []time.Duration {
	b.Helper()
	in := make([]byte, 8*len(offs))
	for i, o := range offs {
		binary.LittleEndian.PutUint64(in[8*i:], uint64(o))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), preadWorkerEnv+"="+path)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || len(out) != len(in) {
		b.Fatalf("pread worker: %v (%d bytes out)\n%s", err, len(out), stderr.String())
	}
	lat := make([]time.Duration, len(offs))
	for i := range lat {
		lat[i] = time.Duration(binary.LittleEndian.Uint64(out[8*i:]))
	}
	slices.Sort(lat)
	return lat
}

// preadMain is the pread worker: offsets on stdin, latencies in ns on
// stdout, both as little-endian uint64s.
func preadMain(path string) int {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return 1
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM)
	buf := make([]byte, 4096)
	out := make([]byte, len(in))
	for i := 0; i+8 <= len(in); i += 8 {
		t0 := time.Now()
		if _, err := unix.Pread(fd, buf, int64(binary.LittleEndian.Uint64(in[i:]))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		binary.LittleEndian.PutUint64(out[i:], uint64(time.Since(t0)))
	}
	os.Stdout.Write(out)
	return 0
}
