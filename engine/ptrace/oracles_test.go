package ptrace

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Readers only the tests use: a second way to read what the package reads
// in batches or holds across injection, to check it against.

// SigActions reads the disposition of every signal with injected
// rt_sigaction(sig, NULL, &old, 8); element i is signal i+1.
func (in *Injector) SigActions() ([NumSignals]SigAction, error) {
	var out [NumSignals]SigAction
	err := in.th.p.t.Do(func() error {
		if err := in.needScratch(32); err != nil {
			return err
		}
		for sig := 1; sig <= NumSignals; sig++ {
			if _, err := in.call(unix.SYS_RT_SIGACTION, uint64(sig), 0, in.scratch, 8); err != nil {
				return fmt.Errorf("rt_sigaction(%d): %w", sig, err)
			}
			if err := in.th.p.ReadMem(in.scratch, bytesOf(&out[sig-1])); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// CanBatch reports whether Batch runs its calls in one resume (the
// Injector was made by NewInjector, or by InjectorAt on the stub of an
// open one); otherwise Batch injects them one by one.
func (in *Injector) CanBatch() bool { return in.batch != 0 }

// ReadUint64 reads one little-endian word.
func (p *Process) ReadUint64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := p.ReadMem(addr, b[:]); err != nil {
		return 0, err
	}
	return le64(b[:]), nil
}

// maxPending bounds PendingSignals (RLIMIT_SIGPENDING is usually a few
// thousand; realtime signals can queue).
const maxPending = 1 << 16

// PendingSignals returns the signals queued for the thread (shared=false)
// or for the whole process (shared=true), oldest first, without dequeuing
// them (PTRACE_PEEKSIGINFO).
func (th *Thread) PendingSignals(shared bool) ([]SigInfo, error) {
	var out []SigInfo
	err := th.on(func() error {
		buf := make([]SigInfo, 32)
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

func ptPeekSigInfo(tid int, shared bool, off uint64, out []SigInfo) (int, error) {
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
