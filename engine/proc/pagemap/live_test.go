package pagemap

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/proc"
	"golang.org/x/sys/unix"
)

const page = proc.PageSize

// TestLiveAnonymousPages: pages 0, 1 and 5 of an anonymous mapping
// written, page 2 read: present either way, the shared zero page or a
// private page of zeros as this kernel does it (probed).
func TestLiveAnonymousPages(t *testing.T) {
	b := mapTestRegion(t, 8, func(i int) bool { return i == 0 || i == 1 || i == 5 })
	_ = readByte(&b[2*page])
	anon := addrOf(b)
	p := openSelfPagemap(t)
	zeroPage, err := ReadFaultMapsZeroPage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a read fault maps the zero page: %v", zeroPage)
	want := []Run{{anon, anon + 3*page, 0}, {anon + 5*page, anon + 6*page, 0}}
	if got, err := p.Populated(anon, anon+8*page, nil); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Populated(anon) = %x, %v; want %x", got, err, want)
	}
	es := make([]Entry, 3)
	if n, err := p.ReadEntries(anon, es); err != nil || n != 3 {
		t.Fatalf("ReadEntries = %d, %v", n, err)
	}
	if !es[0].Present() || !es[0].Exclusive() || es[0].File() {
		t.Errorf("anon entry %x: want page 0 present exclusive anonymous", es[0])
	}
	if !es[2].Present() || es[2].File() || es[2].Exclusive() == zeroPage {
		t.Errorf("anon entry %x of the page read: want present, anonymous, exclusive %v (zero page %v)", es[2], !zeroPage, zeroPage)
	}
	if p.ScanSupported() {
		zero, err := p.RunsScan(Query{Start: anon, End: anon + 8*page, Require: PagePFNZero}, nil)
		var w []Run
		if zeroPage {
			w = []Run{{anon + 2*page, anon + 3*page, 0}}
		}
		if err != nil || !reflect.DeepEqual(zero, w) {
			t.Errorf("zero-page runs %x, %v; want %x", zero, err, w)
		}
	}
}

// TestLiveFilePrivatePages: of a private file mapping, page 0 read (the
// page cache) and page 1 copied on write.
func TestLiveFilePrivatePages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, make([]byte, 4*page), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, 4*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	_ = readByte(&b[0])
	b[page] = 1
	fp := addrOf(b)
	p := openSelfPagemap(t)
	want := []Run{{fp + page, fp + 2*page, 0}}
	if got, err := p.Anonymous(fp, fp+4*page, nil); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Anonymous(file private) = %x, %v; want %x", got, err, want)
	}
	es := make([]Entry, 1)
	if n, err := p.ReadEntries(fp, es); err != nil || n != 1 || !es[0].Present() || !es[0].File() {
		t.Errorf("file page entry %x, %v", es[0], err)
	}
}

// TestLiveMethodsAgree: both methods agree on every mapping of a stopped
// process, whose page tables do not change while they are read.
func TestLiveMethodsAgree(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st, err := proc.ReadStat(pid); err == nil && st.State == 'T' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child did not stop")
		}
	}
	ms, err := proc.ReadMappings(pid)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.ScanSupported() {
		t.Skip("PAGEMAP_SCAN unsupported by this kernel")
	}
	for i := range ms {
		m := &ms[i]
		if m.IsSpecial() {
			continue
		}
		for _, q := range []Query{
			{Start: m.Start, End: m.End, AnyOf: PagePresent | PageSwapped},
			{Start: m.Start, End: m.End, AnyOf: PagePresent | PageSwapped, Exclude: PageFile},
			{Start: m.Start, End: m.End, Require: PagePresent, Return: PageFile},
		} {
			r, err1 := p.RunsRead(q, nil)
			s, err2 := p.RunsScan(q, nil)
			if err1 != nil || err2 != nil || !reflect.DeepEqual(r, s) {
				t.Errorf("%v query %+v: read %x (%v), scan %x (%v)", m, q, r, err1, s, err2)
			}
		}
	}
}

func TestLiveMissingProcess(t *testing.T) {
	// A pid above pid_max never exists.
	if _, err := Open(1 << 23); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open: %v", err)
	}
}
