package check

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// neededNS is what needs new namespaces.
const neededNS = "restore --pidns --netns"

// checkNamespaces starts the stub stopped in new pid, mount and network
// namespaces, as restore --pidns --netns new does, and kills it.
func checkNamespaces(stub string) Feature {
	const name = "namespaces"
	if stub == "" {
		var err error
		if stub, err = os.Executable(); err != nil {
			return feature(name, neededNS, err, "")
		}
	}
	t, err := ptrace.New()
	if err != nil {
		return feature(name, neededNS, err, "")
	}
	defer t.Close()
	p, err := t.StartStopped(stub, []string{"lazyfs-check-stub"}, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL,
		Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWNET})
	if err != nil {
		return feature(name, neededNS, fmt.Errorf("start a stub in new pid, mount and network namespaces: %w", err), "")
	}
	defer p.Kill()
	s, err := proc.ReadStatus(p.Pid())
	if err == nil && (len(s.NSpid) < 2 || s.NSpid[len(s.NSpid)-1] != 1) {
		err = fmt.Errorf("the stub has pids %v, want 1 in its namespace", s.NSpid)
	}
	return feature(name, neededNS, err, fmt.Sprintf("started pid %d as pid 1 of new pid, mount and network namespaces", p.Pid()))
}
