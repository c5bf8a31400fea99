package e2e

import (
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestShuffleCodec dumps the two model servers, bf16 weights (modelserver)
// and float32 weights in many arrays (weightserver), with each shuffling
// codec: the image must equal the stopped process's memory page for page
// (decoded through the image reader), hold shuffled blocks and name the
// codec and the shuffle feature in its manifest. (float32 weights stay
// raw with shuffle-lz4: only their exponent plane shrinks, by less than
// the 12.5% a block must save; they shuffle with shuffle-huff.) The snapshot is then
// restored eagerly, lazily through the private mount and lazily from the
// files, and each restored server must answer `token` (a checksum of all
// its weights, and of its heap) as the original did.
func TestShuffleCodec(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	servers := []struct {
		name    string
		args    []string
		weights string // the ready field of the weights' size
		lz4     bool   // the weights shuffle with LZ4 planes
	}{
		{"modelserver", []string{"16M"}, "weights_len", true},
		{"weightserver", []string{"8M", "0", "42", "hugepage", "4M"}, "size", false},
	}
	for _, srv := range servers {
		for _, codecName := range []string{"shuffle-lz4", "shuffle-huff"} {
			t.Run(srv.name+"/"+codecName, func(t *testing.T) {
				ctx := testContext(t)
				p := fixture.Start(t, srv.name, srv.args...)
				port := int(p.Ready.MustInt(t, "port"))
				si, _ := dumpRecorded(t, ctx, p, "--codec", codecName)
				want := lazyAsk(t, ctx, port, "token")
				m := si.Snap.Manifest
				st := si.Pages.Stats()
				t.Logf("%s: ratio %.3f, %d shuffle blocks (%d of %d bytes), %d raw, %d lz4",
					codecName, st.Ratio(), st.Shuffle.Blocks, st.Shuffle.Stored, st.Shuffle.Bytes, st.Raw.Blocks, st.LZ4.Blocks)
				if m.Compression != codecName || !m.HasFeature(image.FeatureShuffle) {
					t.Fatalf("manifest: compression %q, features %v", m.Compression, m.Features)
				}
				if w := p.Ready.MustUint(t, srv.weights); (srv.lz4 || codecName == "shuffle-huff") && st.Shuffle.Bytes < w {
					t.Errorf("%d bytes in shuffle blocks, fewer than the %d bytes of weights", st.Shuffle.Bytes, w)
				}
				if err := p.Kill(ctx); err != nil {
					t.Fatal(err)
				}

				check := func(how string) {
					t.Helper()
					if got := lazyAsk(t, ctx, port, "token"); tokenSums(got) != tokenSums(want) {
						t.Errorf("%s restore answers %q, the original %q", how, got, want)
					}
				}
				restoreAndAdopt(t, p, si.Dir)
				check("eager")
				if err := p.Kill(ctx); err != nil {
					t.Fatal(err)
				}
				for _, source := range []string{"mount", "direct"} {
					l := startLazy(t, si.Dir, "--source", source)
					pid := l.waitRunning(t, ctx)
					if err := p.Adopt(); err != nil {
						t.Fatal(err)
					}
					check("lazy --source " + source)
					l.mustFinish(t, ctx, pid)
					if err := p.Kill(ctx); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// tokenSums is the memory and heap checksums of a `token` answer, without
// its timing.
func tokenSums(answer string) string {
	l := fixture.ParseLine(answer)
	c, _ := l.Value("checksum")
	h, _ := l.Value("heap")
	if c == "" || h == "" || !strings.HasPrefix(answer, "token ") {
		return "bad answer " + answer
	}
	return c + " " + h
}
