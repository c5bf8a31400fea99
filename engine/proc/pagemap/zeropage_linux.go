package pagemap

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/lazyfs/lazyfs/engine/proc"
	"golang.org/x/sys/unix"
)

// ReadFaultMapsZeroPage reports whether a read fault of private anonymous
// memory maps the shared zero page on this kernel (most kernels), rather
// than a private page of zeros. It reads one page of a fresh mapping of
// its own (huge pages off) and asks pagemap what is mapped there:
// PAGEMAP_SCAN's PAGE_IS_PFNZERO where the kernel has it, else the
// exclusive bit (the zero page is never exclusively mapped; a private
// page that was just faulted in always is).
//
// Either way a dump stores such pages as ZERO blocks, found by their
// content: they are present, so the dump reads them, and they read as
// zeros.
func ReadFaultMapsZeroPage() (bool, error) {
	page, err := unix.Mmap(-1, 0, proc.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false, fmt.Errorf("zero-page probe: mmap: %w", err)
	}
	defer unix.Munmap(page)
	// A page-sized mapping cannot hold a huge page; say so anyway, so
	// that no THP policy decides the answer.
	_ = unix.Madvise(page, unix.MADV_NOHUGEPAGE)
	addr := uint64(uintptr(unsafe.Pointer(&page[0])))
	if readByte(&page[0]) != 0 {
		return false, errors.New("zero-page probe: a fresh anonymous page is not zero")
	}
	pm, err := Open(os.Getpid())
	if err != nil {
		return false, fmt.Errorf("zero-page probe: %w", err)
	}
	defer pm.Close()
	es := make([]Entry, 1)
	if n, err := pm.ReadEntries(addr, es); err != nil || n != 1 {
		return false, fmt.Errorf("zero-page probe: read pagemap entry: %d entries, %v", n, err)
	}
	if !es[0].Present() {
		return false, fmt.Errorf("zero-page probe: the page read is not present (entry %#x)", uint64(es[0]))
	}
	if pm.ScanSupported() {
		runs, err := pm.RunsScan(Query{Start: addr, End: addr + proc.PageSize, Require: PagePresent | PagePFNZero}, nil)
		if err != nil {
			return false, fmt.Errorf("zero-page probe: PAGEMAP_SCAN: %w", err)
		}
		return len(runs) == 1, nil
	}
	return !es[0].Exclusive(), nil
}

// readByte reads *p so that the compiler keeps the load (and the fault).
//
//go:noinline
func readByte(p *byte) byte { return *(*byte)(unsafe.Pointer(p)) }
