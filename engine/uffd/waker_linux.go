package uffd

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// waker is an eventfd that wakes a serving thread blocked in ppoll: the
// read-ahead goroutine, context cancellation and finishing children write
// to it. Writes after close are dropped, so the fd number is never reused
// under a late writer.
type waker struct {
	mu     sync.Mutex
	fd     int
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

// checkFeatures reads the userfaultfd's enabled features from
// /proc/self/fdinfo ("API:\taa:<features>:<ioctls>") and refuses one
// without RequiredFeatures or on which UFFDIO_API was not done.
func checkFeatures(fd int) error {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("check userfaultfd features: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		v, ok := strings.CutPrefix(line, "API:")
		if !ok {
			continue
		}
		f := strings.Split(strings.TrimSpace(v), ":")
		if len(f) != 3 {
			break
		}
		feat, err := strconv.ParseUint(f[1], 16, 64)
		if err != nil {
			break
		}
		if feat&RequiredFeatures != RequiredFeatures {
			return fmt.Errorf("check userfaultfd %d: features %#x, need %#x: %w", fd, feat, uint64(RequiredFeatures), ErrFeatures)
		}
		return nil
	}
	return fmt.Errorf("check userfaultfd %d: no userfaultfd API line in fdinfo: %w", fd, ErrFeatures)
}
