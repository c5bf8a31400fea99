package codec

import "golang.org/x/sys/unix"

// schedCPUs returns the number of CPUs in the calling thread's affinity
// mask, or 0 if it cannot be read.
func schedCPUs() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	return set.Count()
}
