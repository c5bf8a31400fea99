package raw

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

func ptraceRaw(req, tid int, addr, data uintptr) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), addr, data, 0, 0)
	if e != 0 {
		return r, e
	}
	return r, nil
}

func ptracePtr(req, tid int, addr uintptr, data unsafe.Pointer) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), addr, uintptr(data), 0, 0)
	if e != 0 {
		return r, e
	}
	return r, nil
}

// Seize attaches to tid with PTRACE_SEIZE and options opts (PTRACE_O_*).
func Seize(tid, opts int) error {
	_, err := ptraceRaw(unix.PTRACE_SEIZE, tid, 0, uintptr(opts))
	return err
}

// Interrupt asks tid for a stop (PTRACE_INTERRUPT).
func Interrupt(tid int) error {
	_, err := ptraceRaw(unix.PTRACE_INTERRUPT, tid, 0, 0)
	return err
}

// Cont resumes tid, delivering signal sig (0: none) (PTRACE_CONT).
func Cont(tid, sig int) error {
	_, err := ptraceRaw(unix.PTRACE_CONT, tid, 0, uintptr(sig))
	return err
}

// Listen lets tid, in a group-stop, report the next stop without resuming
// it (PTRACE_LISTEN).
func Listen(tid int) error {
	_, err := ptraceRaw(unix.PTRACE_LISTEN, tid, 0, 0)
	return err
}

// Detach detaches from tid, delivering signal sig (0: none)
// (PTRACE_DETACH).
func Detach(tid, sig int) error {
	_, err := ptraceRaw(unix.PTRACE_DETACH, tid, 0, uintptr(sig))
	return err
}

// SetOptions sets tid's options (PTRACE_O_*; PTRACE_SETOPTIONS).
func SetOptions(tid, opts int) error {
	_, err := ptraceRaw(unix.PTRACE_SETOPTIONS, tid, 0, uintptr(opts))
	return err
}

// EventMsg returns the message of tid's last event stop: the new task's
// id after a clone or fork (PTRACE_GETEVENTMSG).
func EventMsg(tid int) (uint64, error) {
	var msg uint64
	_, err := ptracePtr(unix.PTRACE_GETEVENTMSG, tid, 0, unsafe.Pointer(&msg))
	return msg, err
}

// Peek reads the word at addr of tid (PTRACE_PEEKTEXT; the raw syscall
// stores it at *data).
func Peek(tid int, addr uint64) (uint64, error) {
	var w uint64
	_, err := ptracePtr(unix.PTRACE_PEEKTEXT, tid, uintptr(addr), unsafe.Pointer(&w))
	return w, err
}

// Poke writes the word w at addr of tid (PTRACE_POKETEXT).
func Poke(tid int, addr, w uint64) error {
	_, err := ptraceRaw(unix.PTRACE_POKETEXT, tid, uintptr(addr), uintptr(w))
	return err
}

// GetRegSet reads tid's regset note into buf and returns the length the
// kernel filled in (PTRACE_GETREGSET).
func GetRegSet(tid int, note int, buf []byte) (int, error) {
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	_, err := ptracePtr(unix.PTRACE_GETREGSET, tid, uintptr(note), unsafe.Pointer(&iov))
	return int(iov.Len), err
}

// SetRegSet writes buf as tid's regset note (PTRACE_SETREGSET).
func SetRegSet(tid int, note int, buf []byte) error {
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	_, err := ptracePtr(unix.PTRACE_SETREGSET, tid, uintptr(note), unsafe.Pointer(&iov))
	return err
}

// GetSigMask returns tid's blocked signals (PTRACE_GETSIGMASK).
func GetSigMask(tid int) (uint64, error) {
	var m uint64
	_, err := ptracePtr(unix.PTRACE_GETSIGMASK, tid, 8, unsafe.Pointer(&m))
	return m, err
}

// SetSigMask sets tid's blocked signals (PTRACE_SETSIGMASK).
func SetSigMask(tid int, m uint64) error {
	_, err := ptracePtr(unix.PTRACE_SETSIGMASK, tid, 8, unsafe.Pointer(&m))
	return err
}

// GetSigInfo returns the siginfo of tid's signal stop (PTRACE_GETSIGINFO).
func GetSigInfo(tid int) (SigInfo, error) {
	var si SigInfo
	_, err := ptracePtr(unix.PTRACE_GETSIGINFO, tid, 0, unsafe.Pointer(&si))
	return si, err
}

// SetSigInfo replaces the siginfo of tid's signal stop
// (PTRACE_SETSIGINFO).
func SetSigInfo(tid int, si *SigInfo) error {
	_, err := ptracePtr(unix.PTRACE_SETSIGINFO, tid, 0, unsafe.Pointer(si))
	return err
}

// RseqConfig is struct ptrace_rseq_configuration.
type RseqConfig struct {
	Ptr       uint64 // address of the thread's struct rseq; 0 if none
	Size      uint32 // registered length
	Signature uint32 // abort signature
	Flags     uint32
	_         uint32
}

// GetRseq returns tid's rseq registration
// (PTRACE_GET_RSEQ_CONFIGURATION).
func GetRseq(tid int) (RseqConfig, error) {
	var c RseqConfig
	_, err := ptracePtr(unix.PTRACE_GET_RSEQ_CONFIGURATION, tid, unsafe.Sizeof(c), unsafe.Pointer(&c))
	return c, err
}

// SigInfo is a raw siginfo_t (128 bytes).
type SigInfo [128]byte

// Signo is si_signo.
func (s *SigInfo) Signo() unix.Signal { return unix.Signal(int32(le32(s[0:]))) }

// Code is si_code.
func (s *SigInfo) Code() int32 { return int32(le32(s[8:])) }

// Addr is si_addr (meaningful for faults).
func (s *SigInfo) Addr() uint64 { return le64(s[16:]) }

// Pid is si_pid (meaningful for kill, sigqueue and SIGCHLD).
func (s *SigInfo) Pid() int32 { return int32(le32(s[16:])) }

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
