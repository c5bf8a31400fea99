package codec

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// Encoded is one block as the Pipeline hands it to emit.
type Encoded struct {
	Kind Kind
	// Stored is what goes into the pages file: nil for Zero, Src itself for
	// Raw, and for LZ4 and Shuffle a buffer owned by the pipeline that is valid only
	// until emit returns.
	Stored []byte
	// Src is the block as submitted; the caller may recycle it once emit
	// has returned for it.
	Src []byte
	CRC uint32 // CRC32C of Src
	// PageCRCs is the CRC32C of each page of a Raw block longer than a
	// page, with PipelineOptions.PageChecksums; valid until emit returns.
	PageCRCs []uint32
	Tag      any // as submitted
	// Sealed is what PipelineOptions.Seal returned for the block (nil
	// without Seal, and for Zero blocks): a buffer owned by the pipeline,
	// valid only until emit returns.
	Sealed []byte
}

// PipelineOptions configure a Pipeline.
type PipelineOptions struct {
	Workers int  // encoding goroutines; 0 means runtime.GOMAXPROCS(0)
	Mode    Mode // Compress, NoCompress, ShuffleLZ4 or ShuffleHuff
	// PageChecksums asks for Encoded.PageCRCs.
	PageChecksums bool
	// Seal, if set, is called on the encoding goroutine with every
	// encoded block that is not Zero and a buffer of the block's slot
	// (empty, with the capacity it had last time); what it returns,
	// built in that buffer or not, is handed to emit as Encoded.Sealed.
	// The dump encrypts blocks with it, in parallel like the encoding.
	// An error stops the pipeline like an error of emit.
	Seal func(e *Encoded, buf []byte) ([]byte, error)
	// InParent, if set, is asked on the encoding goroutines (several at
	// once: it must be safe for that), for every
	// block that is not all zeros, whether the parent snapshot holds the
	// same bytes at the same place (crc is the CRC32C of src); if so, the
	// block is emitted as a Parent block, without encoding (Stored nil,
	// no PageCRCs, no Seal). An error stops the pipeline like an error of
	// emit.
	InParent func(src []byte, crc uint32, tag any) (bool, error)
}

// ErrClosed is returned by Submit after Close.
var ErrClosed = errors.New("codec: pipeline closed")

// Pipeline encodes blocks on several goroutines and emits them, from one
// goroutine, strictly in submission order.
//
// Memory is bounded: at most 2*Workers+2 blocks are in flight between Submit
// and the return of emit, and Submit blocks while that many are. Each
// in-flight slot owns one LZ4 output buffer, reused only after emit returned
// for the block that used it.
//
// The first error from emit, or the cancellation of the context, is sticky:
// Submit returns it from then on, no further block is emitted, and Close
// returns it.
type Pipeline struct {
	mode     Mode
	pageCRCs bool
	emit     func(*Encoded) error
	seal     func(*Encoded, []byte) ([]byte, error)
	inParent func([]byte, uint32, any) (bool, error)

	slots chan *slot // free slots: taking one is the backpressure
	work  chan *slot // slots to encode
	order chan *slot // slots to emit, in submission order

	submitMu sync.Mutex // orders Submit and Close
	// +checklocks:submitMu
	closed bool

	errMu sync.Mutex
	// +checklocks:errMu
	err  error
	dead chan struct{} // closed with the first error

	stopCtx func() bool
	workers sync.WaitGroup
	emitter sync.WaitGroup
}

// slot is one in-flight block and the buffer its LZ4 output goes to.
type slot struct {
	Encoded
	buf     []byte
	sealBuf []byte
	done    chan struct{} // worker -> emitter, buffered 1
}

// NewPipeline starts the encoding and emitting goroutines. Close must be
// called to stop them.
func NewPipeline(ctx context.Context, opts PipelineOptions, emit func(*Encoded) error) *Pipeline {
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	n := 2*workers + 2
	p := &Pipeline{
		mode:     opts.Mode,
		pageCRCs: opts.PageChecksums,
		emit:     emit,
		seal:     opts.Seal,
		inParent: opts.InParent,
		slots:    make(chan *slot, n),
		work:     make(chan *slot, n),
		order:    make(chan *slot, n),
		dead:     make(chan struct{}),
	}
	for range n {
		p.slots <- &slot{done: make(chan struct{}, 1)}
	}
	p.stopCtx = context.AfterFunc(ctx, func() { p.fail(ctx.Err()) })
	for range workers {
		p.workers.Go(p.encodeLoop)
	}
	p.emitter.Go(p.emitLoop)
	return p
}

// Submit queues src for encoding. It blocks while the pipeline is full.
// src must not be modified until emit has returned for it. Submit returns
// the sticky error once emit or the context failed. Submit and Close may be
// called from different goroutines; blocks are emitted in the order their
// Submit calls returned.
func (p *Pipeline) Submit(src []byte, tag any) error {
	if len(src) == 0 || len(src) > MaxBlockSize || len(src)%PageSize != 0 {
		return fmt.Errorf("codec: submit: block of %d bytes (want a multiple of %d up to %d)",
			len(src), PageSize, MaxBlockSize)
	}
	p.submitMu.Lock()
	defer p.submitMu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.failed(); err != nil {
		return err
	}
	var s *slot
	select {
	case s = <-p.slots:
	case <-p.dead:
		return p.failed()
	}
	s.Src, s.Tag = src, tag
	// Both channels hold every slot, so these sends never block.
	p.order <- s
	p.work <- s
	return nil
}

// Close waits until every submitted block was emitted (or dropped after an
// error), stops the goroutines and returns the first error.
func (p *Pipeline) Close() error {
	p.submitMu.Lock()
	if !p.closed {
		p.closed = true
		close(p.work)
		close(p.order)
	}
	p.submitMu.Unlock()
	p.workers.Wait()
	p.emitter.Wait()
	p.stopCtx()
	return p.failed()
}

func (p *Pipeline) fail(err error) {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if p.err == nil {
		p.err = err
		close(p.dead)
	}
}

func (p *Pipeline) failed() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.err
}

func (p *Pipeline) isDead() bool {
	select {
	case <-p.dead:
		return true
	default:
		return false
	}
}

func (p *Pipeline) encodeLoop() {
	var enc Encoder
	for s := range p.work {
		if !p.isDead() && p.inParent != nil && !IsZero(s.Src) {
			crc := Checksum(s.Src)
			same, err := p.inParent(s.Src, crc, s.Tag)
			if err != nil {
				p.fail(err)
			}
			if same {
				s.Kind, s.Stored, s.CRC = Parent, nil, crc
				s.PageCRCs = s.PageCRCs[:0]
				s.done <- struct{}{}
				continue
			}
		}
		if !p.isDead() {
			s.Kind, s.Stored, s.buf = enc.encode(s.Src, p.mode, s.buf)
			s.PageCRCs = s.PageCRCs[:0]
			switch {
			case s.Kind == Zero:
				s.CRC = ZeroChecksum(len(s.Src))
			case s.Kind == Raw && p.pageCRCs && len(s.Src) > PageSize && len(s.Src)%PageSize == 0:
				s.PageCRCs, s.CRC = PageChecksums(s.PageCRCs, s.Src)
			default:
				s.CRC = Checksum(s.Src)
			}
			if p.seal != nil && s.Kind != Zero {
				out, err := p.seal(&s.Encoded, s.sealBuf[:0])
				if err != nil {
					p.fail(err)
				}
				s.Sealed = out
				if cap(out) > cap(s.sealBuf) {
					s.sealBuf = out[:0]
				}
			}
		}
		s.done <- struct{}{}
	}
}

func (p *Pipeline) emitLoop() {
	for s := range p.order {
		<-s.done
		if !p.isDead() {
			if err := p.emit(&s.Encoded); err != nil {
				p.fail(err)
			}
		}
		s.Encoded = Encoded{PageCRCs: s.PageCRCs[:0]} // keep the buffer
		p.slots <- s
	}
}
