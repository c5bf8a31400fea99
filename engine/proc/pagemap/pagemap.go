package pagemap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// Entry is one 64-bit entry of /proc/PID/pagemap, describing one virtual
// page (Documentation/admin-guide/mm/pagemap.rst).
type Entry uint64

// Pagemap entry bits.
const (
	entryPresent   Entry = 1 << 63
	entrySwapped   Entry = 1 << 62
	entryFile      Entry = 1 << 61 // file page or shared anonymous
	entryGuard     Entry = 1 << 58 // MADV_GUARD_INSTALL guard region
	entryUffdWP    Entry = 1 << 57
	entryExclusive Entry = 1 << 56 // exclusively mapped (anon)
	entrySoftDirty Entry = 1 << 55
	entryPFNMask   Entry = 1<<55 - 1
)

// Present reports bit 63: the page is in RAM.
func (e Entry) Present() bool { return e&entryPresent != 0 }

// Swapped reports bit 62: the page is in swap (or a migration entry).
func (e Entry) Swapped() bool { return e&entrySwapped != 0 }

// File reports bit 61: the page is a page-cache page or shared anonymous
// (shmem), not a private anonymous page. In a private file mapping a
// present page with this bit clear was copied on write.
func (e Entry) File() bool { return e&entryFile != 0 }

// Exclusive reports bit 56: the page is mapped only by this process.
func (e Entry) Exclusive() bool { return e&entryExclusive != 0 }

// UffdWP reports bit 57: the page is userfaultfd write-protected.
func (e Entry) UffdWP() bool { return e&entryUffdWP != 0 }

// SoftDirty reports bit 55.
func (e Entry) SoftDirty() bool { return e&entrySoftDirty != 0 }

// Guard reports bit 58: the page is in a guard region.
func (e Entry) Guard() bool { return e&entryGuard != 0 }

// PFN returns the page frame number of a present page (zero without
// CAP_SYS_ADMIN).
func (e Entry) PFN() uint64 {
	if !e.Present() {
		return 0
	}
	return uint64(e & entryPFNMask)
}

// Category is a set of page categories: the PAGE_IS_* bits of the
// PAGEMAP_SCAN ioctl, extended with bits that only pagemap entries carry.
type Category uint64

// Page categories. The low nine are the kernel's PAGE_IS_* values.
const (
	PageWPAllowed Category = 1 << 0 // in a VMA registered for uffd WP_ASYNC
	PageWritten   Category = 1 << 1 // written since write-protected
	PageFile      Category = 1 << 2 // page cache or shmem (pagemap bit 61)
	PagePresent   Category = 1 << 3
	PageSwapped   Category = 1 << 4
	PagePFNZero   Category = 1 << 5 // the shared zero page
	PageHuge      Category = 1 << 6
	PageSoftDirty Category = 1 << 7
	PageGuard     Category = 1 << 8

	// PageExclusive (pagemap bit 56) and PageUffdWP (bit 57) are known
	// only from pagemap entries, not from PAGEMAP_SCAN.
	PageExclusive Category = 1 << 32
	PageUffdWP    Category = 1 << 33
)

// scanCategories are the categories PAGEMAP_SCAN can test and report.
const scanCategories = PageWPAllowed | PageWritten | PageFile | PagePresent |
	PageSwapped | PagePFNZero | PageHuge | PageSoftDirty | PageGuard

// entryCategories are the categories a pagemap entry tells.
const entryCategories = PageFile | PagePresent | PageSwapped | PageSoftDirty |
	PageGuard | PageExclusive | PageUffdWP

// Categories returns the categories a pagemap entry tells.
func (e Entry) Categories() Category {
	var c Category
	if e.Present() {
		c |= PagePresent
	}
	if e.Swapped() {
		c |= PageSwapped
	}
	if e.File() {
		c |= PageFile
	}
	if e.SoftDirty() {
		c |= PageSoftDirty
	}
	if e.Guard() {
		c |= PageGuard
	}
	if e.Exclusive() {
		c |= PageExclusive
	}
	if e.UffdWP() {
		c |= PageUffdWP
	}
	return c
}

// Query selects pages in [Start, End) by category, like PAGEMAP_SCAN: a
// page is selected when it has every category in Require, none in
// Exclude and, if AnyOf is not empty, at least one in AnyOf. A query
// should select on PagePresent or PageSwapped: PAGEMAP_SCAN walks only
// mapped ranges, and the two methods agree only on pages that exist.
type Query struct {
	Start, End uint64 // page aligned
	Require    Category
	Exclude    Category
	AnyOf      Category
	// Return is the set of categories reported in each Run; adjacent
	// selected pages whose categories differ within Return are reported
	// as separate runs. Zero merges every adjacent selected page.
	Return Category
	// WriteProtect write-protects the selected pages as they are
	// reported (PM_SCAN_WP_MATCHING with PM_SCAN_CHECK_WPASYNC), for
	// incremental dumps of ranges registered with userfaultfd WP_ASYNC.
	// Only the scan method supports it.
	WriteProtect bool
}

func (q *Query) categories() Category { return q.Require | q.Exclude | q.AnyOf | q.Return }

func (q *Query) match(c Category) bool {
	if c&q.Require != q.Require || c&q.Exclude != 0 {
		return false
	}
	return q.AnyOf == 0 || c&q.AnyOf != 0
}

func (q *Query) check() error {
	if q.Start%proc.PageSize != 0 || q.End%proc.PageSize != 0 || q.End < q.Start {
		return fmt.Errorf("pagemap query %#x-%#x: range not page aligned or reversed", q.Start, q.End)
	}
	return nil
}

// Run is a range of consecutive selected pages.
type Run struct {
	Start, End uint64
	// Categories are the categories of the run's pages within the
	// query's Return set.
	Categories Category
}

// Pages returns the number of pages in r.
func (r Run) Pages() uint64 { return (r.End - r.Start) / proc.PageSize }

// appendRun appends [start, end) with categories c to runs, extending the
// last run when it ends at start with the same categories.
func appendRun(runs []Run, start, end uint64, c Category) []Run {
	if n := len(runs); n > 0 && runs[n-1].End == start && runs[n-1].Categories == c {
		runs[n-1].End = end
		return runs
	}
	return append(runs, Run{Start: start, End: end, Categories: c})
}

// Method is how a Pagemap answers a Query.
type Method int

const (
	// MethodRead reads 8-byte entries from /proc/PID/pagemap in large
	// chunks and classifies them here.
	MethodRead Method = iota
	// MethodScan asks the kernel with the PAGEMAP_SCAN ioctl (Linux 6.7
	// and later), which returns ranges instead of entries.
	MethodScan
)

func (m Method) String() string {
	switch m {
	case MethodRead:
		return "read"
	case MethodScan:
		return "scan"
	}
	return fmt.Sprintf("Method(%d)", int(m))
}

// Buffer sizes of a Pagemap.
const (
	readChunkEntries = 64 << 10 // 512 KiB of entries, 256 MiB of address space
	scanVecLen       = 4096     // regions per PAGEMAP_SCAN call
)

// Pagemap reads the page table state of one process. It is not safe for
// concurrent use.
type Pagemap struct {
	f      *os.File
	method Method
	scanOK bool
	buf    []byte       // read method: chunk of raw entries
	vec    []pageRegion // scan method: regions returned by the kernel
}

// Open opens /proc/PID/pagemap. The default method is MethodScan
// when the kernel supports PAGEMAP_SCAN, MethodRead otherwise.
func Open(pid int) (*Pagemap, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/pagemap")
	if err != nil {
		return nil, fmt.Errorf("open pagemap: %w", err)
	}
	p := &Pagemap{f: f, method: MethodRead}
	if p.scanOK = probeScan(f); p.scanOK {
		p.method = MethodScan
	}
	return p, nil
}

// Close closes the pagemap file.
func (p *Pagemap) Close() error { return p.f.Close() }

// ScanSupported reports whether the kernel supports PAGEMAP_SCAN.
func (p *Pagemap) ScanSupported() bool { return p.scanOK }

// Method returns the method Runs uses.
func (p *Pagemap) Method() Method { return p.method }

// SetMethod chooses the method Runs uses; MethodScan needs ScanSupported.
func (p *Pagemap) SetMethod(m Method) error {
	switch m {
	case MethodRead:
	case MethodScan:
		if !p.scanOK {
			return fmt.Errorf("pagemap: PAGEMAP_SCAN: %w", errors.ErrUnsupported)
		}
	default:
		return fmt.Errorf("pagemap: unknown method %d", int(m))
	}
	p.method = m
	return nil
}

// ReadEntries reads the entries of the len(dst) pages starting at the page
// containing vaddr. It returns how many entries it read; past the end of
// the address space the kernel returns fewer.
func (p *Pagemap) ReadEntries(vaddr uint64, dst []Entry) (int, error) {
	if vaddr/proc.PageSize > (1<<63-1)/8 {
		return 0, nil
	}
	off := int64(vaddr/proc.PageSize) * 8
	if cap(p.buf) < 8*len(dst) {
		p.buf = make([]byte, 8*min(len(dst), readChunkEntries))
	}
	n := 0
	for n < len(dst) {
		k := min(len(dst)-n, cap(p.buf)/8)
		b := p.buf[:8*k]
		got, err := p.f.ReadAt(b, off+int64(8*n))
		got -= got % 8
		for i := 0; i < got; i += 8 {
			dst[n] = Entry(binary.NativeEndian.Uint64(b[i:]))
			n++
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, fmt.Errorf("read pagemap at %#x: %w", vaddr+uint64(n)*proc.PageSize, err)
		}
		if got == 0 {
			return n, nil
		}
	}
	return n, nil
}

// Runs appends to dst the runs of pages q selects, in address order, using
// the Pagemap's method. A query on PageExclusive or PageUffdWP is always
// answered by reading entries; one on categories only PAGEMAP_SCAN knows
// fails with errors.ErrUnsupported where the kernel lacks it.
func (p *Pagemap) Runs(q Query, dst []Run) ([]Run, error) {
	c := q.categories()
	scanOK := p.scanOK && c&^scanCategories == 0 && q.AnyOf&q.Exclude == 0
	if scanOK && (p.method == MethodScan || c&^entryCategories != 0 || q.WriteProtect) {
		return p.RunsScan(q, dst)
	}
	return p.RunsRead(q, dst)
}

// RunsRead answers q by reading pagemap entries.
func (p *Pagemap) RunsRead(q Query, dst []Run) ([]Run, error) {
	if err := q.check(); err != nil {
		return dst, err
	}
	if c := q.categories(); c&^entryCategories != 0 || q.WriteProtect {
		return dst, fmt.Errorf("pagemap read: categories %#x: %w", uint64(c&^entryCategories), errors.ErrUnsupported)
	}
	if cap(p.buf) < 8*readChunkEntries {
		p.buf = make([]byte, 8*readChunkEntries)
	}
	for addr := q.Start; addr < q.End; {
		k := min((q.End-addr)/proc.PageSize, readChunkEntries)
		b := p.buf[:8*k]
		got, err := p.f.ReadAt(b, int64(addr/proc.PageSize)*8)
		if err != nil && !errors.Is(err, io.EOF) {
			return dst, fmt.Errorf("read pagemap at %#x: %w", addr, err)
		}
		got -= got % 8
		for i := 0; i < got; i += 8 {
			c := Entry(binary.NativeEndian.Uint64(b[i:])).Categories()
			if q.match(c) {
				dst = appendRun(dst, addr, addr+proc.PageSize, c&q.Return)
			}
			addr += proc.PageSize
		}
		if got == 0 {
			break
		}
	}
	return dst, nil
}

// Populated appends the runs of pages in [start, end) that are present or
// swapped: the pages of an anonymous mapping that hold data.
func (p *Pagemap) Populated(start, end uint64, dst []Run) ([]Run, error) {
	return p.Runs(Query{Start: start, End: end, AnyOf: PagePresent | PageSwapped}, dst)
}

// Anonymous appends the runs of pages in [start, end) that are present or
// swapped and are private anonymous pages: in a private file mapping, the
// pages copied on write.
func (p *Pagemap) Anonymous(start, end uint64, dst []Run) ([]Run, error) {
	return p.Runs(Query{Start: start, End: end, AnyOf: PagePresent | PageSwapped, Exclude: PageFile}, dst)
}
