package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/image"
)

// statsFlag is --stats FILE of dump and restore.
func statsFlag(fl *cli.FlagSet, what string) *string {
	return fl.String("stats", "", "write the figures of the "+what+" as JSON into `FILE` once it succeeds (phases with their durations, processes, threads, memory and bytes; the fields are listed in docs/cli.md)")
}

// checkStats refuses, before a dump or restore starts, a --stats FILE
// whose directory does not exist.
func checkStats(file string) error {
	if file == "" {
		return nil
	}
	if st, err := os.Stat(filepath.Dir(file)); err != nil || !st.IsDir() {
		return cli.Usagef("--stats %s: no directory %s to write it in", file, filepath.Dir(file))
	}
	return nil
}

// ms is a duration in milliseconds, as the stats files give them.
type ms float64

func millis(d time.Duration) ms { return ms(float64(d.Microseconds()) / 1000) }

type phaseStats struct {
	Name string `json:"name"`
	MS   ms     `json:"ms"`
}

func phases(ps []engine.Phase) []phaseStats {
	out := make([]phaseStats, 0, len(ps))
	for _, p := range ps {
		out = append(out, phaseStats{p.Name, millis(p.Took)})
	}
	return out
}

// dumpStats is the --stats file of a dump.
type dumpStats struct {
	Command   string       `json:"command"` // "dump"
	Snapshot  string       `json:"snapshot"`
	PID       int          `json:"pid"`
	Processes int          `json:"processes"`
	Threads   int          `json:"threads"`
	TotalMS   ms           `json:"total_ms"`
	FrozenMS  ms           `json:"frozen_ms"`
	Phases    []phaseStats `json:"phases"`
	// MemoryBytes: the memory dumped; WrittenBytes: the pages files
	// written (padding included); Pages: the blocks by kind.
	MemoryBytes  uint64        `json:"memory_bytes"`
	WrittenBytes uint64        `json:"written_bytes"`
	Pages        image.Stats   `json:"pages"`
	TCPConns     int           `json:"tcp_connections"`
	PreCopy      *preCopyStats `json:"pre_copy,omitempty"`
}

type preCopyStats struct {
	Rounds  int    `json:"rounds"`
	Copied  uint64 `json:"copied_bytes"`
	MS      ms     `json:"ms"`
	Frozen  uint64 `json:"frozen_copy_bytes"`
	PauseMS ms     `json:"pause_ms"`
}

func newDumpStats(dir string, r *engine.DumpResult) dumpStats {
	s := dumpStats{Command: "dump", Snapshot: dir, PID: r.PID, Processes: r.Processes, Threads: r.Threads,
		TotalMS: millis(r.Total), FrozenMS: millis(r.Freeze), Phases: phases(r.Phases),
		MemoryBytes: r.Stats.Total.Bytes, WrittenBytes: r.Stats.FileSize, Pages: r.Stats, TCPConns: r.Conns}
	if p := r.PreCopy; p != nil {
		s.PreCopy = &preCopyStats{Rounds: len(p.Rounds), MS: millis(p.Time), Frozen: p.FrozenCopy, PauseMS: millis(p.Pause)}
		for _, rd := range p.Rounds {
			s.PreCopy.Copied += rd.Copied
		}
	}
	return s
}

// restoreStats is the --stats file of a restore.
type restoreStats struct {
	Command     string       `json:"command"` // "restore"
	Snapshot    string       `json:"snapshot"`
	Lazy        bool         `json:"lazy"`
	PID         int          `json:"pid"`
	Processes   int          `json:"processes"`
	Threads     int          `json:"threads"`
	RunningMS   ms           `json:"running_ms"` // until the processes ran
	TotalMS     ms           `json:"total_ms"`   // until every page was in
	Phases      []phaseStats `json:"phases"`
	StoredBytes uint64       `json:"stored_bytes"` // the snapshot's pages files
	FilledBytes uint64       `json:"filled_bytes"` // memory written before they ran
	// The lazy phase: faults served and the bytes placed for them, the
	// bytes the prefetcher placed, the bytes read from the source.
	Faults        uint64 `json:"faults"`
	FaultBytes    uint64 `json:"fault_bytes"`
	PrefetchBytes uint64 `json:"prefetch_bytes"`
	LazyReadBytes uint64 `json:"lazy_read_bytes"`
	Exited        bool   `json:"exited"` // every process exited in the lazy phase
}

func newRestoreStats(dir string, lazy bool, r *engine.RestoreResult) restoreStats {
	return restoreStats{Command: "restore", Snapshot: dir, Lazy: lazy, PID: r.PID, Processes: r.Processes, Threads: r.Threads,
		RunningMS: millis(r.ToRunning), TotalMS: millis(r.Total), Phases: phases(r.Phases),
		StoredBytes: r.StoredBytes, FilledBytes: r.Filled,
		Faults: r.Lazy.Faults, FaultBytes: r.Lazy.FaultBytes, PrefetchBytes: r.Lazy.PrefetchBytes, LazyReadBytes: r.Lazy.ReadBytes, Exited: r.Lazy.Exited}
}

// writeStats writes v as indented JSON into file, whole or not at all:
// a temporary file in its directory, renamed over it.
func writeStats(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return fmt.Errorf("--stats: %w", err)
	}
	defer os.Remove(f.Name()) // after a rename, nothing
	if _, err = f.Write(append(b, '\n')); err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), file)
	}
	if err != nil {
		return fmt.Errorf("--stats %s: %w", file, err)
	}
	return nil
}
