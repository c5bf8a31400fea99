package mem

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/engine/units"
)

// fillVMAs: a private file mapping, anonymous private memory (lazy), a
// shared anonymous object, locked memory and the stack.
var fillVMAs = []image.VMA{
	{Start: 0x40_0000, End: 0x41_0000, Kind: image.VMAFile, Prot: rw, Flags: private},
	{Start: 0x60_0000, End: 0x70_0000, Kind: image.VMAAnon, Prot: rw, Flags: private, Dumped: true},
	{Start: 0x70_0000, End: 0x71_0000, Kind: image.VMAShmem, Prot: rw, Flags: shared, Dumped: true},
	{Start: 0x71_0000, End: 0x72_0000, Kind: image.VMAAnon, Prot: rw, Flags: private, Dumped: true, VMFlags: []string{"lo"}},
	{Start: 0x7ffd_0000_0000, End: 0x7ffd_0002_0000, Kind: image.VMAAnon, Name: "[stack]", Prot: rw, Flags: private | unix.MAP_GROWSDOWN, Dumped: true},
}

func block(kind codec.Kind, addr uint64) image.Block {
	return image.Block{Addr: addr, Len: 0x4000, Kind: kind}
}

func addrs(bs []image.Block) []uint64 {
	var out []uint64
	for _, b := range bs {
		out = append(out, b.Addr)
	}
	return out
}

// TestSortBlocks: the fill writes Raw blocks straight from the pages
// file, decodes the others first, writes zero blocks only where a fresh
// mapping would not read as zeros (a private file mapping reads the
// file), and leaves out what a lazy restore serves: anonymous private
// memory but for a thread's rseq area, not the stack nor locked memory.
func TestSortBlocks(t *testing.T) {
	threads := []image.Thread{{TID: 1, Rseq: &image.Rseq{Addr: 0x60_8010, Len: 32}}}
	lazy := func(b image.Block, v *image.VMA) bool {
		return Lazy(v) && !EagerPage(threads, b.Addr, uint64(b.Len))
	}
	blocks := []image.Block{
		block(codec.Raw, 0x40_0000), block(codec.Zero, 0x40_4000), block(codec.LZ4, 0x40_8000),
		block(codec.Raw, 0x60_0000), block(codec.Raw, 0x60_8000), block(codec.Zero, 0x60_c000), block(codec.LZ4, 0x61_0000),
		block(codec.Zero, 0x70_0000), block(codec.Raw, 0x70_4000),
		block(codec.LZ4, 0x71_0000),
		block(codec.Raw, 0x7ffd_0001_0000), block(codec.Zero, 0x7ffd_0001_4000),
	}
	for _, tc := range []struct {
		name               string
		skip               func(image.Block, *image.VMA) bool
		raw, decode, zeros []uint64
	}{
		{"eager", nil,
			[]uint64{0x40_0000, 0x60_0000, 0x60_8000, 0x70_4000, 0x7ffd_0001_0000}, []uint64{0x40_8000, 0x61_0000, 0x71_0000}, []uint64{0x40_4000}},
		{"lazy", lazy,
			[]uint64{0x40_0000, 0x60_8000, 0x70_4000, 0x7ffd_0001_0000}, []uint64{0x40_8000, 0x71_0000}, []uint64{0x40_4000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := sortBlocks(fillVMAs, slices.Values(blocks), tc.skip)
			if err != nil {
				t.Fatal(err)
			}
			if got := addrs(bs.raw); !slices.Equal(got, tc.raw) {
				t.Errorf("raw %#x, want %#x", got, tc.raw)
			}
			if got := addrs(bs.decode); !slices.Equal(got, tc.decode) {
				t.Errorf("decoded %#x, want %#x", got, tc.decode)
			}
			if got := addrs(bs.zero); !slices.Equal(got, tc.zeros) {
				t.Errorf("zeros %#x, want %#x", got, tc.zeros)
			}
			for i, b := range bs.decode {
				if v := bs.vmas[i]; v != VMAAt(fillVMAs, b.Addr) {
					t.Errorf("decoded block %#x with VMA %#x", b.Addr, v.Start)
				}
			}
		})
	}
	if _, err := sortBlocks(fillVMAs, slices.Values([]image.Block{block(codec.Raw, 0x50_0000)}), nil); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("block outside every VMA: %v, want ErrCorrupt", err)
	}
}

// TestUffdTargets: UFFDIO_COPY places the blocks of anonymous private
// memory only; each VMA registered once.
func TestUffdTargets(t *testing.T) {
	blocks := []image.Block{block(codec.Raw, 0x40_0000), block(codec.Raw, 0x60_0000), block(codec.LZ4, 0x60_4000),
		block(codec.Raw, 0x70_0000), block(codec.Raw, 0x7ffd_0001_0000)}
	got := uffdTargets(fillVMAs, blocks)
	if len(got) != 2 || !got[&fillVMAs[1]] || !got[&fillVMAs[4]] {
		var starts []uint64
		for v := range got {
			starts = append(starts, v.Start)
		}
		t.Errorf("registered %#x, want the anonymous private VMAs at 0x600000 and the stack", starts)
	}
}

// TestInherit: a child keeps from its parent the VMAs that fork makes as
// they were at the dump, and in them the blocks that lie wholly in the
// pages it shared; a VMA whose advice differs from the parent's, or the
// parent no longer has, is its own.
func TestInherit(t *testing.T) {
	parent := &image.Process{VMAs: []image.VMA{
		{Start: 0x60_0000, End: 0x70_0000, Kind: image.VMAAnon, Prot: rw, Flags: private},
		{Start: 0x70_0000, End: 0x71_0000, Kind: image.VMAAnon, Prot: rw, Flags: private, VMFlags: []string{"hg"}},
	}}
	child := &image.Process{VMAs: []image.VMA{
		{Start: 0x60_0000, End: 0x70_0000, Kind: image.VMAAnon, Prot: rw, Flags: private,
			Inherited: []image.PageRange{{Start: 0x60_0000, End: 0x60_6000}, {Start: 0x60_8000, End: 0x61_0000}}},
		{Start: 0x70_0000, End: 0x71_0000, Kind: image.VMAAnon, Prot: rw, Flags: private,
			Inherited: []image.PageRange{{Start: 0x70_0000, End: 0x71_0000}}},
		{Start: 0x80_0000, End: 0x81_0000, Kind: image.VMAAnon, Prot: rw, Flags: private,
			Inherited: []image.PageRange{{Start: 0x80_0000, End: 0x81_0000}}},
	}}
	blocks := []image.Block{
		block(codec.Raw, 0x60_0000), block(codec.Raw, 0x60_4000), // the second only half shared
		block(codec.Raw, 0x60_8000), block(codec.Raw, 0x60_c000), block(codec.Raw, 0x62_0000),
		block(codec.Raw, 0x70_0000), block(codec.Raw, 0x80_0000),
	}
	got := inherit(child, slices.Values(blocks), parent)
	wantVMAs := []units.Range{{Start: 0x60_0000, End: 0x70_0000}}
	wantKept := []units.Range{{Start: 0x60_0000, End: 0x60_4000}, {Start: 0x60_8000, End: 0x61_0000}}
	if !slices.Equal(got.VMAs, wantVMAs) || !slices.Equal(got.Kept, wantKept) {
		t.Errorf("inherits VMAs %v kept %v, want %v and %v", got.VMAs, got.Kept, wantVMAs, wantKept)
	}
	if got := Inherit(child, nil, nil); got.VMAs != nil || got.Kept != nil {
		t.Errorf("without a parent: %+v", got)
	}
}

// ownPage maps a page of the test's own memory, filled with fill, with
// protection prot.
func ownPage(t *testing.T, fill byte, prot int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, image.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	for i := range b {
		b[i] = fill
	}
	if err := unix.Mprotect(b, prot); err != nil {
		t.Fatal(err)
	}
	return b
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// TestFillWrite: the fill writes a writable mapping with
// process_vm_writev and a read-only one through /proc/PID/mem (which
// process_vm_writev cannot write); a Raw block is read from the pages
// file and checked against its CRC32C on the way. The process is the
// test's own.
func TestFillWrite(t *testing.T) {
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		t.Skip(err)
	}
	defer mem.Close()
	payload := bytes.Repeat([]byte{'p'}, image.PageSize)
	f := &filler{pid: os.Getpid(), mem: mem, uffd: -1, pages: bytes.NewReader(append(make([]byte, 512), payload...))}

	for _, tc := range []struct {
		name string
		prot int
	}{{"writable", unix.PROT_READ | unix.PROT_WRITE}, {"read-only", unix.PROT_READ}} {
		t.Run(tc.name, func(t *testing.T) {
			dst := ownPage(t, 'x', tc.prot)
			v := &image.VMA{Start: addrOf(dst), End: addrOf(dst) + image.PageSize, Kind: image.VMAAnon, Prot: tc.prot, Flags: private}
			j := &fillJob{vma: v, blocks: []image.Block{{Addr: v.Start, Len: image.PageSize, Kind: codec.Raw, StoredLen: image.PageSize, Off: 512, CRC: codec.Checksum(payload)}}}
			var buf []byte
			if err := f.do(j, &buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, payload) {
				t.Errorf("page reads %q..., want the block", dst[:4])
			}
			if tc.prot&unix.PROT_WRITE == 0 {
				local := []unix.Iovec{{Base: &payload[0]}}
				local[0].SetLen(len(payload))
				if _, err := unix.ProcessVMWritev(os.Getpid(), local, []unix.RemoteIovec{{Base: uintptr(v.Start), Len: len(payload)}}, 0); err == nil {
					t.Error("process_vm_writev wrote a read-only page: the choice of /proc/PID/mem is moot")
				}
			}
		})
	}
}

// TestFillWriteUserfaultfd: anonymous private memory registered with a
// userfaultfd is placed with UFFDIO_COPY, without a fault.
func TestFillWriteUserfaultfd(t *testing.T) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		t.Skip("userfaultfd:", errno)
	}
	defer unix.Close(int(fd))
	if _, _, err := uffdio.API(int(fd), 0); err != nil {
		t.Fatal(err)
	}
	dst := ownPage(t, 0, unix.PROT_READ|unix.PROT_WRITE)
	unix.Madvise(dst, unix.MADV_DONTNEED) // not present: the copy places it
	v := &image.VMA{Start: addrOf(dst), End: addrOf(dst) + image.PageSize, Kind: image.VMAAnon, Prot: rw, Flags: private}
	if _, err := uffdio.Register(int(fd), v.Start, image.PageSize, uffdio.RegisterModeMissing); err != nil {
		t.Fatal(err)
	}
	f := &filler{pid: os.Getpid(), uffd: int(fd), uffdVMAs: map[*image.VMA]bool{v: true}}
	data := bytes.Repeat([]byte{'u'}, image.PageSize)
	if err := f.write(&fillJob{vma: v, blocks: []image.Block{{Addr: v.Start, Len: image.PageSize}}}, data); err != nil {
		t.Fatal(err)
	}
	if err := uffdio.Unregister(int(fd), v.Start, image.PageSize); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, data) {
		t.Errorf("page reads %q..., want the block", dst[:4])
	}
	// Placed already: a second copy finds it there.
	if _, err := uffdio.Register(int(fd), v.Start, image.PageSize, uffdio.RegisterModeMissing); err != nil {
		t.Fatal(err)
	}
	if err := f.write(&fillJob{vma: v, blocks: []image.Block{{Addr: v.Start, Len: image.PageSize}}}, data); !errors.Is(err, uffdio.ErrExist) {
		t.Errorf("second copy: %v, want uffdio.ErrExist", err)
	}
}
