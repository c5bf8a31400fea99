package fs

import (
	"context"
	"fmt"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/lazyfs/lazyfs/engine/image"
)

// memNode is a window of a process's address space served as a sparse
// file: offset 0 of the file is address base. MNT/PID/mem is the window
// [0, end of the highest dumped VMA); each MNT/PID/regions file is the
// window of one VMA. Reads go through the process's image.Reader (and so
// the mount's block cache); addresses that were not dumped read as zeros
// and are holes for lseek SEEK_DATA / SEEK_HOLE.
type memNode struct {
	fusefs.Inode
	own  *owner
	proc *process
	base uint64
	size uint64
	// dumped is the number of dumped bytes inside the window (st_blocks).
	dumped uint64
	// openFlags is FOPEN_KEEP_CACHE or FOPEN_DIRECT_IO (Options.DirectIO),
	// with FOPEN_NOFLUSH.
	openFlags uint32
}

var (
	_ = (fusefs.NodeGetattrer)((*memNode)(nil))
	_ = (fusefs.NodeOpener)((*memNode)(nil))
	_ = (fusefs.NodeReader)((*memNode)(nil))
	_ = (fusefs.NodeLseeker)((*memNode)(nil))
)

func newMemNode(own *owner, p *process, base, size uint64, openFlags uint32) *memNode {
	return &memNode{own: own, proc: p, base: base, size: size, dumped: p.r.DumpedIn(base, base+size), openFlags: openFlags}
}

func (m *memNode) Getattr(ctx context.Context, f fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	m.own.fill(&out.Attr, syscall.S_IFREG|fileMode)
	setSize(&out.Attr, m.size, m.dumped)
	return 0
}

func (m *memNode) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := openReadOnly(flags, m.openFlags)
	if errno == 0 && m.openFlags&fuse.FOPEN_KEEP_CACHE != 0 && flags&syscall.O_DIRECT == 0 {
		fh = keptHandle{}
	}
	return fh, fl, errno
}

// keptHandle is an open mem or region file whose reads the kernel keeps
// in its page cache: FOPEN_KEEP_CACHE, and not opened with O_DIRECT
// (whose reads bypass the page cache). Its reads are made with
// image.ReadOptions.Kept, so that a block served whole leaves the block
// cache: the page cache holds the decoded bytes, once. (A reader that
// sets O_DIRECT later with fcntl only makes the blocks it reads whole
// decoded again on the next read.)
type keptHandle struct{}

func (m *memNode) Read(ctx context.Context, f fusefs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if uint64(off) >= m.size {
		return fuse.ReadResultData(nil), 0
	}
	n := min(uint64(len(dest)), m.size-uint64(off))
	buf := dest[:n]
	_, kept := f.(keptHandle)
	if _, err := m.proc.r.ReadAtWith(ctx, buf, int64(m.base+uint64(off)), image.ReadOptions{Kept: kept}); err != nil {
		return nil, m.proc.errno(err, m.base+uint64(off), len(buf))
	}
	return fuse.ReadResultData(buf), 0
}

// Lseek implements SEEK_DATA and SEEK_HOLE over the dumped ranges: data
// is what was dumped, holes are everything else (and past the end of the
// file, which ends in an implicit hole).
func (m *memNode) Lseek(ctx context.Context, f fusefs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	switch whence {
	case seekData, seekHole:
	default:
		return 0, syscall.EINVAL
	}
	if off >= m.size {
		return 0, syscall.ENXIO
	}
	addr, end := m.base+off, m.base+m.size
	if whence == seekData {
		d, ok := m.proc.r.NextData(addr)
		if !ok || d >= end {
			return 0, syscall.ENXIO
		}
		return d - m.base, 0
	}
	return min(nextHole(m.proc.r, addr), end) - m.base, 0
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

// lseek(2) whence values the kernel forwards to FUSE.
const (
	seekData = 3 // SEEK_DATA
	seekHole = 4 // SEEK_HOLE
)

// coreNode is MNT/PID/core: the process's ELF core file (package
// corefile), a sparse file whose holes are the dumped holes of its
// PT_LOADs.
type coreNode struct {
	fusefs.Inode
	own  *owner
	proc *process
	// openFlags as memNode's.
	openFlags uint32
}

var (
	_ = (fusefs.NodeGetattrer)((*coreNode)(nil))
	_ = (fusefs.NodeOpener)((*coreNode)(nil))
	_ = (fusefs.NodeReader)((*coreNode)(nil))
	_ = (fusefs.NodeLseeker)((*coreNode)(nil))
)

func (c *coreNode) Getattr(ctx context.Context, f fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	c.own.fill(&out.Attr, syscall.S_IFREG|fileMode)
	setSize(&out.Attr, c.proc.core().Size(), c.proc.core().DataBytes())
	return 0
}

func (c *coreNode) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return openReadOnly(flags, c.openFlags)
}

func (c *coreNode) Read(ctx context.Context, f fusefs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 {
		return nil, syscall.EINVAL
	}
	b, err := c.proc.core().ReadAt(ctx, dest, uint64(off))
	if err != nil {
		return nil, c.proc.errno(fmt.Errorf("core at offset %#x: %w", off, err), uint64(off), len(dest))
	}
	return fuse.ReadResultData(b), 0
}

// Lseek implements SEEK_DATA and SEEK_HOLE: data is the headers and
// notes, the dumped pages and the pages a mapped file serves.
func (c *coreNode) Lseek(ctx context.Context, f fusefs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	switch whence {
	case seekData, seekHole:
	default:
		return 0, syscall.EINVAL
	}
	o, ok := c.proc.core().Seek(off, whence == seekData)
	if !ok {
		return 0, syscall.ENXIO
	}
	return o, 0
}
