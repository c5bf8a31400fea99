package ptrace

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// si_code values of SIGCHLD (waitid).
const (
	cldExited  = 1
	cldKilled  = 2
	cldDumped  = 3
	cldTrapped = 4
	cldStopped = 5
)

// status is one wait result for a tracee.
type status struct {
	exited   bool        // the thread is gone (exit or kill)
	sig      unix.Signal // stop signal, or the killing signal
	event    int         // PTRACE_EVENT_* of a stop, 0 for a signal stop
	exitCode int         // exit status when exited by exit()
}

func (s status) String() string {
	switch {
	case s.exited && s.sig != 0:
		return fmt.Sprintf("killed by %v", s.sig)
	case s.exited:
		return fmt.Sprintf("exited(%d)", s.exitCode)
	case s.event != 0:
		return fmt.Sprintf("event stop %d (%v)", s.event, s.sig)
	default:
		return fmt.Sprintf("signal stop %v", s.sig)
	}
}

// waitOnce polls tid once without blocking. It returns ok=false when the
// tid has nothing to report. Stops are consumed; an exit is consumed only
// when reap is set (leaving a foreign child's exit for its real parent's
// wait).
func waitOnce(tid int, reap bool) (st status, ok bool, err error) {
	var info unix.Siginfo
	const any = unix.WSTOPPED | unix.WEXITED | unix.WALL | unix.WNOHANG | unix.WNOWAIT
	for {
		err = unix.Waitid(unix.P_PID, tid, &info, any, nil)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.ECHILD {
		return status{exited: true}, true, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("waitid %d: %w", tid, err)
	}
	raw := (*SigInfo)(unsafe.Pointer(&info))
	if raw.Pid() == 0 {
		return st, false, nil
	}
	code := raw.Code()
	val := int(int32(le32(raw[24:])))
	consume := unix.WSTOPPED | unix.WALL | unix.WNOHANG
	switch code {
	case cldTrapped, cldStopped:
		st = status{sig: unix.Signal(val & 0xff), event: val >> 8}
	case cldExited:
		st = status{exited: true, exitCode: val}
		consume = unix.WEXITED | unix.WALL | unix.WNOHANG
	case cldKilled, cldDumped:
		st = status{exited: true, sig: unix.Signal(val)}
		consume = unix.WEXITED | unix.WALL | unix.WNOHANG
	default:
		// CLD_CONTINUED is not requested; anything else is a surprise.
		return st, false, fmt.Errorf("waitid %d: unexpected si_code %d", tid, code)
	}
	if st.exited && !reap {
		return st, true, nil
	}
	for {
		err = unix.Waitid(unix.P_PID, tid, &info, consume, nil)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil && err != unix.ECHILD {
		return st, false, fmt.Errorf("waitid %d: %w", tid, err)
	}
	return st, true, nil
}

// spinPolls is how many times a wait polls with sched_yield before it
// starts sleeping: injected system calls come back in microseconds.
const spinPolls = 64

// waitStop waits for tid to report a stop or its exit, until deadline.
func (t *Tracer) waitStop(tid int, reap bool, deadline time.Time) (status, error) {
	sleep := 20 * time.Microsecond
	for i := 0; ; i++ {
		st, ok, err := waitOnce(tid, reap)
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
