package fs

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// FSType is the file system type of a lazyfs mount in /proc/mounts
// ("fuse." + Subtype).
const (
	Subtype = "lazyfs"
	FSType  = "fuse." + Subtype
)

// timeout is the entry and attribute timeout: the snapshot never changes
// while mounted, so the kernel may keep names and attributes for as long
// as it likes.
const timeout = 24 * time.Hour

// minReadaheadCache is the smallest cache with which readers decode ahead
// of sequential reads.
const minReadaheadCache = 128 << 20

// noFlush is in the flags of every open: nothing is ever written, so the
// kernel need not send FLUSH on close(2). It also makes a close that no
// server can answer return at once: the helper of MountPrivate closes its
// copy of a file of its own mount, and a helper killed while its close
// waited for its own (dead) server threads could never exit.
const noFlush = fuse.FOPEN_NOFLUSH

// Server is a mounted snapshot.
type Server struct {
	mountpoint string
	srv        *fuse.Server
	procs      []*process
	log        *slog.Logger

	done chan struct{} // closed when the serve loop has ended
	once sync.Once
	err  error
}

// Mount opens the snapshot in snapshotDir and mounts it read-only on
// mountpoint, then serves it until Unmount or an external unmount
// (lazyfs -u, fusermount3 -u, umount). It returns once the mount answers
// requests.
//
// Mount refuses an incomplete snapshot (errors.Is(err,
// image.ErrIncomplete)) or one whose index is corrupt; a mountpoint that
// is not a directory (syscall.ENOTDIR) or is already a mount point
// (ErrBusy); and reports ErrNoFUSE when /dev/fuse or fusermount3 is
// missing. Options turn, in order, into the snapshot's readers and the
// node tree (openTree), then go-fuse's options (fuseOptions).
func Mount(snapshotDir, mountpoint string, opts Options) (*Server, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mnt, err := checkMountpoint(mountpoint)
	if err != nil {
		return nil, err
	}
	if _, err := CheckFUSE(); err != nil {
		return nil, err
	}
	s := &Server{mountpoint: mnt, log: logger, done: make(chan struct{})}
	root, err := s.openTree(snapshotDir, opts)
	if err != nil {
		return nil, err
	}
	fopts := fuseOptions(snapshotDir, opts, logger)
	srv, err := fuse.NewServer(fusefs.NewNodeFS(root, fopts), mnt, &fopts.MountOptions)
	if err != nil {
		s.closeReaders()
		return nil, fmt.Errorf("mount %s: %w", mnt, mountError(err))
	}
	s.srv = srv
	if opts.directMount {
		// Whatever the mount opened, no program started later inherits.
		if err := closeOnExecAll(); err != nil {
			srv.Unmount()
			s.closeReaders()
			return nil, fmt.Errorf("mount %s: close_range: %w", mnt, err)
		}
	}
	go func() {
		srv.Serve()
		s.closeReaders()
		close(s.done)
	}()
	if err := srv.WaitMount(); err != nil {
		s.Unmount()
		return nil, fmt.Errorf("mount %s: %w", mnt, err)
	}
	if err := setReadahead(mnt, opts.ReadaheadKB); err != nil {
		logger.Debug("raise read-ahead of the mount", "mountpoint", mnt, "err", err)
	}
	return s, nil
}

// openTree opens the snapshot in snapshotDir and the page readers of its
// processes (into s.procs), and returns the root of the tree that serves
// them. The snapshot is closed on return: the readers keep their own
// files.
func (s *Server) openTree(snapshotDir string, opts Options) (*rootNode, error) {
	snap, err := image.OpenWith(snapshotDir, image.OpenOptions{Trust: opts.TrustSnapshot, Remote: opts.Remote, Keys: opts.Keys})
	if errors.Is(err, image.ErrIncomplete) {
		return nil, fmt.Errorf("%w (the dump did not finish: nothing to mount)", err)
	}
	if err != nil {
		return nil, err
	}
	defer snap.Close() // the readers keep their own files
	ropts := readerOptions(opts, s.log)
	// MNT/PID/workingset reads the snapshot directory again later, from
	// wherever the server's working directory is then.
	absDir, err := filepath.Abs(snap.Dir)
	if err != nil {
		return nil, err
	}
	for _, pid := range snap.PIDs() {
		p, err := openProcess(snap, pid, ropts, opts.memOnly)
		if err != nil {
			s.closeReaders()
			return nil, err
		}
		p.ws = wsSource{dir: absDir, id: snap.ID(), trust: opts.TrustSnapshot}
		s.procs = append(s.procs, p)
	}

	openFlags := uint32(fuse.FOPEN_KEEP_CACHE)
	if opts.DirectIO {
		openFlags = fuse.FOPEN_DIRECT_IO
	}
	openFlags |= noFlush
	return &rootNode{
		dirNode:   dirNode{own: &owner{uid: uint32(os.Getuid()), gid: uint32(os.Getgid()), mtime: snap.Manifest.Created}},
		manifest:  snap.ManifestJSON(),
		procs:     s.procs,
		memOnly:   opts.memOnly,
		openFlags: openFlags,
		stats:     statsText,
	}, nil
}

// readerOptions returns the options of the page readers: the block cache
// the mount shares (Options.Cache, or a new one of Options.CacheSize) and
// whether they decode ahead of sequential readers.
func readerOptions(opts Options, logger *slog.Logger) image.ReaderOptions {
	c := opts.Cache
	if c == nil {
		size := opts.CacheSize
		if size <= 0 {
			size = DefaultCacheSize
		}
		c = cache.New(size)
	}
	// Readahead decodes up to two batches of 32 MiB ahead of a sequential
	// reader; in a cache that cannot hold them with room to spare, the
	// prefetched blocks would evict each other before they are read.
	readahead := c.Stats().MaxBytes >= minReadaheadCache
	return image.ReaderOptions{Cache: c, Threads: opts.DecompressThreads, Readahead: readahead, Logger: logger}
}

// fuseOptions returns go-fuse's options of the mount of snapshotDir.
func fuseOptions(snapshotDir string, opts Options, logger *slog.Logger) *fusefs.Options {
	to := timeout
	fopts := &fusefs.Options{
		EntryTimeout:    &to,
		AttrTimeout:     &to,
		NegativeTimeout: &to,
		NullPermissions: true,
		UID:             uint32(os.Getuid()),
		GID:             uint32(os.Getgid()),
		Logger:          log.New(io.Discard, "", 0),
	}
	fopts.MountOptions = fuse.MountOptions{
		AllowOther:   opts.AllowOther,
		Options:      []string{"ro", "default_permissions"},
		MaxWrite:     MaxRequest,
		MaxReadAhead: MaxRequest,
		FsName:       snapshotName(snapshotDir),
		Name:         Subtype,
		Debug:        opts.Debug,
		Logger:       debugLogger(logger),
		// Not DirectMount, even as root, but in the private mount's helper
		// (Options.directMount): go-fuse's direct mount leaves the
		// /dev/fuse descriptor inheritable, and a child that inherits it
		// (a restored process) would keep the connection alive after this
		// server is gone. fusermount3's descriptor is set close-on-exec.
		DirectMount:   opts.directMount,
		DisableXAttrs: true,
		PanicHandler: func(v any) fuse.Status {
			logger.Error("panic in FUSE handler", "panic", v, "stack", string(debug.Stack()))
			return fuse.EIO
		},
	}
	return fopts
}

// snapshotName is the source column of the mount in /proc/mounts.
func snapshotName(dir string) string {
	if store.IsRemote(dir) {
		return dir
	}
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// debugLogger turns go-fuse's log.Logger output into debug records.
func debugLogger(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelDebug)
}

// Mountpoint returns the absolute path the snapshot is mounted on.
func (s *Server) Mountpoint() string { return s.mountpoint }

// MemPath returns the path of MNT/PID/mem.
func (s *Server) MemPath(pid int) string {
	return filepath.Join(s.mountpoint, strconv.Itoa(pid), "mem")
}

// Wait blocks until the file system is unmounted, by Unmount or from
// outside (lazyfs -u, fusermount3 -u, umount).
func (s *Server) Wait() { <-s.done }

// Done is closed when the file system has been unmounted.
func (s *Server) Done() <-chan struct{} { return s.done }

// detachWait is how long Unmount waits, after detaching a busy mount, for
// the connection to end before it returns and leaves the serve loop to
// end when the last open file is closed.
const detachWait = time.Second

// Unmount unmounts the file system. If files on it are still open the
// mount is busy: it is then detached (umount -l), so that the mountpoint
// is free at once, and the FUSE connection is aborted where the fusectl
// file system allows (root, /sys/fs/fuse/connections mounted), which makes
// those files fail with ENOTCONN. Otherwise the detached file system is
// served until its last file is closed or this process exits; Wait and
// Done tell when. The snapshot is closed when serving ends. Unmount is
// idempotent and safe after an external unmount.
func (s *Server) Unmount() error {
	s.once.Do(func() { s.err = s.unmount() })
	return s.err
}

func (s *Server) unmount() error {
	select {
	case <-s.done:
		return nil // unmounted from outside
	default:
	}
	dev, devErr := mountDev(s.mountpoint)
	err := s.srv.Unmount()
	if err == nil {
		<-s.done // go-fuse's Unmount has waited for the serve loop
		return nil
	}
	s.log.Warn("mount busy: detaching it", "mountpoint", s.mountpoint, "err", err)
	if err := detach(s.mountpoint); err != nil {
		return fmt.Errorf("unmount %s: %w", s.mountpoint, err)
	}
	if devErr == nil {
		if err := abortConnection(dev); err != nil {
			s.log.Debug("abort FUSE connection", "err", err)
		}
	}
	select {
	case <-s.done:
	case <-time.After(detachWait):
		s.log.Info("detached: open files are served until closed", "mountpoint", s.mountpoint)
	}
	return nil
}

// closeReaders closes the page readers; runs once the serve loop is over
// (or when Mount fails).
func (s *Server) closeReaders() {
	for _, p := range s.procs {
		if err := p.close(); err != nil {
			s.log.Debug("close pages", "pid", p.pid, "err", err)
		}
	}
}

// Sentinel errors of Mount and Unmount.
var (
	// ErrNoFUSE: /dev/fuse cannot be opened or fusermount3 is missing.
	ErrNoFUSE = errors.New("FUSE unavailable")
	// ErrBusy: the mountpoint is already a mount point, or the mount is in
	// use.
	ErrBusy = errors.New("mountpoint busy")
	// ErrNotMounted: Unmount was given a path that is not a lazyfs mount.
	ErrNotMounted = errors.New("not a lazyfs mount")
	// ErrKernelFS: the mountpoint is a directory the kernel makes (under
	// /proc, /sys, a cgroup), which a mount would hide.
	ErrKernelFS = errors.New("on a filesystem of the kernel's own")
)

// mountError adds the sentinel a caller can test to an error of the
// mount itself.
func mountError(err error) error {
	switch {
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("%w: %w", ErrBusy, err)
	case errors.Is(err, syscall.ENODEV), errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.EACCES) && os.Geteuid() != 0:
		return fmt.Errorf("%w: %w", ErrNoFUSE, err)
	}
	return err
}
