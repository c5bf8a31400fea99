package corefile

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// File is the ELF64 core file of a process of a snapshot at the instant
// of the dump, as the kernel's fs/binfmt_elf.c would have written it,
// generated from the snapshot when it is read (no conversion step); a
// lazyfs mount serves it as MNT/PID/core:
//
//	ELF header, program headers (PT_NOTE first, then one PT_LOAD per VMA)
//	PT_NOTE   per thread, main thread first: NT_PRSTATUS, then NT_FPREGSET
//	          and NT_X86_XSTATE from the saved FP state; after the first
//	          thread's NT_PRSTATUS: NT_PRPSINFO, NT_SIGINFO (only when a
//	          signal was pending), NT_AUXV, NT_FILE
//	padding   a hole up to coreDataAlign
//	PT_LOADs  the bytes of each VMA that has any, in address order
//
// Its layout (sizes, offsets, notes) is computed by New and never
// changes; the notes are built then and held in memory. A read of the
// headers and notes touches no memory; a read of a PT_LOAD reads exactly
// the addresses it covers through the process's image.Reader, and so, in
// a mount, through the mount's block cache, like mem, but without the
// reader's readahead (image.ReadOptions.NoReadahead): it decodes the blocks the
// request touches and no others.
//
// Which VMAs have file bytes (p_filesz) follows the kernel's default
// coredump_filter (0x33):
//
//   - private anonymous memory with dumped pages, shared anonymous memory,
//     memfd and shmem: the whole VMA; pages that were not dumped are holes
//     (they read as zeros, as they did in the process);
//   - the vDSO, when the snapshot was taken on a kernel of the mount's
//     release: the mount's own vDSO (vdso.go);
//   - a private file mapping that holds copied-on-write pages (Dumped) or
//     is writable: the whole VMA; the pages that were not dumped are the
//     mapped file's bytes, read from the file named in the snapshot. The
//     file is checked against the identity the dump recorded (device,
//     inode, size, mtime) when the core is laid out (the first time it is
//     used), and again on every read. When it is missing or differs then,
//     the VMA is split instead: each dumped run is a PT_LOAD with its bytes and each range
//     between runs a PT_LOAD with p_filesz 0, so a debugger reads those
//     from its own copy of the file (as it does for read-only code) and
//     never sees zeros the process did not hold. When it changes after
//     that, reads of those pages fail with EIO. (MNT/PID/mem shows
//     such pages as holes, zeros: it serves only what the snapshot holds.)
//   - private anonymous memory never touched (nothing dumped: the kernel
//     skips a VMA without anon_vma), read-only private file mappings with
//     nothing dumped, shared file mappings (their contents live in the
//     file), vvar and vsyscall and any other vDSO (not in the snapshot),
//     and VMAs marked MADV_DONTDUMP (dd): a PT_LOAD with p_filesz 0, as the
//     kernel writes them.
//
// The core is x86-64 only (core_amd64.go lays out the arch's structures).
type File struct {
	st   *image.Process
	r    *image.Reader
	head []byte      // ELF header, program headers, notes
	segs []coreSeg   // PT_LOADs with file bytes, by file offset
	data []coreRange // data extents of the file (SEEK_DATA), merged
	size uint64
	used uint64 // data bytes (st_blocks)
	// files are the mapped files that serve pages that were not dumped,
	// by path, shared by every VMA that maps them.
	files map[string]*mappedFile
}

// coreSeg is the part of the core file that holds the bytes of
// [addr, addr+size) of the process.
type coreSeg struct {
	off, addr, size uint64
	// src is the image address of addr: addr itself, or, for a second
	// mapping of a shared object, where the object's pages were dumped.
	src uint64
	// file, if set, serves the pages that were not dumped, from fileOff
	// at addr.
	file    *mappedFile
	fileOff uint64
	// bytes, if set, are the segment's bytes (the vDSO, vdso.go).
	bytes []byte
}

// coreRange is [off, end) of the core file.
type coreRange struct{ off, end uint64 }

// coreDataAlign aligns the first PT_LOAD in the file: the headers and
// notes are read alone (readelf, the first request of gdb, the kernel's
// read-ahead of them) without decoding any memory. It is the largest read
// request of a lazyfs mount (fs.MaxRequest), a multiple of the page size,
// as p_align requires; a hole, so it costs nothing.
const coreDataAlign = 1 << 20

// corePageSize is p_align of the PT_LOADs and the unit of NT_FILE offsets.
const corePageSize = image.PageSize

// Note types that debug/elf does not define (include/uapi/linux/elf.h).
const (
	ntAUXV      = 6
	ntSIGINFO   = 0x53494749 // "SIGI"
	ntFILE      = 0x46494c45 // "FILE"
	ntX86XSTATE = 0x202
	// pnXNum in e_phnum says the count is in sh_info of section 0.
	pnXNum = 0xffff
)

// load is a PT_LOAD of the core: size bytes of memory at addr, of which
// filesz (0 or size) are in the file, served by seg.
type load struct {
	addr, size uint64
	filesz     uint64
	flags      elf.ProgFlag
	seg        *coreSeg
}

// New lays out the core of the process whose state is st and whose pages
// r reads, of a snapshot taken on kernel release. It takes the PT_LOADs
// of each VMA (appendLoads), then lays the file out from start to end,
// headers, notes, then each segment, in one function so that every offset
// is computed where it is used. The core reads r as long as it is used,
// and Close closes the mapped files it opened, not r.
func New(st *image.Process, r *image.Reader, release string) *File {
	c := &File{st: st, r: r, files: map[string]*mappedFile{}}
	var loads []load
	vmas := slices.Clone(st.VMAs)
	slices.SortFunc(vmas, func(a, b image.VMA) int { return cmpU64(a.Start, b.Start) })
	for _, v := range vmas {
		loads = c.appendLoads(loads, v, release)
	}

	notes := coreNotes(st, c.fileNote(vmas))
	phnum := 1 + len(loads)
	xnum := phnum >= pnXNum
	hdrSize := uint64(elfHeaderSize + phnum*progHeaderSize)
	if xnum {
		hdrSize += sectHeaderSize
	}
	notesOff := hdrSize
	dataOff := roundUp(notesOff+uint64(len(notes)), coreDataAlign)

	head := make([]byte, 0, notesOff+uint64(len(notes)))
	head = appendELFHeader(head, phnum, xnum)
	head = appendProg(head, elf.PT_NOTE, 0, notesOff, 0, uint64(len(notes)), 0, 4)
	off := dataOff
	for _, l := range loads {
		head = appendProg(head, elf.PT_LOAD, l.flags, off, l.addr, l.filesz, l.size, corePageSize)
		if l.seg != nil {
			l.seg.off = off
			c.segs = append(c.segs, *l.seg)
		}
		off += l.filesz
	}
	if xnum {
		head = appendSectHeader(head, phnum)
	}
	head = append(head, notes...)
	c.head = head
	c.size = max(off, uint64(len(head)))

	c.addData(0, uint64(len(head)))
	for _, s := range c.segs {
		c.segData(s)
	}
	for _, d := range c.data {
		c.used += d.end - d.off
	}
	return c
}

// appendLoads appends the PT_LOADs of v to loads: one, with or without
// bytes, or, for a private file mapping whose file is not there as it
// was dumped, one per dumped run and per range between them.
func (c *File) appendLoads(loads []load, v image.VMA, release string) []load {
	if v.End <= v.Start {
		return loads
	}
	flags := progFlags(v.Prot)
	whole := func(seg coreSeg) {
		seg.addr, seg.size = v.Start, v.End-v.Start
		loads = append(loads, load{addr: v.Start, size: seg.size, filesz: seg.size, flags: flags, seg: &seg})
	}
	empty := func(lo, hi uint64) { loads = append(loads, load{addr: lo, size: hi - lo, flags: flags}) }
	switch {
	case slices.Contains(v.VMFlags, "dd"):
		empty(v.Start, v.End)
	case v.Kind == image.VMAAnon && !v.Dumped:
		// never touched (the kernel dumps an anonymous VMA only
		// if it has an anon_vma): a reservation, a guard
		empty(v.Start, v.End)
	case v.Kind == image.VMAVDSO && vdsoFor(release, v.End-v.Start) != nil:
		whole(coreSeg{bytes: vdsoFor(release, v.End-v.Start)})
	case v.Kind == image.VMAAnon || v.Kind == image.VMAShmem:
		src := v.Start
		if v.Shmem != nil && v.Kind == image.VMAShmem {
			src = v.Shmem.Source + v.Offset
		}
		whole(coreSeg{src: src})
	case v.Kind == image.VMAFile && (v.Dumped || v.Prot&unix.PROT_WRITE != 0):
		if mf := c.mappedFile(v); mf != nil {
			whole(coreSeg{src: v.Start, file: mf, fileOff: v.Offset})
			break
		}
		// The file is not there as it was dumped: the dumped runs
		// have bytes, the rest none.
		a := v.Start
		for a < v.End {
			d, ok := c.r.NextData(a)
			if !ok || d >= v.End {
				break
			}
			if d > a {
				empty(a, d)
			}
			e := min(nextHole(c.r, d), v.End)
			loads = append(loads, load{addr: d, size: e - d, filesz: e - d, flags: flags, seg: &coreSeg{addr: d, size: e - d, src: d}})
			a = e
		}
		if a < v.End {
			empty(a, v.End)
		}
	default:
		empty(v.Start, v.End)
	}
	return loads
}

// segData adds the data extents of s: its dumped runs and, when a file
// fills the rest, the pages that the file holds.
func (c *File) segData(s coreSeg) {
	if s.bytes != nil {
		c.addData(s.off, s.off+s.size)
		return
	}
	r := c.r
	end := s.src + s.size
	fileEnd := s.src
	if s.file != nil && uint64(s.file.id.Size) > s.fileOff {
		fileEnd = min(end, s.src+roundUp(uint64(s.file.id.Size)-s.fileOff, corePageSize))
	}
	c.addData(s.off, s.off+(fileEnd-s.src))
	for a := s.src; a < end; {
		d, ok := r.NextData(a)
		if !ok || d >= end {
			break
		}
		e := min(nextHole(r, d), end)
		c.addData(s.off+(d-s.src), s.off+(e-s.src))
		a = e
	}
}

// addData adds [off, end) to the data extents. Extents are added in
// increasing order of off, possibly overlapping the last one.
func (c *File) addData(off, end uint64) {
	if end <= off {
		return
	}
	if n := len(c.data); n > 0 && off <= c.data[n-1].end {
		c.data[n-1].end = max(c.data[n-1].end, end)
		return
	}
	c.data = append(c.data, coreRange{off, end})
}

// fileNote returns the NT_FILE description: every VMA that maps a file.
func (c *File) fileNote(vmas []image.VMA) []byte {
	type entry struct {
		start, end, pgoff uint64
		name              string
	}
	var es []entry
	for _, v := range vmas {
		if v.File == nil || v.End <= v.Start {
			continue
		}
		name := v.File.Path
		if name == "" {
			name = v.Name
		}
		es = append(es, entry{v.Start, v.End, v.Offset / corePageSize, name})
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(es)))
	b = binary.LittleEndian.AppendUint64(b, corePageSize)
	for _, e := range es {
		b = binary.LittleEndian.AppendUint64(b, e.start)
		b = binary.LittleEndian.AppendUint64(b, e.end)
		b = binary.LittleEndian.AppendUint64(b, e.pgoff)
	}
	for _, e := range es {
		b = append(b, e.name...)
		b = append(b, 0)
	}
	return b
}

// coreNotes returns the PT_NOTE segment of st: per thread, main thread
// first, NT_PRSTATUS, NT_FPREGSET and NT_X86_XSTATE; the process's notes
// after the first NT_PRSTATUS, as the kernel orders them.
func coreNotes(st *image.Process, fileNote []byte) []byte {
	threads := slices.Clone(st.Threads)
	slices.SortStableFunc(threads, func(a, b image.Thread) int {
		return boolInt(b.TID == st.PID) - boolInt(a.TID == st.PID)
	})
	var b []byte
	for i, t := range threads {
		sig := pendingSignal(t.SigPending | st.SigPending)
		b = appendNote(b, "CORE", uint32(elf.NT_PRSTATUS), prstatus(st, &t, sig))
		if i == 0 {
			b = appendNote(b, "CORE", uint32(elf.NT_PRPSINFO), prpsinfo(st))
			if sig != 0 {
				b = appendNote(b, "CORE", ntSIGINFO, siginfo(sig))
			}
			b = appendNote(b, "CORE", ntAUXV, auxvNote(st.MM.Auxv))
			b = appendNote(b, "CORE", ntFILE, fileNote)
		}
		if fp := fpregs(&t); fp != nil {
			b = appendNote(b, "CORE", uint32(elf.NT_FPREGSET), fp)
		}
		if len(t.XState) > 0 {
			b = appendNote(b, "LINUX", ntX86XSTATE, t.XState)
		}
	}
	return b
}

// pendingSignal returns the lowest-numbered pending signal of set, or 0.
// The snapshot holds the pending sets, not the siginfo of each signal:
// the core reports that signal in pr_cursig and NT_SIGINFO with what is
// known of it, its number.
func pendingSignal(set uint64) int {
	for s := 1; s <= 64; s++ {
		if set&(1<<(s-1)) != 0 {
			return s
		}
	}
	return 0
}

// fpregs returns the NT_FPREGSET of t: its saved NT_PRFPREG regset, or
// the legacy (FXSAVE) area that starts its XSAVE area.
func fpregs(t *image.Thread) []byte {
	switch {
	case len(t.FPRegs) > 0:
		return t.FPRegs
	case len(t.XState) >= fxsaveSize:
		return t.XState[:fxsaveSize]
	}
	return nil
}

// auxvNote returns the NT_AUXV description: the saved auxiliary vector,
// pairs of words ending with AT_NULL.
func auxvNote(auxv []uint64) []byte {
	var b []byte
	for _, w := range auxv {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	if n := len(auxv); n < 2 || n%2 != 0 || auxv[n-2] != 0 {
		if n%2 != 0 {
			b = binary.LittleEndian.AppendUint64(b, 0)
		}
		b = binary.LittleEndian.AppendUint64(b, 0)
		b = binary.LittleEndian.AppendUint64(b, 0)
	}
	return b
}

// appendNote appends one ELF note (4-byte aligned name and description).
func appendNote(b []byte, name string, typ uint32, desc []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(name)+1))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = append(b, name...)
	b = append(b, make([]byte, roundUp(uint64(len(name)+1), 4)-uint64(len(name)))...)
	b = append(b, desc...)
	return append(b, make([]byte, roundUp(uint64(len(desc)), 4)-uint64(len(desc)))...)
}

// Sizes of the ELF64 structures.
const (
	elfHeaderSize  = 64
	progHeaderSize = 56
	sectHeaderSize = 64
)

// appendELFHeader appends the ELF header of a core with phnum program
// headers right after it (and, when phnum does not fit in e_phnum, one
// section header after them whose sh_info holds it).
func appendELFHeader(b []byte, phnum int, xnum bool) []byte {
	le := binary.LittleEndian
	b = append(b, elf.ELFMAG...)
	b = append(b, byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT), byte(elf.ELFOSABI_NONE))
	b = append(b, make([]byte, elf.EI_NIDENT-8)...)
	b = le.AppendUint16(b, uint16(elf.ET_CORE))
	b = le.AppendUint16(b, uint16(coreMachine))
	b = le.AppendUint32(b, uint32(elf.EV_CURRENT))
	b = le.AppendUint64(b, 0)             // e_entry
	b = le.AppendUint64(b, elfHeaderSize) // e_phoff
	var shoff uint64
	shnum, en := uint16(0), uint16(phnum)
	if xnum {
		shoff, shnum, en = uint64(elfHeaderSize+phnum*progHeaderSize), 1, pnXNum
	}
	b = le.AppendUint64(b, shoff)
	b = le.AppendUint32(b, 0) // e_flags
	b = le.AppendUint16(b, elfHeaderSize)
	b = le.AppendUint16(b, progHeaderSize)
	b = le.AppendUint16(b, en)
	b = le.AppendUint16(b, sectHeaderSize)
	b = le.AppendUint16(b, shnum)
	return le.AppendUint16(b, 0) // e_shstrndx
}

// appendSectHeader appends the extended-numbering section header.
func appendSectHeader(b []byte, phnum int) []byte {
	sh := make([]byte, sectHeaderSize)
	binary.LittleEndian.PutUint32(sh[44:], uint32(phnum)) // sh_info
	return append(b, sh...)
}

func appendProg(b []byte, typ elf.ProgType, flags elf.ProgFlag, off, vaddr, filesz, memsz, align uint64) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, uint32(typ))
	b = le.AppendUint32(b, uint32(flags))
	b = le.AppendUint64(b, off)
	b = le.AppendUint64(b, vaddr)
	b = le.AppendUint64(b, 0) // p_paddr
	b = le.AppendUint64(b, filesz)
	b = le.AppendUint64(b, memsz)
	return le.AppendUint64(b, align)
}

func progFlags(prot int) elf.ProgFlag {
	var f elf.ProgFlag
	if prot&unix.PROT_READ != 0 {
		f |= elf.PF_R
	}
	if prot&unix.PROT_WRITE != 0 {
		f |= elf.PF_W
	}
	if prot&unix.PROT_EXEC != 0 {
		f |= elf.PF_X
	}
	return f
}

// ReadAt reads the core at off into dst (which it may shorten at the end
// of the file) and returns the bytes read.
func (c *File) ReadAt(ctx context.Context, dst []byte, off uint64) ([]byte, error) {
	if off >= c.size {
		return dst[:0], nil
	}
	dst = dst[:min(uint64(len(dst)), c.size-off)]
	end := off + uint64(len(dst))
	clear(dst)
	if off < uint64(len(c.head)) {
		copy(dst, c.head[off:])
	}
	i := sort.Search(len(c.segs), func(i int) bool { return c.segs[i].off+c.segs[i].size > off })
	for ; i < len(c.segs) && c.segs[i].off < end; i++ {
		s := &c.segs[i]
		lo, hi := max(off, s.off), min(end, s.off+s.size)
		if err := c.readSeg(ctx, s, dst[lo-off:hi-off], lo-s.off); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

// readSeg reads the bytes at rel in segment s: the image's, and where a
// file serves the pages that were not dumped, the file's there.
func (c *File) readSeg(ctx context.Context, s *coreSeg, dst []byte, rel uint64) error {
	if s.bytes != nil {
		copy(dst, s.bytes[rel:])
		return nil
	}
	r := c.r
	src := s.src + rel
	if _, err := r.ReadAtWith(ctx, dst, int64(src), image.ReadOptions{NoReadahead: true}); err != nil {
		return err
	}
	if s.file == nil {
		return nil
	}
	end := src + uint64(len(dst))
	for a := src; a < end; {
		h := nextHole(r, a)
		if h >= end {
			break
		}
		e := end
		if d, ok := r.NextData(h); ok && d < end {
			e = d
		}
		if err := s.file.readAt(dst[h-src:e-src], s.fileOff+(h-s.src)); err != nil {
			return err
		}
		a = e
	}
	return nil
}

// Size is the size of the core file.
func (c *File) Size() uint64 { return c.size }

// DataBytes is the number of bytes of the file that are not holes
// (st_blocks).
func (c *File) DataBytes() uint64 { return c.used }

// Seek returns the next data (or, if data is false, hole) offset at or
// after off, and false past the end of the file or of its last data.
func (c *File) Seek(off uint64, data bool) (uint64, bool) {
	if off >= c.size {
		return 0, false
	}
	i := sort.Search(len(c.data), func(i int) bool { return c.data[i].end > off })
	if data {
		if i == len(c.data) {
			return 0, false
		}
		return max(off, c.data[i].off), true
	}
	if i < len(c.data) && c.data[i].off <= off {
		return min(c.data[i].end, c.size), true
	}
	return off, true
}

// mappedFile is a file whose bytes serve the pages of a private file
// mapping that were not dumped. It is opened on first use and checked
// against the dumped identity on every read; a deleted one is the
// contents the snapshot kept (data).
type mappedFile struct {
	path string
	id   image.FileID
	data []byte
	once sync.Once
	f    *os.File
	err  error
}

// errFileChanged: a mapped file is no longer the one the dump recorded.
var errFileChanged = errors.New("mapped file changed since the dump")

// mappedFile returns the file that v maps if it is there, a regular file,
// and the one the dump recorded, or the contents the snapshot kept of it
// if it was deleted (VMA.Ghost); nil otherwise.
func (c *File) mappedFile(v image.VMA) *mappedFile {
	if v.Ghost != nil && v.File != nil {
		for _, w := range c.st.VMAs {
			if w.Ghost != nil && w.File != nil && w.File.Dev == v.File.Dev && w.File.Ino == v.File.Ino && len(w.Ghost.Data) > 0 {
				return &mappedFile{path: v.File.Path, id: *v.File, data: w.Ghost.Data}
			}
		}
		return nil
	}
	if v.File == nil || v.File.Path == "" || !filepath.IsAbs(v.File.Path) {
		return nil
	}
	path := v.File.Path
	if root := c.st.Root; root != "" && root != "/" {
		path = filepath.Join(root, path)
	}
	if mf, ok := c.files[path]; ok {
		if mf == nil || mf.id != *v.File {
			return nil
		}
		return mf
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || !sameFile(&st, v.File) {
		c.files[path] = nil
		return nil
	}
	mf := &mappedFile{path: path, id: *v.File}
	c.files[path] = mf
	return mf
}

// sameFile reports whether st is the file id names, unchanged.
func sameFile(st *unix.Stat_t, id *image.FileID) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Dev == id.Dev && st.Ino == id.Ino &&
		st.Size == id.Size && st.Mtim.Nano() == id.MtimeNs
}

// readAt reads dst at off of the file; what lies past its end reads as
// zeros (as the mapping shows it up to the end of its last page).
func (m *mappedFile) readAt(dst []byte, off uint64) error {
	if m.data != nil {
		n := 0
		if off < uint64(len(m.data)) {
			n = copy(dst, m.data[off:])
		}
		clear(dst[n:])
		return nil
	}
	m.once.Do(func() {
		f, err := os.OpenFile(m.path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOATIME, 0)
		if errors.Is(err, unix.EPERM) { // O_NOATIME on a file of another user
			f, err = os.OpenFile(m.path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		}
		m.f, m.err = f, err
	})
	if m.err != nil {
		return fmt.Errorf("%s: %w", m.path, m.err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(m.f.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", m.path, err)
	}
	if !sameFile(&st, &m.id) {
		return fmt.Errorf("%s: %w", m.path, errFileChanged)
	}
	n, err := m.f.ReadAt(dst, int64(off))
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", m.path, err)
	}
	clear(dst[n:])
	return nil
}

// Close closes the mapped files that were opened.
func (c *File) Close() {
	for _, m := range c.files {
		if m != nil && m.f != nil {
			m.f.Close()
		}
	}
}

// nextHole returns the first address at or after addr that was not
// dumped. Runs may touch (a VMA boundary ends a run), so the end of one
// run is not necessarily a hole.
func nextHole(r *image.Reader, addr uint64) uint64 {
	for {
		h := r.NextHole(addr)
		if h == addr {
			return h
		}
		addr = h
	}
}

func roundUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
