package proc

import (
	"bytes"
	"fmt"
	"math"

	"golang.org/x/sys/unix"
)

// NumRlimits is the number of resource limits (RLIM_NLIMITS).
const NumRlimits = 16

// RlimInfinity is the value of an unlimited limit.
const RlimInfinity = math.MaxUint64

// Rlimit is one resource limit.
type Rlimit struct {
	Cur, Max uint64
}

// Rlimits holds every resource limit, indexed by RLIMIT_* number.
type Rlimits [NumRlimits]Rlimit

// rlimitNames are the /proc/PID/limits row names by RLIMIT_* number.
var rlimitNames = [NumRlimits]string{
	unix.RLIMIT_CPU:     "Max cpu time",
	unix.RLIMIT_FSIZE:   "Max file size",
	unix.RLIMIT_DATA:    "Max data size",
	unix.RLIMIT_STACK:   "Max stack size",
	unix.RLIMIT_CORE:    "Max core file size",
	unix.RLIMIT_RSS:     "Max resident set",
	unix.RLIMIT_NPROC:   "Max processes",
	unix.RLIMIT_NOFILE:  "Max open files",
	unix.RLIMIT_MEMLOCK: "Max locked memory",
	unix.RLIMIT_AS:      "Max address space",
	10:                  "Max file locks",
	11:                  "Max pending signals",
	12:                  "Max msgqueue size",
	13:                  "Max nice priority",
	14:                  "Max realtime priority",
	15:                  "Max realtime timeout",
}

// ParseLimits parses /proc/PID/limits. Every one of the NumRlimits rows
// must be present. Prefer Rlimits, which reads the exact values.
func ParseLimits(b []byte) (*Rlimits, error) {
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("%w: limits longer than 64 KiB", ErrTooLarge)
	}
	var l Rlimits
	var seen [NumRlimits]bool
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		for i, name := range rlimitNames {
			rest, ok := bytes.CutPrefix(line, []byte(name))
			if !ok || len(rest) == 0 || !isSpace(rest[0]) {
				continue
			}
			soft, rest := nextField(rest)
			hard, _ := nextField(rest)
			cur, ok1 := limitValue(soft)
			max, ok2 := limitValue(hard)
			if !ok1 || !ok2 || seen[i] {
				return nil, Malformed("limits row", line)
			}
			l[i] = Rlimit{Cur: cur, Max: max}
			seen[i] = true
			break
		}
	}
	for i, ok := range seen {
		if !ok {
			return nil, Malformed("limits without row "+rlimitNames[i], nil)
		}
	}
	return &l, nil
}

func limitValue(b []byte) (uint64, bool) {
	if string(b) == "unlimited" {
		return RlimInfinity, true
	}
	return parseUint(b, 10)
}

// ReadLimits reads and parses /proc/PID/limits.
func ReadLimits(pid int) (*Rlimits, error) {
	b, err := ReadFile(pidPath(pid, "limits"), 64<<10)
	if err != nil {
		return nil, fmt.Errorf("read limits: %w", err)
	}
	l, err := ParseLimits(b)
	if err != nil {
		return nil, fmt.Errorf("parse limits of %d: %w", pid, err)
	}
	return l, nil
}

// ReadRlimits reads every resource limit of pid with prlimit(2), exactly
// (needs the same uid or CAP_SYS_RESOURCE).
func ReadRlimits(pid int) (*Rlimits, error) {
	var l Rlimits
	for i := range l {
		var r unix.Rlimit
		if err := unix.Prlimit(pid, i, nil, &r); err != nil {
			return nil, fmt.Errorf("prlimit(%d, %d): %w", pid, i, err)
		}
		l[i] = Rlimit{Cur: r.Cur, Max: r.Max}
	}
	return &l, nil
}
