package e2e

import (
	"strings"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestRestoreTorchServer restores a real PyTorch model server
// (fixtures/torchserver.py on Debian's python3-torch), the smaller shape
// of make bench's: 2 layers of width 256 (a 51 MB token embedding, ~60 MB
// of weights in all) beside what every PyTorch process holds, libtorch's
// libraries and their ~1,600 mappings, an OpenMP runtime, the
// interpreter's heap. It is restored eagerly, lazily through the private
// mount and lazily with --source direct; each time, the first token (a
// forward pass that reads every weight) must be the original's, argmax
// and the checksum of every logit, during the lazy phase and after it.
func TestRestoreTorchServer(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	p := fixture.StartTorch(t, "2", "256")
	t.Logf("%s", p.Ready.Text)
	want := torchAnswer(t, lazyAsk(t, ctx, p.Port, "token"))
	if again := torchAnswer(t, lazyAsk(t, ctx, p.Port, "token")); again != want {
		t.Fatalf("the original answers %q, then %q: its forward pass is not deterministic", want, again)
	}
	if n := len(strings.Split(readProcFile(t, "%d/maps", p.PID), "\n")); n < 500 {
		t.Fatalf("the original has %d mappings; a PyTorch process has over a thousand", n)
	}
	dir, _ := dumpForRestore(t, ctx, p)

	check := func(t *testing.T, when string) {
		t.Helper()
		if got := lazyAsk(t, ctx, p.Port, "ping"); got != "pong" {
			t.Errorf("%s: ping answered %q", when, got)
		}
		if got := torchAnswer(t, lazyAsk(t, ctx, p.Port, "token")); got != want {
			t.Errorf("%s: token answered %q, the original %q", when, got, want)
		}
	}
	restoreEachWay(t, ctx, p, dir, check, nil)
}

// torchAnswer is a token answer of the torchserver without its timing.
func torchAnswer(t *testing.T, a string) string {
	t.Helper()
	l := fixture.ParseLine(a)
	if l.Event != "token" || l.Fields["argmax"] == "" || l.Fields["checksum"] == "" {
		t.Fatalf("torchserver answered %q to token", a)
	}
	return "token argmax=" + l.Fields["argmax"] + " checksum=" + l.Fields["checksum"]
}
