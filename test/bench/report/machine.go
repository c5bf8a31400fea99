package report

import (
	"github.com/lazyfs/lazyfs/engine/units"
)

// Machine describes where the numbers were measured.
type Machine struct {
	CPU               string
	CPUs              int    // online CPUs
	Affinity          int    // CPUs this process may run on
	Hypervisor        bool   // the CPU flags say so
	Kernel            string // release
	Memory            uint64 // MemTotal
	GoVersion         string // of snapctl
	Revision          string // lazyfs commit snapctl was built from
	LZ4Version        string
	FreePageReporting string // what virtio_balloon offers
	WorkDisk          string // device and file system of the work directory
	LoadBefore        string // /proc/loadavg at the start
	LoadAfter         string // and at the end
}

// memoryString formats MemTotal.
func (m Machine) memoryString() string {
	return units.FormatSize(m.Memory)
}
