package fs

import (
	"log/slog"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/image/seal"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// DefaultCacheSize is the size of the decoded-block cache of a mount when
// Options.CacheSize is zero.
const DefaultCacheSize = 256 << 20

// DefaultReadaheadKB is what the kernel's read-ahead window of the mount
// (/sys/class/bdi/MAJOR:MINOR/read_ahead_kb) is raised to after mounting,
// so that the kernel actually sends requests of MaxRequest bytes.
const DefaultReadaheadKB = 4096

// MaxRequest is the largest read request the kernel sends (go-fuse
// MaxWrite, which also sets max_read and max_pages, and MaxReadAhead).
// Larger requests would need fs.fuse.max_pages_limit raised.
const MaxRequest = 1 << 20

// Options configure a mount. The zero value is usable: a private cache of
// DefaultCacheSize, automatic decompression threads, owner-only access,
// page cache kept between opens.
type Options struct {
	// CacheSize bounds the decoded blocks kept in memory, in bytes; zero
	// means DefaultCacheSize. Ignored when Cache is set.
	CacheSize int64
	// Cache, if set, is used instead of a cache of CacheSize (to share one
	// cache between a mount and other readers).
	Cache *cache.Cache
	// DecompressThreads is --decompress-threads: 1 decodes the blocks of a
	// request serially, 0 chooses from the CPU affinity mask and the work,
	// N > 1 is a maximum (image.ReaderOptions.Threads).
	DecompressThreads int
	// AllowOther lets users other than the one mounting reach the files
	// (FUSE allow_other; needs user_allow_other in /etc/fuse.conf for
	// non-root). Off by default: memory images hold secrets. Permissions
	// are checked by the kernel (default_permissions) either way: files are
	// 0400 and directories 0500, owned by the mounting uid.
	AllowOther bool
	// TrustSnapshot accepts a snapshot that users other than the caller
	// and root can change (image.OpenOptions.Trust).
	TrustSnapshot bool
	// Remote configures the store of a snapshot given by address
	// (s3://BUCKET/PREFIX): its endpoint and local block cache.
	Remote store.Options
	// Keys open a sealed snapshot (image.OpenOptions.Keys): its memory is
	// decrypted as it is read, into the cache, never onto a disk. A
	// private mount's helper reads the same identity files again.
	Keys *seal.Keyring
	// DirectIO opens mem and region files with FOPEN_DIRECT_IO instead of
	// FOPEN_KEEP_CACHE: every read goes to the server, nothing is kept in
	// the kernel's page cache. See the package documentation for when that
	// pays.
	DirectIO bool
	// ReadaheadKB is written to the mount's read_ahead_kb after mounting;
	// zero means DefaultReadaheadKB, negative leaves the kernel default.
	// Failing to write it (not root) is logged, not fatal.
	ReadaheadKB int
	// Debug logs every FUSE request and reply (go-fuse debug log) to
	// Logger at debug level.
	Debug bool
	// Logger receives corrupt-block errors and mount diagnostics; nil
	// discards them.
	Logger *slog.Logger

	// directMount mounts with mount(2) as root rather than through
	// fusermount3 (one process fewer to start), then makes every
	// descriptor of this process close-on-exec, since go-fuse opens
	// /dev/fuse without it: only for a process that starts no other
	// program while it mounts, the private mount's helper.
	directMount bool
	// memOnly mounts MNT/PID/mem alone, without reading the processes'
	// states: the private mount of a lazy restore reads nothing else, so
	// its helper, which starts beside the restore, need not decode them.
	memOnly bool
}
