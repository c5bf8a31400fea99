package report

import (
	"strings"
	"testing"
	"time"
)

// TestCodecSeries renders and validates synthetic results of the codec
// series, and checks that validate catches a shuffling codec that
// shuffled nothing and a missing run.
func TestCodecSeries(t *testing.T) {
	const runs = 3
	sr := &SizeResult{Size: 1 << 30}
	for _, fx := range []struct{ Name, Weights string }{{"modelserver", "bf16"}, {"weightserver", "float32"}} {
		for i, name := range []string{"lz4", "shuffle-lz4", "shuffle-huff"} {
			c := &CodecResult{Fixture: fx.Name, Weights: fx.Weights, Codec: name, Memory: 1 << 30,
				Pages: 900 << 20, WeightBytes: 512 << 20, WeightStored: uint64(512-100*i) << 20,
				Dump: time.Second, Freeze: time.Second}
			if name != "lz4" {
				c.Shuffled = 512 << 20
			}
			for _, k := range CodecCases(false) {
				rr := &RestoreResult{Case: k}
				for r := range runs {
					rr.Runs = append(rr.Runs, RestoreRun{Token: time.Duration(900+r) * time.Millisecond})
				}
				c.Restores = append(c.Restores, rr)
			}
			sr.Codecs = append(sr.Codecs, c)
		}
	}
	var errs []string
	bad := func(f string, a ...any) { errs = append(errs, f) }
	validateCodecs(runs, sr, bad)
	if len(errs) > 0 {
		t.Fatalf("plausible results rejected: %v", errs)
	}
	var m md
	renderCodecs(&m, sr)
	out := m.String()
	for _, want := range []string{"### Block codecs", "| weightserver (float32) | `shuffle-huff` |", "0.805", "901 ms (900–902)"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	sr.Codecs[1].Shuffled = 0
	sr.Codecs[2].Restores[0].Runs = sr.Codecs[2].Restores[0].Runs[:1]
	errs = nil
	validateCodecs(runs, sr, bad)
	if len(errs) != 2 {
		t.Errorf("validate found %d problems, want 2: %v", len(errs), errs)
	}
}
