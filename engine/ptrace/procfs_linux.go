package ptrace

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procStatus holds the fields of /proc/TID/status the tracer needs.
type procStatus struct {
	state     byte // first letter of State:
	tgid      int
	ppid      int
	tracerPid int
}

func readStatus(tid int) (procStatus, error) {
	var st procStatus
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return st, err
	}
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		v = bytes.TrimSpace(v)
		switch string(k) {
		case "State":
			if len(v) > 0 {
				st.state = v[0]
			}
		case "Tgid":
			st.tgid, _ = strconv.Atoi(string(v))
		case "PPid":
			st.ppid, _ = strconv.Atoi(string(v))
		case "TracerPid":
			st.tracerPid, _ = strconv.Atoi(string(v))
		}
	}
	return st, nil
}

// listTasks returns the tids in /proc/PID/task.
func listTasks(pid int) ([]int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if tid, err := strconv.Atoi(n); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

func openMem(pid int) (*os.File, error) {
	return os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR|unix.O_CLOEXEC, 0)
}

// mapping is one line of /proc/PID/maps, reduced to what injection needs.
type mapping struct {
	start, end uint64
	perms      string
	path       string
}

func readMaps(pid int) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		s, err1 := strconv.ParseUint(lo, 16, 64)
		e, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		m := mapping{start: s, end: e, perms: fields[1]}
		if len(fields) >= 6 {
			m.path = strings.Join(fields[5:], " ")
		}
		out = append(out, m)
	}
	return out, sc.Err()
}
