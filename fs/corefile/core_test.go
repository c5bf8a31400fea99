package corefile

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cache"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
)

// coreReader reads a process's core through File.ReadAt, as the FUSE
// node does.
type coreReader struct{ c *File }

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

// randomCoreProcess returns a random synthetic process for a core: every
// VMA kind, holes, VMAs not dumped, private file mappings whose file is
// there (and whose undumped pages the core serves from it) or missing,
// MADV_DONTDUMP, threads with random registers and FP state.
func randomCoreProcess(t testing.TB, seed uint64) (imagetest.Process, map[string][]byte) {
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	files := map[string][]byte{}
	p := imagetest.Process{PID: 1000 + int(seed%50000), Seed: seed}
	a := uint64(0x400000) + rng.Uint64N(64)*imagetest.PageSize
	for range 1 + rng.IntN(14) {
		n := 1 + rng.Uint64N(96)
		v := imagetest.VMA{Start: a, End: a + pages(n), Prot: []int{protR, protRW, protRX, 0}[rng.IntN(4)],
			Content: []imagetest.Content{imagetest.Zero, imagetest.Random, imagetest.BF16, imagetest.Text, imagetest.Patchwork}[rng.IntN(5)]}
		a = v.End + pages(rng.Uint64N(3)) // touching or not
		switch rng.IntN(8) {
		case 0, 1, 2: // anonymous, sometimes never touched
			v.NotDumped = rng.IntN(8) == 0
		case 3: // shmem
			v.Kind, v.Shared, v.Name = image.VMAShmem, true, "/memfd:x (deleted)"
		case 4, 5: // private file mapping, file there or not
			v.Kind, v.Name = image.VMAFile, "/nonexistent/lib.so"
			if rng.IntN(3) > 0 {
				off := rng.Uint64N(4) * imagetest.PageSize
				// the file may end before the mapping does
				size := int(off + pages(n) - rng.Uint64N(pages(n)/2+1))
				id, b := imagetest.MappedFile(t, dir, seed*100+uint64(len(p.VMAs)), size)
				files[id.Path] = b
				v.File, v.Offset, v.Name = &id, off, id.Path
			} else {
				v.File = &image.FileID{Path: v.Name, Dev: 1, Ino: 2}
			}
			v.NotDumped = rng.IntN(3) == 0
		case 6:
			v.Kind, v.Shared, v.NotDumped, v.Name = image.VMAFileShared, true, true, "/data/shared"
			v.File = &image.FileID{Path: v.Name}
		case 7:
			v.Kind, v.NotDumped, v.Name, v.Prot = image.VMAVDSO, true, "[vdso]", protRX
			if vdso, _ := hostVDSO(); vdso != nil && rng.IntN(2) == 0 {
				v.End = v.Start + uint64(len(vdso)) // as large as the mount's
				n = uint64(len(vdso)) / imagetest.PageSize
				a = v.End + pages(rng.Uint64N(3))
			}
		}
		if !v.NotDumped {
			for range rng.IntN(3) {
				lo := rng.Uint64N(n)
				hi := min(n, lo+1+rng.Uint64N(n-lo))
				v.Holes = append(v.Holes, [2]uint64{pages(lo), pages(hi)})
			}
		}
		if rng.IntN(12) == 0 {
			v.VMFlags = []string{"rd", "wr", "dd"}
		}
		p.VMAs = append(p.VMAs, v)
	}
	// The leader first, as a dump lists the threads.
	for i := range 1 + rng.IntN(4) {
		th := image.Thread{TID: p.PID + i, SigMask: rng.Uint64(), SigPending: rng.Uint64() & 0x4000}
		th.Regs.Rip, th.Regs.Rsp, th.Regs.Rbp = rng.Uint64(), rng.Uint64(), rng.Uint64()
		switch rng.IntN(3) {
		case 0:
			th.XState = make([]byte, 832+64*rng.IntN(4))
		case 1:
			th.FPRegs = make([]byte, fxsaveSize)
		}
		for j := range th.XState {
			th.XState[j] = byte(rng.Uint32())
		}
		for j := range th.FPRegs {
			th.FPRegs[j] = byte(rng.Uint32())
		}
		p.Threads = append(p.Threads, th)
	}
	p.Auxv = []uint64{6, 4096, 25, 0x7ffc0000, 0, 0}
	return p, files
}

// wantCoreBytes returns what the core must hold at addr of VMA v: the
// memory the snapshot holds there, and, in a private file mapping whose
// file is there, the file's bytes where nothing was dumped.
func wantCoreBytes(s *imagetest.Snapshot, pid int, v *imagetest.VMA, files map[string][]byte, addr, n uint64) []byte {
	if v.Kind == image.VMAVDSO {
		vdso, _ := hostVDSO()
		return vdso[addr-v.Start : addr-v.Start+n]
	}
	b := s.Memory(pid, addr, int(n))
	if v.Kind != image.VMAFile || v.File == nil || files[v.File.Path] == nil {
		return b
	}
	data := files[v.File.Path]
	for _, h := range holesOf(s.Dumped(pid), addr, addr+n) {
		for a := h[0]; a < h[1]; a++ {
			if o := v.Offset + a - v.Start; o < uint64(len(data)) {
				b[a-addr] = data[o]
			}
		}
	}
	return b
}

// holesOf returns the parts of [lo, hi) outside the dumped ranges.
func holesOf(dumped [][2]uint64, lo, hi uint64) [][2]uint64 {
	var out [][2]uint64
	a := lo
	for _, r := range dumped {
		if r[1] <= a || r[0] >= hi {
			continue
		}
		if r[0] > a {
			out = append(out, [2]uint64{a, r[0]})
		}
		a = max(a, r[1])
	}
	if a < hi {
		out = append(out, [2]uint64{a, hi})
	}
	return out
}

// checkCore parses the core of a random synthetic snapshot with
// debug/elf and checks it against the snapshot.
func checkCore(t *testing.T, seed uint64) {
	bs := []int{4 << 10, 64 << 10, 256 << 10}[seed%3]
	proc, files := randomCoreProcess(t, seed)
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: bs, Mode: codec.Compress}, proc)
	if err != nil {
		t.Fatal(err)
	}
	c := openTestCore(t, s, proc.PID)
	f, err := elf.NewFile(io.NewSectionReader(coreReader{c}, 0, int64(c.size)))
	if err != nil {
		t.Fatalf("seed %d: debug/elf: %v", seed, err)
	}
	if f.Type != elf.ET_CORE || f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB {
		t.Fatalf("seed %d: header %v %v %v %v", seed, f.Type, f.Machine, f.Class, f.Data)
	}
	if f.Progs[0].Type != elf.PT_NOTE {
		t.Fatalf("seed %d: first program header %v, want PT_NOTE", seed, f.Progs[0].Type)
	}
	checkNotes(t, seed, f.Progs[0], &proc)

	// The PT_LOADs tile every VMA, in order, and hold its bytes.
	loads := f.Progs[1:]
	li := 0
	for i := range proc.VMAs {
		v := &proc.VMAs[i]
		for a := v.Start; a < v.End; li++ {
			if li >= len(loads) {
				t.Fatalf("seed %d: no PT_LOAD for %#x of VMA %#x-%#x", seed, a, v.Start, v.End)
			}
			l := loads[li]
			if l.Type != elf.PT_LOAD || l.Vaddr != a || l.Vaddr+l.Memsz > v.End || l.Memsz == 0 || l.Filesz > l.Memsz {
				t.Fatalf("seed %d: PT_LOAD %d %#x+%#x (filesz %#x) in VMA %#x-%#x at %#x", seed, li, l.Vaddr, l.Memsz, l.Filesz, v.Start, v.End, a)
			}
			if l.Off%imagetest.PageSize != 0 || l.Off < coreDataAlign || l.Flags != progFlags(v.Prot) {
				t.Fatalf("seed %d: PT_LOAD %#x: offset %#x, flags %v", seed, l.Vaddr, l.Off, l.Flags)
			}
			if l.Filesz > 0 {
				got := make([]byte, l.Filesz)
				if _, err := l.ReadAt(got, 0); err != nil {
					t.Fatalf("seed %d: read PT_LOAD %#x: %v", seed, l.Vaddr, err)
				}
				if want := wantCoreBytes(s, proc.PID, v, files, l.Vaddr, l.Filesz); !bytes.Equal(got, want) {
					at := bytesDiff(got, want)
					t.Fatalf("seed %d: PT_LOAD %#x (VMA %#x-%#x %s): differs at %#x", seed, l.Vaddr, v.Start, v.End, v.Kind, l.Vaddr+uint64(at))
				}
				if l.Filesz != l.Memsz {
					t.Fatalf("seed %d: PT_LOAD %#x: filesz %#x of memsz %#x", seed, l.Vaddr, l.Filesz, l.Memsz)
				}
			}
			vdso, _ := hostVDSO()
			wantBytes := !slices.Contains(v.VMFlags, "dd") && (v.Kind == "" && !v.NotDumped || v.Kind == image.VMAShmem ||
				v.Kind == image.VMAVDSO && uint64(len(vdso)) == v.End-v.Start ||
				v.Kind == image.VMAFile && files[v.File.Path] != nil && (!v.NotDumped || v.Prot&unix.PROT_WRITE != 0))
			if wantBytes && l.Filesz != v.End-v.Start {
				t.Fatalf("seed %d: PT_LOAD %#x of VMA %#x-%#x %s: filesz %#x, want the whole VMA", seed, l.Vaddr, v.Start, v.End, v.Kind, l.Filesz)
			}
			a += l.Memsz
		}
	}
	if li != len(loads) {
		t.Fatalf("seed %d: %d PT_LOADs, %d used by VMAs", seed, len(loads), li)
	}

	// SEEK_DATA/SEEK_HOLE: holes read as zeros; st_blocks counts the data.
	ranges := seekAll(t, c)
	var data uint64
	prev := uint64(0)
	all := make([]byte, c.size)
	if _, err := (coreReader{c}).ReadAt(all, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if !allZero(all[prev:r[0]]) {
			t.Fatalf("seed %d: hole %#x-%#x holds data", seed, prev, r[0])
		}
		data += r[1] - r[0]
		prev = r[1]
	}
	if !allZero(all[prev:]) {
		t.Fatalf("seed %d: hole %#x-end holds data", seed, prev)
	}
	if data != c.used || ranges[0][0] != 0 || ranges[0][1] < uint64(len(c.head)) {
		t.Fatalf("seed %d: data ranges %v (%d bytes), used %d", seed, ranges[:1], data, c.used)
	}
}

// checkNotes checks the notes of the core of proc.
func checkNotes(t *testing.T, seed uint64, pt *elf.Prog, proc *imagetest.Process) {
	b := make([]byte, pt.Filesz)
	if _, err := pt.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	type note struct {
		name string
		typ  uint32
		desc []byte
	}
	var notes []note
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("seed %d: truncated note", seed)
		}
		nl, dl, typ := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
		b = b[12:]
		name := strings.TrimRight(string(b[:nl]), "\x00")
		b = b[roundUp(uint64(nl), 4):]
		notes = append(notes, note{name, typ, b[:dl]})
		b = b[roundUp(uint64(dl), 4):]
	}
	var status []note
	for _, n := range notes {
		if n.typ == uint32(elf.NT_PRSTATUS) {
			if len(n.desc) != prstatusSize || n.name != "CORE" {
				t.Fatalf("seed %d: NT_PRSTATUS %q of %d bytes", seed, n.name, len(n.desc))
			}
			status = append(status, n)
		}
	}
	if len(status) != len(proc.Threads) {
		t.Fatalf("seed %d: %d NT_PRSTATUS, want %d", seed, len(status), len(proc.Threads))
	}
	for _, n := range status {
		tid := int(binary.LittleEndian.Uint32(n.desc[32:]))
		i := slices.IndexFunc(proc.Threads, func(th image.Thread) bool { return th.TID == tid })
		if i < 0 {
			t.Fatalf("seed %d: NT_PRSTATUS of unknown thread %d", seed, tid)
		}
		th := proc.Threads[i]
		if rip, rsp := binary.LittleEndian.Uint64(n.desc[112+16*8:]), binary.LittleEndian.Uint64(n.desc[112+19*8:]); rip != th.Regs.Rip || rsp != th.Regs.Rsp {
			t.Fatalf("seed %d: thread %d: rip %#x rsp %#x, want %#x %#x", seed, tid, rip, rsp, th.Regs.Rip, th.Regs.Rsp)
		}
	}
	if slices.ContainsFunc(proc.Threads, func(th image.Thread) bool { return th.TID == proc.PID }) {
		if tid := int(binary.LittleEndian.Uint32(status[0].desc[32:])); tid != proc.PID {
			t.Fatalf("seed %d: first NT_PRSTATUS is thread %d, want the main thread", seed, tid)
		}
	}
	// a pending signal of the first thread is NT_SIGINFO's and pr_cursig
	first := proc.Threads[slices.IndexFunc(proc.Threads, func(th image.Thread) bool {
		return th.TID == int(binary.LittleEndian.Uint32(status[0].desc[32:]))
	})]
	sigi := slices.IndexFunc(notes, func(n note) bool { return n.typ == ntSIGINFO })
	if sig := pendingSignal(first.SigPending); sig != 0 {
		if sigi < 0 || binary.LittleEndian.Uint32(notes[sigi].desc) != uint32(sig) || len(notes[sigi].desc) != siginfoSize ||
			binary.LittleEndian.Uint16(status[0].desc[12:]) != uint16(sig) {
			t.Fatalf("seed %d: signal %d pending: NT_SIGINFO at %d, pr_cursig %d", seed, sig, sigi, binary.LittleEndian.Uint16(status[0].desc[12:]))
		}
	} else if sigi >= 0 {
		t.Fatalf("seed %d: NT_SIGINFO with no signal pending", seed)
	}
	for _, typ := range []uint32{uint32(elf.NT_PRPSINFO), ntAUXV, ntFILE} {
		if !slices.ContainsFunc(notes, func(n note) bool { return n.typ == typ && n.name == "CORE" }) {
			t.Fatalf("seed %d: no note of type %#x", seed, typ)
		}
	}
}

func bytesDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestCoreRandom is the property test of the core: random synthetic
// snapshots, parsed with debug/elf.
func TestCoreRandom(t *testing.T) {
	n := 40
	if testing.Short() {
		n = 8
	}
	base := uint64(time.Now().UnixNano())
	t.Logf("seeds %d..%d", base, base+uint64(n)-1)
	for i := range n {
		checkCore(t, base+uint64(i))
	}
}

// FuzzCore checks the core of the synthetic snapshot a seed makes.
func FuzzCore(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 42} {
		f.Add(s)
	}
	f.Fuzz(checkCore)
}

// TestCoreReadsDecodeOnlyTheirBlocks: small reads of a PT_LOAD close to
// each other (as a debugger makes them) decode the blocks they touch and
// no others, though the process's reader reads ahead for mem; in Raw
// blocks, whose pages are checked one by one, they decode no block at all.
func TestCoreReadsDecodeOnlyTheirBlocks(t *testing.T) {
	for _, tc := range []struct {
		content imagetest.Content
		want    int64
	}{{imagetest.Text, 2}, {imagetest.Random, 0}} {
		const pid = 55
		vma := imagetest.VMA{Start: 0x10000000, End: 0x10000000 + pages(4096), Prot: protRW, Content: tc.content}
		s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: 64 << 10, Mode: codec.Compress},
			imagetest.Process{PID: pid, Seed: 3, VMAs: []imagetest.VMA{vma}})
		if err != nil {
			t.Fatal(err)
		}
		c := openTestCore(t, s, pid) // a reader with readahead, as a mount's
		seg := c.segs[0]
		for i, rel := range []uint64{pages(10), pages(11) + 100, pages(40), pages(41)} {
			b := make([]byte, 64)
			if _, err := c.ReadAt(context.Background(), b, seg.off+rel); err != nil {
				t.Fatal(err)
			}
			if want := s.Memory(pid, vma.Start+rel, 64); !bytes.Equal(b, want) {
				t.Fatalf("content %v: read %d differs", tc.content, i)
			}
		}
		time.Sleep(100 * time.Millisecond) // readahead, if any, would be under way
		// pages 10, 11 are in the block of pages 0-15; pages 40, 41 in 32-47
		if st := c.r.CacheStats(); st.Misses != tc.want || st.Entries != tc.want {
			t.Errorf("content %v: four small reads in two blocks decoded %d blocks (%d cached), want %d", tc.content, st.Misses, st.Entries, tc.want)
		}
	}
}

const (
	protR  = unix.PROT_READ
	protRW = unix.PROT_READ | unix.PROT_WRITE
	protRX = unix.PROT_READ | unix.PROT_EXEC
)

// pages returns n pages in bytes.
func pages(n uint64) uint64 { return n * imagetest.PageSize }

// openTestCore lays out the core of process pid of s, read through a
// reader with readahead, as a mount's.
func openTestCore(t testing.TB, s *imagetest.Snapshot, pid int) *File {
	t.Helper()
	snap, err := image.Open(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := snap.State(pid)
	if err != nil {
		t.Fatal(err)
	}
	r, err := snap.OpenPages(pid, image.ReaderOptions{Cache: cache.New(16 << 20), Threads: 1, Readahead: true})
	if err != nil {
		t.Fatal(err)
	}
	c := New(st, r, snap.Manifest.Kernel.Release)
	t.Cleanup(func() {
		c.Close()
		r.Close()
	})
	return c
}

// seekAll enumerates the data ranges of c with Seek.
func seekAll(t testing.TB, c *File) [][2]uint64 {
	t.Helper()
	var out [][2]uint64
	var off uint64
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("Seek does not advance")
		}
		d, ok := c.Seek(off, true)
		if !ok {
			return out
		}
		if d < off {
			t.Fatalf("Seek data %#x = %#x", off, d)
		}
		h, ok := c.Seek(d, false)
		if !ok || h <= d {
			t.Fatalf("Seek hole %#x = %#x, %v", d, h, ok)
		}
		out = append(out, [2]uint64{d, h})
		off = h
	}
}
