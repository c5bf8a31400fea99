package report

import (
	"fmt"
	"slices"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
)

// TorchResult is the torch series.
type TorchResult struct {
	Shape   string // layers and width
	Params  int64
	Weights uint64 // bytes of the model's parameters
	Memory  string // what the snapshot holds, as snapctl dump says
	Image   uint64 // the snapshot directory
	Maps    int    // mappings of the original process
	Dump    []time.Duration
	Freeze  []time.Duration
	// CRIU is the criu used ("criu 4.2 at /path"), or why none was.
	CRIU      string
	CRIUUsed  bool
	CRIUImage uint64
	CRIUDump  []time.Duration
	Restores  []*TorchRestore
}

// TorchRestore is one restore case of the series.
type TorchRestore struct {
	Label   string // "eager", "lazy, --source mount", "CRIU lazy-pages"...
	CRIU    bool
	Cold    bool
	Ping    []time.Duration
	Token   []time.Duration
	Running []time.Duration // lazyfs lazy: "running after"
	AllIn   []time.Duration // lazyfs: eager "in", lazy "all memory in after"
	Faults  []int           // lazyfs lazy: faults served
	Served  []string        // lazyfs lazy: bytes served on faults, as printed
}

// TorchCases are the restores of each round, in order.
func TorchCases(criu bool) []*TorchRestore {
	var cs []*TorchRestore
	for _, cold := range []bool{false, true} {
		for _, l := range []string{"eager", "lazy, --source mount", "lazy, --source direct"} {
			cs = append(cs, &TorchRestore{Label: l, Cold: cold})
		}
		if criu {
			for _, l := range []string{"CRIU restore", "CRIU lazy-pages"} {
				cs = append(cs, &TorchRestore{Label: l, Cold: cold, CRIU: true})
			}
		}
	}
	return cs
}

func ColdName(cold bool) string {
	if cold {
		return "cold"
	}
	return "warm"
}

func validateTorch(runs int, sr *SizeResult, bad func(string, ...any)) {
	tr := sr.Torch
	if tr == nil {
		return
	}
	if len(tr.Dump) != runs || len(tr.Freeze) != runs {
		bad("torch: %d dumps for %d runs", len(tr.Dump), runs)
	}
	if tr.CRIUUsed && len(tr.CRIUDump) != runs {
		bad("torch: %d CRIU dumps for %d runs", len(tr.CRIUDump), runs)
	}
	if len(tr.Restores) != len(TorchCases(tr.CRIUUsed)) {
		bad("torch: %d restore cases, want %d", len(tr.Restores), len(TorchCases(tr.CRIUUsed)))
	}
	for _, c := range tr.Restores {
		if len(c.Ping) != runs || len(c.Token) != runs {
			bad("torch %s %s: %d ping and %d token figures for %d runs", c.Label, ColdName(c.Cold), len(c.Ping), len(c.Token), runs)
		}
		for i := range c.Ping {
			if i < len(c.Token) && c.Ping[i] > c.Token[i] {
				bad("torch %s: ping %s after token %s", c.Label, c.Ping[i], c.Token[i])
			}
		}
	}
}

// find returns the case labelled l, cold or warm.
func (tr *TorchResult) find(l string, cold bool) *TorchRestore {
	for _, c := range tr.Restores {
		if c.Label == l && c.Cold == cold {
			return c
		}
	}
	return nil
}

// ratio is a's median over b's, "—" without both.
func ratio(a, b []time.Duration) string {
	x, y := Summarize(a), Summarize(b)
	if !x.Valid() || !y.Valid() || y.Med == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", float64(x.Med)/float64(y.Med))
}

func renderTorch(m *md, sr *SizeResult) {
	tr := sr.Torch
	if tr == nil {
		return
	}
	m.p("### PyTorch server: first token")
	m.p("")
	m.p("`test/fixtures/torchserver.py` on Debian's python3-torch 1.13: a GPT-2-shaped transformer, %s (%d parameters, %s of float32 weights, drawn from N(0, 0.02) with a fixed seed), warmed up by one forward pass; the process maps %d regions, most of them libtorch's libraries, and its snapshot holds %s of memory in %s. A client starts with the restore command, connects every 2 ms until the server accepts, asks `ping`, then `token` (the next token of a fixed 8-token prompt: one forward pass, which reads every weight once); times are from the start of the command (for CRIU lazy-pages, of its daemon, started first) and every token is checked against the original's (argmax and a checksum of the logits). Default options: `snapctl dump -t PID -D DIR`, `snapctl restore -D DIR [--lazy [--source direct]]`.",
		tr.Shape, tr.Params, units.FormatSize(tr.Weights), tr.Maps, tr.Memory, units.FormatSize(tr.Image))
	m.p("")
	if tr.CRIUUsed {
		m.p("CRIU: %s, in the same rounds, each restore in turn: `criu dump -t PID -D DIR --shell-job --tcp-established` (image %s), `criu restore -D DIR --shell-job --tcp-established -d`, and for a lazy restore on the same host `criu lazy-pages -D DIR --daemon` then `criu restore ... --lazy-pages`.", tr.CRIU, units.FormatSize(tr.CRIUImage))
	} else {
		m.p("CRIU: %s.", tr.CRIU)
	}
	m.p("")
	m.header("", "lazyfs", "CRIU")
	m.row("dump", Summarize(tr.Dump).String(), Summarize(tr.CRIUDump).String())
	m.row("process frozen", Summarize(tr.Freeze).String(), "—")
	m.p("")
	m.header("restore", "cache", "ping", "token", "token / lazyfs eager", "running after", "all memory in", "faults (served on them)")
	for _, c := range tr.Restores {
		eager := tr.find("eager", c.Cold)
		faults := "—"
		if len(c.Faults) > 0 && len(c.Served) == len(c.Faults) {
			faults = fmt.Sprintf("%d (%s)", median(c.Faults), c.Served[len(c.Served)/2])
		}
		m.row(c.Label, ColdName(c.Cold), Summarize(c.Ping).String(), Summarize(c.Token).String(), ratio(c.Token, eager.Token),
			Summarize(c.Running).String(), Summarize(c.AllIn).String(), faults)
	}
	m.p("")
	if tr.CRIUUsed {
		for _, cold := range []bool{false, true} {
			mount, crl := tr.find("lazy, --source mount", cold), tr.find("CRIU lazy-pages", cold)
			cre := tr.find("CRIU restore", cold)
			m.p("- %s: lazy through the mount gives the first token at %s of CRIU lazy-pages', %s of CRIU's eager restore's.", ColdName(cold), ratio(mount.Token, crl.Token), ratio(mount.Token, cre.Token))
		}
		m.p("- dump: %s of CRIU's.", ratio(tr.Dump, tr.CRIUDump))
		m.p("")
	}
}

// median is the middle of ns (the lower of the two middle ones).
func median(ns []int) int {
	if len(ns) == 0 {
		return 0
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
