package fs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// bigLayout returns n VMAs of size bytes of mixed model-server memory
// (1/4 zero, 1/4 random, 1/2 bf16-like), each with a hole.
func bigLayout(n int, size uint64) []imagetest.VMA {
	var v []imagetest.VMA
	a := uint64(0x7f1000000000)
	for i := 0; i < n; i++ {
		v = append(v, imagetest.VMA{Start: a, End: a + size, Prot: protRW, Content: imagetest.Mixed, Name: fmt.Sprintf("[anon:shard%d]", i),
			Holes: [][2]uint64{{size / 2, size/2 + pages(16)}}})
		a += size + pages(1)
	}
	return v
}

// TestConcurrentReaders runs 8 readers at once over a large snapshot:
// cat processes over every region (checked with sha256), and goroutines preading mem at
// random; every checksum and every chunk must match.
func TestConcurrentReaders(t *testing.T) {
	t0 := time.Now()
	const pid = 999
	total := uint64(256 << 20)
	if raceEnabled {
		total = 64 << 20
	}
	const nvma = 8
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: 256 << 10, Mode: codec.Compress},
		imagetest.Process{PID: pid, Seed: 3, VMAs: bigLayout(nvma, total/nvma)})
	if err != nil {
		t.Fatal(err)
	}
	// a cache smaller than the snapshot, so blocks are evicted and decoded again
	srv, _ := mount(t, s.Dir, Options{CacheSize: 32 << 20, DecompressThreads: 0})
	vmas := bigLayout(nvma, total/nvma)
	sums := map[string]string{}
	var regions []string
	for _, v := range vmas {
		p := filepath.Join(srv.Mountpoint(), strconv.Itoa(pid), "regions", regionName(imageVMA(v)))
		sum := sha256.Sum256(s.Memory(pid, v.Start, int(v.End-v.Start)))
		sums[p] = hex.EncodeToString(sum[:])
		regions = append(regions, p)
	}

	t.Logf("snapshot and checksums: %v", time.Since(t0))
	testutil.RequireCommand(t, "cat")
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range regions {
				p := regions[(k+2*i)%len(regions)]
				if got, err := catSum(p); err != nil || got != sums[p] {
					errs <- fmt.Errorf("reader %d: cat %s: sha256 %s (%v), want %s", i, p, got, err, sums[p])
				}
			}
		}()
	}
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(srv.MemPath(pid))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			lo, hi := vmas[0].Start, vmas[len(vmas)-1].End
			for k := 0; k < 64; k++ {
				off := lo + r.Uint64N(hi-lo-(1<<20))
				got := make([]byte, 1<<20)
				if _, err := f.ReadAt(got, int64(off)); err != nil {
					errs <- fmt.Errorf("pread reader %d at %#x: %w", i, off, err)
					return
				}
				if !bytes.Equal(got, s.Memory(pid, off, len(got))) {
					errs <- fmt.Errorf("pread reader %d at %#x: differs", i, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("8 readers: %v", time.Since(t0))
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// catSum reads path with cat, in its own process, and returns the sha256
// of what it printed.
func catSum(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "cat", path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	h := sha256.New()
	_, cerr := io.Copy(h, out)
	if err := cmd.Wait(); err != nil {
		return "", err
	}
	if cerr != nil {
		return "", cerr
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
