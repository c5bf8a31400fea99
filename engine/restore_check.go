package engine

import (
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// restorer holds the state of one restore.
type restorer struct {
	snap  *image.Snapshot
	st    *image.Process
	pages *image.Reader
	opts  RestoreOptions
	log   *slog.Logger
	t     *ptrace.Tracer

	stub  *ptrace.Process // the exec'd stub the process is cloned from
	child *ptrace.Process // the restored process
	in    *ptrace.Injector
	area  uint64 // our stub page and scratch in the child
	// threads are the restored threads, in the order of st.Threads.
	threads []*ptrace.Thread
	// shmem maps a shared object id to the fd of it in the child while
	// memory is mapped and fds restored.
	shmem  map[uint64]int
	filled uint64
	// running is set once the process runs (detached, for an eager
	// restore).
	running bool
	lazy    *lazyState
}

// check refuses, before anything is created, a snapshot this machine or
// build cannot restore.
func (r *restorer) check() error {
	st := r.st
	k := r.snap.Manifest.Kernel
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	if rel := unix.ByteSliceToString(u.Release[:]); k.Release != rel || k.Machine != unix.ByteSliceToString(u.Machine[:]) {
		return fmt.Errorf("%w: dumped on %s %s, this is %s: the vDSO would not match", ErrKernelMismatch, k.Release, k.Machine, rel)
	}
	if busy, comm := pidInUse(st.PID); busy {
		return fmt.Errorf("%w: pid %d is taken by %q", ErrPIDInUse, st.PID, comm)
	}
	for _, th := range st.Threads {
		if busy, comm := pidInUse(th.TID); busy {
			return fmt.Errorf("%w: thread id %d is taken by %q", ErrPIDInUse, th.TID, comm)
		}
	}
	if len(st.Threads) == 0 || st.Threads[0].TID != st.PID {
		return fmt.Errorf("%w: the first thread is not the process leader", image.ErrCorrupt)
	}
	if err := checkFile(st.Exe, "executable"); err != nil {
		return err
	}
	for _, v := range st.VMAs {
		if v.File != nil && (v.Kind == image.VMAFile || v.Kind == image.VMAFileShared) {
			if err := checkFile(*v.File, fmt.Sprintf("mapping %x-%x", v.Start, v.End)); err != nil {
				return err
			}
		}
	}
	for _, f := range st.FDs {
		if err := checkFD(f); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
	}
	return nil
}

// checkFile refuses a file whose identity differs from the dump.
func checkFile(id image.FileID, what string) error {
	cur, err := proc.StatFile(id.Path)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, id.Path, err)
	}
	if cur.Dev != id.Dev || cur.Ino != id.Ino || cur.Size != id.Size || cur.Mtime.UnixNano() != id.MtimeNs {
		return fmt.Errorf("%w: %s %s: now device %d inode %d size %d mtime %d; dumped device %d inode %d size %d mtime %d",
			ErrFileChanged, what, id.Path, cur.Dev, cur.Ino, cur.Size, cur.Mtime.UnixNano(), id.Dev, id.Ino, id.Size, id.MtimeNs)
	}
	return nil
}

// checkFD refuses a descriptor this build cannot restore.
func checkFD(f image.FD) error {
	switch f.Kind {
	case image.FDFile, image.FDDir, image.FDFifo:
		if f.File == nil {
			return fmt.Errorf("%w: %s without file identity", image.ErrCorrupt, f.Kind)
		}
		cur, err := proc.StatFile(f.Path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		// An open file may have grown since (a log): identity is the
		// inode, and the offset must still be inside it.
		if cur.Dev != f.File.Dev || cur.Ino != f.File.Ino {
			return fmt.Errorf("%w: %s is now another file (inode %d, was %d)", ErrFileChanged, f.Path, cur.Ino, f.File.Ino)
		}
		if f.Kind == image.FDFile && f.Flags&unix.O_APPEND == 0 && f.Pos > cur.Size {
			return fmt.Errorf("%w: %s is %d bytes, shorter than the saved offset %d", ErrFileChanged, f.Path, cur.Size, f.Pos)
		}
	case image.FDChr:
		if _, err := os.Stat(f.Path); err != nil {
			return err
		}
	case image.FDMemfd, image.FDPipe, image.FDEventfd, image.FDEpoll, image.FDSocket, image.FDTimerfd, image.FDSignalfd:
	default:
		return fmt.Errorf("%w: this build cannot restore %s descriptors", ErrUnsupported, f.Kind)
	}
	return nil
}
