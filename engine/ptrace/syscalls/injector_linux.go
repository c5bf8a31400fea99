package syscalls

import (
	"encoding/binary"
	"unsafe"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Injector is a ptrace.Injector with the typed system calls of this
// package: the mechanism's methods (Call, Batch, Close...) are promoted
// from the embedded Injector, the library's are its own. Any number of
// them may wrap the same ptrace.Injector.
type Injector struct {
	*ptrace.Injector

	// Set at creation from the embedded Injector, which never changes
	// them.
	scratch    uint64
	scratchLen int
	tid        int
	p          *ptrace.Process
}

// New is Thread.NewInjector with the typed calls: it maps a stub and
// scratchLen bytes of scratch memory in th.
func New(th *ptrace.Thread, scratchLen int) (*Injector, error) {
	in, err := th.NewInjector(scratchLen)
	if err != nil {
		return nil, err
	}
	return Wrap(in), nil
}

// At is Thread.InjectorAt with the typed calls: it injects through the
// stub at stub, with scratch memory at scratch.
func At(th *ptrace.Thread, stub, scratch uint64, scratchLen int) (*Injector, error) {
	in, err := th.InjectorAt(stub, scratch, scratchLen)
	if err != nil {
		return nil, err
	}
	return Wrap(in), nil
}

// Wrap gives in the typed calls.
func Wrap(in *ptrace.Injector) *Injector {
	scratch, n := in.Scratch()
	th := in.Thread()
	return &Injector{Injector: in, scratch: scratch, scratchLen: n, tid: th.Tid(), p: th.Process()}
}

// bytesOf views a fixed-size value as bytes (for structs written into
// scratch memory; x86-64 is little-endian like the kernel ABI).
func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }
