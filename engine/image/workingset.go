package image

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image/store"
)

// A working set is the memory a lazily restored process touched first, in
// the order it touched it: what a later lazy restore of the same snapshot
// fetches before anything else. It lives beside the snapshot, outside the
// manifest (a snapshot is complete and verifiable with or without it),
// and is only advice: it holds addresses, never bytes, so a damaged or
// foreign one costs speed, never correctness.
//
// # File (workingset-PID.img)
//
//	offset size  field
//	     0    8  magic "LZFSWSET"
//	     8    2  version (1)
//	    10    2  header size (64)
//	    12    4  pid (the snapshot's process)
//	    16    4  snapshot identity: CRC32C of snapshot.json
//	    20    4  snapshot identity: length of snapshot.json
//	    24    8  entry count N
//	    32    8  recorded span in nanoseconds
//	    40   12  stop reason, ASCII, zero padded
//	    52    4  CRC32C of the entries
//	    56    4  flags: bit 0, the entries' bytes follow them
//	    60    4  CRC32C of bytes 0..59
//	    64 32*N  entries: address u64 | length u64 | time u64 (ns since
//	             the process started running) | CRC32C u32 of its bytes
//	             (0 without) | reserved u32 (0)
//	     .    .  with flag 0: each entry's bytes (the process's memory
//	             there, as in the snapshot), back to back, in entry order
//
// Entries are snapshot addresses and lengths, page aligned, in the order
// the process first touched them. The bytes, if there, are the working
// set's memory laid out contiguously, so that one sequential read brings
// it all; each entry's are checked against its CRC32C before use, as a
// block's are.
const (
	wsMagic      = "LZFSWSET"
	wsVersion    = 1
	wsHeaderSize = 64
	wsEntrySize  = 32
	// maxWSEntries bounds a working set: a page each, 64 GiB of memory.
	maxWSEntries = 1 << 24
	// MaxWorkingSetData bounds the bytes a working set carries.
	MaxWorkingSetData = 1 << 30
	wsReasonLen       = 12
	wsFlagData        = 1
)

// ErrForeignWorkingSet: a working set was recorded on another snapshot
// (or another process of it). It is not corruption.
var ErrForeignWorkingSet = errors.New("working set recorded on another snapshot")

// WorkingSetName returns the file name of the working set of process pid.
func WorkingSetName(pid int) string { return fmt.Sprintf("workingset-%d.img", pid) }

// SnapshotID identifies a snapshot: the checksum and length of its
// manifest, which names every file of it with their checksums.
type SnapshotID struct {
	CRC32C uint32
	Size   uint32
}

func (id SnapshotID) String() string { return fmt.Sprintf("%08x/%d", id.CRC32C, id.Size) }

// ID returns the snapshot's identity.
func (s *Snapshot) ID() SnapshotID { return IDOf(s.manifest) }

// IDOf returns the identity of the snapshot whose snapshot.json is
// manifest.
func IDOf(manifest []byte) SnapshotID {
	return SnapshotID{CRC32C: codec.Checksum(manifest), Size: uint32(len(manifest))}
}

// WorkingSetEntry is one range the process touched.
type WorkingSetEntry struct {
	Addr, Len uint64
	At        time.Duration // since the process started running
	// Data is the memory there (Len bytes), or nil. Either every entry
	// of a working set has its bytes, or none has.
	Data []byte
}

// End returns Addr+Len.
func (e WorkingSetEntry) End() uint64 { return e.Addr + e.Len }

// WorkingSet is a recorded working set.
type WorkingSet struct {
	PID      int
	Snapshot SnapshotID
	// Span is how long the recording ran; Stop says why it stopped
	// ("duration", "faults", "signal", "done": at most 12 ASCII bytes).
	Span    time.Duration
	Stop    string
	Entries []WorkingSetEntry

	unmap func() error // MapWorkingSet's
}

// Close releases what MapWorkingSet mapped: the entries' Data must not
// be used after. It does nothing for a working set read into memory, and
// may be called more than once.
func (w *WorkingSet) Close() error {
	if w == nil || w.unmap == nil {
		return nil
	}
	f := w.unmap
	w.unmap = nil
	return f()
}

// HasData reports whether the entries carry their bytes.
func (w *WorkingSet) HasData() bool { return len(w.Entries) > 0 && w.Entries[0].Data != nil }

// Bytes returns the bytes of memory the entries cover.
func (w *WorkingSet) Bytes() uint64 {
	var n uint64
	for _, e := range w.Entries {
		n += e.Len
	}
	return n
}

// MarshalBinary encodes w in the file format.
func (w *WorkingSet) MarshalBinary() ([]byte, error) {
	if len(w.Entries) > maxWSEntries {
		return nil, fmt.Errorf("working set: %d entries, at most %d", len(w.Entries), maxWSEntries)
	}
	if len(w.Stop) > wsReasonLen {
		return nil, fmt.Errorf("working set: stop reason %q longer than %d bytes", w.Stop, wsReasonLen)
	}
	withData := len(w.Entries) > 0 && w.Entries[0].Data != nil
	var data uint64
	for _, e := range w.Entries {
		if e.Len == 0 || e.Addr%pageSize != 0 || e.Len%pageSize != 0 || e.End() < e.Addr {
			return nil, fmt.Errorf("working set: entry %#x+%#x is not a page-aligned range", e.Addr, e.Len)
		}
		if (e.Data != nil) != withData || (withData && uint64(len(e.Data)) != e.Len) {
			return nil, fmt.Errorf("working set: entry %#x+%#x holds %d bytes: every entry must hold its bytes, or none", e.Addr, e.Len, len(e.Data))
		}
		if withData {
			data += e.Len
		}
	}
	if data > MaxWorkingSetData {
		return nil, fmt.Errorf("working set: %d bytes of data, at most %d", data, MaxWorkingSetData)
	}
	b := make([]byte, wsHeaderSize, wsHeaderSize+wsEntrySize*uint64(len(w.Entries))+data)
	for _, e := range w.Entries {
		b = binary.LittleEndian.AppendUint64(b, e.Addr)
		b = binary.LittleEndian.AppendUint64(b, e.Len)
		b = binary.LittleEndian.AppendUint64(b, uint64(max(e.At, 0)))
		var sum uint32
		if withData {
			sum = codec.Checksum(e.Data)
		}
		b = binary.LittleEndian.AppendUint32(b, sum)
		b = binary.LittleEndian.AppendUint32(b, 0)
	}
	tableEnd := len(b)
	for _, e := range w.Entries {
		b = append(b, e.Data...)
	}
	h := b[:wsHeaderSize]
	copy(h, wsMagic)
	le := binary.LittleEndian
	le.PutUint16(h[8:], wsVersion)
	le.PutUint16(h[10:], wsHeaderSize)
	le.PutUint32(h[12:], uint32(w.PID))
	le.PutUint32(h[16:], w.Snapshot.CRC32C)
	le.PutUint32(h[20:], w.Snapshot.Size)
	le.PutUint64(h[24:], uint64(len(w.Entries)))
	le.PutUint64(h[32:], uint64(max(w.Span, 0)))
	copy(h[40:40+wsReasonLen], w.Stop)
	le.PutUint32(h[52:], codec.Checksum(b[wsHeaderSize:tableEnd]))
	if withData {
		le.PutUint32(h[56:], wsFlagData)
	}
	le.PutUint32(h[60:], codec.Checksum(h[:60]))
	return b, nil
}

// pageSize is the only page size of the format.
const pageSize = 4096

// ParseWorkingSet decodes a working-set file. It checks the magic, the
// version, both checksums, the length against the entry count, and every
// entry; the identity is for the caller to compare (CheckWorkingSet).
func ParseWorkingSet(b []byte) (*WorkingSet, error) {
	if len(b) < wsHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, header is %d", ErrTruncated, len(b), wsHeaderSize)
	}
	h := b[:wsHeaderSize]
	if string(h[:8]) != wsMagic {
		return nil, ErrBadMagic
	}
	le := binary.LittleEndian
	if got := le.Uint32(h[60:]); got != codec.Checksum(h[:60]) {
		return nil, fmt.Errorf("%w: header", ErrHeaderChecksum)
	}
	if v := le.Uint16(h[8:]); v != wsVersion {
		return nil, fmt.Errorf("%w: working set version %d, this build reads %d", ErrVersion, v, wsVersion)
	}
	if hs := le.Uint16(h[10:]); hs != wsHeaderSize {
		return nil, fmt.Errorf("%w: header size %d", ErrCorrupt, hs)
	}
	n := le.Uint64(h[24:])
	if n > maxWSEntries {
		return nil, fmt.Errorf("%w: %d entries, at most %d", ErrCorrupt, n, maxWSEntries)
	}
	flags := le.Uint32(h[56:])
	if flags&^wsFlagData != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	tableEnd := wsHeaderSize + wsEntrySize*n
	if uint64(len(b)) < tableEnd {
		return nil, fmt.Errorf("%w: %d bytes, %d entries need %d", ErrTruncated, len(b), n, tableEnd)
	}
	if got := codec.Checksum(b[wsHeaderSize:tableEnd]); got != le.Uint32(h[52:]) {
		return nil, fmt.Errorf("%w: entries", ErrHeaderChecksum)
	}
	reason := h[40 : 40+wsReasonLen]
	for i, c := range reason {
		if c == 0 {
			reason = reason[:i]
			break
		}
		if c < 0x20 || c > 0x7e {
			return nil, fmt.Errorf("%w: stop reason is not printable ASCII", ErrCorrupt)
		}
	}
	w := &WorkingSet{
		PID:      int(le.Uint32(h[12:])),
		Snapshot: SnapshotID{CRC32C: le.Uint32(h[16:]), Size: le.Uint32(h[20:])},
		Span:     time.Duration(min(le.Uint64(h[32:]), 1<<62)),
		Stop:     string(reason),
		Entries:  make([]WorkingSetEntry, 0, n), // bounded by len(b) above
	}
	withData := flags&wsFlagData != 0
	off := tableEnd // of the next entry's bytes
	for i := range n {
		e := b[wsHeaderSize+wsEntrySize*i:]
		en := WorkingSetEntry{Addr: le.Uint64(e), Len: le.Uint64(e[8:]), At: time.Duration(min(le.Uint64(e[16:]), 1<<62))}
		if en.Len == 0 || en.Addr%pageSize != 0 || en.Len%pageSize != 0 || en.End() < en.Addr {
			return nil, fmt.Errorf("%w: entry %d %#x+%#x is not a page-aligned range", ErrCorrupt, i, en.Addr, en.Len)
		}
		sum := le.Uint32(e[24:])
		if withData {
			if en.Len > uint64(len(b))-off {
				return nil, fmt.Errorf("%w: entry %d's bytes end past the file (%d bytes)", ErrTruncated, i, len(b))
			}
			en.Data = b[off : off+en.Len : off+en.Len]
			off += en.Len
			if got := codec.Checksum(en.Data); got != sum {
				return nil, fmt.Errorf("%w: bytes of entry %d at %#x: crc32c %08x, entry says %08x", ErrHeaderChecksum, i, en.Addr, got, sum)
			}
		} else if sum != 0 || le.Uint32(e[28:]) != 0 {
			return nil, fmt.Errorf("%w: entry %d has a checksum but no bytes", ErrCorrupt, i)
		}
		w.Entries = append(w.Entries, en)
	}
	if uint64(len(b)) != off {
		return nil, fmt.Errorf("%w: %d bytes after the working set", ErrCorrupt, uint64(len(b))-off)
	}
	return w, nil
}

// WorkingSet reads the working set of process pid beside the snapshot.
// Absent, it returns an error matching os.ErrNotExist; recorded on another
// snapshot or process, ErrForeignWorkingSet; damaged, ErrCorrupt. Every
// error names the file. Without OpenOptions.Trust, a file that another
// user can change is refused (ErrUntrusted), as the snapshot's own are.
func (s *Snapshot) WorkingSet(pid int) (*WorkingSet, error) {
	d, err := s.workingSetDir(pid)
	if err != nil {
		return nil, err
	}
	return readWorkingSet(d, pid, s.ID(), s.trust, false)
}

// MapWorkingSet is WorkingSet, the file mapped rather than read: its
// entries' Data are the page cache's pages, valid until Close. A restore
// that starts reads its working set so: tens of MiB read into memory a
// new process has never touched cost it a first touch of every page,
// slow where the hypervisor reclaims free memory, while the pages of a
// file read before are there to map. Whoever reads Data must expect the
// file to shrink under it (another writer truncating it in place, which
// snapctl never does: it renames a new file over the old): a read past
// its end faults, and ReadData turns that into an error.
func (s *Snapshot) MapWorkingSet(pid int) (*WorkingSet, error) {
	d, err := s.workingSetDir(pid)
	if err != nil {
		return nil, err
	}
	return readWorkingSet(d, pid, s.ID(), s.trust, true)
}

// ReadData copies e.Data[off:] into p like copy, but returns an error
// rather than crash if the mapping behind it faults (MapWorkingSet).
func ReadData(p []byte, e WorkingSetEntry, off uint64) (int, error) {
	n := 0
	if err := unlessFault(func() { n = copy(p, e.Data[off:]) }); err != nil {
		return 0, fmt.Errorf("%w: working set entry at %#x: its file changed while mapped (%v)", ErrCorrupt, e.Addr, err)
	}
	return n, nil
}

// LocalDirStore is a store.Store that keeps the files written beside a
// snapshot after its dump (working sets) in a local directory of its own:
// a snapshot directory is its own, an object store's is in its cache
// directory.
type LocalDirStore interface {
	store.Store
	// LocalDir returns that directory, the Store's to close; an error
	// matching ErrUnsupported if the store has none.
	LocalDir() (*os.File, error)
}

// localDir returns the directory where the working sets of the snapshot
// are: the snapshot's own directory, or its store's local directory
// (LocalDirStore); ErrUnsupported for a store that has none.
func (s *Snapshot) localDir() (*os.File, error) {
	if st, ok := s.store.(LocalDirStore); ok {
		return st.LocalDir()
	}
	return nil, fmt.Errorf("%s: %w: working sets are kept beside snapshots in directories only", s.Dir, ErrUnsupported)
}

// workingSetDir is localDir for reading the working set of pid: a store
// without a local directory that holds no such file (an archive without
// one) says it does not exist, not that it is unsupported.
func (s *Snapshot) workingSetDir(pid int) (*os.File, error) {
	d, err := s.localDir()
	if errors.Is(err, ErrUnsupported) && !store.IsRemote(s.Dir) {
		if _, serr := s.store.Stat(WorkingSetName(pid)); errors.Is(serr, os.ErrNotExist) {
			return nil, serr
		}
	}
	return d, err
}

// WorkingSetDir returns the directory where the working sets of the
// snapshot are read and written, or an error matching ErrUnsupported that
// says why it has none.
func (s *Snapshot) WorkingSetDir() (string, error) {
	d, err := s.localDir()
	if err != nil {
		return "", err
	}
	return d.Name(), nil
}

// ReadWorkingSet reads the working set of process pid in the snapshot
// directory dir, checking it against the snapshot's identity id (taken
// when the snapshot was opened: Snapshot.ID), with the checks of
// Snapshot.WorkingSet. For a reader that keeps no snapshot open (a mount).
func ReadWorkingSet(dir string, pid int, id SnapshotID, trust bool) (*WorkingSet, error) {
	d, err := store.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return readWorkingSet(d, pid, id, trust, false)
}

func readWorkingSet(d *os.File, pid int, id SnapshotID, trust, mapped bool) (*WorkingSet, error) {
	name := WorkingSetName(pid)
	path := filepath.Join(d.Name(), name)
	f, err := store.OpenAt(d, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w: not a regular file", path, ErrCorrupt)
	}
	if !trust {
		if err := store.Trusted(f, path); err != nil {
			return nil, err
		}
	}
	if st.Size() > wsHeaderSize+wsEntrySize*maxWSEntries+MaxWorkingSetData {
		return nil, fmt.Errorf("%s: %w: %d bytes", path, ErrCorrupt, st.Size())
	}
	var b []byte
	unmap := func() error { return nil }
	if mapped && st.Size() > 0 {
		if b, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			return nil, fmt.Errorf("map %s: %w", path, err)
		}
		unmap = func() error { return unix.Munmap(b) }
	} else {
		b = make([]byte, st.Size())
		if _, err := io.ReadFull(f, b); err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
	w, err := parseMapped(b)
	if err == nil {
		err = checkWorkingSet(w, pid, id)
	}
	if err != nil {
		unmap()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if mapped {
		w.unmap = unmap
	}
	return w, nil
}

// parseMapped is ParseWorkingSet on bytes that may be a mapping of a file
// that shrinks while it is read: a fault is an error.
func parseMapped(b []byte) (w *WorkingSet, err error) {
	if ferr := unlessFault(func() { w, err = ParseWorkingSet(b) }); ferr != nil {
		return nil, fmt.Errorf("%w: the file changed while read (%v)", ErrCorrupt, ferr)
	}
	return w, err
}

// unlessFault runs f and returns the memory fault that stopped it (a
// mapped file read past its end), if any, as an error; any other panic
// goes on.
func unlessFault(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			fault, ok := r.(interface {
				error
				Addr() uintptr
			})
			if !ok {
				panic(r)
			}
			err = fault
		}
	}()
	f()
	return nil
}

// checkWorkingSet checks that w was recorded on process pid of the
// snapshot id.
func checkWorkingSet(w *WorkingSet, pid int, id SnapshotID) error {
	if w.Snapshot != id {
		return fmt.Errorf("%w: recorded on snapshot %v, this one is %v", ErrForeignWorkingSet, w.Snapshot, id)
	}
	if w.PID != pid {
		return fmt.Errorf("%w: recorded for process %d, not %d", ErrForeignWorkingSet, w.PID, pid)
	}
	return nil
}

// WriteWorkingSet writes w beside the snapshot, through its directory
// (never following a link), atomically: a temporary file of a new name,
// synced, checked by reading it back, then renamed over the old one. A
// writer killed at any point leaves the old file (or none) and at most a
// temporary file, never a partial working set. The file is mode 0600,
// like the snapshot's: it holds process memory.
func (s *Snapshot) WriteWorkingSet(w *WorkingSet) error {
	d, err := s.localDir()
	if err != nil {
		return err
	}
	return writeWorkingSet(d, w)
}

// WriteWorkingSet writes w into the snapshot directory dir, as
// Snapshot.WriteWorkingSet does.
func WriteWorkingSet(dir string, w *WorkingSet) error {
	d, err := store.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("write working set: %w", err)
	}
	defer d.Close()
	return writeWorkingSet(d, w)
}

func writeWorkingSet(d *os.File, w *WorkingSet) error {
	b, err := w.MarshalBinary()
	if err != nil {
		return err
	}
	name := WorkingSetName(w.PID)
	path := filepath.Join(d.Name(), name)
	dfd := int(d.Fd())
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("write working set %s: %w", path, err)
	}
	tmp := fmt.Sprintf(".%s.%x.tmp", name, rnd)
	fd, err := unix.Openat(dfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write working set %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.Name(), tmp))
	err = func() error {
		if _, err := f.Write(b); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		back := make([]byte, len(b)+1)
		n, err := f.ReadAt(back, 0)
		if err != nil && err != io.EOF {
			return err
		}
		if _, err := ParseWorkingSet(back[:n]); err != nil {
			return fmt.Errorf("reading it back: %w", err)
		}
		return nil
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write working set %s: %w", path, err)
	}
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("write working set %s: sync the directory: %w", path, err)
	}
	return nil
}
