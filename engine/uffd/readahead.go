package uffd

import (
	"io"

	"github.com/lazyfs/lazyfs/engine/uffd/pending"
)

// raReq is one prefetch chunk: read src bytes for c into buf.
type raReq struct {
	c       pending.Piece
	buf     []byte
	err     error
	counted bool // its bytes are in Stats.ReadBytes
}

// readAhead reads prefetch chunks from the source on a helper goroutine,
// in order, while the serving thread copies earlier ones. The serving
// thread owns inflight (a FIFO) and the buffers; the helper only fills a
// request's buffer and hands it back, then wakes the serving thread.
type readAhead struct {
	reqs     chan *raReq
	done     chan *raReq
	exited   chan struct{} // closed when the helper goroutine returns
	inflight []*raReq      // FIFO; [0] is the next to copy
	head     bool          // inflight[0] has come back from the helper
	free     [][]byte
	depth    int
	chunk    uint64
}

func startReadAhead(src io.ReaderAt, depth int, chunk uint64, wake func()) *readAhead {
	ra := &readAhead{
		reqs:   make(chan *raReq, depth),
		done:   make(chan *raReq, depth),
		depth:  depth,
		chunk:  chunk,
		exited: make(chan struct{}),
	}
	go func() {
		defer close(ra.exited)
		for r := range ra.reqs {
			r.err = readFull(src, r.buf, r.c.Src)
			ra.done <- r
			wake()
		}
	}()
	return ra
}

// readFull reads exactly len(buf) bytes at addr.
func readFull(src io.ReaderAt, buf []byte, addr uint64) error {
	n, err := src.ReadAt(buf, int64(addr))
	if n == len(buf) {
		return nil
	}
	if err == nil || err == io.EOF {
		return ErrShortRead
	}
	return err
}

// full reports whether depth chunks are in flight.
func (ra *readAhead) full() bool { return len(ra.inflight) >= ra.depth }

func (ra *readAhead) issue(c pending.Piece) {
	var buf []byte
	if n := len(ra.free); n > 0 {
		buf, ra.free = ra.free[n-1], ra.free[:n-1]
	} else {
		buf = make([]byte, ra.chunk)
	}
	r := &raReq{c: c, buf: buf[:c.Len]}
	ra.inflight = append(ra.inflight, r)
	ra.reqs <- r // never blocks: at most depth in flight
}

// ready returns the next chunk to copy if the helper has read it.
func (ra *readAhead) ready() *raReq {
	if len(ra.inflight) == 0 {
		return nil
	}
	if !ra.head {
		select {
		case <-ra.done: // the helper answers in order: this is inflight[0]
			ra.head = true
		default:
			return nil
		}
	}
	return ra.inflight[0]
}

// pop retires the head chunk and recycles its buffer.
func (ra *readAhead) pop() {
	r := ra.inflight[0]
	ra.inflight[0] = nil
	ra.inflight = ra.inflight[1:]
	ra.head = false
	ra.free = append(ra.free, r.buf[:cap(r.buf)])
}

// stop ends the helper goroutine once the reads in flight are done, so
// that the source is not read after Run returns.
func (ra *readAhead) stop() {
	close(ra.reqs)
	<-ra.exited
}
