package mem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

const (
	// fillJobMax bounds the bytes of one write job.
	fillJobMax = 4 << 20
	// maxFillWriters bounds the writer goroutines.
	maxFillWriters = 4
)

// fillJob is a range of consecutive blocks of one VMA to write: either
// Raw blocks consecutive in the pages file, read by the writer, or
// decoded bytes (data).
type fillJob struct {
	vma    *image.VMA
	blocks []image.Block
	data   []byte          // decoded bytes of blocks; nil for Raw blocks read from the file
	done   *sync.WaitGroup // if set, Done once written (data is then released)
}

func (j *fillJob) addr() uint64 { return j.blocks[0].Addr }

func (j *fillJob) len() int {
	return int(j.blocks[len(j.blocks)-1].End() - j.blocks[0].Addr)
}

// FillOptions say what Fill writes and how.
type FillOptions struct {
	// Pages is the snapshot's memory of the process; PagesFile its block
	// payloads (Pages.Payloads()), which Raw blocks are read from
	// directly.
	Pages     *image.Reader
	PagesFile io.ReaderAt
	// Threads is --decompress-threads for the LZ4 blocks.
	Threads int
	// Skip, if set, leaves out the blocks it is true for (those a lazy
	// restore serves later).
	Skip func(b image.Block, v *image.VMA) bool
	// Userfaultfd places anonymous private memory with UFFDIO_COPY
	// through a userfaultfd made in the process for the time of the fill.
	// Not with Skip: the lazy phase registers its own.
	Userfaultfd bool
	// Progress, if set, is called with the bytes written and their total.
	Progress func(done, total uint64)
}

// filler writes the snapshot's memory into the process.
type filler struct {
	t       *Target
	pid     int // the process's, in our pid namespace
	o       FillOptions
	pages   io.ReaderAt // the payloads, for Raw blocks and the decoder
	mem     *os.File    // /proc/PID/mem, for mappings without write permission
	jobs    chan *fillJob
	done    atomic.Uint64 // bytes written
	total   uint64
	progMu  sync.Mutex
	zeros   []byte
	writers int
	// noCRC: pages authenticates every block it reads (it is the
	// payloads of a sealed or signed snapshot): no CRC32C to check.
	noCRC bool
	// uffd, if not -1, is the process's userfaultfd, with the VMAs of
	// uffdVMAs registered MISSING.
	uffd     int
	uffdVMAs map[*image.VMA]bool
}

// Fill writes the snapshot's pages into the process, but those o.Skip
// leaves out, and returns the bytes written.
func Fill(ctx context.Context, t *Target, o FillOptions) (uint64, error) {
	bs, err := sortBlocks(t.State.VMAs, o.Pages.Blocks(), o.Skip)
	if err != nil {
		return 0, err
	}
	raw, decode, vmas, zero := bs.raw, bs.decode, bs.vmas, bs.zero
	pages := o.PagesFile
	pid := t.pid()
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer mem.Close()
	f := &filler{t: t, pid: pid, o: o, pages: pages, mem: mem, jobs: make(chan *fillJob, 2*maxFillWriters),
		writers: min(maxFillWriters, max(1, runtime.GOMAXPROCS(0))), uffd: -1,
		noCRC: o.Pages.Authenticated() && pages == o.Pages.Payloads()}
	if o.Userfaultfd {
		if err := f.openUffd(append(raw, decode...)); err != nil {
			t.Log.Debug("fill without userfaultfd", "err", err)
		}
		defer f.closeUffd()
	}
	for _, bs := range [][]image.Block{raw, decode, zero} {
		for _, b := range bs {
			f.total += uint64(b.Len)
		}
	}
	if len(zero) > 0 {
		f.zeros = make([]byte, o.Pages.BlockSize())
	}
	// Writers drain the queue to its end, even after an error, so that
	// every job's done is called: the decoder waits on them.
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var writers sync.WaitGroup
	for range f.writers {
		writers.Go(func() {
			if err := f.writeLoop(fctx); err != nil {
				cancel(err)
			}
		})
	}
	err = func() error {
		defer close(f.jobs)
		if err := f.queueRaw(fctx, raw); err != nil {
			return err
		}
		if err := f.queueZero(fctx, zero); err != nil {
			return err
		}
		return f.queueDecoded(fctx, decode, vmas)
	}()
	if err != nil {
		cancel(err)
	}
	writers.Wait()
	filled := f.done.Load()
	if err := context.Cause(fctx); err != nil && !errors.Is(err, context.Canceled) {
		return filled, err
	}
	return filled, ctx.Err()
}

// fillBlocks are the blocks a Fill writes, by how.
type fillBlocks struct {
	raw    []image.Block // read from the pages file by the writers
	decode []image.Block // decoded first
	vmas   []*image.VMA  // of decode's blocks
	zero   []image.Block // zeros to write (private file mappings)
}

// sortBlocks sorts the blocks to write by how they are written, but
// those skip (FillOptions.Skip) leaves out.
func sortBlocks(vmas []image.VMA, blocks iter.Seq[image.Block], skip func(image.Block, *image.VMA) bool) (fillBlocks, error) {
	var bs fillBlocks
	for b := range blocks {
		v := VMAAt(vmas, b.Addr)
		if v == nil {
			return bs, fmt.Errorf("%w: block at %#x outside every VMA", image.ErrCorrupt, b.Addr)
		}
		if skip != nil && skip(b, v) {
			continue
		}
		switch b.Kind {
		case codec.Zero:
			// A fresh anonymous or shared mapping reads as zeros; a
			// private file mapping reads the file.
			if v.Kind != image.VMAAnon && v.Kind != image.VMAShmem {
				bs.zero = append(bs.zero, b)
			}
		case codec.Raw:
			bs.raw = append(bs.raw, b)
		default:
			bs.decode = append(bs.decode, b)
			bs.vmas = append(bs.vmas, v)
		}
	}
	return bs, nil
}

// send queues j, unless ctx ends.
func (f *filler) send(ctx context.Context, j *fillJob) error {
	select {
	case f.jobs <- j:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queueRaw cuts the Raw blocks into jobs of blocks consecutive in memory
// and in the pages file, within one VMA. It asks the kernel to read the
// pages file ahead of the writers (a cold page cache: the writers' reads
// then wait less).
func (f *filler) queueRaw(ctx context.Context, blocks []image.Block) error {
	var j *fillJob
	for _, b := range blocks {
		v := VMAAt(f.t.State.VMAs, b.Addr)
		if j != nil {
			last := j.blocks[len(j.blocks)-1]
			if j.vma == v && last.End() == b.Addr && last.Off+uint64(last.Len) == b.Off && j.len()+int(b.Len) <= fillJobMax {
				j.blocks = append(j.blocks, b)
				continue
			}
			if err := f.send(ctx, j); err != nil {
				return err
			}
		}
		j = &fillJob{vma: v, blocks: []image.Block{b}}
	}
	if j != nil {
		return f.send(ctx, j)
	}
	return nil
}

// queueZero queues the zero blocks that must be written (private file
// mappings), one job each.
func (f *filler) queueZero(ctx context.Context, blocks []image.Block) error {
	for _, b := range blocks {
		if err := f.send(ctx, &fillJob{vma: VMAAt(f.t.State.VMAs, b.Addr), blocks: []image.Block{b}, data: f.zeros[:b.Len]}); err != nil {
			return err
		}
	}
	return nil
}

// queueDecoded decodes blocks in batches and queues each batch's blocks,
// waiting until they are written before the decoder reuses the batch.
func (f *filler) queueDecoded(ctx context.Context, blocks []image.Block, vmas []*image.VMA) error {
	if len(blocks) == 0 {
		return nil
	}
	cb := make([]codec.Block, len(blocks))
	for i, b := range blocks {
		cb[i] = codec.Block{Kind: b.Kind, Off: int64(b.Off), StoredLen: int(b.StoredLen), Len: int(b.Len), CRC: b.CRC}
	}
	// base is the first block not yet handed to the writers: a batch
	// fails whole, before any of its blocks is sent.
	base, retried := 0, -1
	for {
		from := base
		err := codec.DecodeBlocks(ctx, f.pages, cb[from:], codec.DecodeOptions{Threads: f.o.Threads, Authenticated: f.noCRC}, func(first int, out [][]byte) error {
			first += from
			var wg sync.WaitGroup
			for i, d := range out {
				wg.Add(1)
				if err := f.send(ctx, &fillJob{vma: vmas[first+i], blocks: blocks[first+i : first+i+1], data: d, done: &wg}); err != nil {
					wg.Done()
					wg.Wait()
					return err
				}
			}
			wg.Wait()
			base = first + len(out)
			return ctx.Err()
		})
		// The block that failed: by its index in the batch (a block the
		// decoder checked), or by its address (a sealed block, which
		// names itself when the source reads it).
		bad := -1
		be, isBE := errors.AsType[*codec.BlockError](err)
		ibe, isIBE := errors.AsType[*image.BlockError](err)
		switch {
		case isIBE:
			for i := from; i < len(blocks); i++ {
				if blocks[i].Addr == ibe.Addr {
					bad = i
					break
				}
			}
		case isBE && be.Index >= 0 && from+be.Index < len(blocks):
			bad = from + be.Index
		}
		if bad < 0 {
			return err
		}
		b := blocks[bad]
		// Bytes kept by the source (an object store's chunk cache) may
		// be the ones that are wrong: dropped and fetched again once per
		// block, as image.Reader does, before it is called corrupt.
		if fg, isF := f.pages.(image.Forgetter); isF && bad != retried && image.Refetchable(err) {
			if fg.Forget(int64(b.Off), int64(b.StoredLen)) {
				f.t.logger().Warn("blocks fetched again: their cached copy failed its check", "addr", fmt.Sprintf("%#x", b.Addr), "err", err)
			}
			retried = bad
			continue
		}
		if isIBE {
			return ibe // a sealed block names itself
		}
		file, index := f.o.Pages.Origin(b)
		return &image.BlockError{File: file, Block: index, Addr: b.Addr, Err: be.Err}
	}
}

// writeLoop writes jobs until the queue closes. After an error (its own,
// returned, or another's: ctx ends) it only takes the remaining jobs off
// the queue.
func (f *filler) writeLoop(ctx context.Context) error {
	var buf []byte
	var err error
	for j := range f.jobs {
		if err == nil && ctx.Err() == nil {
			err = f.do(j, &buf)
		}
		if j.done != nil {
			j.done.Done()
		}
	}
	return err
}

// do writes one job, reading it from the pages file first if it has no
// data.
func (f *filler) do(j *fillJob, buf *[]byte) error {
	data := j.data
	if data == nil {
		n := j.len()
		if cap(*buf) < n {
			*buf = make([]byte, n)
		}
		data = (*buf)[:n]
		if err := f.readRaw(j, data); err != nil {
			return err
		}
	}
	if err := f.write(j, data); err != nil {
		return err
	}
	f.progress(uint64(len(data)))
	return nil
}

// readRaw reads the Raw blocks of j from the pages file into data and
// checks each against its CRC32C, unless PagesFile authenticated them as
// it read them (image.Reader.Authenticated).
func (f *filler) readRaw(j *fillJob, data []byte) error {
	err := f.readRawOnce(j, data)
	if err == nil || !image.Refetchable(err) {
		return err
	}
	// Bytes kept by the source (an object store's chunk cache) may be the
	// ones that are wrong: dropped and fetched again once, as
	// image.Reader does, before the block is called corrupt.
	// (The second read is made even if the source held nothing: another
	// reader may have dropped the same chunk a moment before.)
	fg, ok := f.pages.(image.Forgetter)
	if !ok {
		return err
	}
	first, last := j.blocks[0], j.blocks[len(j.blocks)-1]
	if fg.Forget(int64(first.Off), int64(last.Off+uint64(last.StoredLen)-first.Off)) {
		f.t.logger().Warn("blocks fetched again: their cached copy failed its check", "addr", fmt.Sprintf("%#x", j.addr()), "err", err)
	}
	return f.readRawOnce(j, data)
}

// readRawOnce is one try of readRaw.
func (f *filler) readRawOnce(j *fillJob, data []byte) error {
	if _, err := f.pages.ReadAt(data, int64(j.blocks[0].Off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if ibe, ok := errors.AsType[*image.BlockError](err); ok {
			return ibe // a sealed block names itself
		}
		file, index := f.o.Pages.Origin(j.blocks[0])
		return &image.BlockError{File: file, Block: index, Addr: j.addr(), Err: err}
	}
	if f.noCRC {
		return nil
	}
	for _, b := range j.blocks {
		d := data[b.Addr-j.addr() : b.End()-j.addr()]
		if got := codec.Checksum(d); got != b.CRC {
			file, index := f.o.Pages.Origin(b)
			return &image.BlockError{File: file, Block: index, Addr: b.Addr,
				Err: fmt.Errorf("%w: crc32c %08x, want %08x", codec.ErrChecksum, got, b.CRC)}
		}
	}
	return nil
}

// write writes data at j's address: with process_vm_writev where the
// mapping is writable, else through /proc/PID/mem, which may write
// read-only mappings.
func (f *filler) write(j *fillJob, data []byte) error {
	addr := j.addr()
	var n int
	var err error
	if f.uffdVMAs[j.vma] {
		var c int64
		for n < len(data) && err == nil {
			c, err = uffdio.Copy(f.uffd, addr+uint64(n), data[n:], uffdio.CopyModeDontWake)
			n += int(c)
			if errors.Is(err, uffdio.ErrShort) {
				err = nil
			}
		}
	} else if j.vma.Prot&unix.PROT_WRITE != 0 {
		local := []unix.Iovec{{Base: &data[0]}}
		local[0].SetLen(len(data))
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(data)}}
		n, err = unix.ProcessVMWritev(f.pid, local, remote, 0)
	} else {
		n, err = f.mem.WriteAt(data, int64(addr))
	}
	if err == nil && n != len(data) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(data))
	}
	if err != nil {
		return fmt.Errorf("write memory at %#x: %w", addr, err)
	}
	return nil
}

// openUffd makes a userfaultfd in the process, takes a copy of it and
// closes the process's, and registers MISSING every anonymous private VMA
// that blocks will be written to.
//
// That includes the VMAs that asked for transparent huge pages
// (MADV_HUGEPAGE, VmFlags "hg"), which Map has already advised: UFFDIO_COPY
// places 4 KiB pages in them as anywhere else, where a write through the
// fault path would first allocate and zero a 2 MiB page for the bytes to
// overwrite (slow where the host backs free memory lazily). They keep their
// advice: pages the snapshot does not hold fault in as huge pages once
// the fill is over, and khugepaged may collapse the filled ones.
func (f *filler) openUffd(blocks []image.Block) error {
	want := uffdTargets(f.t.State.VMAs, blocks)
	if len(want) == 0 {
		return nil
	}
	fd, err := Userfaultfd(f.t.In, f.pid)
	if err != nil {
		return err
	}
	f.uffd = fd
	if _, _, err := uffdio.API(fd, 0); err != nil {
		return err
	}
	f.uffdVMAs = map[*image.VMA]bool{}
	for v := range want {
		if _, err := uffdio.Register(fd, v.Start, v.End-v.Start, uffdio.RegisterModeMissing); err != nil {
			return err
		}
		f.uffdVMAs[v] = true
	}
	return nil
}

// uffdTargets returns the VMAs of vmas that openUffd registers: the
// anonymous private ones that blocks will be written to.
func uffdTargets(vmas []image.VMA, blocks []image.Block) map[*image.VMA]bool {
	want := map[*image.VMA]bool{}
	for _, b := range blocks {
		if v := VMAAt(vmas, b.Addr); v.Kind == image.VMAAnon && v.Flags&unix.MAP_PRIVATE != 0 {
			want[v] = true
		}
	}
	return want
}

// closeUffd unregisters what openUffd registered and closes the
// userfaultfd: pages not placed fault in as zeros from now on.
func (f *filler) closeUffd() {
	if f.uffd < 0 {
		return
	}
	for v := range f.uffdVMAs {
		if err := uffdio.Unregister(f.uffd, v.Start, v.End-v.Start); err != nil {
			f.t.Log.Warn("unregister after the fill", "err", err)
		}
	}
	unix.Close(f.uffd)
	f.uffd, f.uffdVMAs = -1, nil
}

// Userfaultfd makes a userfaultfd inside process pid, which in injects
// into (registrations apply to the address space of the process that
// created it), and returns our copy of it; the process keeps none.
func Userfaultfd(in Injector, pid int) (int, error) {
	return UserfaultfdWith(in, pid, 0)
}

// UserfaultfdWith is Userfaultfd with extra flags for userfaultfd(2).
func UserfaultfdWith(in Injector, pid int, flags uint64) (int, error) {
	tfd, err := in.Call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|flags)
	if err != nil {
		return -1, fmt.Errorf("userfaultfd in the process: %w", err)
	}
	defer in.CloseFD(int(tfd))
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	ours, err := unix.PidfdGetfd(pidfd, int(tfd), 0)
	if err != nil {
		return -1, fmt.Errorf("pidfd_getfd: %w", err)
	}
	return ours, nil
}

// progress counts n bytes written and reports the total.
func (f *filler) progress(n uint64) {
	p := f.o.Progress
	if p == nil {
		f.done.Add(n)
		return
	}
	f.progMu.Lock()
	p(f.done.Add(n), f.total)
	f.progMu.Unlock()
}
