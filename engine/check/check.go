package check

import (
	"context"
)

// Feature is a kernel facility (or a tool) that dump or restore needs, as
// Run found it on this machine.
type Feature struct {
	Name   string `json:"name"`
	Needed string `json:"needed"` // what needs it
	OK     bool   `json:"ok"`
	Detail string `json:"detail"` // what was tried and seen, or why it is missing
	// Behaviour marks a behaviour of the kernel reported for what it
	// changes (Needed then says what), not a facility that can be
	// missing: OK is always true.
	Behaviour bool `json:"behaviour,omitempty"`
}

// What needs each feature.
const (
	neededRestore = "restore"
	neededLazy    = "restore --lazy"
	neededPreCopy = "dump --pre-copy"
	neededMount   = "lazyfs, restore --lazy"
)

// pageSize is the size of the pages the probes map and register.
const pageSize = 4096

// Run tries every kernel facility but FUSE that restore and pre-copy
// dumps need, for real: ptrace (a stub started stopped, seized,
// interrupted and injected into), clone3 with set_tid (a process made with
// a chosen free pid and killed), PR_SET_MM_MAP (the size query and a call
// with the stub's own values), userfaultfd (the features lazy restore and
// pre-copy dumps need, and an anonymous range registered MISSING) and
// PAGEMAP_SCAN on /proc/self/pagemap, new pid, mount and network
// namespaces (a stub started in them), and TCP_REPAIR with the nft
// program (--tcp-established). stub is the program started stopped
// (it never runs an instruction); "" means this executable.
func Run(ctx context.Context, stub string) []Feature {
	out := checkTracing(ctx, stub)
	out = append(out, checkUserfaultfd()...)
	return append(out, checkPagemapScan(), checkNamespaces(stub), checkTCPRepair(ctx))
}

// FUSE is the FUSE feature (what lazyfs and restore --lazy mount) from
// what fs.CheckFUSE saw: detail if err is nil, else err.
func FUSE(detail string, err error) Feature {
	return feature("FUSE", neededMount, err, detail)
}

func feature(name, needed string, err error, detail string) Feature {
	if err != nil {
		return Feature{Name: name, Needed: needed, Detail: err.Error()}
	}
	return Feature{Name: name, Needed: needed, OK: true, Detail: detail}
}
