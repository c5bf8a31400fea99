package image

import "io"

// PageSource is where a lazy restore reads the memory of a snapshot's
// processes once they run, each process's pager reading its own: the
// snapshot's files (DirectSource), or a lazyfs mount of the snapshot that
// decodes for every restore sharing it (fs.MountSource, fs.PrivateSource).
// Each implementation knows what it is: whether its bytes must be checked
// again, which blocks are worth reading through it, when it is up and when
// it is gone; the restore only reads.
type PageSource interface {
	// Pages returns what the pager of one process reads its memory from,
	// at the process's addresses: own is the restore's reader of that
	// process's pages (whose PID names it), for what the source reads
	// from the snapshot's files itself (its blocks stored as is, every
	// block until a mount is up) and for the checksums of what comes
	// from elsewhere. Valid until Close or own's Close.
	Pages(own *Reader) (io.ReaderAt, error)
	// Waits reports whether its reads wait on another process doing the
	// work (a FUSE server answering with direct I/O): the pager then
	// reads with more workers, so that one waits while another copies.
	Waits() bool
	// Gone receives an error naming what died if the process serving the
	// source dies before the restore is done with it; nil if none can.
	Gone() <-chan error
	// Abort makes every read waiting on the source fail at once: the
	// restore is ending on a signal, and a store that stalls must not
	// hold it for a read timeout.
	Abort()
	// Close releases the source, once no pager reads from it.
	Close() error
}

// DirectSource reads each process's memory from the snapshot's files
// (snapctl restore --lazy --source direct): its own reader, uncached
// (Reader.Uncached), every block checked as it is read.
var DirectSource PageSource = direct{}

type direct struct{}

func (direct) Pages(own *Reader) (io.ReaderAt, error) { return own.Uncached(), nil }
func (direct) Waits() bool                            { return false }
func (direct) Gone() <-chan error                     { return nil }
func (direct) Abort()                                 {}
func (direct) Close() error                           { return nil }
