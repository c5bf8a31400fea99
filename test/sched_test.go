package e2e

// Scheduling: each thread's nice value, policy and real-time priority, CPU
// affinity and I/O priority, and the process's oom_score_adj come back as
// they were, not as snapctl's (run here under nice 10); a thread under
// SCHED_DEADLINE is refused at dump, naming it.

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// threadSched is what a test sets and reads of a thread's scheduling.
type threadSched struct {
	nice     int
	policy   int // sched_getscheduler's answer
	rtPrio   int
	affinity uint64 // CPUs 0-63
	ioprio   int
}

// readThreadSched reads thread tid's scheduling.
func readThreadSched(t *testing.T, pid, tid int) threadSched {
	t.Helper()
	st, err := proc.ReadTaskStat(pid, tid)
	if err != nil {
		t.Fatal(err)
	}
	s := threadSched{nice: st.Nice, rtPrio: int(st.RTPriority)}
	policy, _, errno := unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, uintptr(tid), 0, 0)
	if errno != 0 {
		t.Fatalf("sched_getscheduler(%d): %v", tid, errno)
	}
	s.policy = int(policy)
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		t.Fatal(err)
	}
	for cpu := range 64 {
		if set.IsSet(cpu) {
			s.affinity |= 1 << cpu
		}
	}
	prio, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, 1, uintptr(tid), 0)
	if errno != 0 {
		t.Fatalf("ioprio_get(%d): %v", tid, errno)
	}
	s.ioprio = int(prio)
	return s
}

// setThreadSched gives thread tid the scheduling s.
func setThreadSched(t *testing.T, tid int, s threadSched) {
	t.Helper()
	param := struct{ prio int32 }{int32(s.rtPrio)}
	if _, _, errno := unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, uintptr(tid), uintptr(s.policy), uintptr(unsafe.Pointer(&param))); errno != 0 {
		t.Fatalf("sched_setscheduler(%d, %d, %d): %v", tid, s.policy, s.rtPrio, errno)
	}
	if s.policy == unix.SCHED_NORMAL || s.policy == unix.SCHED_BATCH {
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, s.nice); err != nil {
			t.Fatal(err)
		}
	}
	var set unix.CPUSet
	for cpu := range 64 {
		if s.affinity&(1<<cpu) != 0 {
			set.Set(cpu)
		}
	}
	if err := unix.SchedSetaffinity(tid, &set); err != nil {
		t.Fatal(err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, 1, uintptr(tid), uintptr(s.ioprio)); errno != 0 {
		t.Fatalf("ioprio_set(%d, %#x): %v", tid, s.ioprio, errno)
	}
}

func TestRestoreScheduling(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	niceBin := testutil.RequireCommand(t, "nice")
	snapctl := buildTool(t, "snapctl")
	ctx := testContext(t)
	// The CPUs this test may use: the last one alone for one thread, all
	// of them for the others.
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	var all uint64
	last := 0
	for cpu := range 64 {
		if mine.IsSet(cpu) {
			all |= 1 << cpu
			last = cpu
		}
	}
	if runtime.NumCPU() > 64 || all == 0 {
		t.Fatalf("CPU affinity %v: this test numbers CPUs 0-63", mine)
	}
	const (
		ioprioIdle = 3 << 13
		ioprioBE6  = 2<<13 | 6
		ioprioRT2  = 1<<13 | 2
	)
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			p := fixture.Start(t, "threads")
			tids := taskIDs(t, p.PID)
			if len(tids) != 5 {
				t.Fatalf("threads fixture has tasks %v, want 5", tids)
			}
			want := map[int]threadSched{
				tids[0]: {policy: unix.SCHED_RR, rtPrio: 3, affinity: all, ioprio: ioprioRT2},
				tids[1]: {nice: 7, policy: unix.SCHED_NORMAL, affinity: 1 << last, ioprio: ioprioIdle},
				tids[2]: {nice: -4, policy: unix.SCHED_BATCH, affinity: all, ioprio: ioprioBE6},
				tids[3]: {nice: 0, policy: unix.SCHED_IDLE | 0x40000000, affinity: all, ioprio: ioprioBE6},
				tids[4]: {nice: 12, policy: unix.SCHED_NORMAL, affinity: all, ioprio: 0},
			}
			for tid, s := range want {
				setThreadSched(t, tid, s)
			}
			// SCHED_IDLE reads back nice 0 on some kernels and the nice
			// it had on others: what restore must bring back is what was
			// read.
			for tid := range want {
				want[tid] = readThreadSched(t, p.PID, tid)
			}
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", p.PID), []byte("321"), 0); err != nil {
				t.Fatal(err)
			}
			dir, _ := dumpForRestore(t, ctx, p)
			args := []string{"-n", "10", snapctl, "restore", "-D", dir}
			if mode == "lazy" {
				args = append(args, "--lazy")
			}
			out, err := exec.CommandContext(ctx, niceBin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("nice -n 10 snapctl restore: %v\n%s", err, out)
			}
			t.Logf("%s", strings.TrimSpace(string(out)))
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
			for tid, w := range want {
				if got := readThreadSched(t, p.PID, tid); got != w {
					t.Errorf("thread %d restored with %+v, dumped with %+v", tid, got, w)
				}
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", p.PID))
			if err != nil || strings.TrimSpace(string(b)) != "321" {
				t.Errorf("oom_score_adj %q, %v; want 321", b, err)
			}
			r := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			wantField(t, r, "ring_ok", "1")
			wantField(t, r, "state_ok", "1")
		})
	}
	t.Run("SCHED_DEADLINE refused", func(t *testing.T) {
		p := fixture.Start(t, "threads")
		tids := taskIDs(t, p.PID)
		// struct sched_attr: size, policy, flags, nice, priority, then
		// runtime, deadline and period in ns.
		attr := struct {
			size                      uint32
			policy                    uint32
			flags                     uint64
			nice                      int32
			priority                  uint32
			runtime, deadline, period uint64
		}{size: 48, policy: 6, runtime: 1_000_000, deadline: 10_000_000, period: 10_000_000}
		// The deadline task's affinity must span its root domain.
		if _, _, errno := unix.Syscall(unix.SYS_SCHED_SETATTR, uintptr(tids[2]), uintptr(unsafe.Pointer(&attr)), 0); errno != 0 {
			t.Fatalf("sched_setattr(SCHED_DEADLINE) on thread %d: %v", tids[2], errno)
		}
		r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", t.TempDir()+"/snap")
		if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "SCHED_DEADLINE") || !strings.Contains(r.Stderr, strconv.Itoa(tids[2])) {
			t.Errorf("dump of a thread under SCHED_DEADLINE: want exit %d naming it and the thread\n%s", exitUnsupported, r)
		}
		if !p.Alive() {
			t.Errorf("the refused dump killed the process")
		}
	})
}

// TestDumpSeccompRefused: a process under a seccomp filter is refused at
// dump, naming seccomp, and left running: a restore could not rebuild the
// filter, and the process would run unconfined.
func TestDumpSeccompRefused(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	p := fixture.Start(t, "seccomp")
	r := runSnapctl(t, "dump", "-t", strconv.Itoa(p.PID), "-D", t.TempDir()+"/snap")
	if r.Code != exitUnsupported || !strings.Contains(r.Stderr, "seccomp") {
		t.Errorf("dump of a process under seccomp: want exit %d naming seccomp\n%s", exitUnsupported, r)
	}
	if !p.Alive() {
		t.Errorf("the refused dump killed the process")
	}
}
