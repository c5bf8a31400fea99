package uffd

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// memSrc is an in-memory source: the bytes of [base, base+len(data)).
type memSrc struct {
	base uint64
	data []byte
}

func (s *memSrc) ReadAt(b []byte, off int64) (int, error) {
	a := uint64(off) - s.base
	if uint64(off) < s.base || a+uint64(len(b)) > uint64(len(s.data)) {
		return 0, fmt.Errorf("memSrc: read %#x+%#x outside", off, len(b))
	}
	return copy(b, s.data[a:]), nil
}

func newMemSrc(base, size uint64) *memSrc {
	s := &memSrc{base: base, data: make([]byte, size)}
	(&patternSrc{}).fill(s.data, base)
	return s
}

// cut returns n extents of size ext from base.
func cut(base, ext uint64, n int) []Extent {
	e := make([]Extent, n)
	for i := range e {
		e[i] = Extent{base + uint64(i)*ext, ext}
	}
	return e
}

// BenchmarkFault measures the cost of a fault served a whole extent, seen
// from the faulting thread (one read per extent of fresh memory), with
// the pager's thread on CPU 0 and the process on CPU 0 (same) or 1
// (cross). ns/op is per fault, including pipe round trips per batch;
// fault-us is the faulting thread's own mean, p50-us its median.
func BenchmarkFault(b *testing.B) {
	if n := unix.Getpagesize(); n != PageSize {
		b.Skipf("page size %d", n)
	}
	const region = 64 << 20
	f, fd, base := startMapped(b, region)
	src := newMemSrc(base, region)
	var cpu0 unix.CPUSet
	cpu0.Set(0)
	for _, ext := range []uint64{4 << 10, 64 << 10, 256 << 10, 1 << 20} {
		for _, place := range []string{"same", "cross", "cross-spin"} {
			b.Run(fmt.Sprintf("%dK/%s", ext>>10, place), func(b *testing.B) {
				var spin time.Duration
				if place == "cross-spin" {
					spin = 200 * time.Microsecond
				}
				f.do("cpu %x", map[string]int{"same": 0, "cross": 1, "cross-spin": 1}[place])
				b.SetBytes(int64(ext))
				var totalNs, faults uint64
				var p50s, service []float64
				b.ResetTimer()
				for done := 0; done < b.N; {
					n := min(b.N-done, int(region/ext))
					b.StopTimer()
					if _, err := uffdio.Register(fd, base, region, uffdio.RegisterModeMissing); err != nil {
						b.Fatal(err)
					}
					p := New(fd, src, cut(base, ext, n), Options{Affinity: &cpu0, Spin: spin})
					ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
					errc := make(chan error, 1)
					go func() { errc <- p.Run(ctx) }()
					b.StartTimer()
					r := f.do("touch %x %x %x", base, uint64(n)*ext, ext)
					err := <-errc
					b.StopTimer()
					cancel()
					if err != nil {
						b.Fatal(err)
					}
					faults += r[0]
					totalNs += r[3]
					p50s = append(p50s, float64(r[1])/1e3)
					service = append(service, float64(p.Stats().FaultP50)/1e3)
					if err := uffdio.Unregister(fd, base, region); err != nil {
						b.Fatal(err)
					}
					f.do("remap %x %x", base, region)
					b.StartTimer()
					done += n
				}
				b.ReportMetric(float64(totalNs)/float64(faults)/1e3, "fault-us")
				b.ReportMetric(median(p50s), "p50-us")
				b.ReportMetric(median(service), "serve-p50-us")
			})
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkPrefetch measures how fast the prefetcher fills 256 MiB of
// fresh (not pre-touched) memory, untouched by the process, no CPU
// pinning, from an in-memory source (a memcpy per read) or from a source
// that computes its bytes at about the speed of an LZ4 decode (decode),
// with and without read-ahead, or with prefetch workers.
func BenchmarkPrefetch(b *testing.B) {
	const region = 256 << 20
	f, fd, base := startMapped(b, region)
	mem := newMemSrc(base, region)
	ext := cut(base, 256<<10, region/(256<<10))
	decode := newPatternSrc(ext)
	for _, tc := range []struct {
		name    string
		src     io.ReaderAt
		chunk   uint64
		ra      int
		workers int
	}{
		{"mem/chunk256K", mem, 256 << 10, 0, 0},
		{"mem/chunk1M", mem, 1 << 20, 0, 0},
		{"mem/chunk4M", mem, 4 << 20, 0, 0},
		{"mem/chunk1M-noreadahead", mem, 1 << 20, -1, 0},
		{"mem/chunk256K-workers2", mem, 256 << 10, 0, 2},
		{"mem/chunk1M-workers2", mem, 1 << 20, 0, 2},
		{"decode/chunk1M", decode, 1 << 20, 0, 0},
		{"decode/chunk1M-noreadahead", decode, 1 << 20, -1, 0},
		{"decode/chunk1M-workers1", decode, 1 << 20, 0, 1},
		{"decode/chunk1M-workers2", decode, 1 << 20, 0, 2},
		{"decode/chunk256K-workers2", decode, 256 << 10, 0, 2},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(region)
			for range b.N {
				b.StopTimer()
				if _, err := uffdio.Register(fd, base, region, uffdio.RegisterModeMissing); err != nil {
					b.Fatal(err)
				}
				p := New(fd, tc.src, ext, Options{Prefetch: true, PrefetchChunk: tc.chunk, ReadAhead: tc.ra, Workers: tc.workers})
				ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
				b.StartTimer()
				err := p.Run(ctx)
				b.StopTimer()
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				if err := uffdio.Unregister(fd, base, region); err != nil {
					b.Fatal(err)
				}
				f.do("remap %x %x", base, region)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkCopyRaw is the floor for BenchmarkPrefetch: UFFDIO_COPY of
// 256 MiB of fresh memory in chunks from one buffer, no source reads.
func BenchmarkCopyRaw(b *testing.B) {
	const region = 256 << 20
	f, fd, base := startMapped(b, region)
	for _, chunk := range []uint64{256 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("chunk%dK", chunk>>10), func(b *testing.B) {
			buf := make([]byte, chunk)
			(&patternSrc{}).fill(buf, 0)
			b.SetBytes(region)
			for range b.N {
				b.StopTimer()
				if _, err := uffdio.Register(fd, base, region, uffdio.RegisterModeMissing); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				for a := base; a < base+region; a += chunk {
					if _, err := uffdio.Copy(fd, a, buf, 0); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if err := uffdio.Unregister(fd, base, region); err != nil {
					b.Fatal(err)
				}
				f.do("remap %x %x", base, region)
				b.StartTimer()
			}
		})
	}
}
