package ptrace

import (
	"fmt"
	"time"

	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// spinPolls is how many times a wait polls with sched_yield before it
// starts sleeping: injected system calls come back in microseconds.
const spinPolls = 64

// waitStop waits for tid to report a stop or its exit, until deadline.
func (t *Tracer) waitStop(tid int, reap bool, deadline time.Time) (raw.Status, error) {
	sleep := 20 * time.Microsecond
	for i := 0; ; i++ {
		st, ok, err := raw.WaitOnce(tid, reap)
		if err != nil || ok {
			return st, err
		}
		if i < spinPolls {
			yield()
			continue
		}
		now := time.Now()
		if !now.Before(deadline) {
			return st, fmt.Errorf("thread %d: %w", tid, ErrTimeout)
		}
		d := min(sleep, deadline.Sub(now))
		timer := time.NewTimer(d)
		select {
		case <-t.sigchld:
		case <-timer.C:
		}
		timer.Stop()
		sleep = min(sleep*2, 5*time.Millisecond)
	}
}
