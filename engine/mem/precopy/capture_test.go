package precopy

import (
	"bytes"
	"testing"

	"github.com/lazyfs/lazyfs/engine/units"
)

const page = 4096

// TestCapture: once stopped, Capture keeps what the rounds copied and
// nobody wrote since, reads the rest (in staged ranges and outside them)
// with the dump's reader, and ReadMem then reads the copy whole.
func TestCapture(t *testing.T) {
	const base = 0x10_0000
	data, err := stageMem(8 * page)
	if err != nil {
		t.Fatal(err)
	}
	// The rounds copied pages 0-3 ('r'); page 2 was written since.
	copy(data, bytes.Repeat([]byte{'r'}, 4*page))
	s := &segment{start: base, end: base + 8*page, data: data, tracked: true}
	s.valid.add(units.Range{Start: base, End: base + 4*page})
	s.valid.sub(units.Range{Start: base + 2*page, End: base + 3*page})
	pc := &Copy{uffd: -1, stopped: true, segs: []*segment{s}}
	defer pc.Close()

	// Two ranges to dump: pages 1-5 of the segment, and two pages after
	// it that no round staged.
	ranges := []units.Range{{Start: base + page, End: base + 6*page}, {Start: base + 10*page, End: base + 12*page}}
	type read struct {
		i       int
		addr, n uint64
	}
	var reads []read
	n, err := pc.Capture(ranges, func(i int, dst []byte, addr uint64) error {
		reads = append(reads, read{i, addr, uint64(len(dst))})
		for j := range dst {
			dst[j] = byte('a' + i)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []read{{0, base + 2*page, page}, {0, base + 4*page, 2 * page}, {1, base + 10*page, 2 * page}}
	if len(reads) != len(want) {
		t.Fatalf("reads %+v, want %+v", reads, want)
	}
	for i := range want {
		if reads[i] != want[i] {
			t.Errorf("read %d: %+v, want %+v", i, reads[i], want[i])
		}
	}
	if n != 5*page {
		t.Errorf("captured %d bytes, want %d", n, 5*page)
	}
	for _, c := range []struct {
		addr uint64
		b    byte
	}{{base + page, 'r'}, {base + 2*page, 'a'}, {base + 3*page, 'r'}, {base + 5*page, 'a'}, {base + 11*page, 'b'}} {
		got := make([]byte, page)
		if err := pc.ReadMem(c.addr, got); err != nil {
			t.Fatalf("ReadMem %#x: %v", c.addr, err)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{c.b}, page)) {
			t.Errorf("copy at %#x reads %q..., want %q", c.addr, got[:4], c.b)
		}
	}
	// Page 0 was copied by a round but is not among the ranges; page 6
	// never was: no copy of it.
	if err := pc.ReadMem(base+6*page, make([]byte, page)); err == nil {
		t.Error("ReadMem of a page never copied succeeded")
	}
	// A read across the segment and the one Capture added after it.
	if err := pc.ReadMem(base+5*page, make([]byte, 2*page)); err == nil {
		t.Error("ReadMem across a page never copied succeeded")
	}
}

// TestCaptureBeforeStop: the copy is not trusted while the process runs.
func TestCaptureBeforeStop(t *testing.T) {
	pc := &Copy{uffd: -1}
	if _, err := pc.Capture(nil, nil); err == nil {
		t.Error("Capture before Stop succeeded")
	}
}
