package proc

import (
	"bytes"
	"fmt"
)

// Stat holds the fields of /proc/PID/stat lazyfs uses. The memory-map
// fields read as zero unless the reader may ptrace the process.
type Stat struct {
	Pid   int
	Comm  string // between the parentheses, which it may itself contain
	State byte

	PPid, Pgrp, Session int
	TTYNr               int // controlling terminal device number, 0 if none
	TPGid               int
	Flags               uint32 // PF_* flags
	Priority, Nice      int
	NumThreads          int
	StartTime           uint64 // clock ticks after boot
	VSize               uint64
	RSS                 uint64 // pages
	Processor           int
	RTPriority          uint32
	Policy              uint32
	ExitSignal          int

	// The mm fields PR_SET_MM_MAP restores (brk itself is not in stat).
	StartCode, EndCode, StartStack uint64 // fields 26-28
	StartData, EndData, StartBrk   uint64 // fields 45-47
	ArgStart, ArgEnd               uint64 // fields 48-49
	EnvStart, EnvEnd               uint64 // fields 50-51
	ExitCode                       int    // field 52
}

// Exited reports whether the task has exited: a zombie its parent has not
// reaped ('Z') or one being torn down ('X'). Its id stays taken until then.
func (s *Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// ParseStat parses /proc/PID/stat (or /proc/PID/task/TID/stat). The comm
// may contain spaces and parentheses: it runs from the first '(' to the
// last ')'. At least the 44 fields every kernel since 2.6.24 prints are
// required; fields 45 to 52 (Linux 3.3 and later) are read where present.
func ParseStat(b []byte) (*Stat, error) {
	if len(b) > 4096 {
		return nil, fmt.Errorf("%w: stat longer than 4096 bytes", ErrTooLarge)
	}
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open {
		return nil, Malformed("stat comm", b)
	}
	s := &Stat{Comm: string(b[open+1 : closing])}
	pid, err := pidField(trimSpace(b[:open]))
	if err != nil {
		return nil, fmt.Errorf("stat pid: %w", err)
	}
	s.Pid = pid
	f := splitFields(b[closing+1:], make([][]byte, 0, 52))
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 44-2 {
		return nil, Malformed("stat has too few fields", b)
	}
	if len(f[0]) != 1 {
		return nil, Malformed("stat state", f[0])
	}
	s.State = f[0][0]
	var p statParser
	s.PPid = p.int(f, 4)
	s.Pgrp = p.int(f, 5)
	s.Session = p.int(f, 6)
	s.TTYNr = p.int(f, 7)
	s.TPGid = p.int(f, 8)
	s.Flags = uint32(p.uint(f, 9, 1<<32-1))
	s.Priority = p.int(f, 18)
	s.Nice = p.int(f, 19)
	s.NumThreads = p.int(f, 20)
	s.StartTime = p.uint(f, 22, 1<<64-1)
	s.VSize = p.uint(f, 23, 1<<64-1)
	s.RSS = p.uint(f, 24, 1<<64-1)
	s.StartCode = p.uint(f, 26, 1<<64-1)
	s.EndCode = p.uint(f, 27, 1<<64-1)
	s.StartStack = p.uint(f, 28, 1<<64-1)
	s.ExitSignal = p.int(f, 38)
	s.Processor = p.int(f, 39)
	s.RTPriority = uint32(p.uint(f, 40, 1<<32-1))
	s.Policy = uint32(p.uint(f, 41, 1<<32-1))
	if len(f) >= 51-2 {
		s.StartData = p.uint(f, 45, 1<<64-1)
		s.EndData = p.uint(f, 46, 1<<64-1)
		s.StartBrk = p.uint(f, 47, 1<<64-1)
		s.ArgStart = p.uint(f, 48, 1<<64-1)
		s.ArgEnd = p.uint(f, 49, 1<<64-1)
		s.EnvStart = p.uint(f, 50, 1<<64-1)
		s.EnvEnd = p.uint(f, 51, 1<<64-1)
	}
	if len(f) >= 52-2 {
		s.ExitCode = p.int(f, 52)
	}
	if p.err != nil {
		return nil, p.err
	}
	return s, nil
}

// statParser parses numbered stat fields, keeping the first error.
type statParser struct{ err error }

func (p *statParser) field(f [][]byte, n int) []byte {
	if n-3 >= len(f) {
		if p.err == nil {
			p.err = fmt.Errorf("stat field %d: %w", n, Malformed("missing", nil))
		}
		return nil
	}
	return f[n-3]
}

func (p *statParser) int(f [][]byte, n int) int {
	b := p.field(f, n)
	if b == nil {
		return 0
	}
	v, ok := parseInt(b)
	if (!ok || v < -1<<31 || v > 1<<31-1) && p.err == nil {
		p.err = fmt.Errorf("stat field %d: %w", n, Malformed("integer", b))
	}
	return int(v)
}

func (p *statParser) uint(f [][]byte, n int, max uint64) uint64 {
	b := p.field(f, n)
	if b == nil {
		return 0
	}
	v, ok := parseUint(b, 10)
	if (!ok || v > max) && p.err == nil {
		p.err = fmt.Errorf("stat field %d: %w", n, Malformed("unsigned integer", b))
	}
	return v
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (*Stat, error) {
	return readStat(pidPath(pid, "stat"))
}

// ReadTaskStat reads /proc/PID/task/TID/stat.
func ReadTaskStat(pid, tid int) (*Stat, error) {
	return readStat(taskPath(pid, tid, "stat"))
}

func readStat(path string) (*Stat, error) {
	b, err := ReadFile(path, 4096)
	if err != nil {
		return nil, fmt.Errorf("read stat: %w", err)
	}
	s, err := ParseStat(b)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return s, nil
}
