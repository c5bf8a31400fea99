package proc

import (
	"bytes"
	"fmt"
)

// maxGroups bounds the supplementary groups accepted (NGROUPS_MAX).
const maxGroups = 65536

// Status holds the fields of /proc/PID/status lazyfs uses.
type Status struct {
	Name       string // the comm, as status escapes it
	State      byte   // 'R', 'S', 'D', 'T', 't', 'Z', ...
	Umask      uint32
	Tgid, Pid  int
	PPid       int
	TracerPid  int
	Uid, Gid   [4]uint32 // real, effective, saved, filesystem
	Groups     []uint32
	NSpid      []int // the pid in each nested pid namespace, outermost first
	Threads    int
	VmSwap     uint64 // bytes of the process's memory in swap (absent: 0)
	NoNewPrivs bool
	Seccomp    int // 0 off, 1 strict, 2 filter
	SigPnd     uint64
	ShdPnd     uint64
	SigBlk     uint64
	SigIgn     uint64
	SigCgt     uint64
	CapInh     uint64
	CapPrm     uint64
	CapEff     uint64
	CapBnd     uint64
	CapAmb     uint64
}

// ParseStatus parses /proc/PID/status (or /proc/PID/task/TID/status).
// Fields it does not use are ignored; the fields above must each be
// well-formed where present. Umask is absent on kernels before 4.7.
func ParseStatus(b []byte) (*Status, error) {
	if len(b) > maxSmallFile {
		return nil, fmt.Errorf("%w: status longer than %d bytes", ErrTooLarge, maxSmallFile)
	}
	s := &Status{}
	seen := 0
	var fields [][]byte
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		key, val, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		val = trimSpace(val)
		fields = splitFields(val, fields[:0])
		if k := string(key); k == "Name" || k == "Pid" {
			seen++
		}
		if err := s.setLineField(string(key), val, fields, line); err != nil {
			return nil, err
		}
		if err := s.setField(string(key), val, fields, line); err != nil {
			return nil, fmt.Errorf("status %s: %w", key, err)
		}
	}
	if seen < 2 {
		return nil, malformed("status without Name and Pid", nil)
	}
	return s, nil
}

// statusInts and statusMasks are the fields of one decimal number and of
// one hexadecimal mask, by name.
var (
	statusInts = map[string]func(*Status) *int{
		"Tgid":      func(s *Status) *int { return &s.Tgid },
		"Pid":       func(s *Status) *int { return &s.Pid },
		"PPid":      func(s *Status) *int { return &s.PPid },
		"TracerPid": func(s *Status) *int { return &s.TracerPid },
		"Threads":   func(s *Status) *int { return &s.Threads },
		"Seccomp":   func(s *Status) *int { return &s.Seccomp },
	}
	statusMasks = map[string]func(*Status) *uint64{
		"SigPnd": func(s *Status) *uint64 { return &s.SigPnd },
		"ShdPnd": func(s *Status) *uint64 { return &s.ShdPnd },
		"SigBlk": func(s *Status) *uint64 { return &s.SigBlk },
		"SigIgn": func(s *Status) *uint64 { return &s.SigIgn },
		"SigCgt": func(s *Status) *uint64 { return &s.SigCgt },
		"CapInh": func(s *Status) *uint64 { return &s.CapInh },
		"CapPrm": func(s *Status) *uint64 { return &s.CapPrm },
		"CapEff": func(s *Status) *uint64 { return &s.CapEff },
		"CapBnd": func(s *Status) *uint64 { return &s.CapBnd },
		"CapAmb": func(s *Status) *uint64 { return &s.CapAmb },
	}
)

// setField sets the field key of s from its value val (split into
// fields); its errors are about the value, and ParseStatus names the key.
func (s *Status) setField(key string, val []byte, fields [][]byte, line []byte) error {
	var err error
	if f, ok := statusInts[key]; ok {
		*f(s), err = pidField(val)
		return err
	}
	if f, ok := statusMasks[key]; ok {
		*f(s), err = hex64(val)
		return err
	}
	switch key {
	case "Name":
		s.Name = string(val)
	case "Umask":
		s.Umask, err = octal32(val)
	case "Uid":
		err = ids4(fields, &s.Uid)
	case "Gid":
		err = ids4(fields, &s.Gid)
	case "VmSwap":
		v, ok := int64(0), len(fields) == 2 && string(fields[1]) == "kB"
		if ok {
			v, ok = parseInt(fields[0])
		}
		if !ok || v < 0 {
			err = malformed("status VmSwap", line)
		}
		s.VmSwap = uint64(v) << 10
	case "NoNewPrivs":
		var v int
		v, err = pidField(val)
		s.NoNewPrivs = v != 0
	}
	return err
}

// setLineField sets the fields of s whose errors quote the whole line:
// State and the lists, Groups and NSpid.
func (s *Status) setLineField(key string, val []byte, fields [][]byte, line []byte) error {
	switch key {
	case "State":
		if len(val) == 0 {
			return malformed("status State", line)
		}
		s.State = val[0]
	case "Groups":
		if len(fields) > maxGroups {
			return fmt.Errorf("%w: more than %d groups", ErrTooLarge, maxGroups)
		}
		s.Groups = make([]uint32, 0, len(fields))
		for _, f := range fields {
			v, ok := parseUint(f, 10)
			if !ok || v > 1<<32-1 {
				return malformed("status Groups", line)
			}
			s.Groups = append(s.Groups, uint32(v))
		}
	case "NSpid":
		if len(fields) > 64 {
			return fmt.Errorf("%w: more than 64 pid namespaces", ErrTooLarge)
		}
		s.NSpid = make([]int, 0, len(fields))
		for _, f := range fields {
			v, e := pidField(f)
			if e != nil {
				return malformed("status NSpid", line)
			}
			s.NSpid = append(s.NSpid, v)
		}
	}
	return nil
}

// ReadStatus reads /proc/PID/status.
func ReadStatus(pid int) (*Status, error) {
	return readStatus(pidPath(pid, "status"))
}

// ReadTaskStatus reads /proc/PID/task/TID/status: the per-thread signal
// mask (SigBlk) and pending signals differ between threads.
func ReadTaskStatus(pid, tid int) (*Status, error) {
	return readStatus(taskPath(pid, tid, "status"))
}

func readStatus(path string) (*Status, error) {
	b, err := readFile(path, maxSmallFile)
	if err != nil {
		return nil, fmt.Errorf("read status: %w", err)
	}
	s, err := ParseStatus(b)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return s, nil
}

func pidField(b []byte) (int, error) {
	v, ok := parseInt(b)
	if !ok || v < -1<<31 || v > 1<<31-1 {
		return 0, malformed("integer", b)
	}
	return int(v), nil
}

func hex64(b []byte) (uint64, error) {
	v, ok := parseUint(b, 16)
	if !ok {
		return 0, malformed("hex mask", b)
	}
	return v, nil
}

func octal32(b []byte) (uint32, error) {
	v, ok := parseUint(b, 8)
	if !ok || v > 1<<32-1 {
		return 0, malformed("octal", b)
	}
	return uint32(v), nil
}

func ids4(fields [][]byte, dst *[4]uint32) error {
	if len(fields) != 4 {
		return malformed("want 4 ids", bytes.Join(fields, []byte{' '}))
	}
	for i, f := range fields {
		v, ok := parseUint(f, 10)
		if !ok || v > 1<<32-1 {
			return malformed("id", f)
		}
		dst[i] = uint32(v)
	}
	return nil
}
