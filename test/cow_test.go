package e2e

// Copy-on-write sharing across fork, on a pre-fork server: forkpool.py
// builds 256 MiB of read-only data in the parent, then forks a
// multiprocessing pool of 4 workers that read all of it (a model server
// that loads its weights and forks workers, gunicorn --preload). Each
// worker's pages are the parent's until written. The dump finds them,
// and restore, eager or lazy, forks the workers from a parent that holds
// them, so that the tree uses about the memory it used before (Pss, the
// pages each process maps divided by the processes mapping them, summed
// over the tree), not five times as much. The snapshot stores those pages
// once, in the parent's pages (forked blocks), and a mount shows each
// worker's memory whole: cmp finds the data the same in every process.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// forkPoolSums asks the pool for the checksum of each 16th of its data.
func forkPoolSums(t *testing.T, ctx context.Context, port int) []string {
	t.Helper()
	var out []string
	for i := range 16 {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(c, "sum %d\n", i)
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		f := strings.Fields(line)
		if err != nil || len(f) != 4 || f[0] != "sum" || f[1] != strconv.Itoa(i) {
			t.Fatalf("sum %d answered %q, %v", i, line, err)
		}
		out = append(out, f[2])
	}
	return out
}

// treePss returns the Pss of the tree under root, summed, in bytes.
func treePss(t *testing.T, root int) uint64 {
	t.Helper()
	var sum uint64
	for pid := range treeOf(t, root) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "Pss:" {
				kb, err := strconv.ParseUint(f[1], 10, 64)
				if err != nil {
					t.Fatalf("smaps_rollup of %d: %q", pid, l)
				}
				sum += kb << 10
				found = true
			}
		}
		if !found {
			t.Fatalf("no Pss in the smaps_rollup of %d", pid)
		}
	}
	return sum
}

func TestRestoreForkPoolShared(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	ctx := testContext(t)
	buildTool(t, "snapctl")
	port := freePort(t)
	p := fixture.StartPython(t, "forkpool.py", strconv.Itoa(port))
	p.Port = port
	workers := strings.Split(p.Ready.Fields["workers"], ",")
	if len(workers) != 4 {
		t.Fatalf("ready line %q: want 4 workers", p.Ready.Text)
	}
	tree := waitTree(t, ctx, p.PID, 5)
	sums := forkPoolSums(t, ctx, port)
	before := treePss(t, p.PID)
	const data = 256 << 20
	if before > 2*data {
		t.Fatalf("the pool uses %d MiB (Pss) before any dump: its workers do not share the parent's %d MiB", before>>20, data>>20)
	}

	for _, mode := range []string{"eager", "lazy"} {
		dir := srvDump(t, ctx, p)
		// inspect tells what each worker shares with the parent, stored
		// once.
		var rep inspectReport
		if err := json.Unmarshal([]byte(mustSnapctl(t, "inspect", "-D", dir, "--json").Stdout), &rep); err != nil {
			t.Fatal(err)
		}
		var region [2]uint64 // the data: the root's largest region
		for _, pr := range rep.Processes {
			if pr.PID == p.PID {
				for _, g := range pr.Regions {
					if g.End-g.Start > region[1]-region[0] {
						region = [2]uint64{g.Start, g.End}
					}
				}
				continue
			}
			// All but the pages a worker wrote: the header of the data's
			// object (its reference count), its own heap and stacks.
			const most = data - data/16
			if pr.Inherited < most || pr.Blocks.Forked.Bytes < most || pr.Blocks.FileSize > data/8 {
				t.Errorf("%s: inspect says worker %d shares %d MiB with its parent, %d MiB of it stored there, %d MiB in its own pages: want about %d MiB shared, stored once",
					mode, pr.PID, pr.Inherited>>20, pr.Blocks.Forked.Bytes>>20, pr.Blocks.FileSize>>20, data>>20)
			}
		}
		if mode == "eager" {
			// Through a mount, every worker's copy of the data reads
			// as the parent's, byte for byte.
			mnt := lazyMountLazyfs(t, dir)
			// But for its first page, which holds the object's header,
			// its reference count: each process's own, written.
			off := strconv.FormatUint(region[0]+4096, 10)
			for _, w := range workers {
				r := runTool(t, "cmp", commandTimeout, "-i", off+":"+off, "-n", strconv.FormatUint(region[1]-region[0]-4096, 10),
					filepath.Join(mnt, strconv.Itoa(p.PID), "mem"), filepath.Join(mnt, w, "mem"))
				if r.Code != 0 {
					t.Errorf("cmp of the data in the parent's and worker %s's memory through the mount:\n%s", w, r)
				}
			}
		}
		var lazy *lazyRun
		if mode == "eager" {
			srvRestore(t, p, dir)
		} else {
			lazy = startLazy(t, dir)
			if pid := lazy.waitRunning(t, ctx); pid != p.PID {
				t.Fatalf("lazy restore ran pid %d, want %d", pid, p.PID)
			}
			if err := p.Adopt(); err != nil {
				t.Fatal(err)
			}
		}
		sameTree(t, p.PID, tree)
		if got := forkPoolSums(t, ctx, port); strings.Join(got, " ") != strings.Join(sums, " ") {
			t.Fatalf("%s restore: the workers read %v, %v before", mode, got, sums)
		}
		if lazy != nil {
			lazy.mustFinish(t, ctx, p.PID)
		}
		// Shared again: what the workers read did not become copies.
		after := treePss(t, p.PID)
		t.Logf("%s restore: Pss of the tree %d MiB, %d MiB before the first dump", mode, after>>20, before>>20)
		if after > before+before/4+(16<<20) {
			t.Errorf("%s restore: the tree uses %d MiB (Pss), %d MiB before: the memory the workers shared with the parent was copied", mode, after>>20, before>>20)
		}
	}
}

// inspectReport is the part of snapctl inspect --json the tests read.
type inspectReport struct {
	Processes []struct {
		PID       int         `json:"pid"`
		Parent    int         `json:"ppid"`
		Inherited uint64      `json:"inherited_bytes"`
		Blocks    image.Stats `json:"blocks"`
		Regions   []struct {
			Start uint64 `json:"start"`
			End   uint64 `json:"end"`
		} `json:"regions"`
	} `json:"processes"`
}
