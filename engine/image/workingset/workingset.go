package workingset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
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
	// MaxData bounds the bytes a working set carries.
	MaxData     = 1 << 30
	wsReasonLen = 12
	wsFlagData  = 1
)

// ErrForeign: a working set was recorded on another snapshot
// (or another process of it). It is not corruption.
var ErrForeign = errors.New("working set recorded on another snapshot")

// Name returns the file name of the working set of process pid.
func Name(pid int) string { return fmt.Sprintf("workingset-%d.img", pid) }

// Entry is one range the process touched.
type Entry struct {
	Addr, Len uint64
	At        time.Duration // since the process started running
	// Data is the memory there (Len bytes), or nil. Either every entry
	// of a working set has its bytes, or none has.
	Data []byte
}

// End returns Addr+Len.
func (e Entry) End() uint64 { return e.Addr + e.Len }

// Set is a recorded working set.
type Set struct {
	PID      int
	Snapshot image.SnapshotID
	// Span is how long the recording ran; Stop says why it stopped
	// ("duration", "faults", "signal", "done": at most 12 ASCII bytes).
	Span    time.Duration
	Stop    string
	Entries []Entry

	unmap func() error // Map's
	// sums are the CRC32C of each entry's Data as the file holds them,
	// for CheckData: set by Map, which leaves the bytes unchecked.
	sums []uint32
}

// CheckData checks the bytes of entry i of a working set that Map
// returned against the CRC32C its file holds for them, an error
// matching image.ErrHeaderChecksum naming the entry if they differ, or
// image.ErrCorrupt if the file shrank under the mapping. A working set
// read whole (Read, Parse) was checked as it was read: nil.
func (w *Set) CheckData(i int) error {
	if w.sums == nil {
		return nil
	}
	e := w.Entries[i]
	var err error
	if ferr := unlessFault(func() { err = checkEntry(i, e, w.sums[i]) }); ferr != nil {
		return fmt.Errorf("%w: working set entry at %#x: its file changed while mapped (%v)", image.ErrCorrupt, e.Addr, ferr)
	}
	return err
}

// checkEntry checks entry i's bytes against sum, the CRC32C its file
// holds for them.
func checkEntry(i int, e Entry, sum uint32) error {
	if got := codec.Checksum(e.Data); got != sum {
		return fmt.Errorf("%w: bytes of entry %d at %#x: crc32c %08x, entry says %08x", image.ErrHeaderChecksum, i, e.Addr, got, sum)
	}
	return nil
}

// Close releases what Map mapped: the entries' Data must not
// be used after. It does nothing for a working set read into memory, and
// may be called more than once.
func (w *Set) Close() error {
	if w == nil || w.unmap == nil {
		return nil
	}
	f := w.unmap
	w.unmap = nil
	return f()
}

// HasData reports whether the entries carry their bytes.
func (w *Set) HasData() bool { return len(w.Entries) > 0 && w.Entries[0].Data != nil }

// Bytes returns the bytes of memory the entries cover.
func (w *Set) Bytes() uint64 {
	var n uint64
	for _, e := range w.Entries {
		n += e.Len
	}
	return n
}

// MarshalBinary encodes w in the file format.
func (w *Set) MarshalBinary() ([]byte, error) {
	if len(w.Entries) > maxWSEntries {
		return nil, fmt.Errorf("working set: %d entries, at most %d", len(w.Entries), maxWSEntries)
	}
	if len(w.Stop) > wsReasonLen {
		return nil, fmt.Errorf("working set: stop reason %q longer than %d bytes", w.Stop, wsReasonLen)
	}
	withData := len(w.Entries) > 0 && w.Entries[0].Data != nil
	var data uint64
	for _, e := range w.Entries {
		if e.Len == 0 || e.Addr%image.PageSize != 0 || e.Len%image.PageSize != 0 || e.End() < e.Addr {
			return nil, fmt.Errorf("working set: entry %#x+%#x is not a page-aligned range", e.Addr, e.Len)
		}
		if (e.Data != nil) != withData || (withData && uint64(len(e.Data)) != e.Len) {
			return nil, fmt.Errorf("working set: entry %#x+%#x holds %d bytes: every entry must hold its bytes, or none", e.Addr, e.Len, len(e.Data))
		}
		if withData {
			data += e.Len
		}
	}
	if data > MaxData {
		return nil, fmt.Errorf("working set: %d bytes of data, at most %d", data, MaxData)
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

// Parse decodes a working-set file. It checks the magic, the
// version, both checksums, the length against the entry count, and every
// entry; the identity is for the caller to compare (Read does).
func Parse(b []byte) (*Set, error) { return parse(b, true) }

// parse is Parse; with checkData false it leaves every entry's bytes
// unchecked and keeps their CRC32C for CheckData.
func parse(b []byte, checkData bool) (*Set, error) {
	if len(b) < wsHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, header is %d", image.ErrTruncated, len(b), wsHeaderSize)
	}
	h := b[:wsHeaderSize]
	if string(h[:8]) != wsMagic {
		return nil, image.ErrBadMagic
	}
	le := binary.LittleEndian
	if got := le.Uint32(h[60:]); got != codec.Checksum(h[:60]) {
		return nil, fmt.Errorf("%w: header", image.ErrHeaderChecksum)
	}
	if v := le.Uint16(h[8:]); v != wsVersion {
		return nil, fmt.Errorf("%w: working set version %d, this build reads %d", image.ErrVersion, v, wsVersion)
	}
	if hs := le.Uint16(h[10:]); hs != wsHeaderSize {
		return nil, fmt.Errorf("%w: header size %d", image.ErrCorrupt, hs)
	}
	n := le.Uint64(h[24:])
	if n > maxWSEntries {
		return nil, fmt.Errorf("%w: %d entries, at most %d", image.ErrCorrupt, n, maxWSEntries)
	}
	flags := le.Uint32(h[56:])
	if flags&^wsFlagData != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", image.ErrCorrupt, flags)
	}
	tableEnd := wsHeaderSize + wsEntrySize*n
	if uint64(len(b)) < tableEnd {
		return nil, fmt.Errorf("%w: %d bytes, %d entries need %d", image.ErrTruncated, len(b), n, tableEnd)
	}
	if got := codec.Checksum(b[wsHeaderSize:tableEnd]); got != le.Uint32(h[52:]) {
		return nil, fmt.Errorf("%w: entries", image.ErrHeaderChecksum)
	}
	reason := h[40 : 40+wsReasonLen]
	for i, c := range reason {
		if c == 0 {
			reason = reason[:i]
			break
		}
		if c < 0x20 || c > 0x7e {
			return nil, fmt.Errorf("%w: stop reason is not printable ASCII", image.ErrCorrupt)
		}
	}
	w := &Set{
		PID:      int(le.Uint32(h[12:])),
		Snapshot: image.SnapshotID{CRC32C: le.Uint32(h[16:]), Size: le.Uint32(h[20:])},
		Span:     time.Duration(min(le.Uint64(h[32:]), 1<<62)),
		Stop:     string(reason),
		Entries:  make([]Entry, 0, n), // bounded by len(b) above
	}
	withData := flags&wsFlagData != 0
	off := tableEnd // of the next entry's bytes
	for i := range n {
		e := b[wsHeaderSize+wsEntrySize*i:]
		en := Entry{Addr: le.Uint64(e), Len: le.Uint64(e[8:]), At: time.Duration(min(le.Uint64(e[16:]), 1<<62))}
		if en.Len == 0 || en.Addr%image.PageSize != 0 || en.Len%image.PageSize != 0 || en.End() < en.Addr {
			return nil, fmt.Errorf("%w: entry %d %#x+%#x is not a page-aligned range", image.ErrCorrupt, i, en.Addr, en.Len)
		}
		sum := le.Uint32(e[24:])
		if withData {
			if en.Len > uint64(len(b))-off {
				return nil, fmt.Errorf("%w: entry %d's bytes end past the file (%d bytes)", image.ErrTruncated, i, len(b))
			}
			en.Data = b[off : off+en.Len : off+en.Len]
			off += en.Len
			if !checkData {
				w.sums = append(w.sums, sum)
			} else if err := checkEntry(int(i), en, sum); err != nil {
				return nil, err
			}
		} else if sum != 0 || le.Uint32(e[28:]) != 0 {
			return nil, fmt.Errorf("%w: entry %d has a checksum but no bytes", image.ErrCorrupt, i)
		}
		w.Entries = append(w.Entries, en)
	}
	if uint64(len(b)) != off {
		return nil, fmt.Errorf("%w: %d bytes after the working set", image.ErrCorrupt, uint64(len(b))-off)
	}
	return w, nil
}

// ReadData copies e.Data[off:] into p like copy, but returns an error
// rather than crash if the mapping behind it faults (Map).
func ReadData(p []byte, e Entry, off uint64) (int, error) {
	n := 0
	if err := unlessFault(func() { n = copy(p, e.Data[off:]) }); err != nil {
		return 0, fmt.Errorf("%w: working set entry at %#x: its file changed while mapped (%v)", image.ErrCorrupt, e.Addr, err)
	}
	return n, nil
}

// parseMapped is parse on bytes that may be a mapping of a file that
// shrinks while it is read: a fault is an error.
func parseMapped(b []byte, checkData bool) (w *Set, err error) {
	if ferr := unlessFault(func() { w, err = parse(b, checkData) }); ferr != nil {
		return nil, fmt.Errorf("%w: the file changed while read (%v)", image.ErrCorrupt, ferr)
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
