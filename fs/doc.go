// Package fs serves a lazyfs snapshot as a read-only FUSE file system
// (go-fuse v2), decoding memory block by block as it is read:
//
//	MNT/snapshot.json                 the manifest, as stored
//	MNT/PID/maps                      the dumped VMAs, in /proc/PID/maps format
//	MNT/PID/mem                       sparse file: offset = virtual address
//	MNT/PID/core                      ELF core file of the process (fs/corefile)
//	MNT/PID/regions/START-END-PERMS[-NAME]   one file per dumped VMA
//	MNT/PID/process.json              the process state, as stored
//	MNT/PID/stats                     blocks by kind, sizes, ratio, cache figures
//
// Mount mounts a snapshot directory and returns a *Server; Unmount, Wait
// and Done end and follow it. The lazyfs command is a thin layer over
// this, and snapctl restore --lazy mounts its snapshot the same way on a
// private mountpoint. Decoding lives in engine/image: every read of mem
// or a region is an image.Reader.ReadAtWith at an address, through one
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
// with FOPEN_DIRECT_IO if Options.DirectIO is set. Measured with the
// package benchmarks on this project's machine (2 vCPUs, kernel 6.18,
// free page reporting on; a 1 GiB snapshot of 1/4 zero, 1/4 random, 1/2
// bf16-like memory in 256 KiB blocks; 256 MiB block cache; readers in
// their own process; medians of 3 runs on a shared, noisy machine):
//
//	                                        keep-cache   direct-io   plain file
//	dd bs=1M, fresh mount, caches dropped    0.94         1.27        1.06 GB/s
//	dd bs=1M, again (everything cached)      5.45         1.56        6.8  GB/s
//	pread 4 KiB of a decoded block p50/p99   1.7/51 µs    16/430 µs
//	pread 4 KiB, first touch       p50/p99   285/760 µs   280/1800 µs
//	pread 4 KiB, caches dropped    p50/p99   755/5600 µs  715/3800 µs
//
// KEEP_CACHE is the default: decoded pages stay in the kernel's page
// cache, so a second reader, or a second restore sharing the mount, reads
// at page-cache speed (3.5x direct I/O), and a 4 KiB read of a decoded
// page costs ~1.7 µs instead of a FUSE round trip (~10x). DIRECT_IO is
// faster (~1.3x) for one reader that reads everything once, as a private
// mount serving a single restore: no second copy into the page cache and
// no memory held twice; but every read, however small, is a request of
// its own, and rereads decode again once blocks have left the block cache.
// First touches cost the same either way: they are dominated by the
// decode path (reading the stored block, its checksum, and faulting in a
// fresh cache buffer, which costs ~14 µs a page on this VM).
//
// With FOPEN_KEEP_CACHE the page cache is the copy kept: a read of a
// mem or region file not opened with O_DIRECT is read with
// image.ReadOptions.Kept, and a block whose every page has been served
// to the page cache leaves the block cache at once (cache.Ref.Served),
// so that decoded memory is held once however many readers share the
// mount. The block cache holds what is still wanted: blocks read in part
// (a 16 KiB read of a 256 KiB block), blocks decoded ahead of a reader
// and not read yet, and the blocks of O_DIRECT readers and of the core
// file. If the kernel drops pages of a block, the next read of them
// decodes it again.
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
// Mounts go through fusermount3, as root too: go-fuse's direct mount(2)
// leaves the /dev/fuse descriptor inheritable by children (a restored
// process would keep a dead server's connection alive). The private
// mount's helper, which starts no program while it mounts, is the
// exception: as root it mounts with mount(2), one process fewer to start
// before a lazy restore is served, and then makes its descriptors
// close-on-exec. Unmount
// unmounts, or, if files are still open, detaches the mount (umount -l)
// so that the mountpoint is free at once; the readers are closed when the
// serve loop ends. The server never sends requests to its own mount after
// start-up (mount checks use /proc/self/mountinfo): a FUSE server killed
// while one of its threads waits on its own mount cannot exit, and holds
// the mount until ForceUnmount (lazyfs -u --force) aborts the connection.
// For the same reason, a program that reads its own mount in-process
// must not be SIGKILLed expecting a clean exit.
//
// # Private mounts
//
// MountPrivate mounts a snapshot for one reader (snapctl restore --lazy):
// a helper process, the program re-executed as PrivateArg0, mounts it in
// a mount namespace of its own (as root), hands back an fd of
// MNT/PID/mem, and serves it until the reader closes it or has exited;
// then it unmounts. The reader is never its own FUSE server, and nothing
// stays mounted if either process dies.
package fs
