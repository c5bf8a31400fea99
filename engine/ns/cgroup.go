package ns

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
)

// JoinCgroups moves process pid into each cgroup of process of, in every
// hierarchy of ours that of is in (cgroup v1 controllers, named
// hierarchies, cgroup v2): its pid written into the cgroup's
// cgroup.procs, as a container runtime does for the processes it starts.
// A hierarchy not mounted here is left alone.
func JoinCgroups(pid, of int) error {
	lines, err := proc.Cgroups(of)
	if err != nil {
		return err
	}
	mounts, err := kernel.Mounts(os.Getpid())
	if err != nil {
		return err
	}
	for _, l := range lines {
		_, rest, _ := strings.Cut(l, ":")
		ctrls, path, _ := strings.Cut(rest, ":")
		mnt := cgroupMount(mounts, ctrls)
		if mnt == "" {
			continue
		}
		if !strings.HasPrefix(path, "/") || slices.Contains(strings.Split(path, "/"), "..") {
			// Outside our cgroup namespace's root: not ours to reach.
			return fmt.Errorf("join the cgroups of process %d: %q is outside snapctl's cgroup namespace", of, path)
		}
		file := filepath.Join(mnt, path, "cgroup.procs")
		f, err := os.OpenFile(file, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(strconv.Itoa(pid))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("join the cgroup %s of process %d: %w", filepath.Join(mnt, path), of, err)
		}
	}
	return nil
}

// cgroupMount returns where the hierarchy of controllers ctrls (as
// /proc/PID/cgroup names them: "cpu,cpuacct", "name=systemd", "" for
// cgroup v2) is mounted in ms, or "".
func cgroupMount(ms []kernel.Mount, ctrls string) string {
	for _, m := range ms {
		switch {
		case ctrls == "" && m.FSType == "cgroup2":
			return m.Path
		case ctrls != "" && m.FSType == "cgroup":
			opts := strings.Split(m.Super, ",")
			all := true
			for _, c := range strings.Split(ctrls, ",") {
				all = all && slices.Contains(opts, c)
			}
			if all {
				return m.Path
			}
		}
	}
	return ""
}
