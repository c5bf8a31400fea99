package fs

import (
	"context"
	"syscall"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Modes of every file and directory: owner-only, read-only.
const (
	fileMode = 0o400
	dirMode  = 0o500
)

// owner holds what every node reports the same way: the mounting user and
// the snapshot's creation time.
type owner struct {
	uid, gid uint32
	mtime    time.Time
}

// fill sets the mode, owner and times of out.
func (o *owner) fill(out *fuse.Attr, mode uint32) {
	out.Mode = mode
	out.Uid, out.Gid = o.uid, o.gid
	out.Nlink = 1
	sec, nsec := uint64(o.mtime.Unix()), uint32(o.mtime.Nanosecond())
	out.Mtime, out.Mtimensec = sec, nsec
	out.Ctime, out.Ctimensec = sec, nsec
	out.Atime, out.Atimensec = sec, nsec
}

// dirNode is a directory of the fixed tree built at mount time.
type dirNode struct {
	fusefs.Inode
	own *owner
}

var _ = (fusefs.NodeGetattrer)((*dirNode)(nil))

func (d *dirNode) Getattr(ctx context.Context, f fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.own.fill(&out.Attr, syscall.S_IFDIR|dirMode)
	out.Nlink = 2
	return 0
}

// bytesNode is a small file whose content is fixed at mount time
// (snapshot.json, process.json, maps).
type bytesNode struct {
	fusefs.Inode
	own  *owner
	data []byte
}

var (
	_ = (fusefs.NodeGetattrer)((*bytesNode)(nil))
	_ = (fusefs.NodeOpener)((*bytesNode)(nil))
	_ = (fusefs.NodeReader)((*bytesNode)(nil))
)

func (b *bytesNode) Getattr(ctx context.Context, f fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	b.own.fill(&out.Attr, syscall.S_IFREG|fileMode)
	setSize(&out.Attr, uint64(len(b.data)), uint64(len(b.data)))
	return 0
}

func (b *bytesNode) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return openReadOnly(flags, fuse.FOPEN_KEEP_CACHE|noFlush)
}

// openReadOnly is the Open of a file with no handle of its own: EROFS for
// anything but a read-only open, else the FOPEN flags fuseFlags.
func openReadOnly(flags, fuseFlags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EROFS
	}
	return nil, fuseFlags, 0
}

func (b *bytesNode) Read(ctx context.Context, f fusefs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return fuse.ReadResultData(sliceAt(b.data, off, len(dest))), 0
}

// genNode is a file generated afresh on every open (stats): the handle
// holds the text, read with direct I/O so that the page cache never
// serves an old one.
type genNode struct {
	fusefs.Inode
	own *owner
	gen func() []byte
}

// genHandle is an open genNode.
type genHandle struct{ data []byte }

var (
	_ = (fusefs.NodeGetattrer)((*genNode)(nil))
	_ = (fusefs.NodeOpener)((*genNode)(nil))
	_ = (fusefs.NodeReader)((*genNode)(nil))
)

func (g *genNode) Getattr(ctx context.Context, f fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	g.own.fill(&out.Attr, syscall.S_IFREG|fileMode)
	n := uint64(len(g.gen()))
	setSize(&out.Attr, n, n)
	out.SetTimeout(0) // the size changes with the cache figures
	return 0
}

func (g *genNode) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EROFS
	}
	return &genHandle{data: g.gen()}, fuse.FOPEN_DIRECT_IO | noFlush, 0
}

func (g *genNode) Read(ctx context.Context, f fusefs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := f.(*genHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	return fuse.ReadResultData(sliceAt(h.data, off, len(dest))), 0
}

// sliceAt returns up to n bytes of b from off.
func sliceAt(b []byte, off int64, n int) []byte {
	if off < 0 || off >= int64(len(b)) {
		return nil
	}
	return b[off:min(int64(len(b)), off+int64(n))]
}

// ioBlockSize is the st_blksize of every file: tools (cp, cat) size their
// buffers from it, and a request of MaxRequest bytes is what the mount
// serves fastest.
const ioBlockSize = MaxRequest

// setSize sets the size and the allocated blocks (in 512-byte units, as
// st_blocks counts them) of a file holding stored bytes of data.
func setSize(out *fuse.Attr, size, stored uint64) {
	out.Size = size
	out.Blocks = (stored + 511) / 512
	out.Blksize = ioBlockSize
}
