package check

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/engine/proc/pagemap"
	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
)

// Behaviours reports the kernel's behaviours that change what a dump finds
// or how fast a restore places memory, never whether either works: each is
// probed or read from the kernel, and each Feature has Behaviour set and
// OK true (a probe that fails says so in Detail).
func Behaviours() []Feature {
	return []Feature{zeroPageBehaviour(), thpBehaviour(), reportingBehaviour(), propagationBehaviour(), sharedMemoryBehaviour()}
}

func behaviour(name, affects, detail string) Feature {
	return Feature{Name: name, Needed: affects, OK: true, Behaviour: true, Detail: detail}
}

// zeroPageBehaviour: what a read fault of private anonymous memory maps.
func zeroPageBehaviour() Feature {
	const name, affects = "read-fault page", "dump, memory use"
	zero, err := pagemap.ReadFaultMapsZeroPage()
	switch {
	case err != nil:
		return behaviour(name, affects, "unknown: "+err.Error())
	case zero:
		return behaviour(name, affects, "the shared zero page: memory only read costs no RAM")
	}
	return behaviour(name, affects, "a private page of zeros: memory only read costs RAM, and a dump reads it (stored as ZERO blocks all the same)")
}

// thpBehaviour: the transparent huge page policy.
func thpBehaviour() Feature {
	const name, affects = "THP", "speed, memory use"
	t, err := kernel.ReadTHP()
	if os.IsNotExist(err) {
		return behaviour(name, affects, "none: this kernel has no transparent huge pages")
	}
	if err != nil {
		return behaviour(name, affects, "unknown: "+err.Error())
	}
	d := fmt.Sprintf("enabled=%s defrag=%s use_zero_page=%v", t.Enabled, t.Defrag, t.UseZeroPage)
	if len(t.Sizes) > 0 {
		d += " sizes " + strings.Join(t.Sizes, ",")
	}
	return behaviour(name, affects, d)
}

// reportingBehaviour: free page reporting to a hypervisor.
func reportingBehaviour() Feature {
	const name, affects = "page reporting", "speed"
	on, order, err := kernel.FreePageReporting()
	switch {
	case err != nil:
		return behaviour(name, affects, "unknown: "+err.Error())
	case !on:
		return behaviour(name, affects, "off")
	}
	return behaviour(name, affects, fmt.Sprintf("on (virtio balloon, order %d): the host takes freed memory back, the first touch of it is slow and timings swing between runs", order))
}

// propagationBehaviour: whether mounts made on the host reach the mount
// namespaces snapctl makes (replicas, the private mount's helper), and
// unmounts reach their copies.
func propagationBehaviour() Feature {
	const name, affects = "/ propagation", "replicas, lazy restore"
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return behaviour(name, affects, "unknown: "+err.Error())
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var opt []string
	found := false
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || fields[4] != "/" {
			continue
		}
		found, opt = true, nil // the last mount on / is the one seen
		for _, o := range fields[6:] {
			if o == "-" {
				break
			}
			opt = append(opt, o)
		}
	}
	if !found {
		return behaviour(name, affects, "unknown: no mount on / in /proc/self/mountinfo")
	}
	for _, o := range opt {
		if strings.HasPrefix(o, "shared:") {
			return behaviour(name, affects, "shared ("+strings.Join(opt, " ")+"): mounts and unmounts made here reach the namespaces snapctl makes")
		}
	}
	return behaviour(name, affects, "private: a namespace snapctl makes keeps copies of the mounts that existed when it was made; unmounts made here do not reach them")
}

// sharedMemoryBehaviour: whether restore --lazy serves shared memory on
// demand (UFFD_FEATURE_MISSING_SHMEM) or fills it before the processes run.
func sharedMemoryBehaviour() Feature {
	const name, affects = "lazy shmem", "restore --lazy speed"
	supported, err := uffdFeatures()
	switch {
	case err != nil:
		return behaviour(name, affects, "unknown: "+err.Error())
	case supported&uffdio.FeatureMissingShmem != 0:
		return behaviour(name, affects, "served on demand: a tree's shared anonymous memory and memfds (UFFD_FEATURE_MISSING_SHMEM)")
	}
	return behaviour(name, affects, "filled before the processes run: UFFDIO_API lacks MISSING_SHMEM (Linux 4.11)")
}
