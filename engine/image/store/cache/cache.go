// Package cache keeps the chunks a store fetched in a local directory
// across runs (--cache-dir), checked whenever they are used, so that a
// second restore on a host fetches nothing, and a snapshot's listing and
// local files beside them. It knows nothing of what a store is: a chunk
// is named by the identity its store gives the file (for S3: endpoint,
// bucket, key, ETag and size) and its index.
package cache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// DefaultSize bounds a cache directory when no size is given.
const DefaultSize = 8 << 30

// Dir is a directory of chunks fetched from stores, kept across runs
// (--cache-dir) so that a second restore on a host fetches nothing: one
// file per chunk, named by the file's identity (for an object: endpoint,
// bucket, key, ETag, size) and the chunk's index, holding the chunk then
// its CRC32C. A chunk is checked against its CRC32C whenever it is read, and
// one that fails is removed and fetched again. The directory is bounded
// in bytes: past its size, the chunks used least recently (by mtime,
// touched on use) go first. Several processes may share it: a chunk is
// written to a temporary file and renamed into place.
//
// The directory must be the caller's (or root's) and writable by nobody
// else, as a snapshot directory must: its bytes become memory. It is
// opened once, not through a symbolic link, and checked through that
// descriptor; every chunk is then opened, created, renamed and removed
// relative to it, never by a path, so that nothing done to the path after
// the check (a symbolic link renamed over it) redirects a chunk. A chunk
// file must be a regular file of the caller's: anything else (a file
// planted by another user, a FIFO, a symbolic link) is a miss, removed
// and fetched again.
type Dir struct {
	name  string   // the directory as given, for messages
	dir   *os.File // the directory, opened once
	trust bool     // --trust-snapshot: chunks of other owners accepted
	limit int64
	used  atomic.Int64 // bytes, as counted at open plus what was put since
	mu    sync.Mutex   // one eviction at a time

	// life guards dir against close: every use holds it for reading,
	// close for writing, so that a descriptor is never used after close
	// (its number may name another file by then).
	life   sync.RWMutex
	closed bool
	// refs counts the store and its open files: files outlive the store,
	// and the directory is closed when the last of them is.
	refs atomic.Int64
}

// Retain counts one more user of the directory; false if it is closed.
func (c *Dir) Retain() bool {
	for {
		n := c.refs.Load()
		if n <= 0 {
			return false
		}
		if c.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Unref ends a use (Open's, or Retain's); the last closes the directory.
func (c *Dir) Unref() {
	if c.refs.Add(-1) == 0 {
		c.close()
	}
}

// hold keeps the directory open until release; false if it is closed.
func (c *Dir) hold() bool {
	c.life.RLock()
	if c.closed {
		c.life.RUnlock()
		return false
	}
	return true
}

func (c *Dir) release() { c.life.RUnlock() }

// close closes the directory, once every use under way has ended.
func (c *Dir) close() {
	c.life.Lock()
	defer c.life.Unlock()
	if !c.closed {
		c.closed = true
		c.dir.Close()
	}
}

// cacheExt names chunk files; temporary ones start with ".tmp".
const cacheExt = ".chunk"

// Open opens the cache directory dir, made if missing, bounded to limit
// bytes (DefaultSize if 0). Unless trust, a directory another user can
// change is refused (store.ErrUntrusted), as is one given by a symbolic
// link. The caller holds one use of it (Unref).
func Open(dir string, limit int64, trust bool) (*Dir, error) {
	if limit <= 0 {
		limit = DefaultSize
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache directory: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if fi, lerr := os.Lstat(dir); err != nil && lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
		// ELOOP, or ENOTDIR with O_DIRECTORY
		return nil, fmt.Errorf("%w: cache directory %s is a symbolic link: give the directory it points to", store.ErrUntrusted, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("cache directory: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	d := os.NewFile(uintptr(fd), dir)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, fmt.Errorf("cache directory %s: %w", dir, err)
	}
	if !trust {
		if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
			d.Close()
			return nil, fmt.Errorf("%w: cache directory %s belongs to uid %d, neither the caller (uid %d) nor root (--trust-snapshot accepts it)", store.ErrUntrusted, dir, st.Uid, euid)
		}
		if st.Mode&0o022 != 0 {
			d.Close()
			return nil, fmt.Errorf("%w: cache directory %s is writable by group or others (mode %04o; --trust-snapshot accepts it)", store.ErrUntrusted, dir, st.Mode&0o7777)
		}
	}
	c := &Dir{name: dir, dir: d, trust: trust, limit: limit}
	c.refs.Store(1) // the opener's
	var used int64
	for _, e := range c.list() {
		used += e.size
	}
	c.used.Store(used)
	return c, nil
}

// fd is the directory's descriptor.
func (c *Dir) fd() int { return int(c.dir.Fd()) }

// chunkName returns the name of chunk i of the file whose identity is id
// in the directory.
func chunkName(id string, i int64) string {
	h := sha256.Sum256([]byte(id))
	return fmt.Sprintf("%s-%d%s", hex.EncodeToString(h[:16]), i, cacheExt)
}

// openChunk opens the chunk file name of the directory for reading, beneath
// it and through no symbolic link (openat2 where the kernel has it; the
// name has no slash, so openat with O_NOFOLLOW is the same on older ones),
// without blocking on a FIFO.
func (c *Dir) openChunk(name string) (*os.File, error) {
	flags := uint64(unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY)
	fd, err := unix.Openat2(c.fd(), name, &unix.OpenHow{
		Flags:   flags,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No openat2 here, or a seccomp filter that refuses it
		// (some container runtimes' answer is EPERM).
		fd, err = unix.Openat(c.fd(), name, int(flags), 0)
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// usable reports whether an opened chunk file may be read: a regular file
// of the caller's (of anyone's with --trust-snapshot).
func (c *Dir) usable(f *os.File) (int64, bool) {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, false
	}
	if !c.trust && st.Uid != uint32(os.Geteuid()) {
		return 0, false
	}
	return st.Size, true
}

// Get returns chunk i of the file id, of n bytes, if the cache holds it
// whole and it passes its CRC32C.
func (c *Dir) Get(id string, i, n int64) ([]byte, bool) {
	if !c.hold() {
		return nil, false
	}
	defer c.release()
	name := chunkName(id, i)
	f, err := c.openChunk(name)
	if err != nil {
		// A symbolic link (or a file behind a mount) is not a chunk; an
		// error of this moment (EMFILE, EINTR, ENOMEM) leaves the chunk
		// for next time.
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			c.dropHeld(name)
		}
		return nil, false
	}
	defer f.Close()
	size, ok := c.usable(f)
	if !ok || size != n+4 {
		c.dropHeld(name)
		return nil, false
	}
	b := make([]byte, n+4)
	m, err := f.ReadAt(b, 0)
	if m != len(b) && err != nil && !errors.Is(err, io.EOF) {
		return nil, false // a read error of this moment: left for next time
	}
	if m != len(b) || codec.Checksum(b[:n]) != binary.LittleEndian.Uint32(b[n:]) {
		c.dropHeld(name)
		return nil, false
	}
	now := unix.NsecToTimeval(time.Now().UnixNano())
	unix.Futimes(int(f.Fd()), []unix.Timeval{now, now}) // used: evicted last
	return b[:n], true
}

// Drop removes chunk i of the file id, which failed a check of its
// reader; it reports whether there was one.
func (c *Dir) Drop(id string, i int64) bool {
	if !c.hold() {
		return false
	}
	defer c.release()
	return c.dropHeld(chunkName(id, i))
}

// dropHeld is drop, the directory held.
func (c *Dir) dropHeld(name string) bool {
	var st unix.Stat_t
	if unix.Fstatat(c.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	if unix.Unlinkat(c.fd(), name, 0) != nil {
		return false
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		c.used.Add(-st.Size)
	}
	return true
}

// ReadThrough returns chunks [lo, hi) of the file id, chunk i being
// size(i) bytes: from the directory if read is set and it holds them all,
// each passing its check (cached true), else from fetch, whose chunks it
// keeps. A chunk that fails its check is fetched again with the others.
// With read unset the directory is only filled: a store reads from it
// only what it cannot read better from itself (an object store's
// manifest, while the store can be reached).
func (c *Dir) ReadThrough(id string, lo, hi int64, size func(i int64) int64, read bool, fetch func() ([][]byte, error)) (chunks [][]byte, cached bool, err error) {
	if read {
		data := make([][]byte, 0, hi-lo)
		for i := lo; i < hi; i++ {
			b, ok := c.Get(id, i, size(i))
			if !ok {
				break
			}
			data = append(data, b)
		}
		if len(data) == int(hi-lo) {
			return data, true, nil
		}
	}
	chunks, err = fetch()
	if err != nil {
		return nil, false, err
	}
	for i, b := range chunks {
		c.Put(id, lo+int64(i), b)
	}
	return chunks, false, nil
}

// Put stores chunk i of the file id. Errors are not the reader's: a
// chunk not cached is fetched again next time.
func (c *Dir) Put(id string, i int64, b []byte) {
	if !c.hold() {
		return
	}
	defer c.release()
	name := chunkName(id, i)
	size := int64(len(b) + 4)
	if size > c.limit {
		return
	}
	if c.used.Load()+size > c.limit {
		c.evict(size)
	}
	if c.write(name, b) {
		c.used.Add(size)
	}
}

// write stores b then its CRC32C as the file name of the directory: a
// temporary file renamed into place.
func (c *Dir) write(name string, b []byte) bool {
	var tmp string
	var fd int
	for range 10 {
		tmp = fmt.Sprintf(".tmp-%016x", rand.Uint64())
		var err error
		fd, err = unix.Openat(c.fd(), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) {
			return false
		}
		fd = -1
	}
	if fd < 0 {
		return false
	}
	f := os.NewFile(uintptr(fd), tmp)
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], codec.Checksum(b))
	_, err := f.Write(b)
	if err == nil {
		_, err = f.Write(sum[:])
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(c.fd(), tmp, c.fd(), name)
	}
	if err != nil {
		unix.Unlinkat(c.fd(), tmp, 0)
		return false
	}
	return true
}

// cacheEntry is a chunk file of the directory.
type cacheEntry struct {
	name string
	size int64
	used time.Time
}

// list returns the chunk files of the directory (regular files only),
// read through its descriptor.
func (c *Dir) list() []cacheEntry {
	fd, err := unix.Openat(c.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	d := os.NewFile(uintptr(fd), c.name)
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []cacheEntry
	for _, name := range names {
		if !strings.HasSuffix(name, cacheExt) {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(c.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		out = append(out, cacheEntry{name, st.Size, time.Unix(st.Mtim.Unix())})
	}
	return out
}

// evict removes the chunks used least recently until need more bytes fit
// with a tenth of the limit to spare.
func (c *Dir) evict(need int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used.Load()+need <= c.limit {
		return
	}
	before := c.used.Load()
	all := c.list()
	var total int64
	for _, e := range all {
		total += e.size
	}
	slices.SortFunc(all, func(a, b cacheEntry) int { return a.used.Compare(b.used) })
	target := c.limit - c.limit/10 - need
	for _, e := range all {
		if total <= target {
			break
		}
		if unix.Unlinkat(c.fd(), e.name, 0) == nil {
			total -= e.size
		}
	}
	// Resynchronised with the directory (other processes share it), by
	// a difference: what puts added meanwhile is kept.
	c.used.Add(total - before)
}

// A listing kept in the cache directory: what a store listed of one
// snapshot (for an object store, the objects by name with their size and
// ETag), so that a restore whose chunks are all cached works with the
// store unreachable. One file per snapshot, named by the snapshot's
// identity, holding the listing as its store encodes it then its CRC32C.

// listingExt names kept listings.
const listingExt = ".listing"

func listingName(id string) string {
	h := sha256.Sum256([]byte("listing\x00" + id))
	return hex.EncodeToString(h[:16]) + listingExt
}

// PutListing keeps b, the listing of the snapshot id.
func (c *Dir) PutListing(id string, b []byte) {
	if !c.hold() {
		return
	}
	defer c.release()
	c.write(listingName(id), b)
}

// Listing returns the kept listing of the snapshot id, checked as a
// chunk is (a regular file of the caller's, its CRC32C right).
func (c *Dir) Listing(id string) ([]byte, bool) {
	if !c.hold() {
		return nil, false
	}
	defer c.release()
	f, err := c.openChunk(listingName(id))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	size, ok := c.usable(f)
	if !ok || size < 4 || size > 16<<20 {
		return nil, false
	}
	b := make([]byte, size)
	if n, _ := f.ReadAt(b, 0); int64(n) != size || codec.Checksum(b[:size-4]) != binary.LittleEndian.Uint32(b[size-4:]) {
		return nil, false
	}
	return b[:size-4], true
}

// SideDir returns the directory of the files a store keeps beside the
// snapshot id (the working sets that lazy restores record, which an
// object store does not hold): a directory of the cache directory named
// by the snapshot, made on first use, and held to the cache directory's
// rules: opened beneath it, never through a symbolic link, the caller's
// or root's and writable by nobody else (unless trusted). The caller
// closes it.
func (c *Dir) SideDir(id string) (*os.File, error) {
	if !c.hold() {
		return nil, errors.New("cache directory closed")
	}
	defer c.release()
	h := sha256.Sum256([]byte("side\x00" + id))
	name := "snapshot-" + hex.EncodeToString(h[:16])
	if err := unix.Mkdirat(c.fd(), name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("cache directory %s: %w", c.name, &os.PathError{Op: "mkdir", Path: name, Err: err})
	}
	fd, err := unix.Openat(c.fd(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", c.name, &os.PathError{Op: "open", Path: name, Err: err})
	}
	d := os.NewFile(uintptr(fd), c.name+"/"+name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s: %w", d.Name(), err)
	}
	if !c.trust {
		if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
			d.Close()
			return nil, fmt.Errorf("%w: %s belongs to uid %d, neither the caller (uid %d) nor root", store.ErrUntrusted, d.Name(), st.Uid, euid)
		}
		if st.Mode&0o022 != 0 {
			d.Close()
			return nil, fmt.Errorf("%w: %s is writable by group or others (mode %04o)", store.ErrUntrusted, d.Name(), st.Mode&0o7777)
		}
	}
	return d, nil
}
