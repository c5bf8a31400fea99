package engine

import (
	"context"
	"github.com/lazyfs/lazyfs/engine/fds"
	"log/slog"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/task"
)

// dumper is one dump: what it learns of its frozen process, and what it
// has created and must undo if it fails.
type dumper struct {
	pid  int
	opts DumpOptions
	log  *slog.Logger

	w          *image.Writer
	t          *ptrace.Tracer
	p          *ptrace.Process
	frozen     time.Time // when the first thread stopped
	maps       []proc.Mapping
	st         *image.Process
	stats      image.Stats
	committed  bool
	resumed    bool // detached or killed
	resumeErr  error
	freezeTime time.Duration
	res        *DumpResult
	// tcp holds the connections taken with TCP_REPAIR (--tcp-established)
	// until the process runs again or dies.
	tcp *fds.TCPRepair
}

// processState reads what /proc tells of the process (task.ReadProcess).
func (d *dumper) processState(context.Context) error { return task.ReadProcess(d.pid, d.st) }

// injected reads what only the process can tell, by injected system calls
// (task.Inject).
func (d *dumper) injected(context.Context) error { return task.Inject(d.p, d.st, d.log) }
