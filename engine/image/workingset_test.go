package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// wsSnapshot writes a snapshot of process 42 and opens it, closed at
// cleanup.
func wsSnapshot(t *testing.T) (string, *Snapshot) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, 42, layoutRanges(1), Options{})
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return dir, s
}

func testWorkingSet(id SnapshotID, pid int) *WorkingSet {
	return &WorkingSet{PID: pid, Snapshot: id, Span: 1500 * time.Millisecond, Stop: "signal", Entries: []WorkingSetEntry{
		{Addr: 0x7f0000010000, Len: 64 << 10, At: 3 * time.Millisecond},
		{Addr: 0x7f0000000000, Len: 4 << 10, At: 4 * time.Millisecond},
		{Addr: 0x600000, Len: 1 << 20, At: 900 * time.Millisecond},
	}}
}

// withData gives w's entries bytes.
func withData(w *WorkingSet) *WorkingSet {
	for i := range w.Entries {
		e := &w.Entries[i]
		e.Data = make([]byte, e.Len)
		synth("random", e.Data, e.Addr)
	}
	return w
}

func TestWorkingSetData(t *testing.T) {
	w := withData(testWorkingSet(SnapshotID{1, 2}, 3))
	b, err := w.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseWorkingSet(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.HasData() || !reflect.DeepEqual(got, w) {
		t.Fatalf("read back %+v", got.Entries)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"data bit flip", func() []byte { c := append([]byte(nil), b...); c[len(c)-100] ^= 1; return c }(), ErrHeaderChecksum},
		{"data truncated", b[:len(b)-4096], ErrTruncated},
		{"data trailing", append(append([]byte(nil), b...), 0), ErrCorrupt},
	} {
		if _, err := ParseWorkingSet(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	w.Entries[1].Data = nil
	if _, err := w.MarshalBinary(); err == nil {
		t.Error("marshalled a working set with bytes for some entries only")
	}
}

func TestWorkingSetRoundTrip(t *testing.T) {
	dir, s := wsSnapshot(t)
	if _, err := s.WorkingSet(42); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no working set: %v, want ErrNotExist", err)
	}
	w := testWorkingSet(s.ID(), 42)
	if err := WriteWorkingSet(dir, w); err != nil {
		t.Fatal(err)
	}
	got, err := s.WorkingSet(42)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, w) {
		t.Fatalf("read back %+v, wrote %+v", got, w)
	}
	if st, err := os.Stat(filepath.Join(dir, WorkingSetName(42))); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("working set file: %v, mode %v; want 0600 (it may hold memory)", err, st.Mode())
	}
	if got.Bytes() != (64+4+1024)<<10 {
		t.Fatalf("Bytes %d", got.Bytes())
	}
	// Written again: replaced, no temporary file left.
	w.Entries = w.Entries[:1]
	if err := WriteWorkingSet(dir, w); err != nil {
		t.Fatal(err)
	}
	if got, err := s.WorkingSet(42); err != nil || len(got.Entries) != 1 {
		t.Fatalf("rewritten: %v, %v", got, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("temporary file %s left behind", e.Name())
		}
	}
	// The snapshot itself is unchanged by it.
	if _, err := Open(dir); err != nil {
		t.Fatalf("snapshot with a working set: %v", err)
	}
}

func TestWorkingSetRefused(t *testing.T) {
	dir, s := wsSnapshot(t)
	good, err := testWorkingSet(s.ID(), 42).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := testWorkingSet(SnapshotID{CRC32C: s.ID().CRC32C ^ 1, Size: s.ID().Size}, 42).MarshalBinary()
	otherPID, _ := testWorkingSet(s.ID(), 43).MarshalBinary()
	flip := func(i int) []byte {
		b := append([]byte(nil), good...)
		b[i] ^= 0x10
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"truncated header", good[:40], ErrTruncated},
		{"truncated entries", good[:len(good)-5], ErrTruncated},
		{"trailing bytes", append(append([]byte(nil), good...), 0), ErrCorrupt},
		{"bad magic", flip(0), ErrBadMagic},
		{"header bit flip", flip(20), ErrHeaderChecksum},
		{"entry bit flip", flip(wsHeaderSize + 3), ErrHeaderChecksum},
		{"foreign snapshot", foreign, ErrForeignWorkingSet},
		{"other process", otherPID, ErrForeignWorkingSet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, WorkingSetName(42))
			if err := os.WriteFile(path, tc.b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := s.WorkingSet(42)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}
}

func TestWorkingSetMarshalRefuses(t *testing.T) {
	for _, w := range []*WorkingSet{
		{Entries: []WorkingSetEntry{{Addr: 0x1001, Len: 4096}}},
		{Entries: []WorkingSetEntry{{Addr: 0x1000, Len: 0}}},
		{Entries: []WorkingSetEntry{{Addr: ^uint64(0) &^ 4095, Len: 8192}}},
		{Stop: "a reason far too long"},
	} {
		if _, err := w.MarshalBinary(); err == nil {
			t.Errorf("%+v marshalled", w)
		}
	}
}

func FuzzWorkingSet(f *testing.F) {
	b, _ := testWorkingSet(SnapshotID{1, 2}, 3).MarshalBinary()
	f.Add(b)
	f.Add(b[:64])
	w := testWorkingSet(SnapshotID{1, 2}, 3)
	w.Entries = w.Entries[1:2]
	b, _ = withData(w).MarshalBinary()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := ParseWorkingSet(b)
		if err != nil {
			return
		}
		again, err := w.MarshalBinary()
		if err != nil {
			t.Fatalf("parsed but does not marshal: %v", err)
		}
		if _, err := ParseWorkingSet(again); err != nil {
			t.Fatalf("re-marshalled does not parse: %v", err)
		}
	})
}

// TestMapWorkingSet: a mapped working set reads as the file; a file
// truncated under its mapping fails ReadData rather than crash the
// reader; Close unmaps, once.
func TestMapWorkingSet(t *testing.T) {
	dir, s := wsSnapshot(t)
	w := withData(testWorkingSet(s.ID(), 42))
	if err := WriteWorkingSet(dir, w); err != nil {
		t.Fatal(err)
	}
	got, err := s.MapWorkingSet(42)
	if err != nil {
		t.Fatal(err)
	}
	mapped := *got
	mapped.unmap = nil
	if !reflect.DeepEqual(&mapped, w) {
		t.Fatalf("mapped %+v, wrote %+v", mapped.Entries, w.Entries)
	}
	last := got.Entries[len(got.Entries)-1]
	p := make([]byte, 4096)
	if n, err := ReadData(p, last, last.Len-4096); err != nil || n != 4096 || !bytes.Equal(p, w.Entries[len(w.Entries)-1].Data[last.Len-4096:]) {
		t.Fatalf("ReadData of the last page: %d, %v", n, err)
	}
	// Truncated in place (snapctl renames a new file over the old one;
	// someone else may not): the last entry's bytes are gone.
	if err := os.Truncate(filepath.Join(dir, WorkingSetName(42)), 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadData(p, last, last.Len-4096); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadData past the end of a truncated file: %v, want ErrCorrupt", err)
	}
	if err := got.Close(); err != nil {
		t.Fatal(err)
	}
	if err := got.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// A file truncated before it is mapped is refused as any damaged one.
	if _, err := s.MapWorkingSet(42); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated working set mapped: %v", err)
	}
}
