package pagemap

import (
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/lazyfs/lazyfs/engine/proc"
	"golang.org/x/sys/unix"
)

// mapTestRegion maps pages anonymous private pages, writes the pages for
// which touch returns true, and unmaps at cleanup.
func mapTestRegion(t testing.TB, pages int, touch func(i int) bool) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, pages*proc.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	// Keep the range out of transparent huge pages so that the pattern
	// below is what the page tables hold.
	if err := unix.Madvise(b, unix.MADV_NOHUGEPAGE); err != nil {
		t.Fatalf("madvise: %v", err)
	}
	for i := 0; i < pages; i++ {
		if touch(i) {
			b[i*proc.PageSize] = 1
		}
	}
	return b
}

func addrOf(b []byte) uint64 { return uint64(uintptrOf(b)) }

func openSelfPagemap(t testing.TB) *Pagemap {
	t.Helper()
	p, err := Open(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestPagemapRunsSelf(t *testing.T) {
	const pages = 256
	// Runs of written pages: 0-9, 20, 30-99, 200-255.
	touch := func(i int) bool { return i < 10 || i == 20 || (i >= 30 && i < 100) || i >= 200 }
	b := mapTestRegion(t, pages, touch)
	start := addrOf(b)
	want := []Run{
		{start, start + 10*proc.PageSize, 0},
		{start + 20*proc.PageSize, start + 21*proc.PageSize, 0},
		{start + 30*proc.PageSize, start + 100*proc.PageSize, 0},
		{start + 200*proc.PageSize, start + 256*proc.PageSize, 0},
	}
	p := openSelfPagemap(t)
	got, err := p.RunsRead(Query{Start: start, End: start + pages*proc.PageSize, AnyOf: PagePresent | PageSwapped}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read runs = %x, want %x", got, want)
	}
	if !p.ScanSupported() {
		t.Skip("PAGEMAP_SCAN unsupported by this kernel")
	}
	got, err = p.RunsScan(Query{Start: start, End: start + pages*proc.PageSize, AnyOf: PagePresent | PageSwapped}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("scan runs = %x, want %x", got, want)
	}
	// Populated uses the default method and must agree.
	got, err = p.Populated(start, start+pages*proc.PageSize, nil)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Populated = %x, %v; want %x", got, err, want)
	}
}

func TestPagemapEntriesSelf(t *testing.T) {
	b := mapTestRegion(t, 4, func(i int) bool { return i == 1 })
	p := openSelfPagemap(t)
	es := make([]Entry, 4)
	n, err := p.ReadEntries(addrOf(b), es)
	if err != nil || n != 4 {
		t.Fatalf("ReadEntries = %d, %v", n, err)
	}
	if es[0].Present() || !es[1].Present() || es[2].Present() {
		t.Fatalf("entries %x: want only page 1 present", es)
	}
	if es[1].File() || !es[1].Exclusive() {
		t.Fatalf("entry %x: a written private anonymous page is exclusive and not file", es[1])
	}
}

func TestPagemapQueryErrors(t *testing.T) {
	p := openSelfPagemap(t)
	if _, err := p.RunsRead(Query{Start: 1, End: proc.PageSize, AnyOf: PagePresent}, nil); err == nil {
		t.Fatal("unaligned query accepted")
	}
	if _, err := p.RunsRead(Query{Start: 0, End: proc.PageSize, Require: PageWritten}, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("read of PageWritten: %v, want ErrUnsupported", err)
	}
	if p.ScanSupported() {
		if _, err := p.RunsScan(Query{Start: 0, End: proc.PageSize, Require: PageExclusive}, nil); !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("scan of PageExclusive: %v, want ErrUnsupported", err)
		}
	}
}

// TestPagemapScanMatchesRead checks that both methods report the same runs
// on irregular patterns, including when the ioctl's region vector fills up
// and the scan resumes (vector lengths down to one region).
func TestPagemapScanMatchesRead(t *testing.T) {
	p := openSelfPagemap(t)
	if !p.ScanSupported() {
		t.Skip("PAGEMAP_SCAN unsupported by this kernel")
	}
	for _, pages := range []int{4096, 4099, 20000} {
		for _, mod := range []int{2, 3, 7} {
			b := mapTestRegion(t, pages, func(i int) bool { return i%mod == 0 || i%5 == 0 })
			q := Query{Start: addrOf(b), End: addrOf(b) + uint64(pages)*proc.PageSize, AnyOf: PagePresent | PageSwapped}
			want, err := p.RunsRead(q, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, vl := range []int{1, 2, 100, scanVecLen} {
				p.vec = make([]pageRegion, vl)
				got, err := p.RunsScan(q, nil)
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("pages %d mod %d vec %d: scan %d runs (%v), read %d runs", pages, mod, vl, len(got), err, len(want))
				}
			}
		}
	}
}

func TestPagemapSetMethod(t *testing.T) {
	b := mapTestRegion(t, 16, func(i int) bool { return i%4 == 0 })
	p := openSelfPagemap(t)
	start := addrOf(b)
	want, err := p.RunsRead(Query{Start: start, End: start + 16*proc.PageSize, AnyOf: PagePresent}, nil)
	if err != nil || len(want) != 4 {
		t.Fatalf("read runs %x, %v", want, err)
	}
	if err := p.SetMethod(MethodRead); err != nil || p.Method() != MethodRead {
		t.Fatalf("SetMethod(read): %v", err)
	}
	if got, err := p.Populated(start, start+16*proc.PageSize, nil); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Populated with read method = %x, %v", got, err)
	}
	if err := p.SetMethod(Method(7)); err == nil {
		t.Errorf("SetMethod accepted an unknown method")
	}
	if err := p.SetMethod(MethodScan); p.ScanSupported() != (err == nil) {
		t.Errorf("SetMethod(scan) = %v with ScanSupported %v", err, p.ScanSupported())
	}
	// Exclusive is known only from entries: Runs answers it by reading,
	// whatever the method. Every written page here is exclusive.
	got, err := p.Runs(Query{Start: start, End: start + 16*proc.PageSize, Require: PagePresent | PageExclusive}, nil)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Runs(exclusive) = %x, %v", got, err)
	}
}
