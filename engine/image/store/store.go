package store

import (
	"context"
	"errors"
	"io"
	"time"
)

// Store holds the files of one snapshot. A snapshot directory is one
// (the default, dirStore); an object store is another, whose package
// registers its address scheme with RegisterScheme ("s3" for
// s3://BUCKET/PREFIX). Readers of the format see only this: the checks
// of the format (the manifest's sizes and CRC32C, every block's CRC32C)
// are the same whatever holds the bytes.
type Store interface {
	// String names the snapshot in messages: its directory or address.
	String() string
	// Stat checks that name is a file of the snapshot that can be
	// trusted, and returns its size. A missing file's error matches
	// os.ErrNotExist; one that cannot be trusted (see Open's trust)
	// ErrUntrusted, and one that is not a plain file ErrCorrupt.
	Stat(name string) (int64, error)
	// Open opens the file name for reads at any offset. Its errors name
	// the file.
	Open(name string) (File, error)
	// Close releases the store. Files opened from it stay usable.
	Close() error
}

// File is a file of a snapshot opened for reading. A read that fails
// (the store went away) returns an error, never other bytes.
type File interface {
	io.ReaderAt
	io.Closer
}

// StoreWriter is where a dump writes a snapshot held other than in a
// local directory. Create refuses a place that already holds files;
// files are uploaded as they are written, and the manifest goes last,
// by Commit, so that a dump that failed is never read as a whole
// snapshot.
type StoreWriter interface {
	String() string
	// Create starts the file name. Its bytes are stored when the upload
	// is closed; Abort drops them.
	Create(name string) (Upload, error)
	// Commit stores the manifest, unless the snapshot has one already
	// (ErrExists), and releases the store.
	Commit(manifest []byte) error
	// Abort removes every file created and releases the store.
	Abort()
}

// Upload is one file being written to a StoreWriter.
type Upload interface {
	io.Writer
	// Close completes the file; its error names it.
	Close() error
	// Abort drops what was written.
	Abort()
}

// Options configure a store given by address. They cross to the
// private mount's helper process as JSON.
type Options struct {
	// Endpoint is the store's URL (snapctl --s3-endpoint); empty means
	// the one the environment names, if any, else the service's.
	Endpoint string `json:",omitempty"`
	// CacheDir, if set, is a directory of blocks already fetched, kept
	// between runs (--cache-dir); CacheSize bounds it in bytes.
	CacheDir  string `json:",omitempty"`
	CacheSize int64  `json:",omitempty"`
	// Trust is image.OpenOptions.Trust: it also accepts a CacheDir that
	// another user can change.
	Trust bool `json:",omitempty"`
	// ReadTimeout bounds one read of the store, every retry included
	// (--s3-read-timeout); zero means the store's default.
	ReadTimeout time.Duration `json:",omitempty"`
	// Context, if set, ends every read of the store when it is done (the
	// command's context: SIGINT and SIGTERM). Not passed on to helper
	// processes, which their parent ends.
	Context context.Context `json:"-"`
}

// Errors of stores. engine/image's errors of the same names are these:
// one errors.Is answers for the format's checks and the store's.
var (
	// ErrCorrupt: a file of the snapshot is not what a snapshot's file
	// can be (a symbolic link, not a regular file), or the format finds
	// its bytes damaged.
	ErrCorrupt = errors.New("corrupt snapshot")
	// ErrUntrusted: a snapshot, or a path a dump or restore would act on,
	// can be changed by a user other than the caller and root; the error
	// wrapping it names the file or directory and its owner or mode.
	ErrUntrusted = errors.New("untrusted")
	// ErrExists: a snapshot is already there.
	ErrExists = errors.New("directory already holds a snapshot")
)
