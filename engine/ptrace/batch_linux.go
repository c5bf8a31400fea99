package ptrace

import (
	"encoding/binary"
	"fmt"
)

// Batches: a thread stopped for a dump answers many small questions
// (every signal's disposition, its alternate stack...), each a system
// call. Injected one at a time, each call costs a resume of the thread
// and a wait for its stop, which on a busy machine is a wait for a CPU.
// A batch runs a table of calls in one resume: the table, in scratch
// memory, is walked by batchCode, which NewInjector maps beside the stub.

// BatchCall is one system call of a batch: its number, arguments and,
// after Batch, its raw result (a negative errno on failure).
type BatchCall struct {
	Nr     int
	Args   [6]uint64
	Result int64
}

// BatchEntry is the size of a table entry: number, six arguments, result.
// Callers that lay out their own data beside a table (engine/ptrace/syscalls)
// reserve this much scratch memory per call.
const BatchEntry = 64

// batchOff is where batchCode follows the stub in the stub page.
const batchOff = 16

// Batch runs calls in order in the thread and sets each one's Result.
// The table takes len(calls)*64 bytes of scratch memory at offset off;
// the calls' own arguments may point to the rest. A call that fails does
// not stop the ones after it: check each Result (Errno).
func (in *Injector) Batch(off int, calls []BatchCall) error {
	return in.th.p.t.Do(func() error { return in.runBatch(off, calls) })
}

func (in *Injector) runBatch(off int, calls []BatchCall) error {
	if in.closed {
		return fmt.Errorf("injector of thread %d is closed", in.th.tid)
	}
	if len(calls) == 0 {
		return nil
	}
	if in.batch == 0 {
		for i := range calls {
			r, err := in.syscall(calls[i].Nr, calls[i].Args[:])
			if err != nil {
				return err
			}
			calls[i].Result = r
		}
		return nil
	}
	n := len(calls) * BatchEntry
	if off < 0 || off%8 != 0 {
		return fmt.Errorf("batch table at scratch offset %d: want a multiple of 8", off)
	}
	if err := in.NeedScratch(off + n); err != nil {
		return err
	}
	table := make([]byte, n)
	for i, c := range calls {
		e := table[i*BatchEntry:]
		binary.LittleEndian.PutUint64(e, uint64(c.Nr))
		for j, a := range c.Args {
			binary.LittleEndian.PutUint64(e[8+8*j:], a)
		}
	}
	addr := in.scratch + uint64(off)
	if err := in.th.p.writeMem(addr, table); err != nil {
		return fmt.Errorf("write batch table: %w", err)
	}
	regs := in.saved
	setBatch(&regs, in.batch, addr, len(calls))
	if _, err := in.run(&regs, in.batch+uint64(len(batchCode)), 0); err != nil {
		return fmt.Errorf("batch of %d calls: %w", len(calls), err)
	}
	if err := in.th.p.ReadMem(addr, table); err != nil {
		return fmt.Errorf("read batch results: %w", err)
	}
	for i := range calls {
		calls[i].Result = int64(binary.LittleEndian.Uint64(table[i*BatchEntry+56:]))
	}
	return nil
}

// WriteStub writes the injection stub ("syscall; int3") at addr of p,
// with the batch code after it, for an Injector made with InjectorAt to
// run its calls through (and its batches in one resume: InjectorAt finds
// the batch code there). addr needs StubLen bytes of executable memory.
func (p *Process) WriteStub(addr uint64) error { return p.WriteMem(addr, stubWithBatch()) }

// StubLen is how many bytes WriteStub writes.
const StubLen = batchOff + len(batchCode)

// stubWithBatch is the stub page's code: the stub, then the batch code.
func stubWithBatch() []byte {
	code := make([]byte, StubLen)
	copy(code, stubCode[:])
	copy(code[batchOff:], batchCode[:])
	return code
}

// NeedScratch checks that the scratch area holds n bytes, for a call
// that stores its arguments or results there.
func (in *Injector) NeedScratch(n int) error {
	if in.scratch == 0 || in.scratchLen < n {
		return fmt.Errorf("injector of thread %d: needs %d bytes of scratch memory, has %d", in.th.tid, n, in.scratchLen)
	}
	return nil
}
