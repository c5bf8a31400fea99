package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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
	// os.ErrNotExist; one that cannot be trusted (see OpenOptions.Trust)
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

// RemoteOptions configure a store given by address. They cross to the
// private mount's helper process as JSON.
type RemoteOptions struct {
	// Endpoint is the store's URL (snapctl --s3-endpoint); empty means
	// the one the environment names, if any, else the service's.
	Endpoint string `json:",omitempty"`
	// CacheDir, if set, is a directory of blocks already fetched, kept
	// between runs (--cache-dir); CacheSize bounds it in bytes.
	CacheDir  string `json:",omitempty"`
	CacheSize int64  `json:",omitempty"`
	// Trust is OpenOptions.Trust: it also accepts a CacheDir that
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

// Scheme opens the stores of one kind of address.
type Scheme struct {
	Open   func(addr string, o RemoteOptions) (Store, error)
	Create func(addr string, o RemoteOptions) (StoreWriter, error)
}

var (
	schemesMu sync.RWMutex
	schemes   = map[string]Scheme{}
)

// RegisterScheme makes addresses "name://..." open with s, wherever a
// snapshot directory is accepted. The package of a store calls it from an
// init function; a second registration of a name panics, as
// database/sql.Register does: two stores claiming one scheme is a bug of
// the build, never something to settle silently.
func RegisterScheme(name string, s Scheme) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if _, dup := schemes[name]; dup {
		panic("image: RegisterScheme called twice for scheme " + name)
	}
	schemes[name] = s
}

// IsRemote reports whether addr is an address of the form scheme://...
// rather than a directory.
func IsRemote(addr string) bool {
	scheme, _, ok := strings.Cut(addr, "://")
	return ok && scheme != "" && !strings.Contains(scheme, "/")
}

// scheme returns the registered scheme of the address addr.
func scheme(addr string) (Scheme, error) {
	name, _, _ := strings.Cut(addr, "://")
	schemesMu.RLock()
	s, ok := schemes[name]
	schemesMu.RUnlock()
	if !ok {
		return Scheme{}, fmt.Errorf("%s: no store for addresses %s:// in this build", addr, name)
	}
	return s, nil
}

// FileStore opens a snapshot held in one file, an archive (package
// engine/image/archive registers it), from the file opened and checked.
type FileStore func(f *os.File) (Store, error)

var fileStore FileStore

// RegisterFileStore makes a path to a regular file, wherever a snapshot
// directory is accepted, open with open. A second registration panics,
// as RegisterScheme's.
func RegisterFileStore(open FileStore) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if fileStore != nil {
		panic("image: RegisterFileStore called twice")
	}
	fileStore = open
}

// OpenStore opens the files of the snapshot at dir (a directory, an
// address, or an archive file) without reading them: what copies a
// snapshot whole, sealed or not, reads it with.
func OpenStore(dir string, o OpenOptions) (Store, error) { return openStore(dir, o) }

// ReadManifest reads and checks the manifest of the snapshot st holds.
func ReadManifest(st Store) (*Manifest, []byte, error) {
	b, err := readManifestBytes(st)
	if err != nil {
		return nil, nil, err
	}
	m, err := parseManifest(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", joinName(st.String(), ManifestName), err)
	}
	return m, b, nil
}

// openFileStore opens the archive at path: a regular file that (unless
// trusted) only the caller and root can change; what it holds is read
// through the one descriptor opened here.
func openFileStore(path string, o OpenOptions) (Store, error) {
	schemesMu.RLock()
	open := fileStore
	schemesMu.RUnlock()
	// O_PATH first: opening a FIFO would wait for a writer, a device
	// would be told it was opened. Only a regular file is opened to read.
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || open == nil {
		return nil, &os.PathError{Op: "open snapshot", Path: path, Err: errors.New("neither a directory nor a snapshot archive (snapctl export)")}
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	if !o.Trust {
		if err := trustedStat(&st, "snapshot archive "+path); err != nil {
			f.Close()
			return nil, err
		}
	}
	s, err := open(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// openStore opens the store of dir: a directory, an address, or an
// archive file.
func openStore(dir string, o OpenOptions) (Store, error) {
	if IsRemote(dir) {
		s, err := scheme(dir)
		if err != nil {
			return nil, err
		}
		ro := o.Remote
		ro.Trust = ro.Trust || o.Trust
		return s.Open(dir, ro)
	}
	d, err := openDir(dir)
	if errors.Is(err, unix.ENOTDIR) {
		return openFileStore(dir, o)
	}
	if err != nil {
		return nil, err
	}
	if !o.Trust {
		if err := trusted(d, "snapshot directory "+d.Name()); err != nil {
			d.Close()
			return nil, err
		}
	}
	return &dirStore{d: d, trust: o.Trust}, nil
}

// dirStore is a snapshot directory, opened once: every file is opened
// through it, never following a link, so that nothing done to the path
// afterwards changes what is read.
type dirStore struct {
	d     *os.File
	trust bool
}

func (s *dirStore) String() string { return s.d.Name() }
func (s *dirStore) Close() error   { return s.d.Close() }

func (s *dirStore) Open(name string) (File, error) { return openAt(s.d, name) }

// Stat checks a file of the directory: a regular file, not a link, and
// (unless trusted) one that only the caller and root can change.
func (s *dirStore) Stat(name string) (int64, error) {
	path := filepath.Join(s.d.Name(), name)
	var st unix.Stat_t
	if err := unix.Fstatat(int(s.d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("%s: %w: not a regular file (mode %o)", path, ErrCorrupt, st.Mode)
	}
	if !s.trust {
		if err := trustedStat(&st, path); err != nil {
			return 0, err
		}
	}
	return st.Size, nil
}

// readAll reads the whole file name of st, of size bytes.
func readAll(st Store, name string, size int64, forget bool) ([]byte, error) {
	f, err := st.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fg, ok := f.(Forgetter); forget && (!ok || !fg.Forget(0, size)) {
		return nil, errors.New("nothing cached to fetch again")
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n < len(b) {
		if err == io.EOF || err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return b, nil
}
