package proc

import "strconv"

// procRoot is where procfs is mounted.
const procRoot = "/proc"

// pidPath returns /proc/PID/name.
func pidPath(pid int, name string) string {
	return procRoot + "/" + strconv.Itoa(pid) + "/" + name
}

// taskPath returns /proc/PID/task/TID/name.
func taskPath(pid, tid int, name string) string {
	return procRoot + "/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/" + name
}
