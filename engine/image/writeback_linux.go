package image

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing [off, off+n) of f to
// disk without waiting (sync_file_range SYNC_FILE_RANGE_WRITE). It is only
// a hint: durability still comes from the fsync in Close, so an error is
// ignored.
func startWriteback(f *os.File, off, n uint64) {
	_ = unix.SyncFileRange(int(f.Fd()), int64(off), int64(n), unix.SYNC_FILE_RANGE_WRITE)
}
