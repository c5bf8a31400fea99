// Package archive keeps a snapshot in one file: a tar archive (POSIX,
// PAX where a member needs it) of one directory holding the snapshot's
// files, the manifest last, so that it streams (snapctl export -o -) and
// unpacks with tar into a snapshot directory. Opened where a snapshot
// directory is expected (restore, lazyfs, inspect, verify), an archive is
// read in place: its members are indexed once, then read at their offsets
// through the one descriptor opened, with the checks of the format that a
// directory gets (sizes and CRC32C of the manifest, every block's CRC32C).
package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/store"
	"github.com/lazyfs/lazyfs/engine/image/workingset"
)

func init() { store.RegisterFileStore(Open) }

// ErrIncremental: an incremental snapshot takes blocks from its parent,
// which an archive of it would not hold.
var ErrIncremental = errors.New("an incremental snapshot (dumped with --parent) takes blocks from its parent: an archive holds one whole snapshot")

// maxMembers bounds the members of an archive that Open indexes: a
// snapshot of a tree of thousands of processes has a few per process.
const maxMembers = 1 << 20

// copyBuf is the size of the reads of a store while writing an archive:
// one request to an object store reads this much.
const copyBuf = 4 << 20

// Files lists the files of the snapshot st holds, in archive order: the
// files the manifest lists (sorted), the working sets recorded since the
// dump, the manifest's authenticator, the manifest.
func Files(st store.Store, m *image.Manifest) ([]string, error) {
	names := make([]string, 0, len(m.Files)+3)
	for name := range m.Files {
		names = append(names, name)
	}
	slices.Sort(names)
	var extra []string
	for _, p := range m.Processes {
		extra = append(extra, workingset.Name(p.PID))
	}
	extra = append(extra, image.AuthName)
	for _, name := range extra {
		if _, listed := m.Files[name]; listed {
			continue
		}
		if _, err := st.Stat(name); err == nil {
			names = append(names, name)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	return append(names, image.ManifestName), nil
}

// Write writes the snapshot st holds into w as an archive whose files are
// in the directory top. Every file the manifest lists is checked against
// its size and CRC32C as it is copied: a snapshot that does not match
// its manifest is not exported (image.ErrCorrupt). progress, if set, is
// called with the bytes written so far and the total.
func Write(ctx context.Context, st store.Store, top string, w io.Writer, progress func(done, total uint64)) error {
	if !validName(top) {
		return fmt.Errorf("archive directory name %q: want a plain name", top)
	}
	m, raw, err := image.ReadManifest(st)
	if err != nil {
		return err
	}
	if m.Parent != nil {
		return fmt.Errorf("%s: %w", st, ErrIncremental)
	}
	names, err := Files(st, m)
	if err != nil {
		return err
	}
	sizes := make([]int64, len(names))
	var total uint64
	for i, name := range names[:len(names)-1] {
		if sizes[i], err = st.Stat(name); err != nil {
			return err
		}
		total += uint64(sizes[i])
	}
	total += uint64(len(raw))
	tw := tar.NewWriter(w)
	hdr := func(name string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: top + "/" + name, Size: size, Mode: 0o600, ModTime: m.Created, Format: tar.FormatPAX}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: top + "/", Mode: 0o700, ModTime: m.Created, Format: tar.FormatPAX}); err != nil {
		return err
	}
	var done uint64
	buf := make([]byte, copyBuf)
	for i, name := range names[:len(names)-1] {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr(name, sizes[i])); err != nil {
			return err
		}
		crc, err := copyFile(ctx, tw, st, name, sizes[i], buf, func(n int) {
			done += uint64(n)
			if progress != nil {
				progress(done, total)
			}
		})
		if err != nil {
			return err
		}
		if sum, listed := m.Files[name]; listed && (sum.Size != sizes[i] || sum.CRC32C != fmt.Sprintf("%08x", crc)) {
			return fmt.Errorf("%s: %w: %d bytes crc32c %08x, manifest says %d bytes crc32c %s", path.Join(st.String(), name), image.ErrManifestMismatch, sizes[i], crc, sum.Size, sum.CRC32C)
		}
	}
	if err := tw.WriteHeader(hdr(image.ManifestName, int64(len(raw)))); err != nil {
		return err
	}
	if _, err := tw.Write(raw); err != nil {
		return err
	}
	if progress != nil {
		progress(total, total)
	}
	return tw.Close()
}

// copyFile copies the file name of st, of size bytes, into w and returns
// its CRC32C.
func copyFile(ctx context.Context, w io.Writer, st store.Store, name string, size int64, buf []byte, wrote func(int)) (uint32, error) {
	f, err := st.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var crc uint32
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		n := int(min(int64(len(buf)), size-off))
		got, err := f.ReadAt(buf[:n], off)
		if got < n {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("read %s: %w", path.Join(st.String(), name), err)
		}
		crc = codec.UpdateChecksum(crc, buf[:n])
		if _, err := w.Write(buf[:n]); err != nil {
			return 0, err
		}
		off += int64(n)
		wrote(n)
	}
	return crc, nil
}

// validName reports whether name is a plain file name: what a member of
// an archive may be called in its directory.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00") && len(name) <= 255
}

// member is a file of an archive: where its bytes are in the archive.
type member struct{ off, size int64 }

// archiveStore is an archive opened as a store.Store.
type archiveStore struct {
	f     *os.File
	files map[string]member

	mu     sync.Mutex
	refs   int  // the store and its files open; the descriptor closes at 0
	closed bool // the store's own reference let go
}

// Open indexes the archive f (store.RegisterFileStore: f is a regular
// file, checked): one directory, holding regular files of plain names,
// each once, within the file. The store owns f.
func Open(f *os.File) (store.Store, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("snapshot archive %s: %w: %s", f.Name(), image.ErrCorrupt, fmt.Sprintf(format, args...))
	}
	s := &archiveStore{f: f, files: map[string]member{}, refs: 1}
	tr := tar.NewReader(f) // f seeks: the members' bytes are skipped, not read
	top := ""
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, bad("%v", err)
		}
		if len(s.files) >= maxMembers {
			return nil, bad("more than %d members", maxMembers)
		}
		dir, name, _ := strings.Cut(strings.TrimSuffix(h.Name, "/"), "/")
		if top == "" {
			top = dir
		}
		switch {
		case dir != top || !validName(dir):
			return nil, bad("member %q is not in the directory %q", h.Name, top)
		case h.Typeflag == tar.TypeDir && name == "":
			continue
		case h.Typeflag != tar.TypeReg:
			return nil, bad("member %q is not a regular file (type %q)", h.Name, h.Typeflag)
		case !validName(name):
			return nil, bad("member %q: not a plain file name", h.Name)
		}
		if _, dup := s.files[name]; dup {
			return nil, bad("member %q twice", h.Name)
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		if len(h.PAXRecords) > 0 {
			for k := range h.PAXRecords {
				if strings.HasPrefix(k, "GNU.sparse.") {
					return nil, bad("member %q is a sparse file", h.Name)
				}
			}
		}
		if h.Size < 0 || h.Size > fi.Size()-off {
			return nil, bad("member %q: %d bytes at %d, past the end (%d bytes): a truncated archive", h.Name, h.Size, off, fi.Size())
		}
		s.files[name] = member{off: off, size: h.Size}
	}
	if top == "" {
		return nil, bad("no files")
	}
	return s, nil
}

func (s *archiveStore) String() string { return s.f.Name() }

func (s *archiveStore) Stat(name string) (int64, error) {
	m, ok := s.files[name]
	if !ok {
		return 0, &os.PathError{Op: "stat", Path: s.f.Name() + ":" + name, Err: os.ErrNotExist}
	}
	return m.size, nil
}

func (s *archiveStore) Open(name string) (store.File, error) {
	m, ok := s.files[name]
	if !ok {
		return nil, &os.PathError{Op: "open", Path: s.f.Name() + ":" + name, Err: os.ErrNotExist}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs == 0 {
		return nil, &os.PathError{Op: "open", Path: s.f.Name() + ":" + name, Err: os.ErrClosed}
	}
	s.refs++
	return &file{SectionReader: io.NewSectionReader(s.f, m.off, m.size), s: s}, nil
}

// Close releases the store; its files stay readable until closed. A
// second Close does nothing.
func (s *archiveStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	return s.release()
}

func (s *archiveStore) release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs == 0 {
		return os.ErrClosed
	}
	if s.refs--; s.refs == 0 {
		return s.f.Close()
	}
	return nil
}

// file is a member of an archive, opened.
type file struct {
	*io.SectionReader
	s    *archiveStore
	once sync.Once
}

func (f *file) Close() error {
	var err error
	f.once.Do(func() { err = f.s.release() })
	return err
}
