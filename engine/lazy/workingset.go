package lazy

import (
	"cmp"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Working sets (workingset.Set): a lazy restore can record which memory
// the process touched first, and a later lazy restore of the same
// snapshot fetches that memory before the rest, in the recorded order.

// WorkingSetMode says what a lazy restore does with the working set
// beside the snapshot.
type WorkingSetMode int

const (
	// WorkingSetUse fetches a working set first if there is one that
	// matches the snapshot; a damaged or foreign one is ignored with a
	// warning naming it, and an entry of its copy of the memory whose
	// bytes fail their CRC32C is read from the snapshot instead, with a
	// warning naming the entry.
	WorkingSetUse WorkingSetMode = iota
	// WorkingSetOff ignores it.
	WorkingSetOff
	// WorkingSetBlocks fetches the snapshot's blocks that hold the
	// working set first, read in place from the source, even if the
	// working set carries its own copy of the memory (which
	// WorkingSetUse prefers).
	WorkingSetBlocks
)

// RecordOptions make a lazy restore record a working set: the ranges
// the process faults in, in order, with the prefetcher held back so that
// every page it needs comes by a fault, until the first stop condition;
// then it is written beside the snapshot (workingset.Write, atomic:
// a restore killed before leaves the previous file, or none) and the
// prefetcher streams in the rest.
type RecordOptions struct {
	// For stops the recording after this long (0: no limit).
	For time.Duration
	// Faults stops it after this many faults served from the snapshot
	// (0: no limit).
	Faults int
	// Stop stops it when it is closed or receives (snapctl: SIGUSR1, sent
	// by whoever saw the process's first answer).
	Stop <-chan struct{}
}

// WorkingSetResult says what a lazy restore did with working sets.
type WorkingSetResult struct {
	// Path is the working-set file used or written ("" if none).
	Path string
	// Used: the restore fetched Ranges (Bytes of memory) first: from the
	// working set's own copy if Copy, else from the snapshot's blocks.
	Used   bool
	Copy   bool
	Ranges int
	Bytes  uint64
	// Ignored says why a working set beside the snapshot was not used
	// (it was also logged as a warning).
	Ignored string
	// Recorded: the restore wrote a working set of Bytes in Ranges
	// ranges, recorded for Span until Stop ("duration", "faults",
	// "signal", "done": the lazy phase ended first).
	Recorded bool
	Span     time.Duration
	Stop     string
}

// workingSetFirst returns what the pager fetches first from the working
// set beside the snapshot (uffd.Options.First), and the source to read it
// from: the working set's own copy of the memory if it has one (a source
// that answers reads inside the copy from it, the rest from src), else
// the snapshot's blocks that hold it, in src. With no usable working set
// it returns nil and src, with a warning naming the file if there is one.
func (p *Process) workingSetFirst(src io.ReaderAt) ([]units.Range, io.ReaderAt) {
	res := &p.ws
	if p.wsLoad == nil {
		return nil, src
	}
	ws, err := p.wsLoad()
	if ws == nil && err == nil {
		return nil, src
	}
	if err != nil {
		res.Ignored = err.Error()
		p.ph.log.Warn("working set ignored: the restore goes on without it", "err", err)
		return nil, src
	}
	res.Path = p.workingSetPath()
	var out []units.Range
	if p.usesCopy(ws) {
		out, src = p.workingSetCopy(ws, src, res)
	} else {
		out = p.workingSetBlocks(ws, res)
	}
	res.Used, res.Ranges = len(out) > 0, len(out)
	p.ph.log.Debug("working set", "file", res.Path, "entries", len(ws.Entries), "ranges", len(out), "bytes", res.Bytes, "copy", res.Copy)
	return out, src
}

// usesCopy reports whether the pager reads ws's own copy of the memory.
// The copy is checked by its own CRC32C only: a sealed or signed
// snapshot's memory is what authenticates, so only the working set's
// addresses serve there.
func (p *Process) usesCopy(ws *workingset.Set) bool {
	return ws.HasData() && p.ph.opts.WorkingSet != WorkingSetBlocks && !p.snap.Sealed() && !p.snap.Signed()
}

// loadWorkingSet starts reading the working set beside the snapshot, if
// the restore uses one, while the restore goes on; p.wsLoad waits for it
// and returns it (nil, nil if there is none).
func (p *Process) loadWorkingSet() {
	o := p.ph.opts
	if o.WorkingSet == WorkingSetOff || o.Record != nil {
		return
	}
	var ws *workingset.Set
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ws, err = workingset.Map(p.snap, p.st.PID) // closed with p
		if errors.Is(err, os.ErrNotExist) {
			ws, err = nil, nil
		}
		if errors.Is(err, image.ErrUnsupported) {
			// A store that keeps none (an object store without a cache
			// directory): nothing was ever recorded.
			p.ph.log.Debug("no working set", "err", err)
			ws, err = nil, nil
		}
	}()
	p.wsLoad = func() (*workingset.Set, error) {
		<-done
		return ws, err
	}
}

// workingSetBlocks returns the lazily served blocks that hold ws, in the
// order of its entries, merged into ranges where they follow each other.
func (p *Process) workingSetBlocks(ws *workingset.Set, res *WorkingSetResult) []units.Range {
	seen := map[uint64]bool{}
	var out []units.Range
	for _, e := range ws.Entries {
		for a := e.Addr; a < e.End(); {
			b, ok := p.pages.BlockAt(a)
			if !ok {
				// A hole of the snapshot (not a block): on to the next
				// block, if the entry reaches one.
				next, ok := p.pages.NextData(a)
				if !ok || next <= a {
					break
				}
				a = next
				continue
			}
			a = b.End()
			if seen[b.Addr] || b.Kind == codec.Zero || !p.serves(b) {
				continue
			}
			seen[b.Addr] = true
			res.Bytes += uint64(b.Len)
			if n := len(out); n > 0 && out[n-1].End == b.Addr {
				out[n-1].End = b.End()
				continue
			}
			out = append(out, units.Range{Start: b.Addr, End: b.End()})
		}
	}
	return out
}

// workingSetCopy returns ws's entries that lie in lazily served blocks,
// in order, and a source that reads them from ws's copy and everything
// else from src. Map left the copy's bytes unchecked: the source checks
// each entry's when it first reads it, as the pager reads the
// snapshot's blocks, rather than the restore all of them before the
// pager may start.
func (p *Process) workingSetCopy(ws *workingset.Set, src io.ReaderAt, res *WorkingSetResult) ([]units.Range, io.ReaderAt) {
	path := p.workingSetPath()
	c := &copySource{src: src, ws: ws, state: make([]atomic.Int32, len(ws.Entries)), bad: func(err error) {
		p.ph.log.Warn("working set entry damaged: its memory is read from the snapshot", "file", path, "err", err)
	}}
	var out []units.Range
	for i, e := range ws.Entries {
		b, ok := p.pages.BlockAt(e.Addr)
		if !ok || b.Kind == codec.Zero || !p.serves(b) || e.End() > b.End() && !p.lazyRange(e.Addr, e.End()) {
			continue
		}
		out = append(out, units.Range{Start: e.Addr, End: e.End()})
		c.parts = append(c.parts, i)
		res.Bytes += e.Len
	}
	slices.SortFunc(c.parts, func(a, b int) int { return cmp.Compare(ws.Entries[a].Addr, ws.Entries[b].Addr) })
	res.Copy = true
	return out, c
}

// lazyRange reports whether every block of [lo, hi) is lazily served.
func (p *Process) lazyRange(lo, hi uint64) bool {
	for a := lo; a < hi; {
		b, ok := p.pages.BlockAt(a)
		if !ok || !p.serves(b) {
			return false
		}
		a = b.End()
	}
	return true
}

// copySource answers a read that lies inside one entry of a working
// set's copy from it, and any other from src. The copy is the working
// set's file mapped (workingset.Map); an entry's bytes are checked
// against their CRC32C before they are first read (good), and an entry
// that fails is read from src, a warning naming it (bad). A snapshot in
// clear is checked for accidents, not edits (an edit of the file in
// place during the restore is one), and a sealed or signed snapshot
// never reads a working set's copy. A file truncated meanwhile fails the
// read, which src answers.
type copySource struct {
	src   io.ReaderAt
	ws    *workingset.Set
	parts []int          // indices of ws.Entries, sorted by address, disjoint
	state []atomic.Int32 // of each of ws.Entries: entryUnchecked, ...
	bad   func(error)
}

// The states of a working set entry's bytes in a copySource.
const (
	entryUnchecked = iota
	entryGood
	entryBad
)

func (c *copySource) ReadAt(p []byte, off int64) (int, error) {
	a := uint64(off)
	k, _ := slices.BinarySearchFunc(c.parts, a, func(i int, a uint64) int {
		switch e := c.ws.Entries[i]; {
		case e.End() <= a:
			return -1
		case e.Addr > a:
			return 1
		}
		return 0
	})
	if k < len(c.parts) {
		i := c.parts[k]
		if e := c.ws.Entries[i]; e.Addr <= a && a+uint64(len(p)) <= e.End() && c.good(i) {
			// A mapped file truncated since: the snapshot's blocks then.
			if n, err := workingset.ReadData(p, e, a-e.Addr); err == nil {
				return n, nil
			}
		}
	}
	return c.src.ReadAt(p, off)
}

// good reports whether entry i's bytes match their CRC32C, checking
// them the first time (the pager's goroutines may check one at once: the
// same answer).
func (c *copySource) good(i int) bool {
	switch c.state[i].Load() {
	case entryGood:
		return true
	case entryBad:
		return false
	}
	if err := c.ws.CheckData(i); err != nil {
		if c.state[i].CompareAndSwap(entryUnchecked, entryBad) {
			c.bad(err)
		}
		return false
	}
	c.state[i].CompareAndSwap(entryUnchecked, entryGood)
	return true
}

// startRecording sets the pager's options up for recording (held
// prefetch, every fault observed) and returns the recorder.
func (p *Process) startRecording(po *uffd.Options, start time.Time) *uffd.Recorder {
	ro := p.ph.opts.Record
	if ro == nil {
		return nil
	}
	rec := uffd.NewRecorder(start, ro.Faults)
	po.HoldPrefetch, po.OnFault = true, rec.Observe
	// Every fault brings in its page only: what is recorded is what the
	// process touched, not the blocks around it.
	po.MaxFaultBytes, po.FaultAhead, po.NoStrideAhead = uffd.PageSize, uffd.PageSize, true
	return rec
}

// record waits for the recording's first stop condition (or the end of
// the lazy phase, ctx), releases the prefetcher and writes the working
// set beside the snapshot. A write that fails is a warning: the restore
// goes on.
func (p *Process) record(ctx context.Context, rec *uffd.Recorder, pager *uffd.Pager) {
	ro := p.ph.opts.Record
	res := &p.ws
	var timeout <-chan time.Time
	if ro.For > 0 {
		t := time.NewTimer(ro.For)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-rec.Done():
	case <-timeout:
		rec.Stop("duration")
	case <-ro.Stop:
		rec.Stop("signal")
	case <-ctx.Done():
		rec.Stop("done")
		if !errors.Is(context.Cause(ctx), errLazyDoneOK) {
			return // the restore failed: nothing worth keeping
		}
	}
	pager.ReleasePrefetch()
	touches, reason, span := rec.Result()
	pid := p.st.PID
	ws := &workingset.Set{PID: pid, Snapshot: p.snap.ID(), Span: span, Stop: reason}
	var total uint64
	for _, t := range touches {
		// Pages touched one after the other make one entry.
		if n := len(ws.Entries); n > 0 && ws.Entries[n-1].End() == t.Addr {
			ws.Entries[n-1].Len += t.Len
		} else {
			ws.Entries = append(ws.Entries, workingset.Entry{Addr: t.Addr, Len: t.Len, At: t.At})
		}
		total += t.Len
	}
	// The memory itself, laid out contiguously, read from the snapshot's
	// own reader (which checks every block) unless it is too large, or
	// the snapshot is signed: a restore would not use that copy, which
	// nothing authenticates (workingSetFirst). (A sealed snapshot records
	// no working set: Restore refuses it.)
	if total <= workingset.MaxData && !p.snap.Signed() {
		ctx := context.WithoutCancel(ctx) // over when the lazy phase is: the snapshot is still open
		for i := range ws.Entries {
			e := &ws.Entries[i]
			buf := make([]byte, e.Len)
			if _, err := p.pages.ReadAtWith(ctx, buf, int64(e.Addr), image.ReadOptions{}); err != nil {
				p.ph.log.Warn("working set written without its memory", "err", err)
				for j := range ws.Entries {
					ws.Entries[j].Data = nil
				}
				break
			}
			e.Data = buf
		}
	}
	if err := workingset.Write(p.snap, ws); err != nil {
		p.ph.log.Warn("working set not written", "err", err)
		return
	}
	res.Recorded, res.Path, res.Span, res.Stop = true, p.workingSetPath(), span, reason
	res.Ranges, res.Bytes = len(ws.Entries), ws.Bytes()
	p.ph.log.Debug("working set recorded", "file", res.Path, "ranges", res.Ranges, "bytes", res.Bytes, "span", span, "stop", reason)
}

// errLazyDoneOK is the cause of the lazy phase's end when the pager
// finished without error: a recording still running then is written.
var errLazyDoneOK = errors.New("lazy phase over")

// errLazyDone is the cause to cancel the lazy phase with once Run has
// returned err.
func errLazyDone(err error) error {
	if err == nil {
		return errLazyDoneOK
	}
	return err
}

// workingSetPath names the working-set file of the process.
func (p *Process) workingSetPath() string {
	dir, err := workingset.Dir(p.snap)
	if err != nil {
		dir = p.snap.Dir
	}
	return filepath.Join(dir, workingset.Name(p.st.PID))
}
