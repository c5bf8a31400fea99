package uffd

import (
	"fmt"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// waker is an eventfd that wakes a serving thread blocked in ppoll: the
// read-ahead goroutine, context cancellation and finishing children write
// to it. Writes after close are dropped, so the fd number is never reused
// under a late writer.
type waker struct {
	fd int

	mu sync.Mutex
	// +checklocks:mu
	closed bool
}

func newWaker() (*waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &waker{fd: fd}, nil
}

func (w *waker) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	one := [8]byte{1} // a native-endian uint64 1 on little-endian amd64
	unix.Write(w.fd, one[:])
}

func (w *waker) drain() {
	var b [8]byte
	unix.Read(w.fd, b[:])
}

func (w *waker) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		unix.Close(w.fd)
	}
}

// lockThread wires the calling goroutine to its thread for good: the
// thread is discarded when the goroutine exits, so a pinned affinity never
// leaks into the runtime's thread pool.
func lockThread() { runtime.LockOSThread() }

// checkFeatures reads the userfaultfd's enabled features from its fdinfo
// ("API:\taa:<features>:<ioctls>") and refuses one without
// uffdio.RequiredFeatures or on which UFFDIO_API was not done.
func checkFeatures(fd int) error {
	fi, err := proc.ReadFDInfo(os.Getpid(), fd)
	if err != nil {
		return fmt.Errorf("check userfaultfd features: %w", err)
	}
	if fi.Uffd == nil {
		return fmt.Errorf("check userfaultfd %d: no userfaultfd API line in fdinfo: %w", fd, ErrFeatures)
	}
	if feat := fi.Uffd.Features; feat&uffdio.RequiredFeatures != uffdio.RequiredFeatures {
		return fmt.Errorf("check userfaultfd %d: features %#x, need %#x: %w", fd, feat, uint64(uffdio.RequiredFeatures), ErrFeatures)
	}
	return nil
}
