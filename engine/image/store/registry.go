package store

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Scheme opens the stores of one kind of address.
type Scheme struct {
	Open   func(addr string, o Options) (Store, error)
	Create func(addr string, o Options) (StoreWriter, error)
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
		panic("store: RegisterScheme called twice for scheme " + name)
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

// Create opens the address addr (IsRemote) for a dump to write a
// snapshot to, with the store of its scheme.
func Create(addr string, o Options) (StoreWriter, error) {
	s, err := scheme(addr)
	if err != nil {
		return nil, err
	}
	return s.Create(addr, o)
}

// FileStore opens a snapshot held in one file, an archive (package
// engine/image/store/archive registers it), from the file opened and
// checked.
type FileStore func(f *os.File) (Store, error)

var fileStore FileStore

// RegisterFileStore makes a path to a regular file, wherever a snapshot
// directory is accepted, open with open. A second registration panics,
// as RegisterScheme's.
func RegisterFileStore(open FileStore) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if fileStore != nil {
		panic("store: RegisterFileStore called twice")
	}
	fileStore = open
}

// Open opens the store of the snapshot at dir: a directory, an address,
// or an archive file. Unless trust, a directory or archive that a user
// other than the caller and root can change is refused (ErrUntrusted);
// o configures the store of an address (trust also accepts its cache
// directory).
func Open(dir string, trust bool, o Options) (Store, error) {
	if IsRemote(dir) {
		s, err := scheme(dir)
		if err != nil {
			return nil, err
		}
		o.Trust = o.Trust || trust
		return s.Open(dir, o)
	}
	d, err := OpenDir(dir)
	if errors.Is(err, unix.ENOTDIR) {
		return openFileStore(dir, trust)
	}
	if err != nil {
		return nil, err
	}
	if !trust {
		if err := Trusted(d, "snapshot directory "+d.Name()); err != nil {
			d.Close()
			return nil, err
		}
	}
	return &dirStore{d: d, trust: trust}, nil
}

// openFileStore opens the archive at path: a regular file that (unless
// trusted) only the caller and root can change; what it holds is read
// through the one descriptor opened here.
func openFileStore(path string, trust bool) (Store, error) {
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
	if !trust {
		if err := TrustedStat(&st, "snapshot archive "+path); err != nil {
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
