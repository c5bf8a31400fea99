package fs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/fs/corefile"
)

// process is what the mount holds of one dumped process: its state and
// the reader of its pages, shared by its mem and region files.
type process struct {
	pid   int
	state *image.Process // nil in a mount of Options.memOnly
	json  []byte         // process-PID.json as stored
	r     *image.Reader
	log   *slog.Logger

	release  string         // the kernel the snapshot was taken on
	coreOnce sync.Once      // lays out coreFile on first use
	coreFile *corefile.File // MNT/PID/core
	ws       wsSource       // MNT/PID/workingset
}

// openProcess reads the state of pid and opens its pages; memOnly opens
// the pages alone (Options.memOnly).
func openProcess(s *image.Snapshot, pid int, ropts image.ReaderOptions, memOnly bool) (*process, error) {
	if memOnly {
		r, err := s.OpenPages(pid, ropts)
		if err != nil {
			return nil, fmt.Errorf("process %d: open pages: %w", pid, err)
		}
		return &process{pid: pid, r: r, log: ropts.Logger}, nil
	}
	st, js, err := s.StateAndJSON(pid)
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	r, err := s.OpenPages(pid, ropts)
	if err != nil {
		return nil, fmt.Errorf("process %d: open pages: %w", pid, err)
	}
	return &process{pid: pid, state: st, json: js, r: r, log: ropts.Logger, release: s.Manifest.Kernel.Release}, nil
}

// core returns MNT/PID/core, laid out the first time it is asked for (a
// mount nobody reads a core from, such as the private mount of a lazy
// restore, never pays for it); its size and offsets are fixed from then
// on.
func (p *process) core() *corefile.File {
	p.coreOnce.Do(func() { p.coreFile = corefile.New(p.state, p.r, p.release) })
	return p.coreFile
}

// close closes the pages and the files the core opened.
func (p *process) close() error {
	if p.coreFile != nil {
		p.coreFile.Close()
	}
	return p.r.Close()
}

// dumpedVMAs returns the VMAs whose contents are in the pages image.
func (p *process) dumpedVMAs() []image.VMA {
	var out []image.VMA
	for _, v := range p.state.VMAs {
		if v.Dumped && v.End > v.Start {
			out = append(out, v)
		}
	}
	return out
}

// memSize is the size of MNT/PID/mem: the end of the highest dumped VMA
// (or of the last dumped page, if a state lists fewer VMAs than the
// pages hold).
func (p *process) memSize() uint64 {
	end := p.r.End()
	if p.state == nil {
		return end // memOnly: the data the pages hold is what is read
	}
	for _, v := range p.dumpedVMAs() {
		end = max(end, v.End)
	}
	return end
}

// errno converts a read error into the errno the reader of a file gets,
// logging it: one conversion point for every read of memory.
func (p *process) errno(err error, addr uint64, n int) syscall.Errno {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return syscall.EINTR
	}
	var be *image.BlockError
	if !errors.As(err, &be) { // block errors are logged by the reader itself
		p.log.Error("read memory", "pid", p.pid, "addr", fmt.Sprintf("%#x", addr), "len", n, "err", err)
	}
	return syscall.EIO
}
