package image

import (
	"errors"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// seqWriter writes a file from start to end through aligned buffers,
// with O_DIRECT where the filesystem allows it: the pages file goes
// straight from the buffers to the disk, without filling the page cache
// with a copy of the memory that nobody reads back during a dump. A
// goroutine writes full buffers while the next one fills, so that the
// disk works while the dump reads and encodes memory.
//
// Writes are whole buffers, which keeps the file offset aligned; the
// last, partial buffer is written after O_DIRECT is turned off. Where the
// filesystem refuses O_DIRECT, or refuses the first direct write, the
// writer writes through the page cache and starts writeback as it goes.
type seqWriter struct {
	f    *os.File
	cur  []byte // the buffer being filled
	n    int    // bytes in cur
	free chan []byte
	full chan []byte   // in order; the last one may be partial
	done chan struct{} // closed when the writing goroutine returns

	// Written by the goroutine; read after done or under errMu.
	errMu  sync.Mutex
	err    error
	direct bool
	off    uint64 // bytes written to the file
	synced uint64 // buffered mode: offset up to which writeback was started
}

const (
	// directAlign is the alignment of O_DIRECT buffers, offsets and
	// lengths: the page size covers every logical block size in use.
	directAlign = 4096
	// seqBufSize is how much one write hands to the disk.
	seqBufSize = 4 << 20
	// seqBufs is how many buffers there are: one filling, the others
	// queued or being written.
	seqBufs = 3
)

func newSeqWriter(f *os.File) *seqWriter {
	w := &seqWriter{f: f, free: make(chan []byte, seqBufs), full: make(chan []byte, seqBufs), done: make(chan struct{})}
	for range seqBufs - 1 {
		w.free <- alignedBuffer(seqBufSize)
	}
	w.cur = alignedBuffer(seqBufSize)
	w.direct = setDirect(f, true) == nil
	go w.run()
	return w
}

// alignedBuffer returns n bytes starting at a directAlign boundary.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)) % directAlign
	return b[skip : skip+n : skip+n]
}

// setDirect turns O_DIRECT on or off for f.
func setDirect(f *os.File, on bool) error {
	fd := uintptr(f.Fd())
	fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if on {
		fl |= unix.O_DIRECT
	} else {
		fl &^= unix.O_DIRECT
	}
	_, err = unix.FcntlInt(fd, unix.F_SETFL, fl)
	return err
}

// Write buffers b, handing every buffer it fills to the writing goroutine.
// It returns the goroutine's error, if any, as soon as it is known.
func (w *seqWriter) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		c := copy(w.cur[w.n:], b[done:])
		w.n += c
		done += c
		if w.n == len(w.cur) {
			if err := w.firstErr(); err != nil {
				return done, err
			}
			w.full <- w.cur
			w.cur, w.n = <-w.free, 0
		}
	}
	return done, w.firstErr()
}

// Flush writes what is buffered and waits until everything is written;
// the writer takes no more writes. The file ends where the data does.
func (w *seqWriter) Flush() error {
	w.full <- w.cur[:w.n]
	close(w.full)
	<-w.done
	w.n = 0
	return w.err
}

// Abort stops the writing goroutine without writing what is buffered.
func (w *seqWriter) Abort() {
	close(w.full)
	<-w.done
}

func (w *seqWriter) firstErr() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// run writes the buffers handed to it, in order; after an error it only
// recycles them. Every buffer goes back to free, which holds them all.
func (w *seqWriter) run() {
	defer close(w.done)
	for b := range w.full {
		if w.firstErr() == nil {
			if err := w.writeOut(b); err != nil {
				w.errMu.Lock()
				w.err = err
				w.errMu.Unlock()
			}
		}
		w.free <- b[:cap(b)]
	}
}

// writeOut writes p; its errors name the file.
func (w *seqWriter) writeOut(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	if w.direct && len(p)%directAlign != 0 {
		if err := setDirect(w.f, false); err != nil {
			return &os.PathError{Op: "fcntl", Path: w.f.Name(), Err: err}
		}
		w.direct = false
	}
	_, err := w.f.Write(p)
	if err != nil && w.direct && w.off == 0 && errors.Is(err, unix.EINVAL) {
		// The filesystem took O_DIRECT at fcntl but refuses the write
		// (an alignment it needs that we do not meet): go buffered.
		if setDirect(w.f, false) == nil {
			w.direct = false
			_, err = w.f.Write(p)
		}
	}
	if err != nil {
		return err
	}
	w.off += uint64(len(p))
	if !w.direct && w.off-w.synced >= writebackChunk {
		startWriteback(w.f, w.synced, w.off-w.synced)
		w.synced = w.off
	}
	return nil
}
