package engine

import (
	"context"

	"github.com/lazyfs/lazyfs/engine/task"
)

// The steps of a process's threads and state: engine/task does the work.

// createThreads recreates every thread but the leader with its tid.
func (r *restorer) createThreads(context.Context) error {
	more, err := task.CreateThreads(r.in, r.st, r.tr.opts.Namespaces.OwnPIDs())
	r.threads = append(r.threads[:1:1], more...)
	return err
}

// threadState restores what each thread registers with the kernel: its
// name, clear_child_tid, robust list, alternate signal stack and rseq.
func (r *restorer) threadState(context.Context) error {
	return task.RestoreThreads(r.in, r.threads, r.st, r.area, scratchLen)
}

// setThreadRegs sets each thread's registers, FP state and signal mask:
// the last thing before the process runs (finish).
func (r *restorer) setThreadRegs() error { return task.SetRegs(r.threads, r.st) }

// processState restores the per-process state (task.RestoreProcess).
func (r *restorer) processState(context.Context) error {
	return task.RestoreProcess(r.in, r.threads, r.area, scratchLen, r.st, r.log)
}

// pendingSignals queues again the signals pending at the dump, once
// every handler and signal mask is in place.
func (r *restorer) pendingSignals(context.Context) error {
	return task.QueuePending(r.pid, r.threads, r.st)
}

// leaveStopped queues SIGSTOP to every thread when the processes are to
// be left stopped.
func (r *restorer) leaveStopped(context.Context) error {
	if !r.tr.opts.LeaveStopped {
		return nil
	}
	return task.StopAll(r.pid, r.threads, r.st)
}
