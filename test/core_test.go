package e2e

// End-to-end tests of MNT/PID/core: standard debuggers (gdb, readelf,
// elfutils' eu-readelf and eu-stack) open the core file that a lazyfs mount
// generates from a snapshot of a real process, with no conversion step.

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// gdbBatch runs gdb -batch on exe and core with the commands cmds, without
// any init file or debuginfod (no network), and returns its standard
// output.
func gdbBatch(t *testing.T, exe, core string, cmds ...string) string {
	t.Helper()
	args := []string{"-nx", "-batch", "-iex", "set debuginfod enabled off"}
	for _, c := range cmds {
		args = append(args, "-ex", c)
	}
	out := string(testutil.Output(t, "gdb", append(args, exe, core)...))
	t.Logf("gdb %s:\n%s", strings.Join(cmds, "; "), out)
	return out
}

// TestCoreGDB dumps the corestack fixture (two threads in functions of its
// own, a global it bumps and a heap marker) mid-loop, mounts the snapshot
// and opens MNT/PID/core with gdb, readelf, eu-readelf and eu-stack.
func TestCoreGDB(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "gdb", "readelf", "eu-readelf", "eu-stack")
	ctx := testContext(t)
	exe := fixture.Build(t, "corestack")
	p := fixture.Start(t, "corestack")
	time.Sleep(50 * time.Millisecond) // some ticks: the global is a count mid-loop
	si := dumpStopped(t, ctx, p)
	mnt := lazyMountLazyfs(t, si.Dir)
	core := filepath.Join(mnt, strconv.Itoa(p.PID), "core")
	globalAddr := p.Ready.MustUint(t, "global_addr")
	markerAddr := p.Ready.MustUint(t, "marker_addr")
	marker, _ := p.Ready.Value("marker")
	global := binary.LittleEndian.Uint64(si.read(t, globalAddr, 8))
	if global <= 1000 {
		t.Fatalf("corestack_global is %d in the snapshot: the main loop never ran", global)
	}

	t.Run("gdb: both backtraces, the global, the heap marker", func(t *testing.T) {
		out := gdbBatch(t, exe, core, "thread apply all bt", "print corestack_global", fmt.Sprintf("x/s %#x", markerAddr))
		for _, want := range []string{
			"corestack_main_tick", "corestack_main_loop", " main ", // the main thread
			"corestack_worker_wait", "corestack_worker_main", "start_thread", // the worker
			fmt.Sprintf("$1 = %d\n", global),
			fmt.Sprintf("%#x:\t%q", markerAddr, marker),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("gdb output lacks %q", want)
			}
		}
		if n := len(regexp.MustCompile(`(?m)^Thread \d+ \(`).FindAllString(out, -1)); n != 2 {
			t.Errorf("gdb shows %d threads, want 2", n)
		}
	})
	t.Run("readelf -n and eu-readelf -n list the notes", func(t *testing.T) {
		out := string(testutil.Output(t, "readelf", "-n", core))
		for _, n := range []string{"NT_PRSTATUS", "NT_PRPSINFO", "NT_AUXV", "NT_FILE", "NT_FPREGSET", "NT_X86_XSTATE"} {
			if !strings.Contains(out, n) {
				t.Errorf("readelf -n lacks %s:\n%s", n, out)
			}
		}
		if c := strings.Count(out, "NT_PRSTATUS"); c != 2 {
			t.Errorf("readelf -n: %d NT_PRSTATUS, want one per thread (2)", c)
		}
		out = string(testutil.Output(t, "eu-readelf", "-n", core))
		for _, n := range []string{"PRSTATUS", "PRPSINFO", "AUXV", "FILE", "FPREGSET", "X86_XSTATE", "corestack", fmt.Sprintf("pid: %d", p.PID)} {
			if !strings.Contains(out, n) {
				t.Errorf("eu-readelf -n lacks %s", n)
			}
		}
	})
	t.Run("snapctl inspect says how to open it", func(t *testing.T) {
		r := runTool(t, buildTool(t, "snapctl"), commandTimeout, "inspect", "-D", si.Dir)
		if want := fmt.Sprintf("gdb %s MNT/%d/core", si.State.Exe.Path, p.PID); r.Code != 0 || !strings.Contains(r.Stdout, want) {
			t.Errorf("snapctl inspect does not say %q:\n%s", want, r)
		}
	})
	t.Run("eu-stack --core shows the frames", func(t *testing.T) {
		out := string(testutil.Output(t, "eu-stack", "--core="+core, "--executable="+exe))
		t.Logf("eu-stack:\n%s", out)
		for _, want := range []string{fmt.Sprintf("TID %d:", p.PID), "corestack_main_tick", "corestack_main_loop", "corestack_worker_wait", "corestack_worker_main"} {
			if !strings.Contains(out, want) {
				t.Errorf("eu-stack lacks %q", want)
			}
		}
	})
}

// TestCorePython: gdb on the core of a python3 snapshot prints a C
// backtrace through the interpreter (its exported symbols; no debug
// information needed).
func TestCorePython(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "gdb")
	ctx := testContext(t)
	p := fixture.StartPython(t, "pystate.py")
	si := dumpStopped(t, ctx, p)
	mnt := lazyMountLazyfs(t, si.Dir)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID))
	if err != nil {
		t.Fatal(err)
	}
	out := gdbBatch(t, exe, filepath.Join(mnt, strconv.Itoa(p.PID), "core"), "bt")
	for _, want := range []string{"#0 ", "_PyEval_EvalFrameDefault", "Py_RunMain", "main"} {
		if !strings.Contains(out, want) {
			t.Errorf("gdb bt lacks %q", want)
		}
	}
}
