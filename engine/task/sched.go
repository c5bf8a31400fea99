package task

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// Scheduling: each thread's nice value, policy and real-time priority, CPU
// affinity and I/O priority, and the process's oom_score_adj. They are
// read and set from snapctl by tid (no injection): the calls take any
// task, and snapctl is root.

// schedResetOnFork is the flag sched_getscheduler(2) adds to the policy
// of a task whose children start with the default policy.
const schedResetOnFork = 0x40000000

// ioprioWhoProcess is IOPRIO_WHO_PROCESS: ioprio_get/set of one task.
const ioprioWhoProcess = 1

// readSched reads the scheduling of thread tid of process pid.
func readSched(pid, tid int) (*image.Sched, error) {
	st, err := proc.ReadTaskStat(pid, tid)
	if err != nil {
		return nil, err
	}
	s := &image.Sched{Nice: st.Nice, RTPriority: st.RTPriority}
	policy, _, errno := unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
	if errno != 0 {
		return nil, fmt.Errorf("sched_getscheduler(%d): %w", tid, errno)
	}
	s.Policy = uint32(policy)
	if p := s.Policy &^ schedResetOnFork; p >= unix.SCHED_DEADLINE {
		return nil, fmt.Errorf("%w: thread %d runs under scheduling policy %d (SCHED_DEADLINE), which restore cannot rebuild", image.ErrUnsupported, tid, p)
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity(%d): %w", tid, err)
	}
	words := (*[len(set)]uint64)(unsafe.Pointer(&set))[:]
	n := len(words)
	for n > 0 && words[n-1] == 0 {
		n--
	}
	s.Affinity = append([]uint64(nil), words[:n]...)
	prio, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(tid), 0)
	if errno != 0 {
		return nil, fmt.Errorf("ioprio_get(%d): %w", tid, errno)
	}
	s.IOPrio = int(prio)
	return s, nil
}

// readOOMScoreAdj reads /proc/PID/oom_score_adj.
func readOOMScoreAdj(pid int) (*int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		return nil, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("/proc/%d/oom_score_adj: %q: %w", pid, b, proc.ErrMalformed)
	}
	return &v, nil
}

// RestoreSched gives each thread of st (threads, in its order) the
// scheduling it had, and the process its oom_score_adj. A snapshot taken
// before they were recorded leaves them as the restore made them. It runs
// last before the processes run, so that a low priority or a narrow
// affinity does not slow the restore itself.
func RestoreSched(threads []*ptrace.Thread, st *image.Process) error {
	for i, t := range st.Threads {
		s := t.Sched
		if s == nil {
			continue
		}
		tid := threads[i].Tid()
		param := struct{ prio int32 }{int32(s.RTPriority)}
		if _, _, errno := unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(tid), uintptr(s.Policy), uintptr(unsafe.Pointer(&param))); errno != 0 {
			return fmt.Errorf("thread %d: sched_setscheduler(policy %d, priority %d): %w", t.TID, s.Policy, s.RTPriority, errno)
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, s.Nice); err != nil {
			return fmt.Errorf("thread %d: setpriority(%d): %w", t.TID, s.Nice, err)
		}
		if len(s.Affinity) > 0 {
			var set unix.CPUSet
			copy((*[len(set)]uint64)(unsafe.Pointer(&set))[:], s.Affinity)
			if err := unix.SchedSetaffinity(tid, &set); err != nil {
				return fmt.Errorf("thread %d: sched_setaffinity(CPUs %s): %w (does this machine have them?)", t.TID, cpuList(s.Affinity), err)
			}
		}
		if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), uintptr(s.IOPrio)); errno != 0 {
			return fmt.Errorf("thread %d: ioprio_set(%#x): %w", t.TID, s.IOPrio, errno)
		}
	}
	if st.OOMScoreAdj != nil && len(threads) > 0 {
		path := fmt.Sprintf("/proc/%d/oom_score_adj", threads[0].Tid())
		if err := os.WriteFile(path, []byte(strconv.Itoa(*st.OOMScoreAdj)), 0); err != nil {
			return fmt.Errorf("oom_score_adj %d: %w", *st.OOMScoreAdj, err)
		}
	}
	return nil
}

// cpuList names the CPUs of a mask as a list (0-3,8).
func cpuList(mask []uint64) string {
	var out []string
	for i := 0; i < 64*len(mask); i++ {
		if mask[i/64]&(1<<(i%64)) == 0 {
			continue
		}
		j := i
		for j+1 < 64*len(mask) && mask[(j+1)/64]&(1<<((j+1)%64)) != 0 {
			j++
		}
		if j > i {
			out = append(out, fmt.Sprintf("%d-%d", i, j))
		} else {
			out = append(out, strconv.Itoa(i))
		}
		i = j
	}
	return strings.Join(out, ",")
}
