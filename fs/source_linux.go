package fs

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// The page sources of a lazy restore that read through a lazyfs mount
// (image.PageSource): a running mount (MountSource, snapctl restore --lazy
// --mount) or a private one made for the restore (PrivateSource). Either
// way only the blocks that must be decoded are read through the mount
// (image.Reader.Mixed): a block stored as is costs a mount a round trip to
// its server and two more copies, and gains nothing there, since the
// pages file's page cache already holds it once for every restore on the
// host.

// MountSource returns the memory of the snapshot's processes read from
// the running lazyfs mount mnt (OpenMount: a mount of that snapshot, by
// root or the caller), whose cache several restores share. Its bytes are
// someone else's: each block read from it is checked against the
// snapshot's CRC32C (image.Reader.Checked), as the snapshot's own readers
// check theirs.
func MountSource(mnt string, snap *image.Snapshot) (image.PageSource, error) {
	m, err := OpenMount(mnt, snap.ManifestJSON())
	if err != nil {
		return nil, fmt.Errorf("--mount %w", err)
	}
	return &mountSource{m: m}, nil
}

type mountSource struct {
	m     *CheckedMount
	mu    sync.Mutex
	files []*os.File
}

// Pages opens MNT/PID/mem with the kernel's readahead off
// (POSIX_FADV_RANDOM): the pager asks the mount for the blocks that must
// be decoded and no others, and readahead would make the mount read the
// blocks around them into its page cache, a second copy of what the pages
// file's page cache holds, for no reader.
func (s *mountSource) Pages(own *image.Reader) (io.ReaderAt, error) {
	f, err := s.m.OpenMem(own.PID())
	if err != nil {
		return nil, fmt.Errorf("--mount: open pages: %w", err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
		f.Close()
		return nil, fmt.Errorf("--mount: posix_fadvise %s: %w", f.Name(), err)
	}
	s.mu.Lock()
	s.files = append(s.files, f)
	s.mu.Unlock()
	return own.Mixed(own.Checked(f)), nil
}

func (s *mountSource) Waits() bool        { return false }
func (s *mountSource) Gone() <-chan error { return nil }
func (s *mountSource) Abort()             {}

func (s *mountSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.Close()
	}
	s.files = nil
	return s.m.Close()
}

// PrivateSource returns the memory of the snapshot's processes read
// through a private mount of it (MountPrivateTree: one helper, one cache
// for every process), made for this restore alone. What makes the mount
// fail at once (no FUSE) is refused here; the mount itself is made in the
// background, while the processes are created and their memory laid out,
// which need no page from it.
//
// Nothing waits for the mount: until it is up, the blocks meant for it
// are decoded here from the snapshot's files, so the processes run and
// their first faults are served without waiting for a helper to start;
// if it cannot be made, the restore goes on that way and log says why.
// If the helper dies once the mount is up, Gone says so.
//
// The mount answers with direct I/O (its reads wait on the helper) and
// keeps a small block cache: each pager reads a block once (see
// test/bench/BENCHMARKS.md, Decisions). Its bytes are read by the helper
// through the snapshot's own reader, which checks them: they are not
// checked again.
func PrivateSource(snap *image.Snapshot, decompressThreads int, log *slog.Logger) (image.PageSource, error) {
	if _, err := CheckFUSE(); err != nil {
		return nil, err
	}
	o := snap.Options()
	dir, pids := snap.Dir, snap.PIDs()
	return mountLater(func() (*PrivateMount, error) {
		return MountPrivateTree(dir, pids, Options{DecompressThreads: decompressThreads, DirectIO: true, CacheSize: 16 << 20,
			TrustSnapshot: o.Trust, Remote: o.Remote, Keys: o.Keys})
	}, log), nil
}

// privateSource is a private mount coming up in the background.
type privateSource struct {
	ready chan struct{} // closed once mount has returned
	m     *PrivateMount
	merr  error
	gone  chan error
	stop  chan struct{}

	mu sync.Mutex
	// aborting: the restore is ending on a signal (Abort); abandoned: the
	// source was closed then, before its mount was up, and the mount is
	// not waited for.
	aborting, abandoned bool
}

// mountLater starts mount in the background and returns the source it
// makes.
func mountLater(mount func() (*PrivateMount, error), log *slog.Logger) *privateSource {
	s := &privateSource{ready: make(chan struct{}), gone: make(chan error, 1), stop: make(chan struct{})}
	go func() {
		m, err := mount()
		s.mu.Lock()
		s.m, s.merr = m, err
		close(s.ready)
		left := s.abandoned
		s.mu.Unlock()
		if left {
			if err == nil {
				m.Close()
			}
			return
		}
		if err != nil {
			log.Warn("no private mount: blocks that must be decoded are decoded by snapctl", "err", err)
			return
		}
		select {
		case <-m.Exited():
			s.gone <- fmt.Errorf("the private mount's FUSE server (%s, pid %d): %v", PrivateArg0, m.HelperPID(), m.ExitErr())
		case <-s.stop:
		}
	}()
	return s
}

// up reports, without waiting, whether the mount can be read.
func (s *privateSource) up() bool {
	select {
	case <-s.ready:
		return s.merr == nil
	default:
		return false
	}
}

// Pages reads through the mount once it is up, and from the snapshot's
// files until then (standIn).
func (s *privateSource) Pages(own *image.Reader) (io.ReaderAt, error) {
	pid := own.PID()
	mem := readerAtFunc(func(p []byte, off int64) (int, error) {
		// Called once up reports true only.
		r, err := s.m.Mem(pid)
		if err != nil {
			return 0, err
		}
		return r.ReadAt(p, off)
	})
	return own.Mixed(standIn{up: s.up, src: mem, direct: own.Uncached()}), nil
}

func (s *privateSource) Waits() bool        { return true }
func (s *privateSource) Gone() <-chan error { return s.gone }

// Abort ends the mount at once if it is up; one still being set up is
// abandoned by Close.
func (s *privateSource) Abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborting = true
	if s.up() {
		s.m.Abort()
	}
}

// Close makes the helper unmount and exit, waiting for a mount still
// being set up, unless the restore is ending on a signal: a mount that
// is not up then is not waited for (it may wait long on a store that
// stalls); the helper ends when this process does, and a mount made
// meanwhile is closed as soon as it is.
func (s *privateSource) Close() error {
	close(s.stop)
	s.mu.Lock()
	select {
	case <-s.ready:
	default:
		if s.aborting {
			s.abandoned = true
			s.mu.Unlock()
			return nil
		}
	}
	s.mu.Unlock()
	<-s.ready // m.Close sees to a helper stuck in its mount
	if s.merr != nil {
		return nil // logged when it failed
	}
	return s.m.Close()
}

// standIn reads from src once up reports it can be read, and from direct
// (the snapshot's own files) until then.
type standIn struct {
	up          func() bool
	src, direct io.ReaderAt
}

func (s standIn) ReadAt(p []byte, off int64) (int, error) {
	if s.up() {
		return s.src.ReadAt(p, off)
	}
	return s.direct.ReadAt(p, off)
}

// readerAtFunc is a function as an io.ReaderAt.
type readerAtFunc func(p []byte, off int64) (int, error)

func (f readerAtFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }
