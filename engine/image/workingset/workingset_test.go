package workingset

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
)

// wsSnapshot writes a snapshot of process 42 and opens it, closed at
// cleanup.
func wsSnapshot(t *testing.T) (string, *image.Snapshot) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snap")
	w, err := image.Create(dir, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pw, err := w.Pages(context.Background(), 42)
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 256<<10)
	synth(mem, 1)
	if err := pw.Add(0x400000, uint64(len(mem)), func(dst []byte, a uint64) error {
		copy(dst, mem[a-0x400000:])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteState(&image.Process{PID: 42, Comm: "synth", Threads: []image.Thread{{TID: 42}}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return dir, s
}

// synth fills b with bytes that seed determines.
func synth(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func testWorkingSet(id image.SnapshotID, pid int) *Set {
	return &Set{PID: pid, Snapshot: id, Span: 1500 * time.Millisecond, Stop: "signal", Entries: []Entry{
		{Addr: 0x7f0000010000, Len: 64 << 10, At: 3 * time.Millisecond},
		{Addr: 0x7f0000000000, Len: 4 << 10, At: 4 * time.Millisecond},
		{Addr: 0x600000, Len: 1 << 20, At: 900 * time.Millisecond},
	}}
}

// withData gives w's entries bytes.
func withData(w *Set) *Set {
	for i := range w.Entries {
		e := &w.Entries[i]
		e.Data = make([]byte, e.Len)
		synth(e.Data, e.Addr)
	}
	return w
}

func TestWorkingSetData(t *testing.T) {
	w := withData(testWorkingSet(image.SnapshotID{CRC32C: 1, Size: 2}, 3))
	b, err := w.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
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
		{"data bit flip", func() []byte { c := append([]byte(nil), b...); c[len(c)-100] ^= 1; return c }(), image.ErrHeaderChecksum},
		{"data truncated", b[:len(b)-4096], image.ErrTruncated},
		{"data trailing", append(append([]byte(nil), b...), 0), image.ErrCorrupt},
	} {
		if _, err := Parse(tc.b); !errors.Is(err, tc.want) {
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
	if _, err := Read(s, 42); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no working set: %v, want ErrNotExist", err)
	}
	w := testWorkingSet(s.ID(), 42)
	if err := WriteDir(dir, w); err != nil {
		t.Fatal(err)
	}
	got, err := Read(s, 42)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, w) {
		t.Fatalf("read back %+v, wrote %+v", got, w)
	}
	if st, err := os.Stat(filepath.Join(dir, Name(42))); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("working set file: %v, mode %v; want 0600 (it may hold memory)", err, st.Mode())
	}
	if got.Bytes() != (64+4+1024)<<10 {
		t.Fatalf("Bytes %d", got.Bytes())
	}
	// Written again: replaced, no temporary file left.
	w.Entries = w.Entries[:1]
	if err := WriteDir(dir, w); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(s, 42); err != nil || len(got.Entries) != 1 {
		t.Fatalf("rewritten: %v, %v", got, err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("temporary file %s left behind", e.Name())
		}
	}
	// The snapshot itself is unchanged by it.
	if _, err := image.Open(dir); err != nil {
		t.Fatalf("snapshot with a working set: %v", err)
	}
}

func TestWorkingSetRefused(t *testing.T) {
	dir, s := wsSnapshot(t)
	good, err := testWorkingSet(s.ID(), 42).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := testWorkingSet(image.SnapshotID{CRC32C: s.ID().CRC32C ^ 1, Size: s.ID().Size}, 42).MarshalBinary()
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
		{"empty", nil, image.ErrTruncated},
		{"truncated header", good[:40], image.ErrTruncated},
		{"truncated entries", good[:len(good)-5], image.ErrTruncated},
		{"trailing bytes", append(append([]byte(nil), good...), 0), image.ErrCorrupt},
		{"bad magic", flip(0), image.ErrBadMagic},
		{"header bit flip", flip(20), image.ErrHeaderChecksum},
		{"entry bit flip", flip(wsHeaderSize + 3), image.ErrHeaderChecksum},
		{"foreign snapshot", foreign, ErrForeign},
		{"other process", otherPID, ErrForeign},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, Name(42))
			if err := os.WriteFile(path, tc.b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Read(s, 42)
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
	for _, w := range []*Set{
		{Entries: []Entry{{Addr: 0x1001, Len: 4096}}},
		{Entries: []Entry{{Addr: 0x1000, Len: 0}}},
		{Entries: []Entry{{Addr: ^uint64(0) &^ 4095, Len: 8192}}},
		{Stop: "a reason far too long"},
	} {
		if _, err := w.MarshalBinary(); err == nil {
			t.Errorf("%+v marshalled", w)
		}
	}
}

func FuzzWorkingSet(f *testing.F) {
	b, _ := testWorkingSet(image.SnapshotID{CRC32C: 1, Size: 2}, 3).MarshalBinary()
	f.Add(b)
	f.Add(b[:64])
	w := testWorkingSet(image.SnapshotID{CRC32C: 1, Size: 2}, 3)
	w.Entries = w.Entries[1:2]
	b, _ = withData(w).MarshalBinary()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := Parse(b)
		if err != nil {
			return
		}
		again, err := w.MarshalBinary()
		if err != nil {
			t.Fatalf("parsed but does not marshal: %v", err)
		}
		if _, err := Parse(again); err != nil {
			t.Fatalf("re-marshalled does not parse: %v", err)
		}
	})
}

// TestMapChecksEntriesOnDemand: Map leaves the entries' bytes to
// CheckData, which finds the one entry whose bytes were changed and
// passes the others; Read refuses the same file whole.
func TestMapChecksEntriesOnDemand(t *testing.T) {
	dir, s := wsSnapshot(t)
	w := withData(testWorkingSet(s.ID(), 42))
	if err := WriteDir(dir, w); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, Name(42))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The second entry's bytes follow the first's, after the table.
	b[wsHeaderSize+wsEntrySize*len(w.Entries)+int(w.Entries[0].Len)+100] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Map(s, 42)
	if err != nil {
		t.Fatalf("Map refused a file whose entries' bytes it does not check: %v", err)
	}
	defer got.Close()
	for i := range got.Entries {
		err := got.CheckData(i)
		if i == 1 && !errors.Is(err, image.ErrHeaderChecksum) {
			t.Errorf("CheckData of the damaged entry: %v, want image.ErrHeaderChecksum", err)
		}
		if i != 1 && err != nil {
			t.Errorf("CheckData of entry %d: %v", i, err)
		}
	}
	if _, err := Read(s, 42); !errors.Is(err, image.ErrHeaderChecksum) {
		t.Errorf("Read of the damaged file: %v, want image.ErrHeaderChecksum", err)
	}
}

// TestMapWorkingSet: a mapped working set reads as the file; a file
// truncated under its mapping fails ReadData rather than crash the
// reader; Close unmaps, once.
func TestMapWorkingSet(t *testing.T) {
	dir, s := wsSnapshot(t)
	w := withData(testWorkingSet(s.ID(), 42))
	if err := WriteDir(dir, w); err != nil {
		t.Fatal(err)
	}
	got, err := Map(s, 42)
	if err != nil {
		t.Fatal(err)
	}
	mapped := *got
	mapped.unmap, mapped.sums = nil, nil
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
	if err := os.Truncate(filepath.Join(dir, Name(42)), 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadData(p, last, last.Len-4096); !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("ReadData past the end of a truncated file: %v, want image.ErrCorrupt", err)
	}
	if err := got.Close(); err != nil {
		t.Fatal(err)
	}
	if err := got.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// A file truncated before it is mapped is refused as any damaged one.
	if _, err := Map(s, 42); !errors.Is(err, image.ErrTruncated) && !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("truncated working set mapped: %v", err)
	}
}
