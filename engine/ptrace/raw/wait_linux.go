package raw

import (
	"fmt"
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

// Status is one wait result for a tracee.
type Status struct {
	Exited   bool        // the thread is gone (exit or kill)
	Sig      unix.Signal // stop signal, or the killing signal
	Event    int         // PTRACE_EVENT_* of a stop, 0 for a signal stop
	ExitCode int         // exit status when exited by exit()
}

func (s Status) String() string {
	switch {
	case s.Exited && s.Sig != 0:
		return fmt.Sprintf("killed by %v", s.Sig)
	case s.Exited:
		return fmt.Sprintf("exited(%d)", s.ExitCode)
	case s.Event != 0:
		return fmt.Sprintf("event stop %d (%v)", s.Event, s.Sig)
	default:
		return fmt.Sprintf("signal stop %v", s.Sig)
	}
}

// WaitOnce polls tid once without blocking. It returns ok=false when the
// tid has nothing to report. Stops are consumed; an exit is consumed only
// when reap is set (leaving a foreign child's exit for its real parent's
// wait).
func WaitOnce(tid int, reap bool) (st Status, ok bool, err error) {
	var info unix.Siginfo
	const any = unix.WSTOPPED | unix.WEXITED | unix.WALL | unix.WNOHANG | unix.WNOWAIT
	for {
		err = unix.Waitid(unix.P_PID, tid, &info, any, nil)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.ECHILD {
		return Status{Exited: true}, true, nil
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
		st = Status{Sig: unix.Signal(val & 0xff), Event: val >> 8}
	case cldExited:
		st = Status{Exited: true, ExitCode: val}
		consume = unix.WEXITED | unix.WALL | unix.WNOHANG
	case cldKilled, cldDumped:
		st = Status{Exited: true, Sig: unix.Signal(val)}
		consume = unix.WEXITED | unix.WALL | unix.WNOHANG
	default:
		// CLD_CONTINUED is not requested; anything else is a surprise.
		return st, false, fmt.Errorf("waitid %d: unexpected si_code %d", tid, code)
	}
	if st.Exited && !reap {
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
