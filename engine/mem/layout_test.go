package mem

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/units"
)

// special returns the VMA of a special mapping of the snapshot.
func special(kind, name string, start, n uint64) image.VMA {
	return image.VMA{Start: start, End: start + n, Kind: kind, Name: name, Prot: unix.PROT_READ, Flags: private}
}

func mremapArgs(from, n, to uint64) string {
	return call{unix.SYS_MREMAP, []uint64{from, n, n, unix.MREMAP_MAYMOVE | unix.MREMAP_FIXED, to}}.String()
}

// movedTo answers an mremap with the address it was asked to move to.
func movedTo(nr int, args []uint64) (uint64, error) {
	if nr == unix.SYS_MREMAP {
		return args[4], nil
	}
	return 0, nil
}

// TestMoveVDSO: the kernel's special mappings are moved where the
// process had them, straight when no target overlaps a current position,
// through a free area when one does; one the snapshot lacks is unmapped;
// a kernel whose special mappings differ is refused before any call.
func TestMoveVDSO(t *testing.T) {
	const vvarLen, vdsoLen = 0x4000, 0x2000
	vmas := []image.VMA{
		{Start: 0x7f00_0000_0000, End: 0x7f00_0010_0000, Kind: image.VMAAnon, Prot: rw, Flags: private},
		special(image.VMAVVar, "[vvar]", 0x7ffd_0000_0000, vvarLen),
		special(image.VMAVDSO, "[vdso]", 0x7ffd_0000_4000, vdsoLen),
	}
	here := func(vvar, vdso uint64, more ...proc.Mapping) []proc.Mapping {
		return append([]proc.Mapping{{Start: vvar, End: vvar + vvarLen, Path: "[vvar]"}, {Start: vdso, End: vdso + vdsoLen, Path: "[vdso]"}}, more...)
	}

	t.Run("in place", func(t *testing.T) {
		in := fakeInjector{reply: movedTo}
		if err := moveVDSO(&in, vmas, here(0x7ffd_0000_0000, 0x7ffd_0000_4000), 0); err != nil {
			t.Fatal(err)
		}
		sameCalls(t, "injected", in.strings(), nil)
	})
	t.Run("apart", func(t *testing.T) {
		in := fakeInjector{reply: movedTo}
		vclock := proc.Mapping{Start: 0x7ffe_0000_8000, End: 0x7ffe_0000_9000, Path: "[vvar_vclock]"}
		vsyscall := proc.Mapping{Start: 0xffff_ffff_ff60_0000, End: 0xffff_ffff_ff60_1000, Path: "[vsyscall]"}
		if err := moveVDSO(&in, vmas, here(0x7ffe_0000_0000, 0x7ffe_0000_4000, vclock, vsyscall), 0); err != nil {
			t.Fatal(err)
		}
		sameCalls(t, "injected", in.strings(), []string{
			call{unix.SYS_MUNMAP, []uint64{0x7ffe_0000_8000, 0x1000}}.String(),
			mremapArgs(0x7ffe_0000_0000, vvarLen, 0x7ffd_0000_0000),
			mremapArgs(0x7ffe_0000_4000, vdsoLen, 0x7ffd_0000_4000),
		})
	})
	t.Run("swapped", func(t *testing.T) {
		// vdso where vvar must go: both go through a free area first.
		in := fakeInjector{reply: movedTo}
		if err := moveVDSO(&in, vmas, here(0x7ffd_0000_2000, 0x7ffd_0000_0000), 0x10000); err != nil {
			t.Fatal(err)
		}
		free := FreeAreas(vmas, vvarLen+vdsoLen+0x10000)
		at := free[len(free)-1]
		sameCalls(t, "injected", in.strings(), []string{
			mremapArgs(0x7ffd_0000_2000, vvarLen, at),
			mremapArgs(0x7ffd_0000_0000, vdsoLen, at+vvarLen),
			mremapArgs(at, vvarLen, 0x7ffd_0000_0000),
			mremapArgs(at+vvarLen, vdsoLen, 0x7ffd_0000_4000),
		})
	})
	t.Run("moved elsewhere", func(t *testing.T) {
		in := fakeInjector{reply: func(int, []uint64) (uint64, error) { return 0x1000, nil }}
		if err := moveVDSO(&in, vmas, here(0x7ffe_0000_0000, 0x7ffe_0000_4000), 0); err == nil || !strings.Contains(err.Error(), "moved to 0x1000") {
			t.Errorf("mremap elsewhere: %v", err)
		}
	})
	for name, maps := range map[string][]proc.Mapping{
		"other size": {{Start: 0x7ffd_0000_0000, End: 0x7ffd_0000_0000 + vvarLen, Path: "[vvar]"}, {Start: 0x7ffd_0000_4000, End: 0x7ffd_0000_7000, Path: "[vdso]"}},
		"no vdso":    {{Start: 0x7ffd_0000_0000, End: 0x7ffd_0000_0000 + vvarLen, Path: "[vvar]"}},
	} {
		t.Run(name, func(t *testing.T) {
			var in fakeInjector
			if err := moveVDSO(&in, vmas, maps, 0); !errors.Is(err, image.ErrKernelMismatch) {
				t.Errorf("%v, want ErrKernelMismatch", err)
			}
			sameCalls(t, "injected", in.strings(), nil)
		})
	}
}

// TestUnmapCalls: every mapping goes but the injection area, the
// kernel's special mappings and the VMAs kept from the parent, in which
// every page but the kept ones is cleared; descriptors are closed first.
func TestUnmapCalls(t *testing.T) {
	const keep = 0x1_0000_0000
	maps := []proc.Mapping{
		{Start: 0x40_0000, End: 0x40_3000, Path: "/usr/bin/stub", Inode: 7},
		{Start: 0x60_0000, End: 0x70_0000}, // holds an inherited VMA
		{Start: keep, End: keep + 0x3000},
		{Start: 0x7ffd_0000_0000, End: 0x7ffd_0000_2000, Path: "[vdso]"},
		{Start: 0x7ffd_0001_0000, End: 0x7ffd_0003_0000, Path: "[stack]"},
	}
	inherit := Inheritance{
		VMAs: []units.Range{{Start: 0x62_0000, End: 0x64_0000}},
		Kept: []units.Range{{Start: 0x62_0000, End: 0x62_1000}, {Start: 0x63_0000, End: 0x64_0000}},
	}
	var b fakeBatch
	unmapCalls(&b, maps, keep, inherit)
	munmap := func(a, n uint64) string { return call{unix.SYS_MUNMAP, []uint64{a, n}}.String() }
	sameCalls(t, "batch", b.strings(), []string{
		call{unix.SYS_CLOSE_RANGE, []uint64{0, 0xffffffff, 0}}.String(),
		munmap(0x40_0000, 0x3000),
		munmap(0x60_0000, 0x2_0000),
		munmap(0x64_0000, 0xc_0000),
		munmap(0x7ffd_0001_0000, 0x2_0000),
		call{unix.SYS_MADVISE, []uint64{0x62_1000, 0xf000, unix.MADV_DONTNEED}}.String(),
	})
}

// TestDumpVMAs: the snapshot's VMAs say what /proc's mappings are:
// protection and sharing from the permissions, MAP_GROWSDOWN from the
// flags, the kernel's special mappings by name; a device mapping is
// refused.
func TestDumpVMAs(t *testing.T) {
	flags := func(s string) proc.VMFlags {
		f, err := proc.ParseVMFlags(s)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	maps := []proc.Mapping{
		{Start: 0x60_0000, End: 0x60_2000, Perms: proc.PermRead | proc.PermWrite, HasSmaps: true, Flags: flags("rd wr mr mw me ac")},
		{Start: 0x70_0000, End: 0x70_1000, Perms: proc.PermRead | proc.PermExec, Path: "[anon:jit]", HasSmaps: true, Flags: flags("rd ex")},
		{Start: 0x7ffd_0000_0000, End: 0x7ffd_0002_0000, Perms: proc.PermRead | proc.PermWrite, Path: "[stack]", HasSmaps: true, Flags: flags("rd wr gd ac")},
		{Start: 0x7ffd_0003_0000, End: 0x7ffd_0003_4000, Perms: proc.PermRead, Path: "[vvar]", HasSmaps: true, Flags: flags("rd pf io")},
		{Start: 0x7ffd_0003_4000, End: 0x7ffd_0003_6000, Perms: proc.PermRead | proc.PermExec, Path: "[vdso]", HasSmaps: true, Flags: flags("rd ex")},
	}
	got, err := VMAs(1, maps, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []image.VMA{
		{Start: 0x60_0000, End: 0x60_2000, Kind: image.VMAAnon, Prot: rw, Flags: private},
		{Start: 0x70_0000, End: 0x70_1000, Kind: image.VMAAnon, Prot: unix.PROT_READ | unix.PROT_EXEC, Flags: private, Name: "[anon:jit]"},
		{Start: 0x7ffd_0000_0000, End: 0x7ffd_0002_0000, Kind: image.VMAAnon, Prot: rw, Flags: private | unix.MAP_GROWSDOWN, Name: "[stack]"},
		{Start: 0x7ffd_0003_0000, End: 0x7ffd_0003_4000, Kind: image.VMAVVar, Prot: unix.PROT_READ, Flags: private, Name: "[vvar]"},
		{Start: 0x7ffd_0003_4000, End: 0x7ffd_0003_6000, Kind: image.VMAVDSO, Prot: unix.PROT_READ | unix.PROT_EXEC, Flags: private, Name: "[vdso]"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d VMAs, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Start != w.Start || g.End != w.End || g.Kind != w.Kind || g.Prot != w.Prot || g.Flags != w.Flags || g.Name != w.Name {
			t.Errorf("VMA %d: %+v, want %+v", i, g, w)
		}
	}
	if !slices.Equal(got[0].VMFlags, maps[0].Flags.Names()) {
		t.Errorf("VMFlags %v, want smaps' %v", got[0].VMFlags, maps[0].Flags.Names())
	}
	dev := []proc.Mapping{{Start: 0x1000, End: 0x2000, Perms: proc.PermRead | proc.PermShared, Path: "/dev/fb0", Inode: 9, HasSmaps: true, Flags: flags("rd sh io pf")}}
	if _, err := VMAs(1, dev, 0); !errors.Is(err, image.ErrUnsupported) {
		t.Errorf("device mapping: %v, want ErrUnsupported", err)
	}
}
