package e2e

import (
	"reflect"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/pagemap"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// zeroBlock is one block of a dump, by its offset in the mapping it lies
// in: what a dump stored for memory, independent of where the kernel put
// the mapping.
type zeroBlock struct {
	Mapping string // "a" or "h" (test/fixtures/zeroread.c)
	Off     uint64
	Len     uint32
	Kind    codec.Kind
}

// TestZeroPageEitherWay: memory a process has only read is dumped as the
// same blocks and restored (eagerly and lazily) as the same memory, whether
// the kernel mapped the shared zero page on the read fault (most kernels)
// or a private page of zeros (some: probed with pagemap.ReadFaultMapsZeroPage,
// never assumed). The zeroread fixture makes its "zero" memory three ways:
// by reading it (this kernel's choice), with the zero page placed by
// UFFDIO_ZEROPAGE (the zero page on every kernel), and by writing zeros
// (private pages on every kernel); its huge-page mapping gets whatever
// this kernel's THP policy makes of the same. Every way must give the
// blocks of the first, ZERO where the memory is zero, and no block where
// the process never touched its memory.
func TestZeroPageEitherWay(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	zeroPage, err := pagemap.ReadFaultMapsZeroPage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this kernel maps the zero page on a read fault: %v", zeroPage)

	var ref []zeroBlock
	for _, mode := range []string{"read", "zeropage", "write0"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.Start(t, "zeroread", mode)
			aAddr, aLen := p.Ready.MustUint(t, "a_addr"), p.Ready.MustUint(t, "a_len")
			hAddr, hLen := p.Ready.MustUint(t, "h_addr"), p.Ready.MustUint(t, "h_len")
			seg := p.Ready.MustUint(t, "seg")
			sumA, sumH := p.Ready.MustUint(t, "checksum_a"), p.Ready.MustUint(t, "checksum_h")

			// What the kernel mapped for the zero memory: present in
			// every mode, the shared zero page where the mode or this
			// kernel says so.
			want := "exclusive"
			if mode == "zeropage" || mode == "read" && zeroPage {
				want = "shared"
			}
			checkZeroEntries(t, p.PID, aAddr+seg, seg/proc.PageSize, want)
			checkZeroEntries(t, p.PID, hAddr, hLen/2/proc.PageSize, "")

			dir, si := dumpForRestore(t, ctx, p)
			var blocks []zeroBlock
			for b := range si.Pages.Blocks() {
				switch {
				case b.Addr >= aAddr && b.End() <= aAddr+aLen:
					blocks = append(blocks, zeroBlock{"a", b.Addr - aAddr, b.Len, b.Kind})
				case b.Addr >= hAddr && b.End() <= hAddr+hLen:
					blocks = append(blocks, zeroBlock{"h", b.Addr - hAddr, b.Len, b.Kind})
				case b.Addr < aAddr+aLen && b.End() > aAddr || b.Addr < hAddr+hLen && b.End() > hAddr:
					t.Errorf("block %+v crosses a mapping's edge", b)
				}
			}
			checkZeroLayout(t, blocks, seg, hLen)
			if ref == nil {
				ref = blocks
			} else if !reflect.DeepEqual(blocks, ref) {
				t.Errorf("mode %s dumped blocks\n%+v\nmode read dumped\n%+v", mode, blocks, ref)
			}

			check := func(how string) {
				t.Helper()
				r := request(t, ctx, p, syscall.SIGUSR1, "report")
				if got := r.MustUint(t, "checksum_a"); got != sumA {
					t.Errorf("%s: mapping a checksum %#x, want %#x", how, got, sumA)
				}
				if got := r.MustUint(t, "checksum_h"); got != sumH {
					t.Errorf("%s: mapping h checksum %#x, want %#x", how, got, sumH)
				}
			}
			restoreAndAdopt(t, p, dir)
			check("eager restore")
			lazyKill(t, ctx, p)

			l := startLazy(t, dir)
			if pid := l.waitRunning(t, ctx); pid != p.PID {
				t.Fatalf("pidfile names %d, want %d", pid, p.PID)
			}
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
			check("lazy restore")
			l.mustFinish(t, ctx, p.PID)
			check("lazy restore, all memory in")
			lazyKill(t, ctx, p)
		})
	}
}

// checkZeroEntries checks that the n pages at addr of pid are present
// private anonymous memory and, as want says, the shared zero page
// ("shared": not exclusively mapped), a private page of their own
// ("exclusive") or either (""). Either includes the huge zero page, which
// a read fault of a huge-page range maps where THP's use_zero_page is on:
// pagemap reports it as shared and, not being an anonymous page, as file
// memory.
func checkZeroEntries(t *testing.T, pid int, addr, n uint64, want string) {
	t.Helper()
	pm, err := pagemap.Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	es := make([]pagemap.Entry, n)
	if got, err := pm.ReadEntries(addr, es); err != nil || uint64(got) != n {
		t.Fatalf("pagemap at %#x: %d entries, %v", addr, got, err)
	}
	for i, e := range es {
		got := "shared"
		if e.Exclusive() {
			got = "exclusive"
		}
		hugeZero := want == "" && e.File() && !e.Exclusive()
		if !e.Present() || e.File() && !hugeZero || want != "" && got != want {
			t.Fatalf("page %#x: pagemap entry %#x (present %v, file %v, %s), want present anonymous %s",
				addr+uint64(i)*proc.PageSize, uint64(e), e.Present(), e.File(), got, want)
		}
	}
}

// checkZeroLayout checks what zeroread's layout must dump as: in a, data
// segments 0 and 3 stored, zero segments 1, 4 and 7 ZERO, untouched 2 and
// 6 absent, segment 5 one block of zeros then data; in h, its first half
// ZERO, its second stored.
func checkZeroLayout(t *testing.T, blocks []zeroBlock, seg, hLen uint64) {
	t.Helper()
	kinds := map[string]map[uint64]codec.Kind{"a": {}, "h": {}}
	for _, b := range blocks {
		if uint64(b.Len) != seg && !(b.Mapping == "h" && uint64(b.Len) <= seg) {
			t.Errorf("block %+v: want blocks of %d bytes (the default block size)", b, seg)
		}
		kinds[b.Mapping][b.Off] = b.Kind
	}
	stored := func(k codec.Kind) bool { return k == codec.Raw || k == codec.LZ4 }
	a := kinds["a"]
	for i, want := range []string{"data", "zero", "none", "data", "zero", "half", "none", "zero"} {
		k, ok := a[uint64(i)*seg]
		bad := false
		switch want {
		case "data", "half":
			bad = !ok || !stored(k)
		case "zero":
			bad = !ok || k != codec.Zero
		case "none":
			bad = ok
		}
		if bad {
			t.Errorf("a, segment %d (%s): block kind %v (dumped %v)", i, want, k, ok)
		}
	}
	for off, k := range kinds["h"] {
		if want := off >= hLen/2; stored(k) != want || !want && k != codec.Zero {
			t.Errorf("h at +%#x: block kind %v", off, k)
		}
	}
	if n := uint64(len(kinds["h"])) * seg; n != hLen {
		t.Errorf("h: %d bytes of blocks, want %d (all of it was touched)", n, hLen)
	}
}
