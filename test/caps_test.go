package e2e

// Capabilities and the parent-death signal: a process running as nobody
// with a bounding set of two capabilities and CAP_NET_BIND_SERVICE
// inheritable, permitted, effective and ambient (as a service started by
// systemd with AmbientCapabilities= runs), whose parent-death signal is
// SIGHUP, comes back, eager or lazy, with exactly those, in each of its
// threads: never with root's uid or full set, which a restore by root
// would give it otherwise (the kernel keeps credentials per thread).

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// capsScript reports its capabilities and parent-death signal on SIGUSR1.
const capsScript = `
import ctypes, os, signal, threading, time
libc = ctypes.CDLL(None, use_errno=True)
threading.Thread(target=lambda: time.sleep(1e6), daemon=True).start()
libc.prctl(1, signal.SIGHUP)  # PR_SET_PDEATHSIG
seq = 0
def on_usr1(signum, frame):
    global seq
    seq += 1
signal.signal(signal.SIGUSR1, on_usr1)
os.write(1, b"ready pid=%d\n" % os.getpid())
answered = 0
while True:
    if seq != answered:
        answered = seq
        caps = {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")}
        # Every thread's credentials, as the leader's.
        creds = set()
        for tid in os.listdir("/proc/self/task"):
            creds.add(tuple(l for l in open("/proc/self/task/%s/status" % tid) if l.startswith(("Uid", "Gid", "Cap", "NoNewPrivs"))))
        pd = ctypes.c_int()
        libc.prctl(2, ctypes.byref(pd))  # PR_GET_PDEATHSIG
        os.write(1, b"report sig=%d seq=%d uid=%d inh=%s prm=%s eff=%s bnd=%s amb=%s pdeath=%d threads=%d same=%d\n" % (
            signal.SIGUSR1, answered, os.getuid(), caps["CapInh"].encode(), caps["CapPrm"].encode(),
            caps["CapEff"].encode(), caps["CapBnd"].encode(), caps["CapAmb"].encode(), pd.value,
            len(os.listdir("/proc/self/task")), len(creds) == 1))
    time.sleep(0.005)
`

func TestRestoreCapabilities(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	setpriv := testutil.RequireCommand(t, "setpriv")
	python := "/usr/bin/python3" // Debian's, which nobody may run (.ci/setup)
	if _, err := os.Stat(python); err != nil {
		python = testutil.RequireCommand(t, "python3")
	}
	buildTool(t, "snapctl")
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // for nobody to read the script
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(dir, "caps.py")
	if err := os.WriteFile(script, []byte(capsScript), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"eager", "lazy"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.StartProgram(t, "caps", setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups",
				"--inh-caps", "+net_bind_service", "--ambient-caps", "+net_bind_service",
				"--bounding-set", "-all,+net_bind_service,+setuid", "--", python, "-I", script)
			before := request(t, ctx, p, syscall.SIGUSR1, "report")
			for k, want := range map[string]string{"uid": "65534", "eff": "0000000000000400", "amb": "0000000000000400", "bnd": "0000000000000480", "pdeath": "1", "threads": "2", "same": "1"} {
				wantField(t, before, k, want)
			}
			dir, _ := dumpForRestore(t, ctx, p)
			var flags []string
			if mode == "lazy" {
				flags = append(flags, "--lazy")
			}
			restoreAndAdopt(t, p, dir, flags...)
			after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			for _, k := range []string{"uid", "inh", "prm", "eff", "bnd", "amb", "pdeath", "threads", "same"} {
				if after.Fields[k] != before.Fields[k] {
					t.Errorf("%s: %s after the restore, %s before", k, after.Fields[k], before.Fields[k])
				}
			}
			lazyKill(t, ctx, p)
		})
	}
}
