package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/uffd"
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
	// pid is the restored process's pid in our pid namespace: st.PID,
	// or another with Namespaces.PID.
	pid int
	// initPID is our pid of the init of the process's new pid namespace
	// (Namespaces.PID), once it runs; 0 if none.
	initPID int
	netns   *os.File // the network namespace to join (Namespaces.Net)
	in      *ptrace.Injector
	area    uint64 // our stub page and scratch in the child
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
	keeper  *uffd.Keeper // the keeper Restore started, if any
	// tree, for a process of a tree, hands out what it shares with the
	// others; layout is the memory of every process of the tree, where
	// the injection area must not be.
	tree   fds.Tree
	layout []image.VMA
	// wsLoad waits for the working set loadWorkingSet started reading.
	wsLoad func() (*image.WorkingSet, error)
}

// restoreFDs recreates every descriptor (engine/fds) and closes the
// shared memory objects that mapping memory left open for them.
func (r *restorer) restoreFDs(ctx context.Context) error {
	err := fds.Restore(ctx, r.in, r.st, r.shmem, r.fdOptions())
	r.shmem = nil
	return err
}

// fdOptions are the options of the descriptors' restore.
func (r *restorer) fdOptions() fds.RestoreOptions {
	return fds.RestoreOptions{Log: r.log, TCPEstablished: r.opts.TCPEstablished, Inherit: r.opts.Inherit, ExternalFallback: r.opts.ExternalFallback, Tree: r.tree}
}

// releaseNetLocks deletes the network locks that held the TCP
// connections of the processes sts since the dump (one lock for a
// whole tree): once they are back, or once the restore failed (their
// peers then see a reset). done remembers the locks released, so that
// a second call releases nothing twice.
func releaseNetLocks(sts []*image.Process, done map[string]bool, log *slog.Logger) {
	for _, st := range sts {
		for _, f := range st.FDs {
			if f.Socket == nil || f.Socket.TCP == nil || f.Socket.TCP.Lock == "" || done[f.Socket.TCP.Lock] {
				continue
			}
			lock := f.Socket.TCP.Lock
			done[lock] = true
			if err := fds.DeleteNetLock(lock); err != nil {
				log.Error("network lock not released: nft delete table inet "+lock, "pid", st.PID, "err", err)
			}
		}
	}
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
	if err := r.checkPIDs(); err != nil {
		return err
	}
	if err := fds.CheckFile(st.Exe, "executable"); err != nil {
		return err
	}
	for _, v := range st.VMAs {
		if v.File != nil && (v.Kind == image.VMAFile || v.Kind == image.VMAFileShared) {
			if err := fds.CheckFile(*v.File, fmt.Sprintf("mapping %x-%x", v.Start, v.End)); err != nil {
				return err
			}
		}
	}
	for _, f := range st.FDs {
		if err := fds.Check(f); err != nil {
			return fmt.Errorf("fd %d: %w", f.FD, err)
		}
		if s := f.Socket; s != nil && s.TCP != nil && r.opts.TCPEstablished && r.opts.Namespaces.Net != "" {
			// The peer and the lock are in our namespace; a copy restored
			// in another would be a second end of the same connection.
			return fmt.Errorf("%w: fd %d is a TCP connection kept by the dump (%s-%s), which lives in snapctl's network namespace with its lock: restore it without --netns, or without --tcp-established (it then comes back closed)",
				ErrUnsupported, f.FD, s.Local, s.Peer)
		}
	}
	if r.tree != nil {
		return nil // the tree checks its descriptors leading outside together
	}
	return fds.CheckExternal([]*image.Process{st}, r.fdOptions())
}

// checkPIDs refuses ids that are taken, where the process is to have
// them: in our pid namespace. A new one is empty; the ids there are the
// process's own view (image.Process.OwnPID), which a snapshot of a
// process in a pid namespace below ours can only have in a new one.
func (r *restorer) checkPIDs() error {
	st := r.st
	if r.opts.Namespaces.PID {
		return nil
	}
	if len(st.NSPID) > 0 {
		return fmt.Errorf("%w: the process lived in a pid namespace (pid %d there, %d outside): it restores into a new one only (--pidns)",
			ErrUnsupported, st.OwnPID(), st.PID)
	}
	if busy, comm := pidInUse(st.PID); busy {
		return fmt.Errorf("%w: pid %d is taken by %q", ErrPIDInUse, st.PID, comm)
	}
	for _, th := range st.Threads {
		if busy, comm := pidInUse(th.TID); busy {
			return fmt.Errorf("%w: thread id %d is taken by %q", ErrPIDInUse, th.TID, comm)
		}
	}
	return nil
}
