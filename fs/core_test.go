package fs

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/fs/corefile"
)

func bytesDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestCoreMounted reads the core through a mount: reading its headers
// and notes decodes no block; SEEK_DATA and SEEK_HOLE and st_blocks
// agree with the layout; a private file mapping's undumped pages come
// from the file, and reading them fails with EIO once it changed.
func TestCoreMounted(t *testing.T) {
	dir := t.TempDir()
	id, fileBytes := imagetest.MappedFile(t, dir, 5, int(pages(8)))
	const pid = 321
	proc := imagetest.Process{PID: pid, Seed: 9, VMAs: []imagetest.VMA{
		{Start: 0x400000, End: 0x400000 + pages(8), Prot: protRW, Kind: image.VMAFile, File: &id, Name: id.Path,
			Content: imagetest.Random, Holes: [][2]uint64{{0, pages(3)}, {pages(5), pages(8)}}},
		{Start: 0x7f0000000000, End: 0x7f0000000000 + pages(4096), Prot: protRW, Content: imagetest.Mixed,
			Holes: [][2]uint64{{pages(100), pages(300)}}},
	}, Threads: []image.Thread{{TID: pid}}}
	s, err := imagetest.Write(filepath.Join(dir, "snap"), image.Options{BlockSize: 64 << 10, Mode: codec.Compress}, proc)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := mount(t, s.Dir, Options{})
	pdir := filepath.Join(srv.Mountpoint(), strconv.Itoa(pid))
	f, err := os.Open(filepath.Join(pdir, "core"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	head := make([]byte, 64<<10)
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if misses := statField(t, pdir, "cache_misses"); misses != 0 {
		t.Errorf("reading the first 64 KiB of core decoded %d blocks, want none", misses)
	}

	ef, err := elf.NewFile(f)
	if err != nil {
		t.Fatal(err)
	}
	l := ef.Progs[1]
	got := make([]byte, l.Filesz)
	if _, err := l.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := s.Memory(pid, l.Vaddr, int(l.Filesz))
	copy(want[:pages(3)], fileBytes[:pages(3)])
	copy(want[pages(5):], fileBytes[pages(5):])
	if !bytes.Equal(got, want) {
		t.Errorf("private file mapping: differs at %#x", l.Vaddr+uint64(bytesDiff(got, want)))
	}

	var data uint64
	for _, r := range seekAll(t, func(off uint64, whence uint32) (uint64, syscall.Errno) {
		o, err := unix.Seek(int(f.Fd()), int64(off), int(whence))
		if err != nil {
			return 0, err.(syscall.Errno)
		}
		return uint64(o), 0
	}) {
		data += r[1] - r[0]
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if blocks := uint64(st.Sys().(*syscall.Stat_t).Blocks) * 512; blocks != (data+511)/512*512 {
		t.Errorf("st_blocks*512 = %d, SEEK_DATA ranges hold %d", blocks, data)
	}
	// the headers and notes, the whole file mapping, the heap's dumped
	// pages; the headers and notes fill less than the first MaxRequest
	// bytes, where the core's first PT_LOAD starts
	if mapped := uint64(len(fileBytes)) + s.DumpedBytes(pid) - pages(2); data <= mapped || data > mapped+MaxRequest {
		t.Errorf("data %d bytes, want the headers and notes and %d", data, mapped)
	}

	// The file changes: its pages can no longer be served.
	if err := os.WriteFile(id.Path, append(fileBytes, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	f2, err := os.Open(filepath.Join(pdir, "core"))
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	unix.Fadvise(int(f2.Fd()), 0, 0, unix.FADV_DONTNEED)
	b := make([]byte, 4096)
	if _, err := f2.ReadAt(b, int64(l.Off)); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of a page of a changed mapped file: %v, want EIO", err)
	}
}

// statField returns a figure of MNT/PID/stats.
func statField(t testing.TB, pdir, name string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pdir, "stats"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("stats: no %s", name)
	return 0
}

// TestCoreCorruptBlockIsEIO: a read of the core that touches a corrupt
// block fails with EIO, as the same read of mem does; the headers and the
// other PT_LOADs read fine.
func TestCoreCorruptBlockIsEIO(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	b := corrupt(t, s.Dir, pidA, codec.Raw)
	p := openTestProcess(t, s, pidA)
	node := &coreNode{own: &owner{}, proc: p}
	ef, err := elf.NewFile(io.NewSectionReader(coreReader{p.core()}, 0, int64(p.core().Size())))
	if err != nil {
		t.Fatal(err)
	}
	var loads []*elf.Prog // the PT_LOADs with bytes
	for _, l := range ef.Progs {
		if l.Type == elf.PT_LOAD && l.Filesz > 0 {
			loads = append(loads, l)
		}
	}
	i := slices.IndexFunc(loads, func(l *elf.Prog) bool { return l.Vaddr <= b.Addr && b.Addr < l.Vaddr+l.Filesz })
	if i < 0 {
		t.Fatalf("no PT_LOAD holds %#x", b.Addr)
	}
	l := loads[i]
	if _, errno := node.Read(context.Background(), nil, make([]byte, 4096), int64(l.Off+badPage(b)-l.Vaddr)); errno != syscall.EIO {
		t.Errorf("read of the corrupt block through the core: %v, want EIO", errno)
	}
	if _, errno := node.Read(context.Background(), nil, make([]byte, 4096), 0); errno != 0 {
		t.Errorf("read of the headers: %v", errno)
	}
	for _, other := range loads {
		if other.Vaddr+other.Filesz <= b.Addr || other.Vaddr > b.End() {
			if _, errno := node.Read(context.Background(), nil, make([]byte, 4096), int64(other.Off)); errno != 0 {
				t.Errorf("read of PT_LOAD %#x: %v", other.Vaddr, errno)
			}
		}
	}
}

// coreReader reads a process's core through File.ReadAt, as coreNode
// does.
type coreReader struct{ c *corefile.File }

func (r coreReader) ReadAt(p []byte, off int64) (int, error) {
	b, err := r.c.ReadAt(context.Background(), p, uint64(off))
	if err != nil {
		return 0, err
	}
	if len(b) < len(p) {
		return len(b), io.EOF
	}
	return len(b), nil
}
