package kernel

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lazyfs/lazyfs/engine/proc"
)

// Sysctl reads the kernel parameter name, dotted as sysctl(8) names it
// ("kernel.pid_max") or as its path under /proc/sys ("kernel/pid_max"),
// without its trailing newline.
func Sysctl(name string) (string, error) {
	rel := strings.ReplaceAll(name, ".", "/")
	if rel == "" || strings.HasPrefix(rel, "/") || strings.Contains(rel, "//") {
		return "", fmt.Errorf("sysctl %q: %w", name, proc.Malformed("name", []byte(name)))
	}
	b, err := proc.ReadFile("/proc/sys/"+rel, proc.MaxSmallFile)
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", name, err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// SysctlInt reads an integer kernel parameter, such as kernel.pid_max or
// kernel.ns_last_pid.
func SysctlInt(name string) (int, error) {
	s, err := Sysctl(name)
	if err != nil {
		return 0, err
	}
	t := strings.TrimSpace(s)
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || strings.HasPrefix(t, "+") || v < -1<<31 || v > 1<<31-1 {
		return 0, fmt.Errorf("sysctl %s: %w", name, proc.Malformed("integer", []byte(s)))
	}
	return int(v), nil
}
