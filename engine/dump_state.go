package engine

import (
	"log/slog"
	"time"

	"github.com/lazyfs/lazyfs/engine/fds/sock"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/mem"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/task"
)

// dumper is one dump: what it learns of its frozen processes, and what it
// has created and must undo if it fails.
type dumper struct {
	pid  int
	opts DumpOptions
	log  *slog.Logger

	w *image.Writer
	t *ptrace.Tracer
	// procs are the processes of the tree, in tree order (treeOrder):
	// the dumped process first.
	procs      []*dumpProc
	frozen     time.Time     // when the first thread stopped
	stop       time.Duration // stopping every thread took
	stats      image.Stats
	committed  bool
	resumed    bool // detached or killed
	resumeErr  error
	freezeTime time.Duration
	res        *DumpResult
	// tcp holds the connections of every process of the tree taken with
	// TCP_REPAIR (--tcp-established), under one network lock, until the
	// processes run again or die.
	tcp *sock.TCPRepair
	// pc and preRes, in a pre-copy dump: the copy made while the process
	// ran, and the figures of its rounds.
	pc     *mem.PreCopy
	preRes *PreCopyResult
	preP   *ptrace.Process // attached since the pre-copy
}

// dumpProc is one process of the dumped tree.
type dumpProc struct {
	pid, parent int
	comm        string
	p           *ptrace.Process
	maps        []proc.Mapping
	st          *image.Process
}

// processState reads what /proc tells of the process (task.ReadProcess).
func (d *dumper) processState(p *dumpProc) error { return task.ReadProcess(p.pid, p.st) }
