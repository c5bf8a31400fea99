package s3_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/test/fixture"
)

// setup starts MinIO with a bucket and points the AWS_* variables and the
// request log at it.
func setup(t *testing.T) (*fixture.MinIO, store.Options, string) {
	t.Helper()
	m := fixture.StartMinIO(t)
	m.MakeBucket("snaps")
	for _, kv := range m.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	trace := filepath.Join(t.TempDir(), "trace.log")
	t.Setenv("LAZYFS_S3_TRACE", trace)
	return m, store.Options{Endpoint: m.Endpoint}, trace
}

// gets counts the ranged GETs of name in the request log.
func gets(t *testing.T, trace, name string) int {
	t.Helper()
	b, err := os.ReadFile(trace)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, " GET ") && strings.Contains(l, "/"+name+" bytes=") {
			n++
		}
	}
	return n
}

func write(t *testing.T, addr string, o store.Options, files map[string][]byte) {
	t.Helper()
	w, err := s3.Create(addr, o)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		u, err := w.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(b); off += 3 << 20 { // writes that do not fall on parts
			if _, err := u.Write(b[off:min(len(b), off+3<<20)]); err != nil {
				t.Fatal(err)
			}
		}
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit([]byte("{}\n")); err != nil {
		t.Fatal(err)
	}
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestRoundTrip writes a file of several parts and a small one, reads
// them back by ranges, sequentially and at random, and checks that a
// second dump into the prefix is refused.
func TestRoundTrip(t *testing.T) {
	_, o, trace := setup(t)
	big, small := random(40<<20+12345, 1), []byte("small file\n")
	addr := "s3://snaps/host1/snap"
	write(t, addr, o, map[string][]byte{"pages-1.img": big, "state.json": small})
	if _, err := s3.Create(addr, o); !errors.Is(err, image.ErrExists) {
		t.Fatalf("second dump into %s: %v, want ErrExists", addr, err)
	}
	s, err := s3.Open(addr, o)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.Stat("pages-1.img"); err != nil || n != int64(len(big)) {
		t.Fatalf("stat: %d, %v", n, err)
	}
	if _, err := s.Stat("nope"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing file: %v", err)
	}
	if _, err := s.Stat(".lazyfs-dump.lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dump's lock is still there: %v", err)
	}
	f, err := s.Open("pages-1.img")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Sequential 256 KiB reads: coalesced GETs and readahead, far fewer
	// GETs than reads.
	buf := make([]byte, 256<<10)
	reads := 0
	for off := 0; off < len(big); off += len(buf) {
		n, err := f.ReadAt(buf, int64(off))
		if n != min(len(buf), len(big)-off) || (err != nil && n == len(buf)) {
			t.Fatalf("read at %d: %d, %v", off, n, err)
		}
		if !bytes.Equal(buf[:n], big[off:off+n]) {
			t.Fatalf("read at %d: wrong bytes", off)
		}
		reads++
	}
	if g := gets(t, trace, "pages-1.img"); g == 0 || g > reads/4 {
		t.Errorf("%d sequential reads made %d GETs", reads, g)
	}
	r := rand.New(rand.NewPCG(2, 2))
	for range 200 {
		off, n := r.IntN(len(big)), r.IntN(3<<20)
		p := make([]byte, n)
		got, err := f.ReadAt(p, int64(off))
		want := min(n, len(big)-off)
		if got != want || (got < n && err == nil) || !bytes.Equal(p[:got], big[off:off+want]) {
			t.Fatalf("read %d at %d: %d bytes, %v", n, off, got, err)
		}
	}
	sf, _ := s.Open("state.json")
	p := make([]byte, len(small))
	if _, err := sf.ReadAt(p, 0); err != nil || !bytes.Equal(p, small) {
		t.Fatalf("small file: %q, %v", p, err)
	}
}

// TestCacheDir reads a file twice through a cache directory: the second
// store fetches nothing, and a chunk damaged on disk is fetched again
// rather than used.
func TestCacheDir(t *testing.T) {
	_, o, trace := setup(t)
	data := random(5<<20+100, 3)
	addr := "s3://snaps/cached"
	write(t, addr, o, map[string][]byte{"pages-1.img": data})
	o.CacheDir = filepath.Join(t.TempDir(), "cache")
	readAll := func() {
		t.Helper()
		s, err := s3.Open(addr, o)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := s.Open("pages-1.img")
		defer f.Close()
		p := make([]byte, len(data))
		if n, err := f.ReadAt(p, 0); n != len(p) || !bytes.Equal(p, data) {
			t.Fatalf("read: %d bytes, %v", n, err)
		}
	}
	readAll()
	first := gets(t, trace, "pages-1.img")
	readAll()
	if g := gets(t, trace, "pages-1.img"); g != first {
		t.Fatalf("second read through the cache made %d GETs of block data", g-first)
	}
	chunks, _ := filepath.Glob(filepath.Join(o.CacheDir, "*.chunk"))
	if len(chunks) != 6 {
		t.Fatalf("%d chunks cached, want 6", len(chunks))
	}
	b, _ := os.ReadFile(chunks[0])
	b[100] ^= 1
	os.WriteFile(chunks[0], b, 0o600)
	readAll()
	if g := gets(t, trace, "pages-1.img"); g != first+1 {
		t.Fatalf("a damaged chunk made %d GETs, want 1", g-first)
	}
	// A cache directory another user could write is refused.
	os.Chmod(o.CacheDir, 0o777)
	if _, err := s3.Open(addr, o); !errors.Is(err, image.ErrUntrusted) {
		t.Fatalf("cache directory writable by others: %v", err)
	}
}

// TestStoreGone stops the server under a reader: reads fail (no bytes),
// then work again once it is back.
func TestStoreGone(t *testing.T) {
	m, o, _ := setup(t)
	data := random(4<<20, 4)
	addr := "s3://snaps/gone"
	write(t, addr, o, map[string][]byte{"pages-1.img": data})
	o.ReadTimeout = 5 * time.Second
	s, err := s3.Open(addr, o)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := s.Open("pages-1.img")
	defer f.Close()
	m.Stop()
	p := make([]byte, 4096)
	start := time.Now()
	if n, err := f.ReadAt(p, 1<<20); err == nil || n != 0 {
		t.Fatalf("read with the store gone: %d bytes, %v", n, err)
	} else {
		t.Logf("read with the store gone failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	m.Start()
	if n, err := f.ReadAt(p, 1<<20); err != nil || !bytes.Equal(p[:n], data[1<<20:1<<20+4096]) {
		t.Fatalf("read once the store is back: %d, %v", n, err)
	}
}

// TestErrors: a missing bucket and refused credentials are one clear
// error each, matching os.ErrNotExist and os.ErrPermission.
func TestErrors(t *testing.T) {
	_, o, _ := setup(t)
	if _, err := s3.Open("s3://nobucket/x", o); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nobucket") {
		t.Errorf("missing bucket: %v", err)
	}
	if _, err := s3.Create("s3://nobucket/x", o); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dump to a missing bucket: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
	if _, err := s3.Open("s3://snaps/x", o); !errors.Is(err, os.ErrPermission) {
		t.Errorf("wrong credentials: %v", err)
	} else {
		t.Log(err)
	}
	for _, bad := range []string{"s3://", "s3:///x", "s3://b/../x", "s3://b/a//c"} {
		if _, err := s3.ParseAddress(bad); !errors.Is(err, s3.ErrAddress) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
