package proc

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// MaxMappings bounds the number of mappings a maps or smaps parser accepts
// (the kernel's default vm.max_map_count is 65530).
const MaxMappings = 1 << 21

// Perms are the protection and sharing bits of a mapping ("rw-p").
type Perms uint8

// Permission bits.
const (
	PermRead   Perms = 1 << iota // r
	PermWrite                    // w
	PermExec                     // x
	PermShared                   // s (VM_MAYSHARE); p when clear
)

// String returns the four-character form used by /proc/PID/maps.
func (p Perms) String() string {
	b := []byte("---p")
	if p&PermRead != 0 {
		b[0] = 'r'
	}
	if p&PermWrite != 0 {
		b[1] = 'w'
	}
	if p&PermExec != 0 {
		b[2] = 'x'
	}
	if p&PermShared != 0 {
		b[3] = 's'
	}
	return string(b)
}

// Dev is a device number split as /proc shows it.
type Dev struct {
	Major, Minor uint32
}

// String returns "major:minor" in hex, as /proc/PID/maps shows it.
func (d Dev) String() string { return fmt.Sprintf("%02x:%02x", d.Major, d.Minor) }

// Usage holds the per-mapping counters of /proc/PID/smaps, in bytes.
type Usage struct {
	Size, KernelPageSize, MMUPageSize                    uint64
	Rss, Pss, PssDirty                                   uint64
	SharedClean, SharedDirty, PrivateClean, PrivateDirty uint64
	Referenced, Anonymous, KSM, LazyFree                 uint64
	AnonHugePages, ShmemPmdMapped, FilePmdMapped         uint64
	SharedHugetlb, PrivateHugetlb                        uint64
	Swap, SwapPss, Locked                                uint64
	// THPEligible is the THPeligible line: the mapping may get
	// transparent huge pages.
	THPEligible bool
	// ProtectionKey is the memory protection key (x86 PKU), or 0.
	ProtectionKey int
}

// Mapping is one virtual memory area of a process.
type Mapping struct {
	Start, End uint64 // [Start, End), page aligned
	Perms      Perms
	Offset     uint64 // file offset of Start
	Dev        Dev
	Inode      uint64
	// Path is the name as /proc shows it, without a " (deleted)" suffix:
	// a file path, "/memfd:NAME", "/SYSV%08x", "/dev/zero", a bracketed
	// kernel name ("[heap]", "[stack]", "[vdso]", "[anon:NAME]"...), or
	// empty for anonymous memory. A newline in a file name appears as
	// "\012", as the kernel escapes it.
	Path    string
	Deleted bool // the name had the " (deleted)" suffix

	// The rest is known only when parsed from smaps.
	HasSmaps bool
	Flags    VMFlags
	Usage    Usage
}

// Len returns the size of the mapping in bytes.
func (m *Mapping) Len() uint64 { return m.End - m.Start }

// Shared reports whether the mapping is MAP_SHARED (VM_MAYSHARE).
func (m *Mapping) Shared() bool { return m.Perms&PermShared != 0 }

// Kind classifies a mapping by how its contents are to be saved.
type Kind int

// Mapping kinds.
const (
	// KindAnon is private anonymous memory: no name, [heap], [stack],
	// [anon:NAME]. Present and swapped pages are dumped.
	KindAnon Kind = iota
	// KindFilePrivate is a private mapping of a file: clean pages come
	// from the file, pages copied on write are dumped.
	KindFilePrivate
	// KindFileShared is a shared mapping of a regular file: the file
	// holds the contents.
	KindFileShared
	// KindShmem is shared memory with no file to restore it from: shared
	// anonymous (/dev/zero), memfd, SysV shm, [anon_shmem:NAME]. The
	// contents are dumped.
	KindShmem
	// KindSpecial is a kernel-provided mapping: [vdso], [vvar],
	// [vvar_vclock], [vsyscall], [uprobes] and any other bracketed name
	// this package does not know.
	KindSpecial
	// KindDevice is an I/O or PFN mapping of a device (VM_IO or
	// VM_PFNMAP, known only from smaps) that is not special.
	KindDevice
)

var kindNames = [...]string{"anon", "file-private", "file-shared", "shmem", "special", "device"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Kind classifies m.
func (m *Mapping) Kind() Kind {
	switch {
	case m.IsSpecial():
		return KindSpecial
	case m.HasSmaps && (m.Flags.Has(VMIO) || m.Flags.Has(VMPFNMap)):
		return KindDevice
	case m.IsShmem():
		return KindShmem
	case m.IsAnon():
		return KindAnon
	case m.Shared():
		return KindFileShared
	default:
		return KindFilePrivate
	}
}

// IsAnon reports whether m has no backing object: no name, [heap],
// [stack] (or an old kernel's [stack:TID]) or [anon:NAME].
func (m *Mapping) IsAnon() bool {
	if m.Inode != 0 {
		return false
	}
	p := m.Path
	return p == "" || p == "[heap]" || p == "[stack]" ||
		strings.HasPrefix(p, "[stack:") || strings.HasPrefix(p, "[anon:")
}

// IsAnonPrivate reports whether m is private anonymous memory.
func (m *Mapping) IsAnonPrivate() bool { return !m.Shared() && m.IsAnon() }

// IsMemfd reports whether m maps a memfd (shared or private).
func (m *Mapping) IsMemfd() bool { return strings.HasPrefix(m.Path, "/memfd:") }

// IsSysV reports whether m is an attached SysV shared memory segment.
func (m *Mapping) IsSysV() bool {
	return m.Shared() && strings.HasPrefix(m.Path, "/SYSV") && len(m.Path) == len("/SYSV")+8
}

// IsShmem reports whether m is shared memory that only the process's
// memory holds: shared anonymous (shown as "/dev/zero (deleted)", or
// [anon_shmem:NAME]), a shared mapping of a memfd or of /dev/zero, or a
// SysV segment.
func (m *Mapping) IsShmem() bool {
	if !m.Shared() {
		return false
	}
	p := m.Path
	return p == "/dev/zero" || m.IsMemfd() || m.IsSysV() || strings.HasPrefix(p, "[anon_shmem:")
}

// IsSpecial reports whether m is a kernel-provided mapping: any bracketed
// name other than [heap], [stack], [anon:...] and [anon_shmem:...].
func (m *Mapping) IsSpecial() bool {
	p := m.Path
	if !strings.HasPrefix(p, "[") || !strings.HasSuffix(p, "]") {
		return false
	}
	return !m.IsAnon() && !strings.HasPrefix(p, "[anon_shmem:")
}

// Name returns Path with " (deleted)" restored when the file was deleted:
// the name exactly as /proc showed it.
func (m *Mapping) Name() string {
	if m.Deleted {
		return m.Path + deletedSuffix
	}
	return m.Path
}

// String formats m as a /proc/PID/maps line (without padding).
func (m *Mapping) String() string {
	return fmt.Sprintf("%x-%x %s %08x %s %d %s", m.Start, m.End, m.Perms, m.Offset, m.Dev, m.Inode, m.Name())
}

const deletedSuffix = " (deleted)"

// ParseMaps parses /proc/PID/maps.
func ParseMaps(r io.Reader) ([]Mapping, error) {
	return parseMaps(r, false)
}

// ParseSmaps parses /proc/PID/smaps: each mapping's header line followed by
// its counters and VmFlags.
func ParseSmaps(r io.Reader) ([]Mapping, error) {
	return parseMaps(r, true)
}

// ReadMappings reads and parses /proc/PID/smaps.
func ReadMappings(pid int) ([]Mapping, error) {
	return readMaps(pid, "smaps", true)
}

// ReadMaps reads and parses /proc/PID/maps (cheaper than smaps: no
// counters, no VmFlags).
func ReadMaps(pid int) ([]Mapping, error) {
	return readMaps(pid, "maps", false)
}

func readMaps(pid int, name string, smaps bool) ([]Mapping, error) {
	path := pidPath(pid, name)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer f.Close()
	ms, err := parseMaps(f, smaps)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return ms, nil
}

func parseMaps(r io.Reader, smaps bool) ([]Mapping, error) {
	sc := NewScanner(r)
	var out []Mapping
	var cur *Mapping
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := sc.Bytes()
		if len(trimSpace(line)) == 0 {
			continue
		}
		if smaps && cur != nil {
			if handled, err := parseSmapsField(line, cur); err != nil {
				return nil, fmt.Errorf("line %d: %w", lineNo, err)
			} else if handled {
				continue
			}
		}
		if len(out) >= MaxMappings {
			return nil, fmt.Errorf("%w: more than %d mappings", ErrTooLarge, MaxMappings)
		}
		m, err := parseMapsLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		if n := len(out); n > 0 && m.Start < out[n-1].End {
			return nil, fmt.Errorf("line %d: %w", lineNo, Malformed("mapping overlaps or is out of order", line))
		}
		m.HasSmaps = smaps
		out = append(out, m)
		cur = &out[len(out)-1]
	}
	if err := sc.Err(); err != nil {
		return nil, ScanErr(err)
	}
	return out, nil
}

// parseMapsLine parses "start-end perms offset major:minor inode   path".
func parseMapsLine(line []byte) (Mapping, error) {
	var m Mapping
	rng, rest := nextField(line)
	perms, rest := nextField(rest)
	off, rest := nextField(rest)
	dev, rest := nextField(rest)
	ino, rest := nextField(rest)

	lo, hi, ok := bytes.Cut(rng, []byte{'-'})
	if !ok {
		return m, Malformed("maps address range", line)
	}
	var ok1, ok2 bool
	m.Start, ok1 = parseUint(lo, 16)
	m.End, ok2 = parseUint(hi, 16)
	if !ok1 || !ok2 || m.End < m.Start {
		return m, Malformed("maps address range", line)
	}
	if len(perms) != 4 {
		return m, Malformed("maps perms", line)
	}
	for i, want := range []byte("rwx") {
		switch perms[i] {
		case want:
			m.Perms |= 1 << i
		case '-':
		default:
			return m, Malformed("maps perms", line)
		}
	}
	switch perms[3] {
	case 's':
		m.Perms |= PermShared
	case 'p':
	default:
		return m, Malformed("maps perms", line)
	}
	if m.Offset, ok = parseUint(off, 16); !ok {
		return m, Malformed("maps offset", line)
	}
	maj, mnr, ok := bytes.Cut(dev, []byte{':'})
	major, ok1 := parseUint(maj, 16)
	minor, ok2 := parseUint(mnr, 16)
	if !ok || !ok1 || !ok2 || major > 1<<32-1 || minor > 1<<32-1 {
		return m, Malformed("maps device", line)
	}
	m.Dev = Dev{Major: uint32(major), Minor: uint32(minor)}
	if m.Inode, ok = parseUint(ino, 10); !ok {
		return m, Malformed("maps inode", line)
	}
	// The name is the rest of the line; it may itself contain blanks.
	name := bytes.TrimRight(rest, "\n")
	if bytes.HasSuffix(name, []byte(deletedSuffix)) {
		m.Deleted = true
		name = name[:len(name)-len(deletedSuffix)]
	}
	m.Path = string(name)
	return m, nil
}

// smapsCounter returns the field of u that the smaps counter key sets, or
// nil for a key not known here.
func smapsCounter(u *Usage, key string) *uint64 {
	switch key {
	case "Size":
		return &u.Size
	case "KernelPageSize":
		return &u.KernelPageSize
	case "MMUPageSize":
		return &u.MMUPageSize
	case "Rss":
		return &u.Rss
	case "Pss":
		return &u.Pss
	case "Pss_Dirty":
		return &u.PssDirty
	case "Shared_Clean":
		return &u.SharedClean
	case "Shared_Dirty":
		return &u.SharedDirty
	case "Private_Clean":
		return &u.PrivateClean
	case "Private_Dirty":
		return &u.PrivateDirty
	case "Referenced":
		return &u.Referenced
	case "Anonymous":
		return &u.Anonymous
	case "KSM":
		return &u.KSM
	case "LazyFree":
		return &u.LazyFree
	case "AnonHugePages":
		return &u.AnonHugePages
	case "ShmemPmdMapped":
		return &u.ShmemPmdMapped
	case "FilePmdMapped":
		return &u.FilePmdMapped
	case "Shared_Hugetlb":
		return &u.SharedHugetlb
	case "Private_Hugetlb":
		return &u.PrivateHugetlb
	case "Swap":
		return &u.Swap
	case "SwapPss":
		return &u.SwapPss
	case "Locked":
		return &u.Locked
	}
	return nil
}

// parseSmapsField parses one "Key: value" line of an smaps entry into m.
// It returns false (and no error) for a line that is not a field, which
// then must be the next mapping's header.
func parseSmapsField(line []byte, m *Mapping) (bool, error) {
	key, val, ok := bytes.Cut(line, []byte{':'})
	if !ok || len(key) == 0 || bytes.ContainsAny(key, " \t-") {
		return false, nil
	}
	k := string(key)
	switch k {
	case "VmFlags":
		f, err := ParseVMFlags(string(val))
		if err != nil {
			return true, err
		}
		m.Flags = f
		return true, nil
	case "THPeligible":
		v, ok := parseUint(trimSpace(val), 10)
		if !ok || v > 1 {
			return true, Malformed("smaps THPeligible", line)
		}
		m.Usage.THPEligible = v == 1
		return true, nil
	case "ProtectionKey":
		v, ok := parseUint(trimSpace(val), 10)
		if !ok || v > 1<<16 {
			return true, Malformed("smaps ProtectionKey", line)
		}
		m.Usage.ProtectionKey = int(v)
		return true, nil
	}
	p := smapsCounter(&m.Usage, k)
	if p == nil {
		// Newer kernels add fields; ignore the ones not known here.
		return true, nil
	}
	num, unit := nextField(val)
	v, ok := parseUint(num, 10)
	if !ok {
		return true, Malformed("smaps counter", line)
	}
	if u := trimSpace(unit); len(u) > 0 {
		if string(u) != "kB" {
			return true, Malformed("smaps unit", line)
		}
		if v > 1<<53 {
			return true, Malformed("smaps counter too large", line)
		}
		v *= 1024
	}
	*p = v
	return true, nil
}
