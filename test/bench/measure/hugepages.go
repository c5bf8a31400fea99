package measure

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// HugeState returns the VMAs of pid whose VmFlags hold hg (MADV_HUGEPAGE)
// and its AnonHugePages in bytes, from /proc/PID/smaps.
func HugeState(pid int) (vmas int, anonHuge uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		return 0, 0, fmt.Errorf("huge pages of %d: %w", pid, err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) > 1 && f[0] == "VmFlags:" && slices.Contains(f[1:], "hg"):
			vmas++
		case len(f) == 3 && f[0] == "AnonHugePages:":
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("smaps of %d: %q: %w", pid, line, ErrOutput)
			}
			anonHuge += kb << 10
		}
	}
	return vmas, anonHuge, nil
}
