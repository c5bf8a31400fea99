package mem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/fds"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/engine/proc/pagemap"
	"github.com/lazyfs/lazyfs/engine/units"
)

// vmaKind maps a /proc mapping to the snapshot's VMA kind.
func vmaKind(m *proc.Mapping) (string, error) {
	switch m.Kind() {
	case proc.KindAnon:
		return image.VMAAnon, nil
	case proc.KindFilePrivate:
		return image.VMAFile, nil
	case proc.KindFileShared:
		if m.Deleted {
			// No path reaches the file any more: its contents are
			// dumped like shared memory's (POSIX semaphores and shm
			// segments unlinked once mapped, shared by a tree).
			return image.VMAShmem, nil
		}
		return image.VMAFileShared, nil
	case proc.KindShmem:
		return image.VMAShmem, nil
	case proc.KindSpecial:
		switch m.Path {
		case "[vdso]":
			return image.VMAVDSO, nil
		case "[vvar]":
			return image.VMAVVar, nil
		case "[vvar_vclock]":
			return image.VMAVVarVclock, nil
		case "[vsyscall]":
			return image.VMAVsyscall, nil
		}
		return "", fmt.Errorf("%w: %s: special mapping %s", image.ErrUnsupported, m, m.Path)
	}
	return "", fmt.Errorf("%w: %s: device mapping (VM_IO or VM_PFNMAP)", image.ErrUnsupported, m)
}

// Source reads the memory of the frozen process (a *ptrace.Process).
type Source interface {
	ReadMem(addr uint64, b []byte) error
}

// dumper is one dump of the memory of process pid, whose mappings (as
// /proc/PID/smaps lists them) are maps.
type dumper struct {
	pid  int
	maps []proc.Mapping
	src  Source
	tree TreeObjects
}

// TreeObjects remembers, across the processes of a tree dumped in turn,
// where each shared memory object's pages were dumped: object id to the
// process and range.
type TreeObjects map[uint64]TreeObject

// TreeObject is where the pages of a shared object were dumped.
type TreeObject struct {
	PID    int
	Lo, Hi uint64 // object offsets dumped
	Source uint64 // address of offset 0 in that process
}

// VMAs describes every mapping of process pid, maps as read from
// /proc/PID/smaps. Whether each one's pages are dumped is decided by Dump.
// A private mapping of a deleted file keeps the file's contents, up to
// ghostLimit (fds.ReadGhost's limit), in the first VMA of it (VMA.Ghost).
func VMAs(pid int, maps []proc.Mapping, ghostLimit int64) ([]image.VMA, error) {
	return (&dumper{pid: pid, maps: maps}).vmas(ghostLimit)
}

func (d *dumper) vmas(ghostLimit int64) ([]image.VMA, error) {
	var out []image.VMA
	ghosts := map[[2]uint64]bool{}
	for i := range d.maps {
		m := &d.maps[i]
		kind, err := vmaKind(m)
		if err != nil {
			return nil, err
		}
		v := image.VMA{Start: m.Start, End: m.End, Offset: m.Offset, Kind: kind, Name: m.Name(), VMFlags: m.Flags.Names()}
		if m.Perms&proc.PermRead != 0 {
			v.Prot |= unix.PROT_READ
		}
		if m.Perms&proc.PermWrite != 0 {
			v.Prot |= unix.PROT_WRITE
		}
		if m.Perms&proc.PermExec != 0 {
			v.Prot |= unix.PROT_EXEC
		}
		if m.Shared() {
			v.Flags = unix.MAP_SHARED
		} else {
			v.Flags = unix.MAP_PRIVATE
		}
		if m.Flags.Has(proc.VMGrowsDown) {
			v.Flags |= unix.MAP_GROWSDOWN
		}
		if kind == image.VMAFile || kind == image.VMAFileShared || (kind == image.VMAShmem && m.Inode != 0) {
			id, err := d.mappedFile(m)
			if err != nil {
				return nil, err
			}
			v.File = &id
		}
		if kind == image.VMAFile && m.Deleted {
			// A library or program replaced while it ran (a package
			// upgrade): its file has no name left to map it from.
			key := [2]uint64{v.File.Dev, v.File.Ino}
			if ghosts[key] {
				v.Ghost = &image.Ghost{Mode: v.File.Mode & 0o7777} // the first VMA of it holds it
			} else {
				f := fmt.Sprintf("/proc/%d/map_files/%x-%x", d.pid, m.Start, m.End)
				if v.Ghost, err = fds.ReadGhost(f, "mapped file "+m.Path, m.Inode, ghostLimit); err != nil {
					return nil, err
				}
				ghosts[key] = true
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// mappedFile identifies the file a mapping maps, through map_files (which
// reaches the very file even if its path now names another).
func (d *dumper) mappedFile(m *proc.Mapping) (image.FileID, error) {
	p := fmt.Sprintf("/proc/%d/map_files/%x-%x", d.pid, m.Start, m.End)
	id, err := proc.StatFile(p)
	if err != nil {
		return image.FileID{}, fmt.Errorf("%s: %w", m, err)
	}
	if id.Ino != m.Inode {
		return image.FileID{}, fmt.Errorf("%s: map_files reaches inode %d, maps says %d", m, id.Ino, m.Inode)
	}
	return fds.FileIdentity(m.Path, id), nil
}

// memRange is a range of pages to dump and how to read it.
type memRange struct {
	start, end uint64
	vma        int      // index in the VMA list
	file       *os.File // shmem object to read at fileOff, or nil for process memory
	fileOff    uint64
}

// shmemObject remembers where a shared object's pages were dumped.
type shmemObject struct {
	id     uint64
	lo, hi uint64 // object offsets dumped
	source uint64 // address of offset 0 in the image
	dumped bool
}

// plan lists the page ranges to dump: present or swapped pages of private
// anonymous memory, the copied-on-write pages of private file mappings,
// and the data of shared anonymous and memfd objects, once per object.
func (d *dumper) plan(st *image.Process) ([]memRange, []*os.File, error) {
	pm, err := pagemap.Open(d.pid)
	if err != nil {
		return nil, nil, err
	}
	defer pm.Close()
	var out []memRange
	var files []*os.File
	objects := map[uint64]*shmemObject{}
	var runs []pagemap.Run
	for i := range st.VMAs {
		v := &st.VMAs[i]
		switch v.Kind {
		case image.VMAAnon, image.VMAFile:
			if v.Kind == image.VMAAnon {
				runs, err = pm.Populated(v.Start, v.End, runs[:0])
			} else {
				runs, err = pm.Anonymous(v.Start, v.End, runs[:0])
			}
			if err != nil {
				return nil, files, fmt.Errorf("pagemap %#x-%#x: %w", v.Start, v.End, err)
			}
			for _, r := range runs {
				out = append(out, memRange{start: r.Start, end: r.End, vma: i})
			}
			v.Dumped = len(runs) > 0
		case image.VMAShmem:
			m := &d.maps[i]
			obj := objects[m.Inode]
			lo, hi := v.Offset, v.Offset+(v.End-v.Start)
			if obj != nil && obj.lo <= lo && hi <= obj.hi {
				v.Shmem = &image.ShmemRef{ID: m.Inode, Source: obj.source}
				continue
			}
			if to, ok := d.tree[m.Inode]; ok && obj == nil && to.PID != d.pid && to.Lo <= lo && hi <= to.Hi {
				// Dumped with another process of the tree.
				v.Shmem = &image.ShmemRef{ID: m.Inode, Source: to.Source, Owner: to.PID}
				continue
			}
			f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", d.pid, v.Start, v.End))
			if err != nil {
				return nil, files, fmt.Errorf("%s: open shared object: %w", m, err)
			}
			files = append(files, f)
			fi, err := f.Stat()
			if err != nil {
				return nil, files, err
			}
			data, err := dataRanges(f, lo, hi)
			if err != nil {
				return nil, files, fmt.Errorf("%s: %w", m, err)
			}
			for _, r := range data {
				out = append(out, memRange{start: v.Start + r.Start - lo, end: v.Start + r.End - lo, vma: i, file: f, fileOff: r.Start})
			}
			v.Dumped = len(data) > 0
			src := v.Start - v.Offset
			v.Shmem = &image.ShmemRef{ID: m.Inode, Size: uint64(fi.Size()), Source: src}
			if obj == nil {
				objects[m.Inode] = &shmemObject{id: m.Inode, lo: lo, hi: hi, source: src, dumped: true}
			}
			if _, ok := d.tree[m.Inode]; !ok && d.tree != nil {
				d.tree[m.Inode] = TreeObject{PID: d.pid, Lo: lo, Hi: hi, Source: src}
			}
		}
	}
	return out, files, nil
}

// dataRanges returns the ranges of [lo, hi) of f that hold data, by
// SEEK_DATA and SEEK_HOLE, page aligned.
func dataRanges(f *os.File, lo, hi uint64) ([]units.Range, error) {
	var out []units.Range
	fd := int(f.Fd())
	for off := lo; off < hi; {
		d, err := unix.Seek(fd, int64(off), unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("seek data: %w", err)
		}
		if uint64(d) >= hi {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole: %w", err)
		}
		s := uint64(d) &^ (image.PageSize - 1)
		e := min(hi, (uint64(h)+image.PageSize-1)&^(image.PageSize-1))
		out = append(out, units.Range{Start: max(s, off), End: e})
		off = e
	}
	return out, nil
}

// DumpOptions are the callbacks of Dump.
type DumpOptions struct {
	// Progress, if set, is called from time to time with the bytes read
	// so far and the total to read.
	Progress func(done, total uint64)
	// Captured, if set, is called as soon as every page has been read
	// from the process, before the last blocks are encoded and the pages
	// file is flushed and synced: from then on the process is no longer
	// needed.
	Captured func()
	// Tree, when dumping the processes of a tree in turn, holds the
	// shared objects dumped with the processes before: their pages are
	// not dumped again.
	Tree TreeObjects
	// PreCopy, if set, holds the memory copied while the process ran
	// (stopped): Dump reads what it lacks from the frozen process, calls
	// Captured, and only then encodes, from the copy.
	PreCopy PreCopied
	// CaptureStats, if set, receives the bytes a pre-copy dump had to
	// read from the frozen process.
	CaptureStats func(read uint64)
}

// PreCopied is memory copied while the process ran, which Dump completes
// from the frozen process and encodes from (engine/mem/precopy's Copy,
// once stopped).
type PreCopied interface {
	// Capture makes the copy hold every range of ranges as the frozen
	// process has it, reading what it lacks with read (i: the index of
	// the range in ranges); it returns the bytes read.
	Capture(ranges []units.Range, read func(i int, dst []byte, addr uint64) error) (uint64, error)
	// CloseTracking ends write tracking, once the process is no longer
	// needed.
	CloseTracking()
	// ReadMem reads the copy of [addr, addr+len(b)).
	ReadMem(addr uint64, b []byte) error
}

// Dump writes into w the pages of process st.PID worth keeping: present
// or swapped pages of private anonymous memory, the copied-on-write pages
// of private file mappings, and the data of shared anonymous and memfd
// objects, once per object. It sets each VMA's Dumped and Shmem. maps are
// the process's mappings, in the order of st.VMAs; src reads its memory.
func Dump(ctx context.Context, w *image.Writer, st *image.Process, maps []proc.Mapping, src Source, opts DumpOptions) (image.Stats, error) {
	d := &dumper{pid: st.PID, maps: maps, src: src, tree: opts.Tree}
	return d.dump(ctx, w, st, opts)
}

// readRange reads the part at addr of range r into dst: from the shared
// object r holds open, or from the process.
func (d *dumper) readRange(r memRange, dst []byte, addr uint64) error {
	if r.file != nil {
		return readFull(r.file, dst, int64(r.fileOff+addr-r.start))
	}
	return d.src.ReadMem(addr, dst)
}

func (d *dumper) dump(ctx context.Context, w *image.Writer, st *image.Process, opts DumpOptions) (image.Stats, error) {
	progress, captured := opts.Progress, opts.Captured
	ranges, files, err := d.plan(st)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err == nil {
		err = d.sysV(st)
	}
	if err != nil {
		return image.Stats{}, err
	}
	read := d.readRange
	if pc := opts.PreCopy; pc != nil {
		if read, err = d.capture(pc, ranges, opts.CaptureStats); err != nil {
			return image.Stats{}, err
		}
		for _, f := range files {
			f.Close()
		}
		files = nil
		if captured != nil {
			captured()
			captured = nil
		}
		pc.CloseTracking()
	}
	var total, done uint64
	for _, r := range ranges {
		total += r.end - r.start
	}
	pw, err := w.Pages(ctx, d.pid)
	if err != nil {
		return image.Stats{}, err
	}
	last, lastReport := -1, time.Now()
	for _, r := range ranges {
		if r.vma != last {
			pw.Break() // no block spans two VMAs
			last = r.vma
		}
		err := pw.Add(r.start, r.end-r.start, func(dst []byte, addr uint64) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			err := read(r, dst, addr)
			done += uint64(len(dst))
			if progress != nil && time.Since(lastReport) > 100*time.Millisecond {
				progress(done, total)
				lastReport = time.Now()
			}
			return err
		})
		if err != nil {
			pw.Close()
			return image.Stats{}, err
		}
	}
	for _, f := range files {
		f.Close()
	}
	files = nil
	if captured != nil {
		captured()
	}
	if err := pw.Close(); err != nil {
		return image.Stats{}, err
	}
	if progress != nil {
		progress(total, total)
	}
	return pw.Stats(), nil
}

// capture makes the pre-copy pc hold every range of ranges as the frozen
// process has it, reports the bytes it read to stats (if set), and
// returns how the dump reads a range from then on: from the copy.
func (d *dumper) capture(pc PreCopied, ranges []memRange, stats func(read uint64)) (func(r memRange, dst []byte, addr uint64) error, error) {
	spans := make([]units.Range, len(ranges))
	for i, r := range ranges {
		spans[i] = units.Range{Start: r.start, End: r.end}
	}
	n, err := pc.Capture(spans, func(i int, dst []byte, addr uint64) error { return d.readRange(ranges[i], dst, addr) })
	if err != nil {
		return nil, err
	}
	if stats != nil {
		stats(n)
	}
	return func(_ memRange, dst []byte, addr uint64) error { return pc.ReadMem(addr, dst) }, nil
}

func readFull(f *os.File, b []byte, off int64) error {
	n, err := f.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		// A shared object shrank under us: the rest reads as zeros,
		// as the mapping would fault.
		clear(b[n:])
		return nil
	}
	return err
}

// MarkShared marks the shared memory objects that several of the
// processes sts of a tree map (image.ShmemRef.Tree): restore makes each
// once and maps it in each.
func MarkShared(sts []*image.Process) {
	if len(sts) < 2 {
		return
	}
	users := map[uint64]map[int]bool{}
	for _, st := range sts {
		for _, v := range st.VMAs {
			if v.Shmem != nil {
				if users[v.Shmem.ID] == nil {
					users[v.Shmem.ID] = map[int]bool{}
				}
				users[v.Shmem.ID][st.PID] = true
			}
		}
	}
	for _, st := range sts {
		for i := range st.VMAs {
			if s := st.VMAs[i].Shmem; s != nil && len(users[s.ID]) > 1 {
				s.Tree = true
			}
		}
	}
}

// sysV notes which shared objects are System V shared memory segments
// (ShmemRef.SysV): their key, id, owner and mode, from /proc/sysvipc/shm
// (a segment's shmem inode number is its id). Their contents are dumped
// as any shared object's. A segment attached in part (a piece unmapped,
// or remapped) is refused: restore attaches whole segments.
func (d *dumper) sysV(st *image.Process) error {
	var segs map[int]kernel.SysVShm
	for i := range st.VMAs {
		v, m := &st.VMAs[i], &d.maps[i]
		if !m.IsSysV() || v.Shmem == nil {
			continue
		}
		if segs == nil {
			var err error
			if segs, err = kernel.ReadSysVShm(); err != nil {
				return fmt.Errorf("System V shared memory: %w", err)
			}
		}
		seg, ok := segs[int(m.Inode)]
		if !ok {
			return fmt.Errorf("%w: %s: System V segment %d is not in this IPC namespace's /proc/sysvipc/shm", image.ErrUnsupported, m, m.Inode)
		}
		if v.Offset != 0 || v.End-v.Start != (seg.Size+image.PageSize-1)&^(image.PageSize-1) {
			return fmt.Errorf("%w: %s: System V segment %d (%d bytes) attached in part", image.ErrUnsupported, m, seg.ID, seg.Size)
		}
		v.Shmem.Size = seg.Size
		v.Shmem.SysV = &image.SysVShm{Key: seg.Key, ID: seg.ID, Mode: seg.Mode & (0o777 | kernel.ShmDest), UID: seg.UID, GID: seg.GID}
	}
	return nil
}
