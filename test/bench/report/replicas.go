package report

import (
	"fmt"
	"strconv"
	"time"
)

// The modes of the series. Lazy: every copy through one lazyfs mount
// (made afresh for the case: its first copy decodes, the others find the
// blocks decoded), the working set removed before the case; with
// RepLazyWS the first copy records one (--record-working-set, stopped by
// SIGUSR1 once it answered "touch 1") and the later copies fetch it first
// (--working-set auto, the default); with RepLazyOff no copy records or
// uses one. Eager: each copy filled by its snapctl from the snapshot
// files (warm in the page cache).
const (
	RepLazyWS  = "lazy, working set"
	RepLazyOff = "lazy, --working-set off"
	RepEager   = "eager"
)

// ReplicaLazy reports whether mode restores lazily.
func ReplicaLazy(mode string) bool { return mode != RepEager }

// ReplicasResult is the runs of one case.
type ReplicasResult struct {
	Mode string
	N    int
	Runs []ReplicasRun
	// Recorded is the first copy's "working set recorded: ..." line
	// (RepLazyWS; the last run's).
	Recorded string
}

// ReplicasRun is one run of a case.
type ReplicasRun struct {
	// Touch1 is, per copy in start order, the time from its snapctl's
	// start to its "touch 1" answer.
	Touch1 []time.Duration
	// Running and Faults are, per copy, what its snapctl said: the time
	// from its start until the process ran, and (lazy) the faults it
	// served.
	Running []time.Duration
	Faults  []int
	// Memory once every copy has all its memory (lazy: every snapctl
	// exited), in bytes: the copies' Pss summed (their inits included),
	// and their Anonymous; the page cache that the snapshot's pages file
	// and the mount's mem file hold (resident pages, as fincore counts
	// them), and of it the mem file's; the lazyfs server's Rss, and the
	// decoded blocks its block cache holds (MNT/PID/stats cache_bytes;
	// lazy only).
	Pss, Anon, PageCache, MemCache, Server, BlockCache uint64
}

// total is the memory the case holds: copies, page cache, server.
func (r ReplicasRun) total() uint64 { return r.Pss + r.PageCache + r.Server }

// touch1Of returns the runs' touch 1 times of copy i.
func (r *ReplicasResult) touch1Of(i int) Dist {
	var ds []time.Duration
	for _, run := range r.Runs {
		if i < len(run.Touch1) {
			ds = append(ds, run.Touch1[i])
		}
	}
	return Summarize(ds)
}

// memOf returns the median of a memory figure over the runs.
func (r *ReplicasResult) memOf(f func(ReplicasRun) uint64) uint64 {
	var ds []time.Duration
	for _, run := range r.Runs {
		ds = append(ds, time.Duration(f(run)))
	}
	return uint64(Summarize(ds).Med)
}

func validateReplicas(runs int, s *SizeResult, bad func(string, ...any)) {
	anon := map[int]uint64{} // copies: the first run's anonymous memory
	for _, r := range s.Replicas {
		for _, run := range r.Runs {
			// Lazy or eager, copies hold the same memory.
			if a, ok := anon[r.N]; !ok {
				anon[r.N] = run.Anon
			} else if run.Anon < a*9/10 || run.Anon > a*11/10 {
				bad("replicas %s x%d: %d bytes anonymous, another run of %d copies %d", r.Mode, r.N, run.Anon, r.N, a)
			}
		}
		if len(r.Runs) != runs {
			bad("replicas %s x%d: %d runs, want %d", r.Mode, r.N, len(r.Runs), runs)
		}
		if r.Mode == RepLazyWS && r.Recorded == "" {
			bad("replicas %s x%d: the first copy recorded no working set", r.Mode, r.N)
		}
		for _, run := range r.Runs {
			if len(run.Touch1) != r.N {
				bad("replicas %s x%d: %d touch 1 times", r.Mode, r.N, len(run.Touch1))
			}
			for _, d := range run.Touch1 {
				if d <= 0 {
					bad("replicas %s x%d: touch 1 after %v", r.Mode, r.N, d)
				}
			}
			// Every copy holds its memory once it is all in (the
			// modelserver's zero quarter stays unmapped).
			if run.Anon < uint64(r.N)*s.Size/2 {
				bad("replicas %s x%d: %d bytes anonymous in %d copies of %d", r.Mode, r.N, run.Anon, r.N, s.Size)
			}
			if ReplicaLazy(r.Mode) && run.Server == 0 {
				bad("replicas %s x%d: no lazyfs server measured", r.Mode, r.N)
			}
		}
	}
}

func renderReplicas(m *md, s *SizeResult) {
	if len(s.Replicas) == 0 {
		return
	}
	mib := func(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	m.p("### Replicas: one snapshot restored 1, 2 and 4 times")
	m.p("")
	m.p("Each copy restored with `--pidns --netns new`, one after another (the next once the one before answered `touch 1` and has all its memory): lazily through one lazyfs mount, made afresh for each case, or eagerly from the snapshot files (warm). No working set beside the snapshot at the start of a case. *%s*: copy 1 records one (`--record-working-set`, SIGUSR1 to its snapctl once it answered `touch 1`) and copies 2 to 4 fetch it first (the default, `--working-set auto`); *%s*: no copy records or uses one. Touch 1: from the copy's snapctl start to its answer, median (min–max) of %d runs. Memory once every copy has all its memory: the copies' Pss (their inits included), the page cache the pages file and the mount's mem file hold (and of it the mem file's), the lazyfs server's Rss (and of it the decoded blocks its block cache holds); medians.", RepLazyWS, RepLazyOff, len(s.Replicas[0].Runs))
	m.p("")
	m.header("restore", "copies", "touch 1: copy 1", "copy 2", "copy 4", "copies' Pss", "page cache", "of it mem file", "lazyfs server", "of it block cache", "total")
	for _, r := range s.Replicas {
		cell := func(i int) string {
			if i >= r.N {
				return "—"
			}
			return r.touch1Of(i).String()
		}
		server, memFile, blocks := "—", "—", "—"
		if ReplicaLazy(r.Mode) {
			server = mib(r.memOf(func(x ReplicasRun) uint64 { return x.Server }))
			memFile = mib(r.memOf(func(x ReplicasRun) uint64 { return x.MemCache }))
			blocks = mib(r.memOf(func(x ReplicasRun) uint64 { return x.BlockCache }))
		}
		m.row(r.Mode, strconv.Itoa(r.N), cell(0), cell(1), cell(3),
			mib(r.memOf(func(x ReplicasRun) uint64 { return x.Pss })),
			mib(r.memOf(func(x ReplicasRun) uint64 { return x.PageCache })), memFile,
			server, blocks, mib(r.memOf(ReplicasRun.total)))
	}
	m.p("")
	renderReplicaCopies(m, s)
}

// renderReplicaCopies writes what follows the replicas table: the working
// set copy 1 recorded, and how the 4th copy compares with the 1st.
func renderReplicaCopies(m *md, s *SizeResult) {
	find := func(mode string, n int) *ReplicasResult {
		for _, r := range s.Replicas {
			if r.Mode == mode && r.N == n {
				return r
			}
		}
		return nil
	}
	ws, off := find(RepLazyWS, 4), find(RepLazyOff, 4)
	if ws != nil && ws.Recorded != "" {
		m.p("Copy 1's %s.", ws.Recorded)
		m.p("")
	}
	ratio := func(a, b time.Duration) string {
		if b <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f×", a.Seconds()/b.Seconds())
	}
	if ws != nil && off != nil {
		fourth := ws.touch1Of(3).Med
		// Copy 1 is the same restore in every case of a mode: its runs
		// pooled over the cases are a steadier baseline than one case's.
		pooled := func(mode string) time.Duration {
			var ds []time.Duration
			for _, r := range s.Replicas {
				for _, run := range r.Runs {
					if r.Mode == mode && len(run.Touch1) > 0 {
						ds = append(ds, run.Touch1[0])
					}
				}
			}
			return Summarize(ds).Med
		}
		m.p("The 4th lazy copy answered `touch 1`, with the working set copy 1 recorded, in %s the time of copy 1 (which recorded it; target ≤ 0.5×; %s of copy 1's median over the 1, 2 and 4 copy cases) and %s that of copy 1 without a working set (%s pooled); without one, the 4th copy in %s the time of the first.",
			ratio(fourth, ws.touch1Of(0).Med), ratio(fourth, pooled(RepLazyWS)), ratio(fourth, off.touch1Of(0).Med), ratio(fourth, pooled(RepLazyOff)), ratio(off.touch1Of(3).Med, off.touch1Of(0).Med))
		m.p("")
		m.p("Copies 1 and 4 of 4: when the process ran (snapctl's count from its start) and the faults its pager served before all memory was in (medians):")
		m.p("")
		m.header("restore", "copy", "process runs", "touch 1", "faults served")
		for _, r := range []*ReplicasResult{ws, off} {
			for _, i := range []int{0, 3} {
				var running []time.Duration
				var faults []time.Duration
				for _, run := range r.Runs {
					if i < len(run.Running) {
						running = append(running, run.Running[i])
						faults = append(faults, time.Duration(run.Faults[i]))
					}
				}
				m.row(r.Mode, strconv.Itoa(i+1), Summarize(running).String(), r.touch1Of(i).String(), strconv.Itoa(int(Summarize(faults).Med)))
			}
		}
		m.p("")
	}
}
