package e2e

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestRestoreWeightServer restores the weightserver fixture (float32
// weights in separate malloc'ed arrays, each advised MADV_HUGEPAGE as numpy
// does, plus a heap of small objects) eagerly, lazily through the mount and
// lazily with --source direct; and the same process without the advice.
// Every answer (touch 1, touch 10, token: their checksums, page counts and
// heap checksum) must be the original's, during the lazy phase and after
// it, and the restored process must end with the VMAs the original had
// advised MADV_HUGEPAGE ("hg" in smaps) advised alike.
func TestRestoreWeightServer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	for _, advice := range []string{"hugepage", "none"} {
		t.Run(advice, func(t *testing.T) {
			ctx := testContext(t)
			// 12 arrays of 8 MiB: numpy advises arrays from 4 MiB up.
			p := fixture.Start(t, "weightserver", "96M", "0", "42", advice, "8M")
			port := int(p.Ready.MustInt(t, "port"))
			arrays := int(p.Ready.MustInt(t, "arrays"))
			reqs := []string{"touch 1", "touch 10", "token"}
			want := map[string]string{}
			for _, req := range reqs {
				want[req] = weightAnswer(lazyAsk(t, ctx, port, req))
			}
			hg := hugePageVMAs(t, p.PID)
			huge := anonHugeKiB(t, p.PID)
			t.Logf("original: %d VMAs with hg, AnonHugePages %d kB", len(hg), huge)
			if n := len(hg); (advice == "hugepage") != (n >= arrays) || (advice == "none" && n != 0) {
				t.Fatalf("advice %s, %d arrays: %d VMAs with hg in the original", advice, arrays, n)
			}
			dir, _ := dumpForRestore(t, ctx, p)

			check := func(t *testing.T, when string) {
				t.Helper()
				for _, req := range append([]string{"ping"}, reqs...) {
					got := lazyAsk(t, ctx, port, req)
					if req == "ping" {
						if got != "pong" {
							t.Errorf("%s: ping answered %q", when, got)
						}
						continue
					}
					if a := weightAnswer(got); a != want[req] {
						t.Errorf("%s: %q answered %q, the original %q", when, req, a, want[req])
					}
				}
			}
			restoreEachWay(t, ctx, p, dir, check, func(t *testing.T, mode string) {
				if got := hugePageVMAs(t, p.PID); !maps.Equal(got, hg) {
					t.Errorf("VMAs with hg: %v after the restore, %v in the original", got, hg)
				}
				// Filled with UFFDIO_COPY, the arrays hold 4 KiB pages
				// (khugepaged may collapse some meanwhile); written
				// through the fault path they would be huge pages, as in
				// the original.
				got := anonHugeKiB(t, p.PID)
				t.Logf("AnonHugePages %d kB, the original %d kB", got, huge)
				if mode == "eager" && huge > 0 && got > huge/2 {
					t.Errorf("AnonHugePages %d kB after the restore, the original %d kB: the fill went through the fault path", got, huge)
				}
			})
		})
	}
}

// weightAnswer is an answer of the weightserver without its timing (us=).
func weightAnswer(a string) string {
	l := fixture.ParseLine(a)
	return l.Event + " checksum=" + l.Fields["checksum"] + " pages=" + l.Fields["pages"] + " heap=" + l.Fields["heap"]
}

// hugePageVMAs returns the VMAs of pid whose VmFlags hold hg
// (MADV_HUGEPAGE), start to end.
func hugePageVMAs(t *testing.T, pid int) map[uint64]uint64 {
	t.Helper()
	out := map[uint64]uint64{}
	var start, end uint64
	for line := range strings.Lines(readProcFile(t, "%d/smaps", pid)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if a, b, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			s, err1 := strconv.ParseUint(a, 16, 64)
			e, err2 := strconv.ParseUint(b, 16, 64)
			if err1 == nil && err2 == nil {
				start, end = s, e
			}
			continue
		}
		if f[0] == "VmFlags:" && slices.Contains(f[1:], "hg") {
			out[start] = end
		}
	}
	return out
}

// anonHugeKiB is the AnonHugePages of pid's smaps_rollup (how much of its
// memory is in transparent huge pages), in KiB.
func anonHugeKiB(t *testing.T, pid int) uint64 {
	t.Helper()
	for line := range strings.Lines(readProcFile(t, "%d/smaps_rollup", pid)) {
		if v, ok := strings.CutPrefix(line, "AnonHugePages:"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("smaps_rollup: %q", line)
			}
			return n
		}
	}
	t.Fatal("no AnonHugePages in smaps_rollup")
	return 0
}
