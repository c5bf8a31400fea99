package lazy

import (
	"bytes"
	"io"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// TestSharedSegments: an object's data runs, held by two processes,
// land in a mapping of part of it at the mapping's addresses, clipped to
// it; reads there come from each run's process at its snapshot address,
// across runs, and a read outside every run fails rather than invent
// bytes.
func TestSharedSegments(t *testing.T) {
	const pg = image.PageSize
	a, b := &Process{}, &Process{}
	o := &sharedObject{id: 7, runs: []dataRun{
		{off: 0, n: 2 * pg, from: a, addr: 0x10000},
		{off: 2 * pg, n: pg, from: b, addr: 0x50000},
		{off: 8 * pg, n: 4 * pg, from: a, addr: 0x20000},
	}}
	if !o.disjoint() {
		t.Fatal("disjoint runs reported overlapping")
	}
	// A mapping at 0x900000 of offsets [pg, 10 pg).
	segs := o.segments(0x900000, 0x900000+9*pg, pg)
	want := []segment{
		{start: 0x900000, end: 0x900000 + pg, from: a, addr: 0x10000 + pg},
		{start: 0x900000 + pg, end: 0x900000 + 2*pg, from: b, addr: 0x50000},
		{start: 0x900000 + 7*pg, end: 0x900000 + 9*pg, from: a, addr: 0x20000},
	}
	if len(segs) != len(want) {
		t.Fatalf("segments %+v, want %+v", segs, want)
	}
	for i := range want {
		if segs[i] != want[i] {
			t.Errorf("segment %d: %+v, want %+v", i, segs[i], want[i])
		}
	}
	// Each process's "snapshot": byte i of its memory at base+i is
	// (i + seed) mod 251.
	mem := func(base uint64, seed int) io.ReaderAt {
		b := make([]byte, 0x40000)
		for i := range b {
			b[i] = byte((i + seed) % 251)
		}
		return &offsetReader{base: base, r: bytes.NewReader(b)}
	}
	srcs := map[*Process]io.ReaderAt{a: mem(0x10000, 1), b: mem(0x50000, 2)}
	s := &segmentSource{segs: segs, read: func(p *Process) io.ReaderAt { return srcs[p] }}
	buf := make([]byte, 2*pg)
	if _, err := s.ReadAt(buf, 0x900000); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		// The first page is a's at 0x10000+pg, the second b's at 0x50000.
		want := byte((pg + i + 1) % 251)
		if i >= pg {
			want = byte((i - pg + 2) % 251)
		}
		if buf[i] != want {
			t.Fatalf("byte %d: %d, want %d", i, buf[i], want)
		}
	}
	if _, err := s.ReadAt(buf[:pg], 0x900000+2*pg); err == nil {
		t.Error("a read of a hole succeeded")
	}
	if (&sharedObject{runs: []dataRun{{off: 0, n: 2 * pg}, {off: pg, n: pg}}}).disjoint() {
		t.Error("overlapping runs reported disjoint")
	}
}

// offsetReader reads r as memory from base on.
type offsetReader struct {
	base uint64
	r    io.ReaderAt
}

func (o *offsetReader) ReadAt(b []byte, off int64) (int, error) {
	return o.r.ReadAt(b, off-int64(o.base))
}

// TestSharedCandidates: what excludes an object from lazy service.
func TestSharedCandidates(t *testing.T) {
	shm := func(id uint64, start uint64, flags int, vmflags ...string) image.VMA {
		return image.VMA{Start: start, End: start + 0x1000, Kind: image.VMAShmem, Flags: flags, VMFlags: vmflags,
			Shmem: &image.ShmemRef{ID: id}}
	}
	sysv := shm(5, 0x9000, unix.MAP_SHARED)
	sysv.Shmem.SysV = &image.SysVShm{Key: 1}
	st := &image.Process{VMAs: []image.VMA{
		shm(1, 0x1000, unix.MAP_SHARED),
		shm(2, 0x3000, unix.MAP_SHARED, "lo"),
		shm(3, 0x5000, unix.MAP_PRIVATE),
		shm(4, 0x7000, unix.MAP_SHARED),
		sysv,
	}, FDs: []image.FD{{FD: 3, File: &image.FileID{Ino: 4}}}}
	got := sharedCandidates([]*Process{{st: st}})
	if len(got) != 1 || !got[1] {
		t.Errorf("candidates %v, want only object 1 (2 locked, 3 private, 4 held by a descriptor, 5 System V)", got)
	}
}
