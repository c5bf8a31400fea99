package fs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"

	"github.com/lazyfs/lazyfs/engine/image"
)

// process is what the mount holds of one dumped process: its state and
// the reader of its pages, shared by its mem and region files.
type process struct {
	pid   int
	state *image.Process
	json  []byte // process-PID.json as stored
	r     *image.Reader
	log   *slog.Logger
	core  *coreFile // MNT/PID/core, laid out at mount time
}

// openProcess reads the state of pid and opens its pages.
func openProcess(s *image.Snapshot, pid int, ropts image.ReaderOptions) (*process, error) {
	js, err := s.StateJSON(pid)
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	st, err := s.State(pid)
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	r, err := s.OpenPages(pid, ropts)
	if err != nil {
		return nil, fmt.Errorf("process %d: open pages: %w", pid, err)
	}
	p := &process{pid: pid, state: st, json: js, r: r, log: ropts.Logger}
	p.core = newCore(p, s.Manifest.Kernel.Release)
	return p, nil
}

// close closes the pages and the files the core opened.
func (p *process) close() error {
	p.core.close()
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
