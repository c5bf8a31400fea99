package report

import (
	"fmt"
	"time"
)

// CryptResult is the crypt series of one size: [0] in clear, [1] sealed.
type CryptResult struct {
	Dumps    [2]*DumpResult
	Restores [2][]*RestoreResult
}

// CryptVariants names the two sides of the series.
var CryptVariants = [2]string{"clear", "sealed"}

// CryptCases are the restores of both snapshots.
func CryptCases() []RestoreCase {
	return []RestoreCase{
		{Mode: Eager, Threads: DefThreads},
		{Mode: Eager, Cold: true, Threads: DefThreads},
		{Mode: LazyMount, Threads: DefThreads},
		{Mode: LazyMount, Cold: true, Threads: DefThreads},
		{Mode: lazyDirect, Threads: DefThreads},
		{Mode: lazyDirect, Cold: true, Threads: DefThreads},
	}
}

func validateCrypt(runs int, sr *SizeResult, bad func(string, ...any)) {
	c := sr.Crypt
	if c == nil {
		return
	}
	for v := range c.Dumps {
		if d := c.Dumps[v]; d == nil || len(d.Wall) != runs {
			bad("crypt %s: dumps missing", CryptVariants[v])
		}
		if len(c.Restores[v]) != len(CryptCases()) {
			bad("crypt %s: %d restore cases, want %d", CryptVariants[v], len(c.Restores[v]), len(CryptCases()))
			continue
		}
		for _, r := range c.Restores[v] {
			if len(r.Runs) != runs {
				bad("crypt %s %s: %d runs, want %d", CryptVariants[v], r.Case, len(r.Runs), runs)
			}
			for i, run := range r.Runs {
				if msg := checkRun(r.Case, run); msg != "" {
					bad("crypt %s %s run %d: %s", CryptVariants[v], r.Case, i, msg)
				}
			}
		}
	}
}

// cryptRatio formats sealed/clear of two medians.
func cryptRatio(clear, sealed time.Duration) string {
	if clear <= 0 || sealed <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", sealed.Seconds()/clear.Seconds())
}

func renderCrypt(m *md, sr *SizeResult) {
	c := sr.Crypt
	if c == nil {
		return
	}
	m.p("### crypt: sealed snapshots (`--encrypt-to`) against snapshots in clear")
	m.p("")
	m.p("The modelserver dumped with `%s` in clear and sealed for an age X25519 recipient (every block AES-256-GCM), alternately; the last snapshot of each restored with its identity as below, the two back to back in every round. *sealed/clear* is the ratio of the medians; the target is at most 1.15× on every row.", DefaultConfig().Name)
	m.p("")
	m.header("measurement", "cache", "clear", "sealed", "sealed/clear")
	if c.Dumps[0] != nil && c.Dumps[1] != nil {
		d0, d1 := Summarize(c.Dumps[0].Wall), Summarize(c.Dumps[1].Wall)
		m.row("dump (command)", "—", d0.String(), d1.String(), cryptRatio(d0.Med, d1.Med))
		f0, f1 := Summarize(c.Dumps[0].Freeze), Summarize(c.Dumps[1].Freeze)
		m.row("dump (process frozen)", "—", f0.String(), f1.String(), cryptRatio(f0.Med, f1.Med))
		m.row("image", "—", fmt.Sprintf("%d bytes", c.Dumps[0].Image), fmt.Sprintf("%d bytes", c.Dumps[1].Image), fmt.Sprintf("%.4f×", float64(c.Dumps[1].Image)/float64(max(1, c.Dumps[0].Image))))
	}
	for i, cs := range CryptCases() {
		if i >= len(c.Restores[0]) || i >= len(c.Restores[1]) {
			break
		}
		a, b := c.Restores[0][i], c.Restores[1][i]
		figs := []struct {
			name string
			f    func(RestoreRun) time.Duration
		}{{"command exits", wallOf}}
		if cs.Lazy() {
			figs = []struct {
				name string
				f    func(RestoreRun) time.Duration
			}{{"`touch 1` answered", firstOf}, {"`token` answered", tokenOf}, {"all memory in", totalOf}}
		}
		for _, fg := range figs {
			m.row(cs.Label()+": "+fg.name, cs.Cache(), cell(a, fg.f), cell(b, fg.f), cryptRatio(a.dist(fg.f).Med, b.dist(fg.f).Med))
		}
	}
	m.p("")
}
