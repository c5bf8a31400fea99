package measure

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// ErrOutput is returned when snapctl's output lacks the line the harness
// reads its figures from.
var ErrOutput = errors.New("unexpected snapctl output")

// What snapctl prints (cmd/snapctl/dump.go and restore.go).
var (
	DumpLine    = regexp.MustCompile(`(?m)^dumped pid (\d+) \((?:\d+ processes, )?(\d+) threads\): (.+) of memory into (.+) \(ratio ([0-9.]+)\) in (\S+); frozen (\S+)$`)
	eagerLine   = regexp.MustCompile(`(?m)^restored pid (\d+) \((?:\d+ processes, )?(\d+) threads\): (.+) of memory in (\S+)$`)
	runningLine = regexp.MustCompile(`(?m)^pid (\d+) running after (\S+); serving its memory$`)
	lazyLine    = regexp.MustCompile(`(?m)^restored pid (\d+) \((?:\d+ processes, )?(\d+) threads\): running after (\S+), all memory in after (\S+) \((.+) served on (\d+) faults, (.+) prefetched\)$`)
)

// DumpReport is what snapctl dump reports.
type DumpReport struct {
	PID    int
	Ratio  float64
	Total  time.Duration // "in D"
	Freeze time.Duration // "frozen F"
}

// ParseDump reads the summary line of snapctl dump.
func ParseDump(out string) (DumpReport, error) {
	m := DumpLine.FindStringSubmatch(out)
	if m == nil {
		return DumpReport{}, fmt.Errorf("dump: no summary line in %q: %w", out, ErrOutput)
	}
	var r DumpReport
	var err error
	if r.PID, err = strconv.Atoi(m[1]); err != nil {
		return r, fmt.Errorf("dump pid: %w", err)
	}
	if r.Ratio, err = strconv.ParseFloat(m[5], 64); err != nil {
		return r, fmt.Errorf("dump ratio: %w", err)
	}
	if r.Total, err = time.ParseDuration(m[6]); err != nil {
		return r, fmt.Errorf("dump time: %w", err)
	}
	if r.Freeze, err = time.ParseDuration(m[7]); err != nil {
		return r, fmt.Errorf("freeze time: %w", err)
	}
	return r, nil
}

// RestoreReport is what snapctl restore reports.
type RestoreReport struct {
	PID     int
	Total   time.Duration // eager: "in D"; lazy: "all memory in after B"
	Running time.Duration // lazy: "running after A"; eager: Total
	Faults  int           // lazy: faults served
}

// ParseRestore reads the summary line of snapctl restore [--lazy].
func ParseRestore(out string, lazy bool) (RestoreReport, error) {
	var r RestoreReport
	var err error
	if !lazy {
		m := eagerLine.FindStringSubmatch(out)
		if m == nil {
			return r, fmt.Errorf("restore: no summary line in %q: %w", out, ErrOutput)
		}
		if r.PID, err = strconv.Atoi(m[1]); err != nil {
			return r, fmt.Errorf("restore pid: %w", err)
		}
		if r.Total, err = time.ParseDuration(m[4]); err != nil {
			return r, fmt.Errorf("restore time: %w", err)
		}
		r.Running = r.Total
		return r, nil
	}
	if runningLine.FindStringSubmatch(out) == nil {
		return r, fmt.Errorf("lazy restore: no running line in %q: %w", out, ErrOutput)
	}
	m := lazyLine.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("lazy restore: no summary line in %q: %w", out, ErrOutput)
	}
	if r.PID, err = strconv.Atoi(m[1]); err != nil {
		return r, fmt.Errorf("restore pid: %w", err)
	}
	if r.Running, err = time.ParseDuration(m[3]); err != nil {
		return r, fmt.Errorf("running time: %w", err)
	}
	if r.Total, err = time.ParseDuration(m[4]); err != nil {
		return r, fmt.Errorf("all-in time: %w", err)
	}
	if r.Faults, err = strconv.Atoi(m[6]); err != nil {
		return r, fmt.Errorf("faults: %w", err)
	}
	return r, nil
}
