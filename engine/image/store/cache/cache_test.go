package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// cacheCase is a cache in a fresh directory and a file's identity.
type cacheCase struct {
	dir string
	c   *Dir
	id  string
}

func newCacheCase(t *testing.T) *cacheCase {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cache")
	c, err := Open(dir, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return &cacheCase{dir: dir, c: c, id: "http://127.0.0.1:9\x00snaps\x00snap/pages-1.img\x00\"e1\"\x001048576"}
}

// plant writes a chunk file as a cache would, CRC32C included, into dir.
func (cc *cacheCase) plant(t *testing.T, dir string, i int64, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, chunkName(cc.id, i))
	sum := binary.LittleEndian.AppendUint32(nil, codec.Checksum(b))
	if err := os.WriteFile(p, append(bytes.Clone(b), sum...), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A cache directory given as a symbolic link is refused, naming it.
func TestCacheSymlinkRefused(t *testing.T) {
	real := filepath.Join(t.TempDir(), "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	_, err := Open(link, 0, false)
	if !errors.Is(err, store.ErrUntrusted) || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), link) {
		t.Errorf("cache directory through a symlink: %v, want untrusted naming the link", err)
	}
}

// Once opened and checked, the cache reads and writes only the directory
// it checked: a symbolic link renamed over its path afterwards, to a
// directory holding a planted chunk with a right CRC32C, redirects
// nothing.
func TestCacheSwappedAfterCheck(t *testing.T) {
	cc := newCacheCase(t)
	good := bytes.Repeat([]byte("good"), 1024)
	cc.c.Put(cc.id, 0, good)

	evil := filepath.Join(t.TempDir(), "evil")
	if err := os.Mkdir(evil, 0o700); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Repeat([]byte("evil"), 1024)
	cc.plant(t, evil, 0, bad)
	cc.plant(t, evil, 1, bad)
	if err := os.Rename(cc.dir, cc.dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(evil, cc.dir); err != nil {
		t.Fatal(err)
	}
	if b, ok := cc.c.Get(cc.id, 0, int64(len(good))); !ok || !bytes.Equal(b, good) {
		t.Errorf("chunk 0 after the swap: %q... (%v), want the chunk put before it", b[:min(8, len(b))], ok)
	}
	if _, ok := cc.c.Get(cc.id, 1, int64(len(bad))); ok {
		t.Error("chunk 1 read from the directory swapped in")
	}
	cc.c.Put(cc.id, 2, good)
	if _, err := os.Stat(filepath.Join(cc.dir+".moved", chunkName(cc.id, 2))); err != nil {
		t.Errorf("a chunk put after the swap is not in the directory checked: %v", err)
	}
	if ents, _ := os.ReadDir(evil); len(ents) != 2 {
		t.Errorf("the directory swapped in has %d entries, want the 2 planted", len(ents))
	}
}

// A chunk file that is not a regular file of the caller's is a miss,
// removed; a FIFO does not block the read.
func TestCacheForeignChunks(t *testing.T) {
	testutil.RequireRoot(t)
	cc := newCacheCase(t)
	data := bytes.Repeat([]byte{7}, 4096)

	p := cc.plant(t, cc.dir, 0, data)
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, ok := cc.c.Get(cc.id, 0, int64(len(data))); ok {
		t.Error("a chunk owned by another user was used")
	}
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the foreign chunk is still there: %v", err)
	}

	fifo := filepath.Join(cc.dir, chunkName(cc.id, 1))
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() {
		_, ok := cc.c.Get(cc.id, 1, int64(len(data)))
		done <- ok
	}()
	select {
	case ok := <-done:
		if ok {
			t.Error("a FIFO was read as a chunk")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("get blocked on a FIFO planted as a chunk")
	}

	target := cc.plant(t, t.TempDir(), 2, data)
	link := filepath.Join(cc.dir, chunkName(cc.id, 2))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, ok := cc.c.Get(cc.id, 2, int64(len(data))); ok {
		t.Error("a chunk read through a symbolic link")
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("the symbolic link's target was removed: %v", err)
	}
	// And one of ours, right, is used.
	cc.plant(t, cc.dir, 3, data)
	if b, ok := cc.c.Get(cc.id, 3, int64(len(data))); !ok || !bytes.Equal(b, data) {
		t.Error("a good chunk of ours was not used")
	}
}

// Eviction goes through the directory's descriptor too, oldest first.
func TestCacheEvicts(t *testing.T) {
	cc := newCacheCase(t)
	cc.c.limit = 40 << 10
	chunk := bytes.Repeat([]byte{1}, 10<<10)
	for i := range int64(6) {
		cc.c.Put(cc.id, i, chunk)
		// mtimes a second apart at most: make them distinct
		old := time.Now().Add(time.Duration(i-10) * time.Minute)
		os.Chtimes(filepath.Join(cc.dir, chunkName(cc.id, i)), old, old)
	}
	if used := cc.c.used.Load(); used > cc.c.limit {
		t.Errorf("%d bytes used, limit %d", used, cc.c.limit)
	}
	if _, ok := cc.c.Get(cc.id, 0, int64(len(chunk))); ok {
		t.Error("the oldest chunk survived eviction")
	}
	if _, ok := cc.c.Get(cc.id, 5, int64(len(chunk))); !ok {
		t.Error("the newest chunk was evicted")
	}
}

// TestCacheClosed: once closed, the cache is a miss for every chunk
// and stores none, never using its descriptor (whose number may name
// another file by then); a close under way waits for the uses in flight.
func TestCacheClosed(t *testing.T) {
	cc := newCacheCase(t)
	b := bytes.Repeat([]byte{7}, 4096)
	cc.c.Put(cc.id, 0, b)
	if got, ok := cc.c.Get(cc.id, 0, int64(len(b))); !ok || !bytes.Equal(got, b) {
		t.Fatal("a chunk put is not got back")
	}
	cc.c.close()
	cc.c.close() // twice is fine
	if _, ok := cc.c.Get(cc.id, 0, int64(len(b))); ok {
		t.Error("a closed cache gave a chunk")
	}
	cc.c.Put(cc.id, 1, b)
	if cc.c.Drop(cc.id, 0) {
		t.Error("a closed cache dropped a chunk")
	}
	if _, err := os.Stat(filepath.Join(cc.dir, chunkName(cc.id, 1))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a closed cache stored a chunk: %v", err)
	}
}

// TestCacheTransientOpenError: a chunk whose open fails for a reason
// of the moment (too many open files) is a miss, and stays for next time.
func TestCacheTransientOpenError(t *testing.T) {
	cc := newCacheCase(t)
	b := bytes.Repeat([]byte{9}, 4096)
	cc.c.Put(cc.id, 0, b)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Fill the descriptor table up to a lowered limit, then ask.
	low := lim
	var held []int
	func() {
		low.Cur = 64
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
			t.Skip(err)
		}
		defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
		for {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				break
			}
			held = append(held, fd)
		}
		_, ok := cc.c.Get(cc.id, 0, int64(len(b)))
		for _, fd := range held {
			unix.Close(fd)
		}
		if ok {
			t.Error("got a chunk with no descriptor free")
		}
	}()
	if got, ok := cc.c.Get(cc.id, 0, int64(len(b))); !ok || !bytes.Equal(got, b) {
		t.Error("the chunk was dropped for EMFILE")
	}
}

// TestCacheReadThrough: chunks the directory holds whole are read from
// it; a run with one missing is fetched, and kept; with read unset the
// directory is only filled.
func TestCacheReadThrough(t *testing.T) {
	cc := newCacheCase(t)
	chunk := func(i int64) []byte { return bytes.Repeat([]byte{byte(i)}, 4096) }
	size := func(int64) int64 { return 4096 }
	fetches := 0
	fetch := func(lo, hi int64) func() ([][]byte, error) {
		return func() ([][]byte, error) {
			fetches++
			var out [][]byte
			for i := lo; i < hi; i++ {
				out = append(out, chunk(i))
			}
			return out, nil
		}
	}
	if _, cached, err := cc.c.ReadThrough(cc.id, 0, 2, size, false, fetch(0, 2)); err != nil || cached || fetches != 1 {
		t.Fatalf("fill: cached %v, %v, %d fetches", cached, err, fetches)
	}
	if _, cached, _ := cc.c.ReadThrough(cc.id, 0, 2, size, false, fetch(0, 2)); cached || fetches != 2 {
		t.Errorf("read unset: cached %v, %d fetches, want the store asked", cached, fetches)
	}
	got, cached, err := cc.c.ReadThrough(cc.id, 0, 2, size, true, fetch(0, 2))
	if err != nil || !cached || fetches != 2 || !bytes.Equal(got[1], chunk(1)) {
		t.Errorf("held whole: cached %v, %v, %d fetches", cached, err, fetches)
	}
	if _, cached, _ := cc.c.ReadThrough(cc.id, 1, 3, size, true, fetch(1, 3)); cached || fetches != 3 {
		t.Errorf("one missing: cached %v, %d fetches, want the run fetched", cached, fetches)
	}
	if b, ok := cc.c.Get(cc.id, 2, 4096); !ok || !bytes.Equal(b, chunk(2)) {
		t.Error("a chunk fetched through was not kept")
	}
	fail := errors.New("no answer")
	if _, _, err := cc.c.ReadThrough(cc.id, 5, 6, size, true, func() ([][]byte, error) { return nil, fail }); err != fail {
		t.Errorf("a failed fetch: %v, want its error", err)
	}
}
