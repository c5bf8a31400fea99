package mem

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/engine/units"
)

const (
	fnr     = unix.MAP_FIXED_NOREPLACE
	private = unix.MAP_PRIVATE
	shared  = unix.MAP_SHARED
	anon    = unix.MAP_ANONYMOUS
	rw      = unix.PROT_READ | unix.PROT_WRITE
)

// newMapper returns a mapper of the VMAs of st through fakes, with the
// files of files open in the process.
func newMapper(st *image.Process, files map[string]int) (*mapper, *fakeInjector, *fakeBatch) {
	in, b := &fakeInjector{}, &fakeBatch{}
	t := &Target{State: st, Log: discard}
	return &mapper{Target: t, in: in, calls: b, files: files, shmem: map[uint64]int{}}, in, b
}

// TestMapLayout: every kind of VMA is mapped where it was, with its
// protection and flags; a RELRO segment writable then read-only; runs of
// anonymous private memory in one mmap with each VMA's advice; a guard
// page and the stack apart; a shared object of several mappings made
// once as a memfd; the kernel's special mappings left to MoveVDSO.
func TestMapLayout(t *testing.T) {
	app := &image.FileID{Path: "/usr/bin/app"}
	db := &image.FileID{Path: "/data/db"}
	vmas := []image.VMA{
		{Start: 0x40_0000, End: 0x40_1000, Kind: image.VMAFile, File: app, Prot: unix.PROT_READ | unix.PROT_EXEC, Flags: private},
		{Start: 0x40_1000, End: 0x40_2000, Kind: image.VMAFile, File: app, Offset: 0x1000, Prot: unix.PROT_READ, Flags: private, VMFlags: []string{"rd", "ac"}},
		{Start: 0x60_0000, End: 0x60_2000, Kind: image.VMAAnon, Prot: rw, Flags: private, VMFlags: []string{"rd", "wr"}},
		{Start: 0x60_2000, End: 0x60_4000, Kind: image.VMAAnon, Prot: rw, Flags: private, VMFlags: []string{"rd", "wr", "hg"}},
		{Start: 0x60_4000, End: 0x60_5000, Kind: image.VMAAnon, Prot: unix.PROT_NONE, Flags: private}, // a guard page
		{Start: 0x70_0000, End: 0x70_1000, Kind: image.VMAShmem, Prot: rw, Flags: shared, Shmem: &image.ShmemRef{ID: 5}},
		{Start: 0x80_0000, End: 0x80_2000, Kind: image.VMAShmem, Prot: rw, Flags: shared, Name: "/memfd:cache (deleted)", Shmem: &image.ShmemRef{ID: 6, Size: 0x3000}},
		{Start: 0x90_0000, End: 0x90_1000, Kind: image.VMAShmem, Prot: unix.PROT_READ, Flags: shared, Offset: 0x2000, Name: "/memfd:cache (deleted)", Shmem: &image.ShmemRef{ID: 6, Size: 0x3000}},
		{Start: 0xa0_0000, End: 0xa0_1000, Kind: image.VMAFileShared, File: db, Prot: rw, Flags: shared, VMFlags: []string{"mw", "nr"}},
		{Start: 0x7ffd_0000_0000, End: 0x7ffd_0000_1000, Kind: image.VMAAnon, Prot: rw, Flags: private},
		{Start: 0x7ffd_0000_1000, End: 0x7ffd_0002_0000, Kind: image.VMAAnon, Name: "[stack]", Prot: rw, Flags: private | unix.MAP_GROWSDOWN},
		{Start: 0x7ffd_0003_0000, End: 0x7ffd_0003_4000, Kind: image.VMAVVar, Name: "[vvar]", Prot: unix.PROT_READ, Flags: private},
		{Start: 0x7ffd_0003_4000, End: 0x7ffd_0003_6000, Kind: image.VMAVDSO, Name: "[vdso]", Prot: unix.PROT_READ | unix.PROT_EXEC, Flags: private},
	}
	m, in, b := newMapper(&image.Process{VMAs: vmas}, map[string]int{"0:/usr/bin/app": 10, "2:/data/db": 12})
	in.reply = func(nr int, _ []uint64) (uint64, error) {
		if nr == unix.SYS_MEMFD_CREATE {
			return 20, nil
		}
		return 0, nil
	}
	if err := m.mapAll(context.Background(), vmas); err != nil {
		t.Fatal(err)
	}
	madvise := func(v image.VMA, adv int) string {
		return call{unix.SYS_MADVISE, []uint64{v.Start, v.End - v.Start, uint64(adv)}}.String()
	}
	want := []string{
		mmapArgs(0x40_0000, 0x1000, unix.PROT_READ|unix.PROT_EXEC, fnr|private, 10, 0),
		mmapArgs(0x40_1000, 0x1000, rw, fnr|private, 10, 0x1000),
		call{unix.SYS_MPROTECT, []uint64{0x40_1000, 0x1000, unix.PROT_READ}}.String(),
		mmapArgs(0x60_0000, 0x4000, rw, fnr|private|anon, -1, 0),
		madvise(vmas[3], unix.MADV_HUGEPAGE),
		mmapArgs(0x60_4000, 0x1000, unix.PROT_NONE, fnr|private|anon, -1, 0),
		mmapArgs(0x70_0000, 0x1000, rw, fnr|shared|anon, -1, 0),
		mmapArgs(0x80_0000, 0x2000, rw, fnr|shared, 20, 0),
		mmapArgs(0x90_0000, 0x1000, unix.PROT_READ, fnr|shared, 20, 0x2000),
		mmapArgs(0xa0_0000, 0x1000, rw, fnr|shared|unix.MAP_NORESERVE, 12, 0),
		mmapArgs(0x7ffd_0000_0000, 0x1000, rw, fnr|private|anon, -1, 0),
		mmapArgs(0x7ffd_0000_1000, 0x1f000, rw, fnr|private|unix.MAP_GROWSDOWN|anon, -1, 0),
	}
	got := b.strings()
	closes := got[len(want):]
	sameCalls(t, "batch", got[:min(len(got), len(want))], want)
	slices.Sort(closes)
	sameCalls(t, "closes", closes, []string{call{unix.SYS_CLOSE, []uint64{10}}.String(), call{unix.SYS_CLOSE, []uint64{12}}.String()})
	// The memfd of object 6, made once, named as it was, of its size.
	wantIn := []string{call{unix.SYS_MEMFD_CREATE, []uint64{scratchBase, unix.MFD_CLOEXEC}}.String(), call{unix.SYS_FTRUNCATE, []uint64{20, 0x3000}}.String()}
	sameCalls(t, "injected", in.strings(), wantIn)
	if name := string(in.put[scratchBase]); name != "cache\x00" {
		t.Errorf("memfd named %q, want \"cache\"", name)
	}
	if m.shmem[6] != 20 || len(m.shmem) != 1 {
		t.Errorf("shared objects made %v, want object 6 as fd 20", m.shmem)
	}
	// Every mmap is checked for its address once the batch ran.
	var addrs []uint64
	for _, mm := range m.mmaps {
		if b.calls[mm.call].nr != unix.SYS_MMAP || b.calls[mm.call].args[0] != mm.addr {
			t.Errorf("checked call %d: %s at %#x", mm.call, b.calls[mm.call], mm.addr)
		}
		addrs = append(addrs, mm.addr)
	}
	if len(addrs) != 10 {
		t.Errorf("%d mmaps checked, want 10: %#x", len(addrs), addrs)
	}
}

// TestMapCheckAddrs: a mapping the kernel put elsewhere than asked
// (a kernel that ignores MAP_FIXED_NOREPLACE) fails the restore, naming it.
func TestMapCheckAddrs(t *testing.T) {
	vmas := []image.VMA{
		{Start: 0x60_0000, End: 0x60_2000, Kind: image.VMAAnon, Prot: rw, Flags: private},
		{Start: 0x70_0000, End: 0x70_1000, Kind: image.VMAAnon, Prot: unix.PROT_READ, Flags: private, VMFlags: []string{"dd"}},
	}
	m, _, b := newMapper(&image.Process{VMAs: vmas}, map[string]int{})
	if err := m.mapAll(context.Background(), vmas); err != nil {
		t.Fatal(err)
	}
	b.results = map[int]int64{0: 0x60_0000, 1: 0x70_0000}
	if err := m.checkAddrs(); err != nil {
		t.Errorf("mapped where asked: %v", err)
	}
	b.results[1] = 0x7f00_0000_0000
	if err := m.checkAddrs(); err == nil || !strings.Contains(err.Error(), "map 700000-701000 r--p") {
		t.Errorf("mapped elsewhere: %v", err)
	}
}

// TestMapInherited: a VMA kept from the parent since fork is not mapped
// again, only advised; the anonymous memory beside it is mapped apart.
func TestMapInherited(t *testing.T) {
	vmas := []image.VMA{
		{Start: 0x60_0000, End: 0x60_2000, Kind: image.VMAAnon, Prot: rw, Flags: private},
		{Start: 0x60_2000, End: 0x60_4000, Kind: image.VMAAnon, Prot: rw, Flags: private, VMFlags: []string{"dd"}},
		{Start: 0x60_4000, End: 0x60_5000, Kind: image.VMAAnon, Prot: rw, Flags: private},
	}
	m, _, b := newMapper(&image.Process{VMAs: vmas}, map[string]int{})
	m.Inherit = Inheritance{VMAs: []units.Range{{Start: 0x60_2000, End: 0x60_4000}}}
	if err := m.mapAll(context.Background(), vmas); err != nil {
		t.Fatal(err)
	}
	sameCalls(t, "batch", b.strings(), []string{
		mmapArgs(0x60_0000, 0x2000, rw, fnr|private|anon, -1, 0),
		call{unix.SYS_MADVISE, []uint64{0x60_2000, 0x2000, unix.MADV_DONTDUMP}}.String(),
		mmapArgs(0x60_4000, 0x1000, rw, fnr|private|anon, -1, 0),
	})
}

// TestMapSysV: the first process to attach a System V segment makes it
// (with the id it had free, its owner and mode) and attaches it where it
// was, read-only as it was; another process of the tree only attaches
// it; a segment marked for destruction is made private and marked again
// once attached.
func TestMapSysV(t *testing.T) {
	nextID := t.TempDir() + "/shm_next_id"
	old := shmNextID
	shmNextID = nextID
	t.Cleanup(func() { shmNextID = old })

	seg := &image.SysVShm{Key: 0x1234, ID: 7, Mode: 0o640, UID: 26, GID: 27}
	vmas := []image.VMA{{Start: 0x7f00_0000_0000, End: 0x7f00_0000_2000, Kind: image.VMAShmem, Prot: unix.PROT_READ, Flags: shared,
		Shmem: &image.ShmemRef{ID: 7, Size: 0x1800, SysV: seg}}}
	m, in, b := newMapper(&image.Process{VMAs: vmas}, map[string]int{})
	var nextAtShmget []byte
	in.reply = func(nr int, _ []uint64) (uint64, error) {
		if nr == unix.SYS_SHMGET {
			nextAtShmget, _ = readFile(nextID)
			return 7, nil
		}
		return 0, nil
	}
	if err := m.mapAll(context.Background(), vmas); err != nil {
		t.Fatal(err)
	}
	if string(nextAtShmget) != "7" {
		t.Errorf("shm_next_id %q at shmget, want the id the segment had", nextAtShmget)
	}
	ds := scratchBase
	sameCalls(t, "injected", in.strings(), []string{
		call{unix.SYS_SHMGET, []uint64{0x1234, 0x1800, unix.IPC_CREAT | unix.IPC_EXCL | 0o640}}.String(),
		call{unix.SYS_SHMCTL, []uint64{7, unix.IPC_SET, uint64(ds)}}.String(),
	})
	perm := in.put[uint64(ds)]
	if len(perm) != 120 || le32(perm[4:]) != 26 || le32(perm[8:]) != 27 || le32(perm[20:]) != 0o640 {
		t.Errorf("IPC_SET with uid %d gid %d mode %o, want 26 27 640", le32(perm[4:]), le32(perm[8:]), le32(perm[20:]))
	}
	sameCalls(t, "batch", b.strings(), []string{call{unix.SYS_SHMAT, []uint64{7, 0x7f00_0000_0000, unix.SHM_RDONLY}}.String()})
	if m.SysV.made[0] != 7 {
		t.Errorf("segments made %v, want 7 (removed if the restore fails)", m.SysV.made)
	}

	// Another process of the tree, writable and executable.
	vmas2 := []image.VMA{vmas[0]}
	vmas2[0].Prot = rw | unix.PROT_EXEC
	m2, in2, b2 := newMapper(&image.Process{VMAs: vmas2}, map[string]int{})
	m2.SysV = m.SysV
	if err := m2.mapAll(context.Background(), vmas2); err != nil {
		t.Fatal(err)
	}
	sameCalls(t, "second process injected", in2.strings(), nil)
	sameCalls(t, "second process batch", b2.strings(), []string{call{unix.SYS_SHMAT, []uint64{7, 0x7f00_0000_0000, shmExec}}.String()})

	// Marked for destruction at the dump; its id taken (ENOSPC) at first.
	gone := *seg
	gone.Mode |= kernel.ShmDest
	vmas3 := []image.VMA{vmas[0]}
	vmas3[0].Shmem = &image.ShmemRef{ID: 7, Size: 0x1800, SysV: &gone}
	m3, in3, b3 := newMapper(&image.Process{VMAs: vmas3}, map[string]int{})
	tries := 0
	in3.reply = func(nr int, _ []uint64) (uint64, error) {
		if nr == unix.SYS_SHMGET {
			if tries++; tries == 1 {
				return 0, unix.ENOSPC
			}
			return 9, nil
		}
		return 0, nil
	}
	if err := m3.mapAll(context.Background(), vmas3); err != nil {
		t.Fatal(err)
	}
	if got := in3.strings()[:2]; got[0] != got[1] || in3.calls[0].args[0] != 0 {
		t.Errorf("shmget %v, want IPC_PRIVATE twice", got)
	}
	if next, _ := readFile(nextID); string(next) != "-1" {
		t.Errorf("shm_next_id left at %q, want -1 once the id was refused", next)
	}
	sameCalls(t, "destroyed segment batch", b3.strings(), []string{
		call{unix.SYS_SHMAT, []uint64{9, 0x7f00_0000_0000, unix.SHM_RDONLY}}.String(),
		call{unix.SYS_SHMCTL, []uint64{9, unix.IPC_RMID, 0}}.String(),
	})
}

func readFile(name string) ([]byte, error) { return os.ReadFile(name) }

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// TestLock: locked VMAs are locked, on fault for MLOCK_ONFAULT.
func TestLock(t *testing.T) {
	vmas := []image.VMA{
		{Start: 0x1000, End: 0x3000, VMFlags: []string{"rd", "lo"}},
		{Start: 0x3000, End: 0x4000, VMFlags: []string{"rd"}},
		{Start: 0x5000, End: 0x7000, VMFlags: []string{"lf"}},
	}
	var in fakeInjector
	if err := lock(&in, vmas); err != nil {
		t.Fatal(err)
	}
	sameCalls(t, "injected", in.strings(), []string{
		call{unix.SYS_MLOCK, []uint64{0x1000, 0x2000}}.String(),
		call{unix.SYS_MLOCK2, []uint64{0x5000, 0x2000, unix.MLOCK_ONFAULT}}.String(),
	})
	in = fakeInjector{reply: func(int, []uint64) (uint64, error) { return 0, unix.EPERM }}
	if err := lock(&in, vmas); !errors.Is(err, unix.EPERM) {
		t.Errorf("failed mlock: %v", err)
	}
}
