package lazy

import (
	"time"

	"github.com/lazyfs/lazyfs/engine/uffd"
)

// Options tune the lazy phase of a restore.
type Options struct {
	// PrefetchDelay holds the background prefetch back for this long after
	// the processes start running: faults are served at once, the rest of
	// memory streams in afterwards. 0 starts it at once.
	PrefetchDelay time.Duration
	// Progress, if set, is called from the pagers with the lazily served
	// bytes placed so far and their total, every process together. It
	// must return at once.
	Progress func(done, total uint64)
	// Keeper starts a keeper process (keeper.Keeper: the running program, which must call helper.Main first) that holds a copy
	// of every userfaultfd of the restored tree from before the processes
	// run until their memory is all in, so that if snapctl dies, the
	// userfaultfds outlive the kill that PTRACE_O_EXITKILL sends: a
	// missing page is never filled with zeros in a process still
	// running. If it cannot start, the restore goes on without (and logs
	// a warning).
	Keeper bool
	// WorkingSet says whether the working set of each process beside the
	// snapshot is fetched first (workingset.go).
	WorkingSet WorkingSetMode
	// Record, if set, records a working set for each process (and ignores
	// those there).
	Record *RecordOptions
}

// Stats describe the lazy phase of a restore, every process together.
type Stats struct {
	// Faults is how many page faults the pagers served, FaultBytes what
	// they placed to serve them; PrefetchBytes what the prefetchers placed
	// besides.
	Faults, FaultBytes, PrefetchBytes uint64
	// ReadBytes is what the pagers read from their source: decoded
	// bytes, a page read twice counted twice.
	ReadBytes uint64
	// Exited: every process exited (its address space went away) during
	// the lazy phase, the pages still pending dropped.
	Exited bool
}

// add adds the figures of one process's pager (and of the children it
// forked meanwhile, counted in s's).
func (s *Stats) add(u uffd.Stats) {
	s.Faults += u.Faults
	s.FaultBytes += u.FaultBytes
	s.PrefetchBytes += u.PrefetchBytes
	s.ReadBytes += u.ReadBytes
	s.Exited = s.Exited && u.Exited
}

// addShared adds the figures of the pager of a process's shared memory,
// which serves faults only and may stop before the process is done.
func (s *Stats) addShared(u uffd.Stats) {
	s.Faults += u.Faults
	s.FaultBytes += u.FaultBytes
	s.ReadBytes += u.ReadBytes
}
