package ptrace

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openMem opens /proc/PID/mem for reading and writing the tracee's memory.
// Everything the tracer parses from /proc it reads through engine/proc.
func openMem(pid int) (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR|unix.O_CLOEXEC, 0)
}
