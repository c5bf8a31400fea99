package report

import (
	"fmt"
	"time"
)

// WSResult is the series of one server.
type WSResult struct {
	Server   string // "modelserver", "weightserver", "modelserver pre-fork"
	Recorded string // snapctl's "working set recorded: ..." lines
	File     uint64 // size of the working-set files
	Cases    []*WSCaseResult
}

// WSCase is one restore of the series.
type WSCase struct {
	Mode  string // WSEager, WSOff, WSCopy, WSBlocks
	Cold  bool
	Token bool // asks "ping" then "token" instead of "ping", "touch 1", "token"
}

// The restores of the series.
const (
	WSEager  = "eager"
	WSOff    = "lazy, --working-set off"
	WSCopy   = "lazy, working set"          // from its copy (the default)
	WSBlocks = "lazy, --working-set blocks" // the snapshot's blocks in place
)

func (c WSCase) Cache() string {
	if c.Cold {
		return "cold"
	}
	return "warm"
}

func (c WSCase) Request() string {
	if c.Token {
		return "token"
	}
	return "touch 1"
}

func (c WSCase) String() string { return fmt.Sprintf("%s %s %s", c.Mode, c.Cache(), c.Request()) }

// Args are the snapctl restore arguments.
func (c WSCase) Args(dir string) []string {
	a := []string{"restore", "-D", dir, "--decompress-threads", "1"}
	switch c.Mode {
	case WSOff:
		a = append(a, "--lazy", "--working-set", "off")
	case WSCopy:
		a = append(a, "--lazy")
	case WSBlocks:
		a = append(a, "--lazy", "--working-set", "blocks")
	}
	return a
}

// WSCaseResult is the runs of one case.
type WSCaseResult struct {
	Case WSCase
	Runs []RestoreRun
}

func (w *WSResult) find(c WSCase) *RestoreResult {
	for _, r := range w.Cases {
		if r.Case == c {
			return &RestoreResult{Runs: r.Runs}
		}
	}
	return nil
}

// WSAnswer is the timed answer of a case: "touch 1" or "token".
func WSAnswer(c WSCase, r RestoreRun) time.Duration {
	if c.Token {
		return r.Token
	}
	return r.First
}

// validateWorkingSet checks the series' runs.
func validateWorkingSet(runs int, sr *SizeResult, bad func(string, ...any)) {
	for _, w := range sr.WorkingSet {
		if w.Recorded == "" {
			bad("workingset %s: nothing recorded", w.Server)
		}
		for _, cr := range w.Cases {
			if len(cr.Runs) != runs {
				bad("workingset %s %s: %d runs, want %d", w.Server, cr.Case, len(cr.Runs), runs)
			}
			for i, r := range cr.Runs {
				if r.Ping <= 0 || WSAnswer(cr.Case, r) < r.Ping || r.Wall <= 0 {
					bad("workingset %s %s run %d: ping %v, answer %v, wall %v", w.Server, cr.Case, i, r.Ping, WSAnswer(cr.Case, r), r.Wall)
				}
			}
		}
	}
}

// workingSetSection renders the series.
func workingSetSection(m *md, sr *SizeResult) {
	if len(sr.WorkingSet) == 0 {
		return
	}
	m.p("### Working set: lazy restores that fetch first what the last one touched")
	m.p("")
	m.p("Each server is dumped once (default option), then restored lazily once with `--record-working-set`, asked `ping` and `touch 1`, and sent SIGUSR1 once `touch 1` was answered: that working set is then used by every lazy restore below except `--working-set off`. *lazy, working set* places the working set's own copy of the touched pages first (the default); *--working-set blocks* reads the snapshot's blocks holding them in place instead. Times from the command's start; median (min–max) of the runs. The *token* rows ask `ping` then `token` (the whole memory), which the working set does not cover. *modelserver pre-fork* is a process tree (`modelserver SIZE PORT 42 2`: the parent builds the memory and forks 2 workers that answer on its socket, at most 256 MiB each, every process's memory dumped whole), restored warm only, with a working set per process.")
	m.p("")
	for _, w := range sr.WorkingSet {
		m.p("**%s** — %s (file %s).", w.Server, w.Recorded, fmtBytes(w.File))
		m.p("")
		m.header("restore", "cache", "request", "process runs", "ping answered", "answer", "command exits")
		for _, cr := range w.Cases {
			c := cr.Case
			r := w.find(c)
			m.row(c.Mode, c.Cache(), c.Request(), cell(r, runningOf), cell(r, pingOf), cell(r, func(run RestoreRun) time.Duration { return WSAnswer(c, run) }), cell(r, wallOf))
		}
		m.p("")
		m.p("Ratios of medians (answer to the request):")
		m.p("")
		m.header("cache", "touch 1: working set / off", "touch 1: working set / eager", "touch 1: blocks / off", "token: working set / off")
		ratio := func(a, b WSCase) string {
			ra, rb := w.find(a), w.find(b)
			if ra == nil || rb == nil || len(ra.Runs) == 0 || len(rb.Runs) == 0 {
				return "—"
			}
			db := rb.dist(func(r RestoreRun) time.Duration { return WSAnswer(b, r) }).Med
			if db <= 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f×", ra.dist(func(r RestoreRun) time.Duration { return WSAnswer(a, r) }).Med.Seconds()/db.Seconds())
		}
		for _, cold := range []bool{false, true} {
			c := func(mode string, token bool) WSCase { return WSCase{Mode: mode, Cold: cold, Token: token} }
			m.row(c(WSEager, false).Cache(), ratio(c(WSCopy, false), c(WSOff, false)), ratio(c(WSCopy, false), c(WSEager, false)),
				ratio(c(WSBlocks, false), c(WSOff, false)), ratio(c(WSCopy, true), c(WSOff, true)))
		}
		m.p("")
	}
}

// fmtBytes formats a byte count.
func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
