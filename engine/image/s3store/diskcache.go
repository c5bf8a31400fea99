package s3store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
)

// DefaultCacheSize bounds a cache directory when no size is given.
const DefaultCacheSize = 8 << 30

// diskCache is a directory of chunks fetched from object stores, kept
// across runs (--cache-dir) so that a second restore on a host fetches
// nothing: one file per chunk, named by the object (endpoint, bucket,
// key, ETag, size) and the chunk's index, holding the chunk then its
// CRC32C. A chunk is checked against its CRC32C whenever it is read, and
// one that fails is removed and fetched again. The directory is bounded
// in bytes: past its size, the chunks used least recently (by mtime,
// touched on use) go first. Several processes may share it: a chunk is
// written to a temporary file and renamed into place.
//
// The directory must be the caller's (or root's) and writable by nobody
// else, as a snapshot directory must: its bytes become memory.
type diskCache struct {
	dir   string
	limit int64
	used  atomic.Int64 // bytes, as counted at open plus what was put since
	mu    sync.Mutex   // one eviction at a time
}

// cacheExt names chunk files; temporary ones start with ".tmp".
const cacheExt = ".chunk"

func openDiskCache(dir string, limit int64, trust bool) (*diskCache, error) {
	if limit <= 0 {
		limit = DefaultCacheSize
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache directory: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cache directory: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", dir, err)
	}
	if !trust {
		if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
			return nil, fmt.Errorf("%w: cache directory %s belongs to uid %d, neither the caller (uid %d) nor root (--trust-snapshot accepts it)", image.ErrUntrusted, dir, st.Uid, euid)
		}
		if st.Mode&0o022 != 0 {
			return nil, fmt.Errorf("%w: cache directory %s is writable by group or others (mode %04o; --trust-snapshot accepts it)", image.ErrUntrusted, dir, st.Mode&0o7777)
		}
	}
	c := &diskCache{dir: dir, limit: limit}
	var used int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(path, cacheExt) {
			if info, err := d.Info(); err == nil {
				used += info.Size()
			}
		}
		return nil
	})
	c.used.Store(used)
	return c, nil
}

// path returns the file of chunk i of the object.
func (c *diskCache) path(cl *client, key string, o object, i int64) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%s\x00%s\x00%d", cl.endpoint, cl.addr.Bucket, key, o.etag, o.size))
	return filepath.Join(c.dir, fmt.Sprintf("%s-%d%s", hex.EncodeToString(h[:16]), i, cacheExt))
}

// get returns chunk i of the object, of n bytes, if the cache holds it
// whole and it passes its CRC32C.
func (c *diskCache) get(cl *client, key string, o object, i, n int64) ([]byte, bool) {
	p := c.path(cl, key, o, i)
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b := make([]byte, n+4)
	m, err := f.ReadAt(b, 0)
	var rest [1]byte
	if extra, _ := f.ReadAt(rest[:], n+4); m != len(b) || extra != 0 || codec.Checksum(b[:n]) != binary.LittleEndian.Uint32(b[n:]) {
		c.drop(p)
		return nil, false
	}
	now := time.Now()
	os.Chtimes(p, now, now) // used: evicted last
	return b[:n], true
}

// drop removes a chunk file that failed its check.
func (c *diskCache) drop(p string) {
	if info, err := os.Lstat(p); err == nil && os.Remove(p) == nil {
		c.used.Add(-info.Size())
	}
}

// put stores chunk i of the object. Errors are not the reader's: a chunk
// not cached is fetched again next time.
func (c *diskCache) put(cl *client, key string, o object, i int64, b []byte) {
	p := c.path(cl, key, o, i)
	size := int64(len(b) + 4)
	if size > c.limit {
		return
	}
	if c.used.Load()+size > c.limit {
		c.evict(size)
	}
	tmp, err := os.CreateTemp(c.dir, ".tmp-*")
	if err != nil {
		return
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], codec.Checksum(b))
	_, err = tmp.Write(b)
	if err == nil {
		_, err = tmp.Write(sum[:])
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return
	}
	c.used.Add(size)
}

// evict removes the chunks used least recently until need more bytes fit
// with a tenth of the limit to spare.
func (c *diskCache) evict(need int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used.Load()+need <= c.limit {
		return
	}
	type entry struct {
		path string
		size int64
		used time.Time
	}
	var all []entry
	var total int64
	entries, _ := os.ReadDir(c.dir)
	for _, d := range entries {
		if !d.Type().IsRegular() || !strings.HasSuffix(d.Name(), cacheExt) {
			continue
		}
		if info, err := d.Info(); err == nil {
			all = append(all, entry{filepath.Join(c.dir, d.Name()), info.Size(), info.ModTime()})
			total += info.Size()
		}
	}
	slices.SortFunc(all, func(a, b entry) int { return a.used.Compare(b.used) })
	target := c.limit - c.limit/10 - need
	for _, e := range all {
		if total <= target {
			break
		}
		if os.Remove(e.path) == nil {
			total -= e.size
		}
	}
	c.used.Store(total)
}
