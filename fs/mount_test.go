package fs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// dumpedVMAs returns the dumped VMAs of the test layout.
func dumpedVMAs(vmas []imagetest.VMA) []imagetest.VMA {
	return slices.DeleteFunc(slices.Clone(vmas), func(v imagetest.VMA) bool { return v.NotDumped })
}

func TestMountTree(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	srv, _ := mount(t, s.Dir, Options{})
	mnt := srv.Mountpoint()

	manifest, err := os.ReadFile(filepath.Join(s.Dir, image.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "snapshot.json")); err != nil || !bytes.Equal(got, manifest) {
		t.Errorf("snapshot.json differs from the manifest (%v)", err)
	}
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if got, want := names(mnt), []string{"4242", "77", "snapshot.json"}; !slices.Equal(got, want) {
		t.Errorf("root holds %q, want %q", got, want)
	}
	pdir := filepath.Join(mnt, strconv.Itoa(pidA))
	if got, want := names(pdir), []string{"core", "maps", "mem", "process.json", "regions", "stats", "workingset"}; !slices.Equal(got, want) {
		t.Errorf("%s holds %q, want %q", pdir, got, want)
	}
	vmas := dumpedVMAs(layout())
	var wantRegions []string
	for _, v := range vmas {
		wantRegions = append(wantRegions, regionName(imageVMA(v)))
	}
	if got := names(filepath.Join(pdir, "regions")); !slices.Equal(got, wantRegions) {
		t.Errorf("regions %q, want %q", got, wantRegions)
	}
	if !slices.Contains(wantRegions, fmt.Sprintf("%08x-%08x-rw-p-heap", vmas[1].Start, vmas[1].End)) {
		t.Errorf("no heap region in %q", wantRegions)
	}

	// maps lists the dumped VMAs as the kernel would
	var states []image.VMA
	for _, v := range vmas {
		states = append(states, imageVMA(v))
	}
	if got, _ := os.ReadFile(filepath.Join(pdir, "maps")); string(got) != string(formatMaps(states)) {
		t.Errorf("maps:\n%s", got)
	}
	js, _ := os.ReadFile(filepath.Join(s.Dir, fmt.Sprintf("process-%d.json", pidA)))
	if got, _ := os.ReadFile(filepath.Join(pdir, "process.json")); !bytes.Equal(got, js) {
		t.Errorf("process.json differs from the stored state")
	}
	st, _ := os.ReadFile(filepath.Join(pdir, "stats"))
	if !strings.Contains(string(st), "cache_misses") || !strings.Contains(string(st), "blocks_lz4") {
		t.Errorf("stats:\n%s", st)
	}

	// owner-only, read-only, owned by the mounting user
	for _, p := range []string{mnt, pdir, filepath.Join(pdir, "mem"), filepath.Join(pdir, "maps"), filepath.Join(pdir, "regions", wantRegions[0])} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		want := uint32(unix.S_IFREG | 0o400)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			want = unix.S_IFDIR | 0o500
		}
		if st.Mode != want || st.Uid != uint32(os.Getuid()) || st.Gid != uint32(os.Getgid()) {
			t.Errorf("%s: mode %o uid %d gid %d, want %o %d %d", p, st.Mode, st.Uid, st.Gid, want, os.Getuid(), os.Getgid())
		}
	}
	if _, err := os.OpenFile(filepath.Join(pdir, "mem"), os.O_RDWR, 0); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
		t.Errorf("open mem read-write: %v, want EROFS or EACCES", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), nil, 0o600); err == nil {
		t.Errorf("created a file on the read-only mount")
	}

	// mem: size, st_blocks as the dumped bytes
	var mst unix.Stat_t
	if err := unix.Stat(filepath.Join(pdir, "mem"), &mst); err != nil {
		t.Fatal(err)
	}
	all := layout()
	if uint64(mst.Size) != all[len(all)-1].End || uint64(mst.Blocks) != s.DumpedBytes(pidA)/512 {
		t.Errorf("mem: size %#x blocks %d, want %#x %d", mst.Size, mst.Blocks, all[len(all)-1].End, s.DumpedBytes(pidA)/512)
	}
	if mst.Blksize != MaxRequest {
		t.Errorf("mem st_blksize %d, want %d", mst.Blksize, MaxRequest)
	}

	// the mount advertises what it is
	if m, err := findMount(mnt); err != nil || m.fstype != FSType {
		t.Errorf("mount %+v (%v), want type %q", m, err, FSType)
	}
}

// imageVMA returns the state record imagetest writes for v.
func imageVMA(v imagetest.VMA) image.VMA {
	flags := unix.MAP_PRIVATE
	if v.Shared {
		flags = unix.MAP_SHARED
	}
	kind := v.Kind
	if kind == "" {
		kind = image.VMAAnon
	}
	return image.VMA{Start: v.Start, End: v.End, Prot: v.Prot, Flags: flags, Kind: kind, Name: v.Name, Dumped: !v.NotDumped}
}

// TestMountMemOnly: the private mount of a lazy restore (Options.memOnly)
// holds PID/mem alone, read without the processes' states, and its bytes
// at every dumped range are the snapshot's. (A child's Forked blocks find
// their parent without the state parsed: TestForkedRefused.)
func TestMountMemOnly(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	srv, _ := mount(t, s.Dir, Options{memOnly: true})
	for _, pid := range []int{pidA, pidB} {
		pdir := filepath.Join(srv.Mountpoint(), strconv.Itoa(pid))
		ents, err := os.ReadDir(pdir)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 || ents[0].Name() != "mem" {
			t.Errorf("%s holds %v, want mem alone", pdir, ents)
		}
		f, err := os.Open(filepath.Join(pdir, "mem"))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range s.Dumped(pid) {
			got := make([]byte, r[1]-r[0])
			if _, err := f.ReadAt(got, int64(r[0])); err != nil {
				t.Fatalf("pid %d: read %#x-%#x: %v", pid, r[0], r[1], err)
			}
			if !bytes.Equal(got, s.Memory(pid, r[0], len(got))) {
				t.Errorf("pid %d: %#x-%#x differs from the snapshot's memory", pid, r[0], r[1])
			}
		}
		f.Close()
	}
}

// TestMountTools reads the mount with the tools people use on memory
// images.
func TestMountTools(t *testing.T) {
	s := writeSnapshot(t, 256<<10)
	srv, _ := mount(t, s.Dir, Options{})
	pdir := filepath.Join(srv.Mountpoint(), strconv.Itoa(pidA))
	mem := filepath.Join(pdir, "mem")
	vmas := dumpedVMAs(layout())

	t.Run("cmp and sha256sum of every region", func(t *testing.T) {
		for _, v := range vmas {
			want := s.Memory(pidA, v.Start, int(v.End-v.Start))
			reg := filepath.Join(pdir, "regions", regionName(imageVMA(v)))
			testutil.Output(t, "cmp", reg, testutil.WriteTemp(t, want))
			sum := sha256.Sum256(want)
			out := testutil.Output(t, "sha256sum", reg)
			if got := strings.Fields(string(out))[0]; got != hex.EncodeToString(sum[:]) {
				t.Errorf("sha256sum %s = %s, want %x", reg, got, sum)
			}
		}
	})
	t.Run("dd of mem", func(t *testing.T) {
		for _, tc := range []struct{ addr, pages uint64 }{
			{vmas[0].Start, 3},             // text, then the heap it touches
			{vmas[1].Start + pages(8), 7},  // across a hole inside the heap
			{vmas[2].Start - pages(2), 40}, // from before the random VMA into it
			{vmas[3].End - pages(1), 5},    // across the end of a VMA into a gap
			{vmas[len(vmas)-1].End - pages(3), 3},
		} {
			out := testutil.Output(t, "dd", "if="+mem, "bs=4096", fmt.Sprintf("skip=%d", tc.addr/4096), fmt.Sprintf("count=%d", tc.pages), "status=none")
			if !bytes.Equal(out, s.Memory(pidA, tc.addr, int(pages(tc.pages)))) {
				t.Errorf("dd at %#x, %d pages: differs", tc.addr, tc.pages)
			}
		}
	})
	t.Run("xxd of mem", func(t *testing.T) {
		for _, addr := range []uint64{vmas[0].Start, vmas[1].Start + 4090, vmas[4].Start + 12345} {
			got := testutil.Output(t, "xxd", "-s", fmt.Sprint(addr), "-l", "64", mem)
			want := testutil.Output(t, "xxd", "-o", fmt.Sprint(addr), "-l", "64", testutil.WriteTemp(t, s.Memory(pidA, addr, 64)))
			if !bytes.Equal(got, want) {
				t.Errorf("xxd at %#x:\n%s\nwant\n%s", addr, got, want)
			}
		}
	})
	t.Run("strings finds the markers", func(t *testing.T) {
		regs, err := filepath.Glob(filepath.Join(pdir, "regions", "*"))
		if err != nil || len(regs) == 0 {
			t.Fatal(regs, err)
		}
		out := testutil.Output(t, "strings", regs...)
		var n int
		marker := fmt.Sprintf("%s pid=%d addr=", imagetest.Marker, pidA)
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, marker) {
				n++
			}
		}
		// every page of a text VMA starts with a marker; patchwork VMAs hold more
		var text int
		for _, v := range vmas {
			if v.Content == imagetest.Text {
				text += int((v.End - v.Start) / imagetest.PageSize)
			}
		}
		if n < text {
			t.Errorf("strings found %d markers, want at least %d", n, text)
		}
	})
	t.Run("lseek enumerates the dumped ranges", func(t *testing.T) {
		f, err := os.Open(mem)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got := seekAll(t, func(off uint64, whence uint32) (uint64, syscall.Errno) {
			n, err := unix.Seek(int(f.Fd()), int64(off), int(whence))
			if err != nil {
				return 0, err.(syscall.Errno)
			}
			return uint64(n), 0
		})
		if want := s.Dumped(pidA); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("SEEK_DATA/SEEK_HOLE give\n%x\nwant\n%x", got, want)
		}
	})
	t.Run("cp --sparse=always keeps the holes", func(t *testing.T) {
		testutil.RequireCommand(t, "cp")
		dst := filepath.Join(shmDir(t), "mem")
		testutil.Output(t, "timeout", "60", "cp", "--sparse=always", mem, dst)
		var st unix.Stat_t
		if err := unix.Stat(dst, &st); err != nil {
			t.Fatal(err)
		}
		all := layout()
		if uint64(st.Size) != all[len(all)-1].End {
			t.Errorf("copy size %#x", st.Size)
		}
		// allocated: at most the dumped bytes (cp also punches the zero pages)
		if alloc := uint64(st.Blocks) * 512; alloc > s.DumpedBytes(pidA) || alloc == 0 {
			t.Errorf("copy allocates %d bytes, dumped %d", alloc, s.DumpedBytes(pidA))
		}
		f, err := os.Open(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, r := range s.Dumped(pidA) {
			got := make([]byte, r[1]-r[0]+2*4096)
			if _, err := f.ReadAt(got, int64(r[0]-4096)); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if !bytes.Equal(got, s.Memory(pidA, r[0]-4096, len(got))) {
				t.Errorf("copy differs around %#x-%#x", r[0], r[1])
			}
		}
	})
	t.Run("random preads", func(t *testing.T) {
		f, err := os.Open(mem)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		rnd := rand.New(rand.NewPCG(5, 5))
		lo, hi := vmas[0].Start-pages(3), vmas[len(vmas)-1].End+pages(3)
		for i := 0; i < 400; i++ {
			off := lo + rnd.Uint64N(hi-lo)
			n := 1 + rnd.IntN(3<<20)
			if i%2 == 0 {
				n = 1 + rnd.IntN(9000)
			}
			got := make([]byte, n)
			k, err := f.ReadAt(got, int64(off))
			if err != nil && err != io.EOF {
				t.Fatalf("pread %#x+%d: %v", off, n, err)
			}
			end := min(off+uint64(n), vmas[len(vmas)-1].End)
			if uint64(k) != end-min(off, end) || !bytes.Equal(got[:k], s.Memory(pidA, off, k)) {
				t.Fatalf("pread %#x+%d: %d bytes, differ", off, n, k)
			}
		}
	})
	t.Run("other process", func(t *testing.T) {
		for _, v := range smallLayout() {
			reg := filepath.Join(srv.Mountpoint(), strconv.Itoa(pidB), "regions", regionName(imageVMA(v)))
			got, err := os.ReadFile(reg)
			if err != nil || !bytes.Equal(got, s.Memory(pidB, v.Start, int(v.End-v.Start))) {
				t.Errorf("%s differs (%v)", reg, err)
			}
		}
	})
}

// shmDir returns a fresh directory on a tmpfs.
func shmDir(t testing.TB) string {
	t.Helper()
	var sfs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
		t.Skipf("/dev/shm is not a tmpfs (%v)", err)
	}
	d, err := os.MkdirTemp("/dev/shm", "lazyfs-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestFUSEDescriptorCloseOnExec: a child of the serving process (a
// restored process) must not inherit the FUSE connection, or it would
// keep it alive after the server is gone.
func TestFUSEDescriptorCloseOnExec(t *testing.T) {
	s := writeSnapshot(t, 64<<10)
	mount(t, s.Dir, Options{})
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); l != "/dev/fuse" {
			continue
		}
		n++
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, _ := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
				if flags&unix.O_CLOEXEC == 0 {
					t.Errorf("fd %s on /dev/fuse is inherited by children (flags %o)", e.Name(), flags)
				}
			}
		}
	}
	if n == 0 {
		t.Errorf("no /dev/fuse descriptor found")
	}
}
