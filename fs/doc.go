// Package fs serves a lazyfs snapshot as a read-only FUSE file system
// (go-fuse v2), decoding memory block by block as it is read:
//
//	MNT/snapshot.json                 the manifest, as stored
//	MNT/PID/maps                      the dumped VMAs, in /proc/PID/maps format
//	MNT/PID/mem                       sparse file: offset = virtual address
//	MNT/PID/regions/START-END-PERMS[-NAME]   one file per dumped VMA
//	MNT/PID/process.json              the process state, as stored
//	MNT/PID/stats                     blocks by kind, sizes, ratio, cache figures
//
// Mount mounts a snapshot directory and returns a *Server; Unmount, Wait
// and Done end and follow it. The lazyfs command is a thin layer over
// this, and snapctl restore --lazy mounts its snapshot the same way on a
// private mountpoint. Decoding lives in engine/image: every read of mem
// or a region is an image.Reader.ReadAtContext at an address, through one
// cache.Cache shared by the whole mount; addresses that were not dumped
// read as zeros.
//
// # Tree and attributes
//
// The tree is built once at mount time (the snapshot is immutable) from
// persistent inodes. Entry, attribute and negative-entry timeouts are a
// day. Files are 0400 and directories 0500, owned by the uid and gid that
// mounted, checked by the kernel (default_permissions); AllowOther adds
// allow_other. mem is as large as the end of the highest dumped VMA; its
// st_blocks counts the dumped bytes, so tools see it as sparse, and lseek
// SEEK_DATA/SEEK_HOLE (NodeLseeker) walk exactly the dumped ranges (runs
// that touch at a VMA boundary are one data range). st_blksize is 1 MiB,
// the request size the mount serves best, which cp and cat use for their
// buffers. stats is generated on every open and read with direct I/O.
//
// # Requests and caching
//
// Requests are up to 1 MiB (MaxWrite, max_read and MaxReadAhead); after
// mounting, the mount's /sys/class/bdi/MAJ:MIN/read_ahead_kb is raised to
// 4096 (root only) because the kernel starts every FUSE mount at 128 KiB
// and only issues requests as large as its read-ahead window.
//
// mem and region files are opened with FOPEN_KEEP_CACHE by default, and
// with FOPEN_DIRECT_IO if Options.DirectIO is set. Measured on this
// project's machine (2 vCPUs, kernel 6.18, free page reporting on,
// 1 GiB snapshot of 1/4 zero, 1/4 random, 1/2 bf16-like memory, 256 KiB
// blocks, 256 MiB block cache; medians, the machine is noisy):
//
//	                                         keep-cache   direct-io   plain file
//	dd 1 MiB, fresh mount, caches dropped    0.6-1.0      0.75-1.1    1.2 GB/s
//	dd 1 MiB, fresh mount, snapshot cached   1.0-1.3      1.4         -
//	dd 1 MiB, again (warm)                   2.8-5.0      0.8-1.4     5.3 GB/s
//	pread 4 KiB, block decoded (p50/p99)     1.6/66 µs    15/250 µs   -
//	pread 4 KiB, first touch   (p50/p99)     ~230/1200 µs (both)      -
//
// KEEP_CACHE is the default because the decoded pages then stay in the
// kernel's page cache: a second reader, or a second restore sharing the
// mount, reads at page-cache speed and a 4 KiB read of a decoded page
// costs ~1.5 µs instead of a FUSE round trip; sequential first reads are
// within the noise of direct I/O. DIRECT_IO pays for one large reader
// that reads everything once (a private mount for one restore): it skips
// the second copy into the page cache and keeps no decoded memory twice,
// but every read, however small, is a request (4 KiB reads become one
// request each) and rereads decode again once blocks leave the block
// cache.
//
// # Errors
//
// Errors cross the FUSE boundary as syscall.Errno in one place
// (process.errno): a block that fails its checksum or cannot be read makes
// that read fail with EIO (the reader logs file, block and address; other
// reads are unaffected); a read interrupted by a signal returns EINTR.
// Mount reports, with errors.Is: image.ErrIncomplete for a snapshot
// without manifest, ErrNoFUSE when /dev/fuse or fusermount3 is missing,
// ErrBusy for a mountpoint that is already a mount point, syscall.ENOTDIR
// for one that is not a directory.
//
// # Mounting and unmounting
//
// As root the mount is made with mount(2) directly (no fusermount3
// needed), otherwise through fusermount3. Unmount unmounts, or, if files
// are still open, detaches the mount (umount -l) so that the mountpoint
// is free at once. The readers are closed when the serve loop ends.
package fs
