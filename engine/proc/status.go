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
// well-formed where present. Umask is absent on kernels before 4.7. An
// error about a value names the key; one about a list or the state quotes
// the whole line.
func ParseStatus(b []byte) (*Status, error) {
	if len(b) > MaxSmallFile {
		return nil, fmt.Errorf("%w: status longer than %d bytes", ErrTooLarge, MaxSmallFile)
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
		var err error
		switch string(key) {
		case "Name":
			s.Name = string(val)
			seen++
		case "State":
			if len(val) == 0 {
				return nil, Malformed("status State", line)
			}
			s.State = val[0]
		case "Umask":
			s.Umask, err = octal32(val)
		case "Pid":
			s.Pid, err = pidField(val)
			seen++
		case "Tgid", "PPid", "TracerPid", "Threads", "Seccomp":
			*s.intField(string(key)), err = pidField(val)
		case "Uid":
			err = ids4(fields, &s.Uid)
		case "Gid":
			err = ids4(fields, &s.Gid)
		case "Groups":
			if err := s.setGroups(fields, line); err != nil {
				return nil, err
			}
		case "NSpid":
			if err := s.setNSpid(fields, line); err != nil {
				return nil, err
			}
		case "VmSwap":
			s.VmSwap, err = vmSwap(fields, line)
		case "NoNewPrivs":
			var v int
			v, err = pidField(val)
			s.NoNewPrivs = v != 0
		case "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb":
			*s.maskField(string(key)), err = hex64(val)
		}
		if err != nil {
			return nil, fmt.Errorf("status %s: %w", key, err)
		}
	}
	if seen < 2 {
		return nil, Malformed("status without Name and Pid", nil)
	}
	return s, nil
}

// vmSwap parses the value of a VmSwap line ("N kB") into bytes.
func vmSwap(fields [][]byte, line []byte) (uint64, error) {
	v, ok := int64(0), len(fields) == 2 && string(fields[1]) == "kB"
	if ok {
		v, ok = parseInt(fields[0])
	}
	if !ok || v < 0 {
		return 0, Malformed("status VmSwap", line)
	}
	return uint64(v) << 10, nil
}

// intField returns the field of s a decimal status line holds.
func (s *Status) intField(key string) *int {
	switch key {
	case "Tgid":
		return &s.Tgid
	case "PPid":
		return &s.PPid
	case "TracerPid":
		return &s.TracerPid
	case "Threads":
		return &s.Threads
	}
	return &s.Seccomp
}

// maskField returns the field of s a hexadecimal mask line holds.
func (s *Status) maskField(key string) *uint64 {
	switch key {
	case "SigPnd":
		return &s.SigPnd
	case "ShdPnd":
		return &s.ShdPnd
	case "SigBlk":
		return &s.SigBlk
	case "SigIgn":
		return &s.SigIgn
	case "SigCgt":
		return &s.SigCgt
	case "CapInh":
		return &s.CapInh
	case "CapPrm":
		return &s.CapPrm
	case "CapEff":
		return &s.CapEff
	case "CapBnd":
		return &s.CapBnd
	}
	return &s.CapAmb
}

// setGroups sets the supplementary groups from a Groups line.
func (s *Status) setGroups(fields [][]byte, line []byte) error {
	if len(fields) > maxGroups {
		return fmt.Errorf("%w: more than %d groups", ErrTooLarge, maxGroups)
	}
	s.Groups = make([]uint32, 0, len(fields))
	for _, f := range fields {
		v, ok := parseUint(f, 10)
		if !ok || v > 1<<32-1 {
			return Malformed("status Groups", line)
		}
		s.Groups = append(s.Groups, uint32(v))
	}
	return nil
}

// setNSpid sets the pid in each pid namespace from an NSpid line.
func (s *Status) setNSpid(fields [][]byte, line []byte) error {
	if len(fields) > 64 {
		return fmt.Errorf("%w: more than 64 pid namespaces", ErrTooLarge)
	}
	s.NSpid = make([]int, 0, len(fields))
	for _, f := range fields {
		v, e := pidField(f)
		if e != nil {
			return Malformed("status NSpid", line)
		}
		s.NSpid = append(s.NSpid, v)
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
	b, err := ReadFile(path, MaxSmallFile)
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
		return 0, Malformed("integer", b)
	}
	return int(v), nil
}

func hex64(b []byte) (uint64, error) {
	v, ok := parseUint(b, 16)
	if !ok {
		return 0, Malformed("hex mask", b)
	}
	return v, nil
}

func octal32(b []byte) (uint32, error) {
	v, ok := parseUint(b, 8)
	if !ok || v > 1<<32-1 {
		return 0, Malformed("octal", b)
	}
	return uint32(v), nil
}

func ids4(fields [][]byte, dst *[4]uint32) error {
	if len(fields) != 4 {
		return Malformed("want 4 ids", bytes.Join(fields, []byte{' '}))
	}
	for i, f := range fields {
		v, ok := parseUint(f, 10)
		if !ok || v > 1<<32-1 {
			return Malformed("id", f)
		}
		dst[i] = uint32(v)
	}
	return nil
}
