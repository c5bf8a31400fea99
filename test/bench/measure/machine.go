package measure

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/bench/report"
)

// DescribeMachine collects what the report says about the machine.
func DescribeMachine(work string, t Tools) report.Machine {
	m := report.Machine{
		CPUs:       runtime.NumCPU(),
		GoVersion:  t.GoVersion,
		Revision:   t.Revision,
		LZ4Version: t.LZ4Version,
		LoadBefore: LoadAverage(),
	}
	if m.GoVersion == "" {
		m.GoVersion = runtime.Version()
	}
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		m.Affinity = set.Count()
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if k == "model name" && m.CPU == "" {
				m.CPU = v
			}
			if k == "flags" && strings.Contains(" "+v+" ", " hypervisor ") {
				m.Hypervisor = true
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
					m.Memory = kb << 10
				}
			}
		}
	}
	m.FreePageReporting = freePageReporting()
	m.WorkDisk = diskOf(work)
	return m
}

// LoadAverage returns the three load averages.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// virtioBalloonReporting is VIRTIO_BALLOON_F_REPORTING, the feature bit of
// free page reporting.
const virtioBalloonReporting = 5

// freePageReporting tells whether a virtio balloon with free page
// reporting is present: then memory the guest freed goes back to the host
// and its first touch afterwards is several times slower.
func freePageReporting() string {
	devs, _ := filepath.Glob("/sys/bus/virtio/drivers/virtio_balloon/virtio*/features")
	if len(devs) == 0 {
		return "no virtio balloon"
	}
	b, err := os.ReadFile(devs[0])
	if err != nil {
		return "virtio balloon, features unreadable"
	}
	f := strings.TrimSpace(string(b))
	if len(f) > virtioBalloonReporting && f[virtioBalloonReporting] == '1' {
		return "on (virtio balloon offers free page reporting)"
	}
	return "off (virtio balloon without free page reporting)"
}

// diskOf names the mount holding dir: device and file system type.
func diskOf(dir string) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "?"
	}
	best, desc := "", "?"
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best, desc = mp, f[0]+" ("+f[2]+")"
		}
	}
	return desc
}
