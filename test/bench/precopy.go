package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The "precopy" series: snapctl dump --pre-copy --leave-running of the
// modelserver, idle and while it writes 1% of its memory a second
// (`dirty 1`), against a plain --leave-running dump of the same server
// right after; the idle images must be the plain dump's byte for byte,
// and the pre-copy snapshot restores to a server that answers as the
// original did.
func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "precopy", Measure: preCopySeries})
}

var preCopyLine = regexp.MustCompile(`(?m)^pre-copy: (\d+) rounds copied (.+) in (\S+) \(paused (\S+) to set up\); frozen copy (.+)$`)

// preCopyCases are the fixture's write rates: idle, then `dirty 1`.
var preCopyCases = []struct {
	name  string
	dirty int
}{{"idle", 0}, {"dirty 1", 1}}

func preCopySeries(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	for _, c := range preCopyCases {
		res := &report.PreCopyResult{Case: c.name}
		for r := range h.Runs {
			if err := preCopyOnce(ctx, h, res, c.dirty, r == h.Runs-1); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			h.Logf("precopy %-8s run %d/%d: frozen %s (plain %s), dump %s (plain %s), %d rounds, frozen copy %s",
				c.name, r+1, h.Runs, harness.Millis(res.Frozen[r]), harness.Millis(res.PlainFrozen[r]), harness.Millis(res.Total[r]), harness.Millis(res.PlainTotal[r]),
				res.Rounds[r], res.FrozenCopy[r])
		}
		sr.PreCopy = append(sr.PreCopy, res)
	}
	return nil
}

// preCopyOnce starts a server, sets its write rate, dumps it with
// --pre-copy then plainly (both --leave-running), compares the images when
// it is idle and, if restore, restores the pre-copy snapshot and checks
// its answers.
func preCopyOnce(ctx context.Context, h *harness.Harness, res *report.PreCopyResult, dirty int, restore bool) error {
	ctx, cancel := context.WithTimeout(ctx, 6*h.OpTimeout())
	defer cancel()
	srv, err := measure.StartServer(ctx, h.Tools, h.Tools.Modelserver, h.Size, nil, h.LogPath, h.Work)
	if err != nil {
		return err
	}
	h.Live = srv.PID
	defer h.KillLive()
	if h.Expect == (harness.Expectation{}) {
		if err := h.Learn(ctx, srv.Port); err != nil {
			return err
		}
	}
	if dirty > 0 {
		if _, err := measure.Converse(ctx, srv.Port, time.Now(), fmt.Sprintf("dirty %d", dirty)); err != nil {
			return err
		}
	}
	// The server has seen the close of the connection that asked it (a
	// change to its memory between the two dumps otherwise), and the
	// writer runs at its pace.
	time.Sleep(time.Second)
	pre := filepath.Join(h.Work, "precopy-pre")
	plain := filepath.Join(h.Work, "precopy-plain")
	defer os.RemoveAll(pre)
	defer os.RemoveAll(plain)
	os.RemoveAll(pre)
	os.RemoveAll(plain)

	if err := preCopyDump(ctx, h, srv.PID, pre, res); err != nil {
		return err
	}

	out, err := h.Snapctl(ctx, "dump", "-t", strconv.Itoa(srv.PID), "-D", plain, "--leave-running")
	if err != nil {
		return err
	}
	d, err := measure.ParseDump(out)
	if err != nil {
		return err
	}
	res.PlainFrozen = append(res.PlainFrozen, d.Freeze)
	res.PlainTotal = append(res.PlainTotal, d.Total)
	if dirty == 0 {
		// Even an idle process changes between two dumps (the kernel
		// writes the CPU it runs on into its rseq area): the images are
		// compared on the server stopped by SIGSTOP, dumped both ways.
		same, err := sameStopped(ctx, h, srv.PID, pre+"-stopped", plain+"-stopped")
		if err != nil {
			return err
		}
		if same {
			res.Identical++
		}
	}
	if dirty > 0 {
		// Its memory is no longer the one whose answers the harness
		// knows: the consistency of a dump under writes is the e2e
		// tests' (TestDumpPreCopyGenerations).
		res.Restored = true
		return nil
	}
	if !restore {
		return nil
	}
	h.KillLive()
	if _, err := h.RestoreOnce(ctx, &harness.Snapshot{Dir: pre, PID: srv.PID, Port: srv.Port}, nil, report.RestoreCase{Mode: report.Eager, Threads: report.DefThreads}); err != nil {
		return fmt.Errorf("restore of the pre-copy snapshot: %w", err)
	}
	res.Restored = true
	return nil
}

// preCopyDump dumps pid into dir with --pre-copy, leaving it running, and
// adds the dump's figures to res.
func preCopyDump(ctx context.Context, h *harness.Harness, pid int, dir string, res *report.PreCopyResult) error {
	out, err := h.Snapctl(ctx, "dump", "-t", strconv.Itoa(pid), "-D", dir, "--leave-running", "--pre-copy")
	if err != nil {
		return err
	}
	d, err := measure.ParseDump(out)
	if err != nil {
		return err
	}
	m := preCopyLine.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("dump --pre-copy: no pre-copy line in %q: %w", out, measure.ErrOutput)
	}
	rounds, _ := strconv.Atoi(m[1])
	res.Frozen = append(res.Frozen, d.Freeze)
	res.Total = append(res.Total, d.Total)
	res.Rounds = append(res.Rounds, rounds)
	res.FrozenCopy = append(res.FrozenCopy, m[5])
	return nil
}

// sameStopped stops pid, dumps it with --pre-copy into a and plainly into
// b (both --leave-running), resumes it, and reports whether the two
// images are equal byte for byte.
func sameStopped(ctx context.Context, h *harness.Harness, pid int, a, b string) (bool, error) {
	defer os.RemoveAll(a)
	defer os.RemoveAll(b)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return false, err
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	// The signal is delivered when the process next leaves the kernel.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(measure.PollEvery) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false, err
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && b[i+2] == 'T' {
			break
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("server %d did not stop on SIGSTOP", pid)
		}
	}
	if _, err := h.Snapctl(ctx, "dump", "-t", strconv.Itoa(pid), "-D", a, "--leave-running", "--pre-copy"); err != nil {
		return false, err
	}
	if _, err := h.Snapctl(ctx, "dump", "-t", strconv.Itoa(pid), "-D", b, "--leave-running"); err != nil {
		return false, err
	}
	return measure.SameMemory(a, b, pid)
}
