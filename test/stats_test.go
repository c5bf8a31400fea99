package e2e

// --stats FILE: a dump and an eager and a lazy restore of a real process
// write their figures as JSON, and the figures agree with the snapshot
// and with each other: the phases add up to no more than the total, the
// memory dumped is what was filled (eager) or placed (lazy).

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

type statsPhase struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
}

func readStats(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v\n%s", file, err, b)
	}
}

// phasesWithin checks that phases are named, include want, and add up to
// at most total.
func phasesWithin(t *testing.T, what string, phases []statsPhase, total float64, want ...string) {
	t.Helper()
	var sum float64
	names := map[string]bool{}
	for _, p := range phases {
		if p.Name == "" || p.MS < 0 {
			t.Errorf("%s: phase %+v", what, p)
		}
		sum += p.MS
		names[p.Name] = true
	}
	for _, w := range want {
		if !names[w] {
			t.Errorf("%s: no phase %q in %+v", what, w, phases)
		}
	}
	if total <= 0 || sum > total+1 {
		t.Errorf("%s: phases add up to %.1f ms, total %.1f ms", what, sum, total)
	}
}

func TestStatsFile(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := fixture.Start(t, "counter", "8M")
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "snap")
	dumpPID(t, p.PID, dir, "--stats", filepath.Join(tmp, "dump.json"))

	var d struct {
		Command   string       `json:"command"`
		Snapshot  string       `json:"snapshot"`
		PID       int          `json:"pid"`
		Processes int          `json:"processes"`
		Threads   int          `json:"threads"`
		TotalMS   float64      `json:"total_ms"`
		FrozenMS  float64      `json:"frozen_ms"`
		Phases    []statsPhase `json:"phases"`
		Memory    uint64       `json:"memory_bytes"`
		Written   uint64       `json:"written_bytes"`
		Pages     struct {
			Zero, Raw, LZ4, Total struct {
				Blocks, Bytes uint64
			}
		} `json:"pages"`
	}
	readStats(t, filepath.Join(tmp, "dump.json"), &d)
	if d.Command != "dump" || d.Snapshot != dir || d.PID != p.PID || d.Processes != 1 || d.Threads < 1 {
		t.Errorf("dump stats: %+v", d)
	}
	if d.Memory < 8<<20 || d.Written == 0 || d.Pages.Total.Bytes != d.Memory || d.Pages.Zero.Bytes+d.Pages.Raw.Bytes+d.Pages.LZ4.Bytes != d.Memory {
		t.Errorf("dump stats: memory %d, written %d, pages %+v", d.Memory, d.Written, d.Pages)
	}
	if d.FrozenMS <= 0 || d.FrozenMS > d.TotalMS {
		t.Errorf("dump stats: frozen %.1f ms of %.1f", d.FrozenMS, d.TotalMS)
	}
	phasesWithin(t, "dump", d.Phases, d.TotalMS, "freeze", "dump memory", "commit")

	type restoreStats struct {
		Command       string       `json:"command"`
		Lazy          bool         `json:"lazy"`
		PID           int          `json:"pid"`
		RunningMS     float64      `json:"running_ms"`
		TotalMS       float64      `json:"total_ms"`
		Phases        []statsPhase `json:"phases"`
		Stored        uint64       `json:"stored_bytes"`
		Filled        uint64       `json:"filled_bytes"`
		Faults        uint64       `json:"faults"`
		FaultBytes    uint64       `json:"fault_bytes"`
		PrefetchBytes uint64       `json:"prefetch_bytes"`
	}
	for _, lazy := range []bool{false, true} {
		file := filepath.Join(tmp, "restore.json")
		flags := []string{"--stats", file}
		if lazy {
			flags = append(flags, "--lazy", "--source", "direct")
		}
		restoreAndAdopt(t, p, dir, flags...)
		var r restoreStats
		readStats(t, file, &r)
		if r.Command != "restore" || r.Lazy != lazy || r.PID != p.PID || r.Stored == 0 || r.RunningMS <= 0 || r.RunningMS > r.TotalMS {
			t.Errorf("restore (lazy %v) stats: %+v", lazy, r)
		}
		want := []string{"open snapshot", "check", "map memory", "fill memory", "finish"}
		if lazy {
			want = append(want, "lazy memory")
			// Every non-zero page placed: on a fault or by the prefetcher.
			if nonZero := d.Memory - d.Pages.Zero.Bytes; r.FaultBytes+r.PrefetchBytes+r.Filled < nonZero {
				t.Errorf("lazy: %d filled + %d on faults + %d prefetched, want at least the %d non-zero bytes", r.Filled, r.FaultBytes, r.PrefetchBytes, nonZero)
			}
		} else if r.Filled < d.Memory-d.Pages.Zero.Bytes || r.Faults != 0 {
			t.Errorf("eager: filled %d bytes with %d faults, want the %d non-zero bytes and none", r.Filled, r.Faults, d.Memory-d.Pages.Zero.Bytes)
		}
		phasesWithin(t, "restore", r.Phases, r.TotalMS, want...)
		if err := p.Kill(ctx); err != nil { // and wait: the next restore needs its pid
			t.Fatal(err)
		}
	}
	if r := runSnapctl(t, "restore", "-D", dir, "--stats", filepath.Join(tmp, "no", "such", "dir", "x.json")); r.Code != 2 {
		t.Errorf("--stats into a missing directory: want a usage error before restoring\n%s", r)
	}
}
