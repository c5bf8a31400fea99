package proc

import (
	"errors"
	"os"
	"strconv"
)

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

// Exists reports whether a task (a process or a thread) with this id
// exists, zombies included: /proc/ID resolves for a thread id too, though
// only process ids are listed in /proc.
func Exists(id int) (bool, error) {
	if id <= 0 {
		return false, nil
	}
	_, err := os.Stat(procRoot + "/" + strconv.Itoa(id))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
