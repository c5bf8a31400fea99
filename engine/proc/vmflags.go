package proc

import (
	"fmt"
	"strings"
)

// VMFlag is one VMA flag shown on the VmFlags line of /proc/PID/smaps. The
// values are this package's own bit numbering, not the kernel's VM_* bits
// (which differ between kernel versions and architectures).
type VMFlag uint64

// VMA flags by their smaps mnemonic.
const (
	VMRead        VMFlag = 1 << iota // rd
	VMWrite                          // wr
	VMExec                           // ex
	VMShared                         // sh
	VMMayRead                        // mr
	VMMayWrite                       // mw
	VMMayExec                        // me
	VMMayShare                       // ms
	VMGrowsDown                      // gd
	VMPFNMap                         // pf: pure PFN range, no struct pages
	VMDenyWrite                      // dw (kernels before 5.15)
	VMLocked                         // lo: mlock()ed
	VMIO                             // io: memory-mapped I/O
	VMSeqRead                        // sr: MADV_SEQUENTIAL
	VMRandRead                       // rr: MADV_RANDOM
	VMDontCopy                       // dc: MADV_DONTFORK
	VMDontExpand                     // de
	VMLockOnFault                    // lf: mlock2(MLOCK_ONFAULT)
	VMAccount                        // ac
	VMNoReserve                      // nr: MAP_NORESERVE
	VMHugeTLB                        // ht
	VMSync                           // sf: MAP_SYNC
	VMArch1                          // ar
	VMWipeOnFork                     // wf: MADV_WIPEONFORK
	VMDontDump                       // dd: MADV_DONTDUMP
	VMSoftDirty                      // sd
	VMMixedMap                       // mm
	VMHugePage                       // hg: MADV_HUGEPAGE
	VMNoHugePage                     // nh: MADV_NOHUGEPAGE
	VMMergeable                      // mg: MADV_MERGEABLE (KSM)
	VMUffdMissing                    // um: userfaultfd missing-mode registered
	VMUffdWP                         // uw: userfaultfd write-protect registered
	VMUffdMinor                      // ui: userfaultfd minor-mode registered
	VMShadowStack                    // ss
	VMSealed                         // sl: mseal()ed
	VMDroppable                      // dp: MAP_DROPPABLE
	VMBTI                            // bt (arm64)
	VMMTE                            // mt (arm64)
	VMNonLinear                      // nl (kernels before 4.0)
	VMMPX                            // mp (kernels before 5.6)
)

// vmFlagNames maps each VMFlag bit (by index) to its mnemonic.
var vmFlagNames = [...]string{
	"rd", "wr", "ex", "sh", "mr", "mw", "me", "ms", "gd", "pf", "dw", "lo",
	"io", "sr", "rr", "dc", "de", "lf", "ac", "nr", "ht", "sf", "ar", "wf",
	"dd", "sd", "mm", "hg", "nh", "mg", "um", "uw", "ui", "ss", "sl", "dp",
	"bt", "mt", "nl", "mp",
}

// maxUnknownVMFlags bounds the unknown mnemonics kept per mapping.
const maxUnknownVMFlags = 64

// VMFlags is the set of flags on a smaps VmFlags line. Mnemonics this
// package does not know are kept, space-separated in their order, so that a
// newer kernel's flags are not lost. VMFlags is comparable.
type VMFlags struct {
	known   VMFlag
	unknown string
}

// ParseVMFlags parses the value of a VmFlags line ("rd wr mr mw me ac").
func ParseVMFlags(s string) (VMFlags, error) {
	var f VMFlags
	var unknown []string
	for _, name := range strings.Fields(s) {
		if bit, ok := vmFlagByName(name); ok {
			f.known |= bit
			continue
		}
		if len(unknown) >= maxUnknownVMFlags {
			return VMFlags{}, fmt.Errorf("%w: more than %d unknown VmFlags", ErrTooLarge, maxUnknownVMFlags)
		}
		if len(name) > 8 {
			return VMFlags{}, Malformed("VmFlags mnemonic", []byte(name))
		}
		unknown = append(unknown, name)
	}
	f.unknown = strings.Join(unknown, " ")
	return f, nil
}

func vmFlagByName(name string) (VMFlag, bool) {
	for i, n := range vmFlagNames {
		if n == name {
			return 1 << i, true
		}
	}
	return 0, false
}

// Has reports whether every flag in want is set.
func (f VMFlags) Has(want VMFlag) bool { return f.known&want == want }

// Known returns the flags this package knows.
func (f VMFlags) Known() VMFlag { return f.known }

// Unknown returns the mnemonics this package does not know, in order.
func (f VMFlags) Unknown() []string { return strings.Fields(f.unknown) }

// Names returns every mnemonic in the set: known ones in this package's
// order, then unknown ones.
func (f VMFlags) Names() []string {
	var out []string
	for i, n := range vmFlagNames {
		if f.known&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return append(out, f.Unknown()...)
}

// String returns the mnemonics separated by spaces, as smaps shows them.
func (f VMFlags) String() string { return strings.Join(f.Names(), " ") }

// With returns f with the known flags add set.
func (f VMFlags) With(add VMFlag) VMFlags {
	f.known |= add
	return f
}
