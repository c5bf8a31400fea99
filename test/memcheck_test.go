package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/seal"
)

const pageSize = image.PageSize

// snapImage is one process of an opened snapshot.
type snapImage struct {
	Dir   string
	PID   int
	Snap  *image.Snapshot
	State *image.Process
	Pages *image.Reader
}

// openImage opens process pid of the snapshot in dir; the page reader is
// closed at cleanup.
func openImage(t testing.TB, dir string, pid int) *snapImage {
	t.Helper()
	// A sealed snapshot opens with the identity the test set in
	// $LAZYFS_IDENTITY (crypt_test.go).
	keys, err := seal.LoadKeyring(filepath.SplitList(os.Getenv(seal.IdentityEnv)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := image.OpenWith(dir, image.OpenOptions{Keys: keys})
	if err != nil {
		t.Fatalf("open snapshot: %v", err)
	}
	st, err := s.State(pid)
	if err != nil {
		t.Fatalf("snapshot state: %v", err)
	}
	r, err := s.OpenPages(pid, image.ReaderOptions{})
	if err != nil {
		t.Fatalf("snapshot pages: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return &snapImage{Dir: dir, PID: pid, Snap: s, State: st, Pages: r}
}

// read returns n bytes of the image at addr (holes read as zeros).
func (si *snapImage) read(t testing.TB, addr, n uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := si.Pages.ReadAt(b, int64(addr)); err != nil {
		t.Fatalf("read image at %#x+%d: %v", addr, n, err)
	}
	return b
}

// vma returns the VMA of the image that holds addr, or nil.
func (si *snapImage) vma(addr uint64) *image.VMA {
	for i := range si.State.VMAs {
		if v := &si.State.VMAs[i]; v.Start <= addr && addr < v.End {
			return v
		}
	}
	return nil
}

// mapping is one line of /proc/PID/maps.
type mapping struct {
	Start, End uint64
	Perms      string
	Offset     uint64
	Inode      uint64
	Name       string
}

func (m mapping) String() string {
	return fmt.Sprintf("%x-%x %s %08x %d %s", m.Start, m.End, m.Perms, m.Offset, m.Inode, m.Name)
}

// readMaps parses /proc/PID/maps.
func readMaps(t testing.TB, pid int) []mapping {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 5 {
			t.Fatalf("maps line %q", line)
		}
		var m mapping
		lo, hi, _ := strings.Cut(f[0], "-")
		m.Start, err = strconv.ParseUint(lo, 16, 64)
		if err == nil {
			m.End, err = strconv.ParseUint(hi, 16, 64)
		}
		if err == nil {
			m.Offset, err = strconv.ParseUint(f[2], 16, 64)
		}
		if err == nil {
			m.Inode, err = strconv.ParseUint(f[4], 10, 64)
		}
		if err != nil {
			t.Fatalf("maps line %q: %v", line, err)
		}
		m.Perms = f[1]
		if len(f) > 5 {
			// The name is the rest of the line after the inode's padding.
			i := strings.Index(line, " "+f[4]+" ")
			m.Name = strings.TrimLeft(line[i+len(f[4])+2:], " ")
		}
		out = append(out, m)
	}
	return out
}

// mappingKind classifies a maps line as the dump must: what of it the
// image holds.
type mappingKind int

const (
	mapAnon        mappingKind = iota // private anonymous: present and swapped pages
	mapFilePrivate                    // private file: pages copied on write
	mapShmem                          // shared anonymous or memfd: the object's data
	mapNotDumped                      // shared file, vdso, vvar...: nothing
)

func (m mapping) kind() mappingKind {
	shared := strings.HasSuffix(m.Perms, "s")
	anonName := m.Name == "" || m.Name == "[heap]" || m.Name == "[stack]" || strings.HasPrefix(m.Name, "[anon:")
	switch {
	case shared && (strings.HasPrefix(m.Name, "/dev/zero") || strings.HasPrefix(m.Name, "/memfd:") || strings.HasPrefix(m.Name, "[anon_shmem:")):
		return mapShmem
	case shared:
		return mapNotDumped
	case m.Inode == 0 && anonName:
		return mapAnon
	case strings.HasPrefix(m.Name, "/"):
		return mapFilePrivate
	}
	return mapNotDumped
}

// Pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61
)

// span is a range of memory and its bytes.
type span struct {
	Addr uint64
	Data []byte
}

func (s span) End() uint64 { return s.Addr + uint64(len(s.Data)) }

// memRecord is what a stopped process looked like before a dump: its
// maps, threads, page table entries, and the contents of every present
// page (reading present pages changes nothing in the process).
type memRecord struct {
	PID     int
	Maps    []mapping
	Tasks   []int
	entries map[uint64][]uint64 // mapping start -> pagemap entries
	present []span              // contents of present pages, by address
}

// takeMemory records a stopped process.
func takeMemory(t testing.TB, pid int) *memRecord {
	t.Helper()
	rec := &memRecord{PID: pid, Maps: readMaps(t, pid), Tasks: tasks(t, pid), entries: map[uint64][]uint64{}}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for _, m := range rec.Maps {
		if m.kind() == mapNotDumped && strings.HasPrefix(m.Name, "[") {
			continue // vdso, vvar, vsyscall: not ordinary memory
		}
		n := (m.End - m.Start) / pageSize
		raw := make([]byte, n*8)
		if _, err := pm.ReadAt(raw, int64(m.Start/pageSize*8)); err != nil {
			t.Fatalf("read pagemap of %s: %v", m, err)
		}
		e := make([]uint64, n)
		for i := range e {
			e[i] = binary.LittleEndian.Uint64(raw[i*8:])
		}
		rec.entries[m.Start] = e
		for _, r := range pageRuns(m.Start, e, func(x uint64) bool { return x&pmPresent != 0 }) {
			b := make([]byte, r[1]-r[0])
			if _, err := mem.ReadAt(b, int64(r[0])); err != nil {
				t.Fatalf("read present pages %#x-%#x of %s: %v", r[0], r[1], m, err)
			}
			rec.present = append(rec.present, span{r[0], b})
		}
	}
	return rec
}

// pageRuns returns the ranges of consecutive pages from start whose
// entries satisfy sel.
func pageRuns(start uint64, entries []uint64, sel func(uint64) bool) [][2]uint64 {
	var out [][2]uint64
	for i, e := range entries {
		if !sel(e) {
			continue
		}
		a := start + uint64(i)*pageSize
		if n := len(out); n > 0 && out[n-1][1] == a {
			out[n-1][1] += pageSize
		} else {
			out = append(out, [2]uint64{a, a + pageSize})
		}
	}
	return out
}

// tasks lists the thread ids of pid, sorted.
func tasks(t testing.TB, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	slices.Sort(out)
	return out
}

// allStopped reports whether every thread of pid is stopped (state T).
func allStopped(t testing.TB, pid int) bool {
	t.Helper()
	for _, tid := range tasks(t, pid) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(tid), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) || s[i+2] != 'T' {
			return false
		}
	}
	return true
}

// imageCheck counts what checkImage compared.
type imageCheck struct {
	Runs       int
	RunBytes   uint64 // bytes of dumped runs compared with memory
	ShmemBytes uint64 // bytes of shared objects compared with memory
}

// checkImage checks an image of a process that was stopped when rec was
// taken and is still stopped now, page for page:
//
//   - the process's maps and threads are as they were before the dump;
//   - the image's VMAs are the maps (bounds, permissions, offset, name)
//     and its threads are the process's;
//   - the image holds exactly the pages the dump must take (private
//     anonymous: present or swapped; private file: copied on write;
//     nothing of shared files and kernel mappings), each equal to the
//     process's memory now and before the dump;
//   - shared anonymous and memfd mappings read from the image as the
//     process's memory reads;
//   - every page present before the dump still holds the same bytes,
//     except the cpu and concurrency-id fields of each thread's rseq area,
//     which the kernel rewrites whenever a thread returns to user space
//     on another CPU (as the dump's injected system calls make it do).
func checkImage(t testing.TB, si *snapImage, rec *memRecord) imageCheck {
	t.Helper()
	var res imageCheck
	pid := rec.PID
	var kernelOwned [][2]uint64
	for _, th := range si.State.Threads {
		if th.Rseq != nil {
			kernelOwned = append(kernelOwned, [2]uint64{th.Rseq.Addr, th.Rseq.Addr + uint64(th.Rseq.Len)})
		}
	}
	// owned clears the kernel-owned fields of b, the memory at addr.
	owned := func(addr uint64, b []byte) []byte {
		end := addr + uint64(len(b))
		for _, k := range kernelOwned {
			if lo, hi := max(k[0], addr), min(k[1], end); lo < hi {
				clear(b[lo-addr : hi-addr])
			}
		}
		return b
	}
	// unchanged compares the memory at addr before and after the dump,
	// outside kernel-owned fields.
	unchanged := func(addr uint64, before, after []byte) bool {
		if bytes.Equal(before, after) {
			return true
		}
		return bytes.Equal(owned(addr, slices.Clone(before)), owned(addr, slices.Clone(after)))
	}
	if got := readMaps(t, pid); !slices.Equal(got, rec.Maps) {
		t.Errorf("maps changed by the dump:\nbefore:\n%s\nafter:\n%s", joinMaps(rec.Maps), joinMaps(got))
	}
	if got := tasks(t, pid); !slices.Equal(got, rec.Tasks) {
		t.Errorf("threads after the dump %v, before %v", got, rec.Tasks)
	}
	var tids []int
	for _, th := range si.State.Threads {
		tids = append(tids, th.TID)
	}
	slices.Sort(tids)
	if !slices.Equal(tids, rec.Tasks) {
		t.Errorf("image threads %v, process threads %v", tids, rec.Tasks)
	}

	// VMAs against maps.
	vmas := si.State.VMAs
	if len(vmas) != len(rec.Maps) {
		t.Errorf("image has %d VMAs, maps %d lines:\n%s", len(vmas), len(rec.Maps), joinMaps(rec.Maps))
	}
	for i := range min(len(vmas), len(rec.Maps)) {
		v, m := vmas[i], rec.Maps[i]
		if v.Start != m.Start || v.End != m.End || image.Perms(v) != m.Perms || v.Offset != m.Offset || v.Name != m.Name {
			t.Errorf("VMA %d: %x-%x %s %08x %q (%s), maps %s", i, v.Start, v.End, image.Perms(v), v.Offset, v.Name, v.Kind, m)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	readMem := func(addr, n uint64) []byte {
		b := make([]byte, n)
		if _, err := mem.ReadAt(b, int64(addr)); err != nil {
			t.Fatalf("read memory %#x+%d: %v", addr, n, err)
		}
		return b
	}

	// Runs: inside one VMA each, exactly the pages expected.
	runs := si.Pages.Runs()
	got := map[uint64][][2]uint64{} // VMA start -> dumped ranges
	for _, r := range runs {
		v := si.vma(r.Addr)
		if v == nil || r.End() > v.End {
			t.Fatalf("run %#x-%#x is not inside one VMA", r.Addr, r.End())
		}
		rs := got[v.Start]
		if n := len(rs); n > 0 && rs[n-1][1] == r.Addr {
			rs[n-1][1] = r.End()
		} else {
			rs = append(rs, [2]uint64{r.Addr, r.End()})
		}
		got[v.Start] = rs
	}
	for i, m := range rec.Maps {
		v := &vmas[i]
		if v.Dumped != (len(got[m.Start]) > 0) {
			t.Errorf("VMA %s: dumped=%v but the image holds %d runs in it", m, v.Dumped, len(got[m.Start]))
		}
		var want [][2]uint64
		switch m.kind() {
		case mapAnon:
			want = pageRuns(m.Start, rec.entries[m.Start], func(e uint64) bool { return e&(pmPresent|pmSwapped) != 0 })
		case mapFilePrivate:
			want = pageRuns(m.Start, rec.entries[m.Start], func(e uint64) bool {
				return e&pmSwapped != 0 || (e&pmPresent != 0 && e&pmFile == 0)
			})
		case mapShmem:
			if v.Shmem == nil {
				t.Errorf("shared memory VMA %s has no shmem reference", m)
				continue
			}
			// The object's pages, wherever the dump put them, read as
			// the mapping does.
			src := v.Shmem.Source + v.Offset
			n := m.End - m.Start
			if !bytes.Equal(si.read(t, src, n), readMem(m.Start, n)) {
				t.Errorf("shared memory VMA %s: image at %#x differs from memory", m, src)
			}
			res.ShmemBytes += n
			if v.Shmem.Source != m.Start-m.Offset && len(got[m.Start]) > 0 {
				t.Errorf("shared memory VMA %s holds runs but its object was dumped at %#x", m, v.Shmem.Source)
			}
			continue
		case mapNotDumped:
		}
		if !slices.Equal(got[m.Start], want) {
			t.Errorf("VMA %s (%s): image holds %s, want %s", m, v.Kind, fmtRanges(got[m.Start]), fmtRanges(want))
		}
	}

	// Bytes of every run: image = memory now = memory before the dump,
	// outside kernel-owned fields (a pre-copy dump holds their values at
	// the freeze, before the injected calls made the kernel rewrite them).
	for _, r := range runs {
		const chunk = 4 << 20
		for a := r.Addr; a < r.End(); a += chunk {
			n := min(chunk, r.End()-a)
			img, now := si.read(t, a, n), readMem(a, n)
			if i := firstDiff(owned(a, slices.Clone(img)), owned(a, slices.Clone(now))); i >= 0 {
				t.Fatalf("image differs from memory at %#x (run %#x-%#x): %#x, memory %#x", a+uint64(i), r.Addr, r.End(), img[i], now[i])
			}
			if before := rec.bytes(a, n); before != nil && !unchanged(a, before, now) {
				t.Errorf("memory changed during the dump: %s", describeDiff(rec, a, before, now))
			}
			res.RunBytes += n
		}
		res.Runs++
	}

	// Every present page is untouched.
	for _, s := range rec.present {
		if now := readMem(s.Addr, uint64(len(s.Data))); !unchanged(s.Addr, s.Data, now) {
			t.Errorf("memory changed during the dump: %s", describeDiff(rec, s.Addr, s.Data, now))
		}
	}
	return res
}

// bytes returns the recorded bytes of [addr, addr+n) if every page of it
// was present, else nil.
func (rec *memRecord) bytes(addr, n uint64) []byte {
	i, _ := slices.BinarySearchFunc(rec.present, addr, func(s span, a uint64) int {
		switch {
		case s.End() <= a:
			return -1
		case s.Addr > a:
			return 1
		}
		return 0
	})
	if i < len(rec.present) {
		if s := rec.present[i]; s.Addr <= addr && addr+n <= s.End() {
			return s.Data[addr-s.Addr : addr-s.Addr+n]
		}
	}
	return nil
}

// describeDiff names the mapping and the bytes that differ between two
// copies of the memory at addr.
func describeDiff(rec *memRecord, addr uint64, before, after []byte) string {
	var where string
	for _, m := range rec.Maps {
		if m.Start <= addr && addr < m.End {
			where = m.String()
		}
	}
	var diffs []string
	n := 0
	for i := range min(len(before), len(after)) {
		if before[i] != after[i] {
			if n < 16 {
				diffs = append(diffs, fmt.Sprintf("+%#x: %#02x->%#02x", i, before[i], after[i]))
			}
			n++
		}
	}
	return fmt.Sprintf("%d bytes differ in %#x+%d (mapping %s): %s", n, addr, len(before), where, strings.Join(diffs, " "))
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func joinMaps(ms []mapping) string {
	var b strings.Builder
	for _, m := range ms {
		b.WriteString(m.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func fmtRanges(rs [][2]uint64) string {
	if len(rs) == 0 {
		return "nothing"
	}
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%#x-%#x", r[0], r[1]))
	}
	if len(parts) > 8 {
		parts = append(parts[:8], fmt.Sprintf("... (%d ranges)", len(rs)))
	}
	return strings.Join(parts, " ")
}
