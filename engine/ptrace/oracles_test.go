package ptrace

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace/raw"
)

// Readers only the tests use: a second way to read what the package reads
// in batches or holds across injection, to check it against.

// maxPending bounds PendingSignals (RLIMIT_SIGPENDING is usually a few
// thousand; realtime signals can queue).
const maxPending = 1 << 16

// PendingSignals returns the signals queued for the thread (shared=false)
// or for the whole process (shared=true), oldest first, without dequeuing
// them (PTRACE_PEEKSIGINFO).
func (th *Thread) PendingSignals(shared bool) ([]raw.SigInfo, error) {
	var out []raw.SigInfo
	err := th.on(func() error {
		buf := make([]raw.SigInfo, 32)
		for len(out) < maxPending {
			n, err := ptPeekSigInfo(th.tid, shared, uint64(len(out)), buf)
			if err != nil {
				return th.check("PTRACE_PEEKSIGINFO", err)
			}
			out = append(out, buf[:n]...)
			if n < len(buf) {
				return nil
			}
		}
		return fmt.Errorf("thread %d: more than %d pending signals", th.tid, maxPending)
	})
	return out, err
}

// peekSigInfoArgs is struct ptrace_peeksiginfo_args.
type peekSigInfoArgs struct {
	Off   uint64
	Flags uint32
	Nr    int32
}

const peekSigInfoShared = 1 // PTRACE_PEEKSIGINFO_SHARED

func ptPeekSigInfo(tid int, shared bool, off uint64, out []raw.SigInfo) (int, error) {
	a := peekSigInfoArgs{Off: off, Nr: int32(len(out))}
	if shared {
		a.Flags = peekSigInfoShared
	}
	r, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKSIGINFO, uintptr(tid),
		uintptr(unsafe.Pointer(&a)), uintptr(unsafe.Pointer(&out[0])), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
