package proc

import (
	"fmt"
	"os"
	"strings"
)

// NamespaceKinds are the namespaces besides the pid one that a process
// can live in apart from its dumper (user namespaces are not followed).
var NamespaceKinds = []string{"cgroup", "ipc", "mnt", "net", "uts"}

// Namespace returns the identity of pid's namespace of kind ("net"...):
// the target of /proc/PID/ns/KIND, "net:[4026531840]".
func Namespace(pid int, kind string) (string, error) {
	return os.Readlink(pidPath(pid, "ns/"+kind))
}

// OtherNamespaces lists the kinds (NamespaceKinds) whose namespace pid
// lives in and this process does not.
func OtherNamespaces(pid int) ([]string, error) {
	var out []string
	for _, kind := range NamespaceKinds {
		its, err := Namespace(pid, kind)
		if err != nil {
			return nil, err
		}
		mine, err := Namespace(os.Getpid(), kind)
		if err != nil {
			return nil, err
		}
		if its != mine {
			out = append(out, kind)
		}
	}
	return out, nil
}

// Cgroups returns the lines of /proc/PID/cgroup: "ID:CONTROLLERS:PATH",
// the paths as this process's cgroup namespace sees them.
func Cgroups(pid int) ([]string, error) {
	b, err := ReadFile(pidPath(pid, "cgroup"), MaxSmallFile)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		if strings.Count(l, ":") < 2 {
			return nil, fmt.Errorf("%w: /proc/%d/cgroup line %q", ErrMalformed, pid, l)
		}
		out = append(out, l)
	}
	return out, nil
}
