package syscalls

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// ThreadInfo is the state of a thread that only injected calls read.
type ThreadInfo struct {
	TidAddress uint64 // prctl(PR_GET_TID_ADDRESS)
	AltStack   AltStack
	// PdeathSig is prctl(PR_GET_PDEATHSIG): the signal the thread gets
	// when the thread that created it dies (0: none).
	PdeathSig int
}

// ProcessInfo is the state of a process that only injected calls read,
// with that of the thread they ran in.
type ProcessInfo struct {
	SigActions [NumSignals]SigAction
	Brk        uint64
	Dumpable   int // prctl(PR_GET_DUMPABLE)
	// ChildSubreaper is prctl(PR_GET_CHILD_SUBREAPER); SubreaperErr its
	// failure, if any (kernels without it).
	ChildSubreaper bool
	SubreaperErr   error
	Thread         ThreadInfo
}

// Scratch layout of ReadProcess and ReadThread: the answers first, the
// table after them.
const (
	infoActs      = 0
	infoSubreaper = infoActs + NumSignals*32
	infoPdeath    = infoSubreaper + 8
	infoTid       = infoPdeath + 8
	infoAltStack  = infoTid + 8
	infoEnd       = infoAltStack + 24
	infoTable     = (infoEnd + 63) &^ 63
)

// threadCalls are the calls of ReadThread, answers at base.
func (in *Injector) threadCalls(base uint64) []ptrace.BatchCall {
	return []ptrace.BatchCall{
		{Nr: unix.SYS_PRCTL, Args: [6]uint64{unix.PR_GET_TID_ADDRESS, base + infoTid}},
		{Nr: unix.SYS_SIGALTSTACK, Args: [6]uint64{0, base + infoAltStack}},
		{Nr: unix.SYS_PRCTL, Args: [6]uint64{unix.PR_GET_PDEATHSIG, base + infoPdeath}},
	}
}

// threadInfo decodes the answers of threadCalls.
func threadInfo(calls []ptrace.BatchCall, b []byte) (ThreadInfo, error) {
	var t ThreadInfo
	if err := ptrace.Errno(calls[0].Result); err != nil {
		return t, fmt.Errorf("PR_GET_TID_ADDRESS: %w", err)
	}
	if err := ptrace.Errno(calls[1].Result); err != nil {
		return t, fmt.Errorf("sigaltstack: %w", err)
	}
	if err := ptrace.Errno(calls[2].Result); err != nil {
		return t, fmt.Errorf("PR_GET_PDEATHSIG: %w", err)
	}
	t.PdeathSig = int(le32(b[infoPdeath:]))
	t.TidAddress = le64(b[infoTid:])
	copy(bytesOf(&t.AltStack), b[infoAltStack:infoAltStack+24])
	return t, nil
}

// ReadThread reads the thread's ThreadInfo in one batch.
func (in *Injector) ReadThread() (ThreadInfo, error) {
	var t ThreadInfo
	err := in.p.Tracer().Do(func() error {
		if err := in.NeedScratch(infoTable); err != nil {
			return err
		}
		b := make([]byte, infoEnd)
		if err := in.p.WriteMem(in.scratch, b); err != nil {
			return err
		}
		calls := in.threadCalls(in.scratch)
		if err := in.Batch(infoTable, calls); err != nil {
			return err
		}
		if err := in.p.ReadMem(in.scratch, b); err != nil {
			return err
		}
		var err error
		t, err = threadInfo(calls, b)
		return err
	})
	return t, err
}

// ReadProcess reads the process's ProcessInfo, and the thread's, in one
// batch: rt_sigaction for every signal, brk(0), the prctl values and the
// thread's calls.
func (in *Injector) ReadProcess() (ProcessInfo, error) {
	var p ProcessInfo
	err := in.p.Tracer().Do(func() error {
		if err := in.NeedScratch(infoTable + (NumSignals+6)*ptrace.BatchEntry); err != nil {
			return err
		}
		b := make([]byte, infoEnd)
		if err := in.p.WriteMem(in.scratch, b); err != nil {
			return err
		}
		s := in.scratch
		calls := make([]ptrace.BatchCall, 0, NumSignals+6)
		for sig := 1; sig <= NumSignals; sig++ {
			calls = append(calls, ptrace.BatchCall{Nr: unix.SYS_RT_SIGACTION, Args: [6]uint64{uint64(sig), 0, s + infoActs + uint64(sig-1)*32, 8}})
		}
		calls = append(calls,
			ptrace.BatchCall{Nr: unix.SYS_BRK},
			ptrace.BatchCall{Nr: unix.SYS_PRCTL, Args: [6]uint64{unix.PR_GET_DUMPABLE}},
			ptrace.BatchCall{Nr: unix.SYS_PRCTL, Args: [6]uint64{unix.PR_GET_CHILD_SUBREAPER, s + infoSubreaper}})
		calls = append(calls, in.threadCalls(s)...)
		if err := in.Batch(infoTable, calls); err != nil {
			return err
		}
		if err := in.p.ReadMem(s, b); err != nil {
			return err
		}
		for sig := 1; sig <= NumSignals; sig++ {
			if err := ptrace.Errno(calls[sig-1].Result); err != nil {
				return fmt.Errorf("rt_sigaction(%d): %w", sig, err)
			}
			copy(bytesOf(&p.SigActions[sig-1]), b[infoActs+(sig-1)*32:infoActs+sig*32])
		}
		c := calls[NumSignals:]
		if err := ptrace.Errno(c[0].Result); err != nil {
			return fmt.Errorf("brk: %w", err)
		}
		p.Brk = uint64(c[0].Result)
		if err := ptrace.Errno(c[1].Result); err != nil {
			return fmt.Errorf("prctl(PR_GET_DUMPABLE): %w", err)
		}
		p.Dumpable = int(c[1].Result)
		if err := ptrace.Errno(c[2].Result); err != nil {
			p.SubreaperErr = fmt.Errorf("prctl(PR_GET_CHILD_SUBREAPER): %w", err)
		} else {
			p.ChildSubreaper = le32(b[infoSubreaper:]) != 0
		}
		var err error
		p.Thread, err = threadInfo(c[3:], b)
		return err
	})
	return p, err
}

// Calls is a batch in the making: system calls, what each is for (to name
// the one that fails), and the data their arguments point to, laid out
// from the start of the injector's scratch memory. Injector.RunCalls runs
// them in one resume of the thread where it can.
type Calls struct {
	calls []ptrace.BatchCall
	what  []string
	data  []byte
	base  uint64
}

// NewCalls starts a batch for in.
func (in *Injector) NewCalls() *Calls { return &Calls{base: in.scratch} }

// Data puts b in the batch's scratch data and returns the address it
// will have in the thread (8-byte aligned).
func (c *Calls) Data(b []byte) uint64 {
	a := c.base + uint64(len(c.data))
	c.data = append(c.data, b...)
	for len(c.data)%8 != 0 {
		c.data = append(c.data, 0)
	}
	return a
}

// String puts s, NUL-terminated, in the batch's scratch data and returns
// its address.
func (c *Calls) String(s string) uint64 { return c.Data(append([]byte(s), 0)) }

// Add appends system call nr with args; what names it in an error.
func (c *Calls) Add(what string, nr int, args ...uint64) {
	bc := ptrace.BatchCall{Nr: nr}
	copy(bc.Args[:], args)
	c.calls = append(c.calls, bc)
	c.what = append(c.what, what)
}

// Len returns how many calls the batch holds.
func (c *Calls) Len() int { return len(c.calls) }

// What returns what call i is for.
func (c *Calls) What(i int) string { return c.what[i] }

// Result returns the raw result of call i once RunCalls has run it.
func (c *Calls) Result(i int) int64 { return c.calls[i].Result }

// RunCalls writes c's data into the scratch memory and runs its calls in
// order: in one resume when they fit the scratch memory beside their
// data, in as few as fit otherwise, one by one without the batch code.
// Every call runs, whatever the ones before it returned; the first that
// failed is returned as an error naming it.
func (in *Injector) RunCalls(c *Calls) error {
	if err := in.execCalls(c); err != nil {
		return err
	}
	for i := range c.calls {
		if err := ptrace.Errno(c.calls[i].Result); err != nil {
			return fmt.Errorf("%s: %w", c.what[i], err)
		}
	}
	return nil
}

// execCalls is RunCalls without the check of each call's result: the
// error is a failure to run them.
func (in *Injector) execCalls(c *Calls) error {
	if len(c.calls) == 0 {
		return nil
	}
	if c.base != in.scratch {
		return fmt.Errorf("batch made for another injector's scratch memory")
	}
	if len(c.data) > 0 {
		if _, err := in.Put(0, c.data); err != nil {
			return err
		}
	}
	per := max(1, (in.scratchLen-len(c.data))/ptrace.BatchEntry)
	for i := 0; i < len(c.calls); i += per {
		if err := in.Batch(len(c.data), c.calls[i:min(i+per, len(c.calls))]); err != nil {
			return err
		}
	}
	return nil
}
