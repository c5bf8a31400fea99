package e2e

// End-to-end tests of lazyfs on snapshots dumped by snapctl from real
// processes: the counter fixture and python3. What the mount shows is
// compared with a model built from the record of the process taken while
// it was stopped for the dump (takeMemory), not with the image reader, so
// that the whole chain, dump to FUSE read, is checked: the pages the dump
// had to take hold the bytes the process held; everything else reads as
// zeros and is a hole to SEEK_DATA.

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// memModel is what MNT/<pid>/mem must show: spans of the bytes the
// process held where the dump had to take pages, zeros elsewhere.
type memModel struct {
	spans []span // sorted, disjoint
}

// newMemModel builds the model of a process from its record: private
// anonymous pages that were present, private file pages that had been
// copied on write, and the contents of shared anonymous and memfd
// mappings (read from the image: the record holds what the process's
// page table mapped, not the object). A swapped page fails the test: its
// bytes were not recorded.
func newMemModel(t testing.TB, rec *memRecord, si *snapImage) *memModel {
	t.Helper()
	m := &memModel{}
	for _, mp := range rec.Maps {
		var sel func(uint64) bool
		switch mp.kind() {
		case mapAnon:
			sel = func(e uint64) bool { return e&(pmPresent|pmSwapped) != 0 }
		case mapFilePrivate:
			sel = func(e uint64) bool { return e&pmSwapped != 0 || e&pmPresent != 0 && e&pmFile == 0 }
		case mapShmem:
			for _, r := range si.Pages.Runs() {
				lo, hi := max(r.Addr, mp.Start), min(r.End(), mp.End)
				if lo < hi {
					m.spans = append(m.spans, span{lo, si.read(t, lo, hi-lo)})
				}
			}
			continue
		default:
			continue
		}
		for _, r := range pageRuns(mp.Start, rec.entries[mp.Start], sel) {
			b := rec.bytes(r[0], r[1]-r[0])
			if b == nil {
				t.Fatalf("%#x-%#x of %s: swapped out while stopped, its bytes were not recorded", r[0], r[1], mp)
			}
			m.spans = append(m.spans, span{r[0], b})
		}
	}
	slices.SortFunc(m.spans, func(a, b span) int { return cmp.Compare(a.Addr, b.Addr) })
	// The cpu fields of each thread's rseq area are the kernel's: it
	// rewrote them when the dump's injected calls returned to the thread
	// on another CPU (checkImage allows the same).
	for _, th := range si.State.Threads {
		if th.Rseq == nil {
			continue
		}
		lo, hi := th.Rseq.Addr, th.Rseq.Addr+uint64(th.Rseq.Len)
		for i, sp := range m.spans {
			if sp.Addr < hi && lo < sp.End() {
				a, b := max(lo, sp.Addr), min(hi, sp.End())
				d := slices.Clone(sp.Data)
				copy(d[a-sp.Addr:b-sp.Addr], si.read(t, a, b-a))
				m.spans[i].Data = d
			}
		}
	}
	return m
}

// bytes returns what the mount must show at [addr, addr+n).
func (m *memModel) bytes(addr, n uint64) []byte {
	out := make([]byte, n)
	i, _ := slices.BinarySearchFunc(m.spans, addr, func(s span, a uint64) int {
		if s.End() <= a {
			return -1
		}
		return 1
	})
	for ; i < len(m.spans) && m.spans[i].Addr < addr+n; i++ {
		s := m.spans[i]
		lo, hi := max(s.Addr, addr), min(s.End(), addr+n)
		copy(out[lo-addr:hi-addr], s.Data[lo-s.Addr:hi-s.Addr])
	}
	return out
}

// ranges returns the data ranges, adjacent spans merged.
func (m *memModel) ranges() [][2]uint64 {
	var out [][2]uint64
	for _, s := range m.spans {
		if n := len(out); n > 0 && out[n-1][1] == s.Addr {
			out[n-1][1] = s.End()
			continue
		}
		out = append(out, [2]uint64{s.Addr, s.End()})
	}
	return out
}

// dataBytes is the number of bytes the dump took.
func (m *memModel) dataBytes() uint64 {
	var n uint64
	for _, s := range m.spans {
		n += uint64(len(s.Data))
	}
	return n
}

// regionFile is a file of MNT/<pid>/regions.
type regionFile struct {
	Path       string
	Start, End uint64
}

// listRegions lists the region files of a process directory of the mount
// and parses their bounds from the names.
func listRegions(t testing.TB, pdir string) []regionFile {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(pdir, "regions"))
	if err != nil {
		t.Fatal(err)
	}
	var out []regionFile
	for _, e := range ents {
		var r regionFile
		f := strings.SplitN(e.Name(), "-", 3)
		if len(f) < 3 {
			t.Fatalf("region file %q: not <start>-<end>-<perms>[-<name>]", e.Name())
		}
		var err1, err2 error
		r.Start, err1 = strconv.ParseUint(f[0], 16, 64)
		r.End, err2 = strconv.ParseUint(f[1], 16, 64)
		if err := errors.Join(err1, err2); err != nil || r.End <= r.Start {
			t.Fatalf("region file %q: bounds: %v", e.Name(), err)
		}
		r.Path = filepath.Join(pdir, "regions", e.Name())
		out = append(out, r)
	}
	return out
}

// mountedAt reports whether /proc/mounts lists a mount at path.
func mountedAt(t testing.TB, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == path {
			return true
		}
	}
	return false
}

// checkRegions compares every region file with the model, with cmp and
// sha256sum, and checks that every dumped range lies in a region file.
func checkRegions(t *testing.T, si *snapImage, pdir string, model *memModel) []regionFile {
	t.Helper()
	regs := listRegions(t, pdir)
	if len(regs) == 0 {
		t.Fatal("no region files")
	}
	for _, r := range regs {
		want := model.bytes(r.Start, r.End-r.Start)
		st, err := os.Stat(r.Path)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(st.Size()) != r.End-r.Start {
			t.Errorf("%s: size %d, want the VMA's %d", r.Path, st.Size(), r.End-r.Start)
		}
		got, err := os.ReadFile(r.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			i := firstDiff(got, want)
			a := r.Start + uint64(i)
			t.Fatalf("%s differs from the memory at %#x (offset %#x): %x, want %x (image %x)", r.Path, a, i, got[i:min(i+16, len(got))], want[i:min(i+16, len(want))], si.read(t, a, 16))
		}
		testutil.Output(t, "cmp", r.Path, testutil.WriteTemp(t, want))
		sum := sha256.Sum256(want)
		if got := strings.Fields(string(testutil.Output(t, "sha256sum", r.Path)))[0]; got != hex.EncodeToString(sum[:]) {
			t.Errorf("sha256sum %s = %s, want %x", r.Path, got, sum)
		}
	}
	for _, rg := range model.ranges() {
		for a := rg[0]; a < rg[1]; {
			i := slices.IndexFunc(regs, func(r regionFile) bool { return r.Start <= a && a < r.End })
			if i < 0 {
				t.Fatalf("dumped page %#x is in no region file", a)
			}
			a = regs[i].End
		}
	}
	return regs
}

// seekRanges enumerates the data ranges of a file with SEEK_DATA and
// SEEK_HOLE.
func seekRanges(t testing.TB, path string) [][2]uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]uint64
	var off int64
	for {
		d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return out
		}
		if err != nil {
			t.Fatalf("SEEK_DATA %#x: %v", off, err)
		}
		h, err := unix.Seek(int(f.Fd()), d, unix.SEEK_HOLE)
		if err != nil {
			t.Fatalf("SEEK_HOLE %#x: %v", d, err)
		}
		if h <= d || d < off {
			t.Fatalf("SEEK_DATA %#x = %#x, SEEK_HOLE = %#x: no progress", off, d, h)
		}
		out = append(out, [2]uint64{uint64(d), uint64(h)})
		off = h
	}
}

// TestLazyfsCounter mounts a snapshot of the counter fixture and reads it
// with cmp, sha256sum, dd, xxd, strings, lseek, cp --sparse and random
// preads, each compared with the memory the process held.
func TestLazyfsCounter(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "cmp", "sha256sum", "dd", "xxd", "strings", "cp")
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "64M")
	si, rec := dumpRecorded(t, ctx, p)
	model := newMemModel(t, rec, si)
	mnt := lazyMountLazyfs(t, si.Dir)
	pdir := filepath.Join(mnt, strconv.Itoa(p.PID))
	mem := filepath.Join(pdir, "mem")
	addr := p.Ready.MustUint(t, "addr")
	size := p.Ready.MustUint(t, "size")
	marker, _ := p.Ready.Value("marker")
	markerAddr := p.Ready.MustUint(t, "marker_addr")

	var regs []regionFile
	t.Run("cmp and sha256sum of every region", func(t *testing.T) {
		regs = checkRegions(t, si, pdir, model)
		t.Logf("%d region files, %d dumped bytes", len(regs), model.dataBytes())
	})
	t.Run("dd and xxd of mem", func(t *testing.T) {
		for _, tc := range []struct{ addr, pages uint64 }{
			{addr, 4},                             // the zero quarter
			{addr + size/4 - 2*pageSize, 5},       // zero into random
			{addr + size/2 + 123*pageSize, 64},    // weights
			{addr + size - pageSize, 3},           // the end of the mapping, beyond
			{markerAddr &^ (pageSize - 1), 2},     // the heap
			{model.spans[0].Addr - 2*pageSize, 4}, // a hole into the first data
		} {
			out := testutil.Output(t, "dd", "if="+mem, "bs=4096", fmt.Sprintf("skip=%d", tc.addr/4096), fmt.Sprintf("count=%d", tc.pages), "status=none")
			if !bytes.Equal(out, model.bytes(tc.addr, tc.pages*pageSize)) {
				t.Errorf("dd at %#x, %d pages: differs from the memory", tc.addr, tc.pages)
			}
		}
		for _, a := range []uint64{markerAddr, addr + size/4 + 4000, addr + size - 32} {
			got := testutil.Output(t, "xxd", "-s", fmt.Sprint(a), "-l", "64", mem)
			want := testutil.Output(t, "xxd", "-o", fmt.Sprint(a), "-l", "64", testutil.WriteTemp(t, model.bytes(a, 64)))
			if !bytes.Equal(got, want) {
				t.Errorf("xxd -s %#x:\n%s\nwant\n%s", a, got, want)
			}
		}
	})
	t.Run("strings finds the heap marker", func(t *testing.T) {
		paths, err := filepath.Glob(filepath.Join(pdir, "regions", "*"))
		if err != nil || len(paths) == 0 {
			t.Fatal(paths, err)
		}
		if !bytes.Contains(testutil.Output(t, "strings", paths...), []byte(marker)) {
			t.Errorf("strings regions/* does not show %q", marker)
		}
	})
	t.Run("SEEK_DATA and SEEK_HOLE give the dumped ranges", func(t *testing.T) {
		got, want := seekRanges(t, mem), model.ranges()
		if !slices.Equal(got, want) {
			t.Errorf("SEEK_DATA/SEEK_HOLE give\n%s\nwant\n%s", fmtRanges(got), fmtRanges(want))
		}
	})
	t.Run("st_blocks and cp --sparse=always onto tmpfs", func(t *testing.T) {
		st, err := os.Stat(mem)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if got := uint64(sys.Blocks) * 512; got != model.dataBytes() {
			t.Errorf("mem: st_blocks*512 = %d, want the dumped %d", got, model.dataBytes())
		}
		var fs unix.Statfs_t
		if err := unix.Statfs("/dev/shm", &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
			t.Fatalf("/dev/shm is not a tmpfs (%v)", err)
		}
		dir, err := os.MkdirTemp("/dev/shm", "lazyfs-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		dst := filepath.Join(dir, "mem")
		start := time.Now()
		testutil.Output(t, "cp", "--sparse=always", mem, dst)
		took := time.Since(start)
		var cst unix.Stat_t
		if err := unix.Stat(dst, &cst); err != nil {
			t.Fatal(err)
		}
		alloc := uint64(cst.Blocks) * 512
		t.Logf("cp --sparse=always of a %#x-byte mem: %v, %d bytes allocated, %d dumped", st.Size(), took, alloc, model.dataBytes())
		if cst.Size != st.Size() || alloc == 0 || alloc > model.dataBytes() {
			t.Errorf("copy: size %#x, %d bytes allocated; want size %#x and at most the %d dumped bytes", cst.Size, alloc, st.Size(), model.dataBytes())
		}
		f, err := os.Open(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, s := range model.spans {
			b := make([]byte, len(s.Data))
			if _, err := f.ReadAt(b, int64(s.Addr)); err != nil || !bytes.Equal(b, s.Data) {
				t.Fatalf("copy at %#x+%d: differs (%v)", s.Addr, len(s.Data), err)
			}
		}
	})
	t.Run("random reads", func(t *testing.T) {
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 1))
		f, err := os.Open(mem)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		end := model.spans[len(model.spans)-1].End()
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		memSize := uint64(st.Size())
		const block = 256 << 10
		for i := range 3000 {
			var off uint64
			switch i % 4 {
			case 0: // anywhere below the last dumped byte
				off = rng.Uint64N(end)
			case 1: // at a block boundary of a span, give or take a little
				s := model.spans[rng.IntN(len(model.spans))]
				off = (s.Addr+rng.Uint64N(uint64(len(s.Data))+1))&^(block-1) - 64 + rng.Uint64N(128)
			case 2: // around the start or end of a span (a VMA or a hole)
				s := model.spans[rng.IntN(len(model.spans))]
				off = s.Addr - 2*pageSize + rng.Uint64N(4*pageSize)
				if rng.IntN(2) == 0 {
					off = s.End() - 2*pageSize + rng.Uint64N(4*pageSize)
				}
			default: // inside a span
				s := model.spans[rng.IntN(len(model.spans))]
				off = s.Addr + rng.Uint64N(uint64(len(s.Data)))
			}
			n := 1 + rng.Uint64N(3*block)
			if rng.IntN(3) == 0 {
				n = 1 + rng.Uint64N(2*pageSize)
			}
			if off >= memSize {
				continue
			}
			n = min(n, memSize-off)
			b := make([]byte, n)
			got, err := f.ReadAt(b, int64(off))
			if err != nil && got != len(b) {
				t.Fatalf("pread %#x+%d: %d bytes, %v", off, n, got, err)
			}
			if want := model.bytes(off, n); !bytes.Equal(b, want) {
				at := firstDiff(b, want)
				t.Fatalf("pread %#x+%d: differs at %#x", off, n, off+uint64(at))
			}
		}
		// and inside the region files, at offsets relative to them
		for range 500 {
			r := regs[rng.IntN(len(regs))]
			off := rng.Uint64N(r.End - r.Start)
			n := min(1+rng.Uint64N(2*block), r.End-r.Start-off)
			b := make([]byte, n)
			rf, err := os.Open(r.Path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = rf.ReadAt(b, int64(off))
			rf.Close()
			if err != nil {
				t.Fatalf("pread %s at %#x+%d: %v", r.Path, off, n, err)
			}
			if !bytes.Equal(b, model.bytes(r.Start+off, n)) {
				t.Fatalf("pread %s at %#x+%d: differs", r.Path, off, n)
			}
		}
	})
}

// TestLazyfsPython mounts a snapshot of python3 (4 KiB blocks) with
// lazyfs in the foreground, compares its regions with the interpreter's
// memory, finds a key of its dict with strings | grep, then stops lazyfs
// with SIGTERM: it unmounts and exits 0.
func TestLazyfsPython(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "cmp", "sha256sum", "strings", "grep", "sh")
	ctx := testContext(t)
	p := fixture.StartPython(t, "pystate.py")
	si, rec := dumpRecorded(t, ctx, p, "--compress")
	model := newMemModel(t, rec, si)

	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(buildTool(t, "lazyfs"), si.Dir, mnt)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			// Unmount first: a FUSE server killed while its mount is
			// in use can be held until the connection goes.
			exec.Command("fusermount3", "-u", "-z", mnt).Run()
			cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				t.Errorf("lazyfs (pid %d) still running 10s after SIGKILL", cmd.Process.Pid)
			}
		}
		if mountedAt(t, mnt) {
			t.Errorf("%s still mounted after the test", mnt)
		}
	})
	pdir := filepath.Join(mnt, strconv.Itoa(p.PID))
	for !mountedAt(t, mnt) {
		select {
		case <-exited:
			t.Fatalf("lazyfs exited before mounting: %v\n%s", waitErr, stderr.String())
		case <-ctx.Done():
			t.Fatalf("lazyfs did not mount: %v\n%s", ctx.Err(), stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
	}

	checkRegions(t, si, pdir, model)
	key := fmt.Sprintf("key-%06d", p.Ready.MustInt(t, "entries")-1)
	out := testutil.Output(t, "sh", "-c", `strings "$1"/regions/* | grep -c -F -- "$2"`, "sh", pdir, key)
	if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err != nil || n == 0 {
		t.Errorf("strings regions/* | grep %s: %q", key, out)
	}
	if got, want := seekRanges(t, filepath.Join(pdir, "mem")), model.ranges(); !slices.Equal(got, want) {
		t.Errorf("SEEK_DATA/SEEK_HOLE give\n%s\nwant\n%s", fmtRanges(got), fmtRanges(want))
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("lazyfs after SIGTERM: %v\n%s", waitErr, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("lazyfs still running 10s after SIGTERM\n%s", stderr.String())
	}
	if mountedAt(t, mnt) {
		t.Errorf("%s still mounted after lazyfs exited on SIGTERM", mnt)
	}
}

// TestLazyfsConcurrentReaders: eight readers of one 1 GiB snapshot, with
// different read sizes, through the region file and through mem, each
// get the checksum the fixture computed of its mapping.
func TestLazyfsConcurrentReaders(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "1G")
	addr, size := p.Ready.MustUint(t, "addr"), p.Ready.MustUint(t, "size")
	want := p.Ready.MustUint(t, "checksum")
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, p.PID, dir)
	mnt := lazyMountLazyfs(t, dir)
	pdir := filepath.Join(mnt, strconv.Itoa(p.PID))
	// The region file that holds the mapping: the kernel may have merged
	// it with an anonymous neighbour of the same flags into one VMA.
	var region string
	var regionOff int64
	for _, r := range listRegions(t, pdir) {
		if r.Start <= addr && addr+size <= r.End {
			region, regionOff = r.Path, int64(addr-r.Start)
		}
	}
	if region == "" {
		t.Fatalf("no region file holds the mapping %#x-%#x", addr, addr+size)
	}

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			path, off := region, regionOff
			if i%2 == 1 {
				path, off = filepath.Join(pdir, "mem"), int64(addr)
			}
			bufSize := []int{4 << 10, 64 << 10, 1 << 20, 3<<20 + 4096}[i/2]
			errs[i] = func() error {
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				defer f.Close()
				h := fixture.NewHash()
				buf := make([]byte, bufSize)
				for done := int64(0); done < int64(size); {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					n, err := f.ReadAt(buf[:min(int64(len(buf)), int64(size)-done)], off+done)
					if n == 0 && err != nil {
						return fmt.Errorf("at %#x: %w", off+done, err)
					}
					h.Write(buf[:n])
					done += int64(n)
				}
				if got := h.Sum64(); got != want {
					return fmt.Errorf("checksum %#x, want %#x", got, want)
				}
				return nil
			}()
		})
	}
	wg.Wait()
	t.Logf("8 readers of %d MiB each: %v", size>>20, time.Since(start))
	for i, err := range errs {
		if err != nil {
			t.Errorf("reader %d: %v", i, err)
		}
	}
}
