package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd"
	"github.com/lazyfs/lazyfs/engine/units"
)

// Working sets (image.WorkingSet): a lazy restore can record which memory
// the process touched first, and a later lazy restore of the same
// snapshot fetches that memory before the rest, in the recorded order.

// WorkingSetMode says what a lazy restore does with the working set
// beside the snapshot.
type WorkingSetMode int

const (
	// WorkingSetUse fetches a working set first if there is one that
	// matches the snapshot; a damaged or foreign one is ignored with a
	// warning naming it.
	WorkingSetUse WorkingSetMode = iota
	// WorkingSetOff ignores it.
	WorkingSetOff
)

// RecordOptions make a lazy restore record a working set: the ranges
// the process faults in, in order, with the prefetcher held back so that
// every page it needs comes by a fault, until the first stop condition;
// then it is written beside the snapshot (image.WriteWorkingSet, atomic:
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
	// Used: the restore fetched Ranges (Bytes of memory) first.
	Used   bool
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

// workingSetFirst returns the blocks of the working set beside the
// snapshot that the pager serves, in recorded order, merged into ranges
// where they follow each other, for uffd.Options.First; or nil, with a
// warning naming the file if one is there but cannot be used.
func (r *restorer) workingSetFirst(res *WorkingSetResult) []units.Range {
	o := r.opts.LazyOptions
	if o.WorkingSet == WorkingSetOff || o.Record != nil {
		return nil
	}
	pid, err := SnapshotPID(r.snap)
	if err != nil {
		return nil
	}
	ws, err := r.snap.WorkingSet(pid)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		res.Ignored = err.Error()
		r.log.Warn("working set ignored: the restore goes on without it", "err", err)
		return nil
	}
	res.Path = filepath.Join(r.snap.Dir, image.WorkingSetName(pid))
	seen := map[uint64]bool{}
	var out []units.Range
	for _, e := range ws.Entries {
		for a := e.Addr; a < e.End(); {
			b, ok := r.pages.BlockAt(a)
			if !ok {
				// A hole of the snapshot (not a block): on to the next
				// block, if the entry reaches one.
				next, ok := r.pages.NextData(a)
				if !ok || next <= a {
					break
				}
				a = next
				continue
			}
			a = b.End()
			if seen[b.Addr] || b.Kind == codec.Zero || !r.lazyBlock(b) {
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
	res.Used, res.Ranges = len(out) > 0, len(out)
	r.log.Debug("working set", "file", res.Path, "entries", len(ws.Entries), "ranges", len(out), "bytes", res.Bytes)
	return out
}

// startRecording sets the pager's options up for recording (held
// prefetch, every fault observed) and returns the recorder.
func (r *restorer) startRecording(po *uffd.Options, start time.Time) *uffd.Recorder {
	ro := r.opts.LazyOptions.Record
	if ro == nil {
		return nil
	}
	rec := uffd.NewRecorder(start, ro.Faults)
	po.HoldPrefetch, po.OnFault = true, rec.Observe
	return rec
}

// record waits for the recording's first stop condition (or the end of
// the lazy phase, ctx), releases the prefetcher and writes the working
// set beside the snapshot. A write that fails is a warning: the restore
// goes on.
func (r *restorer) record(ctx context.Context, rec *uffd.Recorder, p *uffd.Pager, res *WorkingSetResult) {
	ro := r.opts.LazyOptions.Record
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
	p.ReleasePrefetch()
	touches, reason, span := rec.Result()
	pid, err := SnapshotPID(r.snap)
	if err != nil {
		r.log.Warn("working set not written", "err", err)
		return
	}
	ws := &image.WorkingSet{PID: pid, Snapshot: r.snap.ID(), Span: span, Stop: reason}
	for _, t := range touches {
		ws.Entries = append(ws.Entries, image.WorkingSetEntry{Addr: t.Addr, Len: t.Len, At: t.At})
	}
	if err := image.WriteWorkingSet(r.snap.Dir, ws); err != nil {
		r.log.Warn("working set not written", "err", err)
		return
	}
	res.Recorded, res.Path, res.Span, res.Stop = true, filepath.Join(r.snap.Dir, image.WorkingSetName(pid)), span, reason
	res.Ranges, res.Bytes = len(ws.Entries), ws.Bytes()
	r.log.Debug("working set recorded", "file", res.Path, "ranges", res.Ranges, "bytes", res.Bytes, "span", span, "stop", reason)
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
