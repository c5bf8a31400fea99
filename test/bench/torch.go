package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
	"github.com/lazyfs/lazyfs/test/fixture"
)

// The "torch" series: a real PyTorch model server
// (test/fixtures/torchserver.py on Debian's python3-torch, a GPT-2-small
// shaped transformer), dumped with the default options and restored
// eagerly, lazily through the private mount and lazily with --source
// direct, cold and warm; a client asks ping then token (the first token
// of a fixed prompt: a forward pass that reads every weight). When CRIU
// is on the machine and `criu check` passes, CRIU dumps its own server
// (same seed, same model) and restores it eagerly (criu restore) and
// lazily (criu lazy-pages on the image directory, then criu restore
// --lazy-pages), in the same rounds. Its size is the model's, not the
// size above; it runs for the first size only.

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "torch", Measure: measureTorch})
}

// torchShape is the model: GPT-2 small, or a small one for a smoke run.
func torchShape(h *harness.Harness) []string {
	if h.Smoke {
		return []string{"2", "256"}
	}
	return []string{"12", "768"}
}

// torchSnap is a dumped torchserver: its directory, pid, port and answer.
type torchSnap struct {
	dir   string
	pid   int
	port  int
	token string // the original's answer, without its timing
}

func measureTorch(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	if !h.First {
		return nil
	}
	py := "/usr/bin/python3"
	if out, err := exec.CommandContext(ctx, py, "-I", "-c", "import torch").CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import torch (Debian package python3-torch): %w: %s", py, err, bytes.TrimSpace(out))
	}
	root, err := report.ModuleRoot()
	if err != nil {
		return err
	}
	script := filepath.Join(root, "test", "fixtures", "torchserver.py")
	tr := &report.TorchResult{Shape: strings.Join(torchShape(h), " layers of width ")}
	criu, why := findCRIU(ctx)
	tr.CRIU, tr.CRIUUsed = why, criu != ""
	h.Logf("torch: %s", why)

	snaps := map[bool]*torchSnap{}
	defer func() {
		for _, s := range snaps {
			os.RemoveAll(s.dir)
		}
	}()
	tools := []bool{false} // useCRIU
	if criu != "" {
		tools = append(tools, true)
	}
	for _, useCRIU := range tools {
		s, err := dumpTorch(ctx, h, tr, py, script, criu, useCRIU)
		if err != nil {
			return fmt.Errorf("dump (criu %v): %w", useCRIU, err)
		}
		snaps[useCRIU] = s
	}
	tr.Restores = report.TorchCases(criu != "")
	for r := range h.Runs {
		for _, c := range tr.Restores {
			if err := torchRestoreOnce(ctx, h, c, snaps[c.CRIU], criu); err != nil {
				return fmt.Errorf("%s, cold %v: %w", c.Label, c.Cold, err)
			}
			last := len(c.Token) - 1
			h.Logf("torch %-22s %s run %d/%d: ping %s, token %s", c.Label, report.ColdName(c.Cold), r+1, h.Runs, harness.Millis(c.Ping[last]), harness.Millis(c.Token[last]))
		}
	}
	// The dumps' other runs: a server for each tool started and dumped
	// again after the restores (a dump kills the process).
	for r := 1; r < h.Runs; r++ {
		for _, useCRIU := range tools {
			s, err := dumpTorch(ctx, h, tr, py, script, criu, useCRIU)
			if err != nil {
				return fmt.Errorf("dump (criu %v): %w", useCRIU, err)
			}
			os.RemoveAll(s.dir)
		}
	}
	sr.Torch = tr
	return nil
}

// findCRIU returns the criu to compare with ($CRIU, or criu on PATH) if
// `criu check` passes on this machine, and what the report says of it.
func findCRIU(ctx context.Context) (path, what string) {
	path = os.Getenv("CRIU")
	if path == "" {
		p, err := exec.LookPath("criu")
		if err != nil {
			return "", "CRIU is not on this machine (criu not on PATH, $CRIU unset): its rows are left out"
		}
		path = p
	}
	ver, _ := exec.CommandContext(ctx, path, "--version").Output()
	v := strings.Join(strings.Fields(string(ver)), " ")
	if out, err := exec.CommandContext(ctx, path, "check").CombinedOutput(); err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return "", fmt.Sprintf("%s (%s) fails `criu check` on this kernel (%s): its rows are left out", path, v, lines[len(lines)-1])
	}
	return path, fmt.Sprintf("%s (%s)", path, v)
}

// dumpTorch starts a torchserver, learns its token and dumps it, with
// snapctl or with criu.
func dumpTorch(ctx context.Context, h *harness.Harness, tr *report.TorchResult, py, script, criu string, useCRIU bool) (*torchSnap, error) {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	srv, err := startTorch(ctx, h, py, script)
	if err != nil {
		return nil, err
	}
	port := srv.Port
	as, err := measure.Converse(ctx, port, time.Now(), "token")
	if err != nil {
		return nil, fmt.Errorf("original server: %w", err)
	}
	s := &torchSnap{pid: srv.PID, port: port, token: torchToken(as[0].Line)}
	if s.token == "" {
		return nil, fmt.Errorf("the original answered %q to token: %w", as[0].Line.Text, measure.ErrOutput)
	}
	if !useCRIU {
		tr.Params, _ = srv.Ready.Int("params")
		if b, err := srv.Ready.Int("bytes"); err == nil {
			tr.Weights = uint64(b)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", srv.PID)); err == nil {
			tr.Maps = bytes.Count(b, []byte("\n"))
		}
	}
	name := "snap-torch"
	if useCRIU {
		name = "criu-torch"
	}
	s.dir = filepath.Join(h.Work, name)
	if err := os.RemoveAll(s.dir); err != nil {
		return nil, err
	}
	start := time.Now()
	if useCRIU {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return nil, err
		}
		if out, err := exec.CommandContext(ctx, criu, "dump", "-t", strconv.Itoa(srv.PID), "-D", s.dir,
			"--shell-job", "--tcp-established", "-o", "dump.log").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("criu dump: %w: %s (log %s)", err, out, filepath.Join(s.dir, "dump.log"))
		}
		tr.CRIUDump = append(tr.CRIUDump, time.Since(start))
		if tr.CRIUImage, err = measure.DirSize(s.dir); err != nil {
			return nil, err
		}
	} else {
		out, err := h.Snapctl(ctx, "dump", "-t", strconv.Itoa(srv.PID), "-D", s.dir)
		if err != nil {
			return nil, err
		}
		d, err := measure.ParseDump(out)
		if err != nil {
			return nil, err
		}
		tr.Dump, tr.Freeze = append(tr.Dump, d.Total), append(tr.Freeze, d.Freeze)
		if m := measure.DumpLine.FindStringSubmatch(out); m != nil {
			tr.Memory = m[3]
		}
		if tr.Image, err = measure.DirSize(s.dir); err != nil {
			return nil, err
		}
	}
	if err := srv.WaitGone(ctx); err != nil {
		return nil, err
	}
	h.Live = 0
	return s, nil
}

// startTorch starts the PyTorch server script with py, logging to
// h.LogPath, and waits until it is ready.
func startTorch(ctx context.Context, h *harness.Harness, py, script string) (*measure.Server, error) {
	port, err := measure.FreePort()
	if err != nil {
		return nil, err
	}
	from := int64(0)
	if st, err := os.Stat(h.LogPath); err == nil {
		from = st.Size()
	}
	logFile, err := os.OpenFile(h.LogPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(h.Tools.Launch, append([]string{py, "-I", script, strconv.Itoa(port)}, torchShape(h)...)...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = logFile, logFile, h.Work
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return nil, err
	}
	srv := &measure.Server{PID: cmd.Process.Pid, Port: port, Done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(srv.Done)
	}()
	h.Live = srv.PID
	if srv.Ready, err = measure.WaitReady(ctx, h.LogPath, from, srv); err != nil {
		cmd.Process.Kill()
		return nil, err
	}
	return srv, nil
}

// torchToken is a token answer without its timing: argmax and checksum.
func torchToken(l fixture.Line) string {
	if l.Event != "token" || l.Fields["argmax"] == "" || l.Fields["checksum"] == "" {
		return ""
	}
	return "argmax=" + l.Fields["argmax"] + " checksum=" + l.Fields["checksum"]
}

// servedLine reads what the lazy summary line says was served on faults.
var servedLine = regexp.MustCompile(`\(([^()]+) served on \d+ faults`)

// torchRestoreOnce restores snap as c says, times ping and token from
// the start of the restore, checks the token, then kills the server and
// waits until its pid is free.
func torchRestoreOnce(ctx context.Context, h *harness.Harness, c *report.TorchRestore, snap *torchSnap, criu string) error {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	if measure.Alive(snap.pid) {
		return fmt.Errorf("pid %d is taken before the restore", snap.pid)
	}
	files, err := measure.SnapshotFiles(snap.dir)
	if err != nil {
		return err
	}
	if err := measure.SetCache(c.Cold, files...); err != nil {
		return err
	}
	prog, args := torchRestoreCommand(h, c, snap.dir, criu)
	lazy := strings.HasPrefix(c.Label, "lazy")
	start := time.Now()
	if c.Label == "CRIU lazy-pages" {
		// The daemon serves the pages from the image directory (same
		// host); the restore finds it by its socket there. Timed from
		// the daemon's start: both are the restore.
		args = append(args, "--lazy-pages")
		pidfile := filepath.Join(snap.dir, "lazy-pages.pid")
		if out, err := exec.CommandContext(ctx, criu, "lazy-pages", "-D", snap.dir, "--daemon",
			"--pidfile", pidfile, "-o", "lazy-pages.log").CombinedOutput(); err != nil {
			return fmt.Errorf("criu lazy-pages: %w: %s", err, out)
		}
		// The daemon outlives its process (criu 4.2): ended at the end of
		// the run, whatever happens to it.
		defer endPidfile(pidfile)
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.Work
	if err := cmd.Start(); err != nil {
		return err
	}
	h.Live = snap.pid
	exited := make(chan error, 1)
	askCtx, stopAsking := context.WithCancel(ctx)
	defer stopAsking()
	go func() {
		err := cmd.Wait()
		exited <- err
		if err != nil {
			stopAsking()
		}
	}()
	as, askErr := measure.Converse(askCtx, snap.port, start, "ping", "token")
	if err := <-exited; err != nil {
		return fmt.Errorf("%s %q: %w\n%s%s", filepath.Base(prog), args, err, out.String(), errOut.String())
	}
	if askErr != nil {
		return askErr
	}
	if got := torchToken(as[1].Line); got != snap.token {
		return fmt.Errorf("the restored server answered %q; the original %s", as[1].Line.Text, snap.token)
	}
	c.Ping, c.Token = append(c.Ping, as[0].At), append(c.Token, as[1].At)
	if !c.CRIU {
		if err := torchRestoreFigures(c, out.String(), snap.pid, lazy); err != nil {
			return err
		}
	}
	if err := measure.KillAndReap(ctx, snap.pid); err != nil {
		return err
	}
	h.Live = 0
	return nil
}

// torchRestoreCommand returns the program and arguments that restore the
// snapshot in dir as c says: snapctl's, or criu's (whose lazy-pages
// daemon files of an earlier run it removes).
func torchRestoreCommand(h *harness.Harness, c *report.TorchRestore, dir, criu string) (prog string, args []string) {
	prog = h.Tools.Snapctl
	switch c.Label {
	case "eager":
		args = []string{"restore", "-D", dir}
	case "lazy, --source mount":
		args = []string{"restore", "-D", dir, "--lazy"}
	case "lazy, --source direct":
		args = []string{"restore", "-D", dir, "--lazy", "--source", "direct"}
	case "CRIU restore", "CRIU lazy-pages":
		prog = criu
		args = []string{"restore", "-D", dir, "--shell-job", "--tcp-established", "-d", "-o", "restore.log"}
		for _, f := range []string{"lazy-pages.socket", "lazy-pages.pid"} {
			os.Remove(filepath.Join(dir, f))
		}
	}
	return prog, args
}

// torchRestoreFigures adds to c the figures snapctl's restore output
// gives.
func torchRestoreFigures(c *report.TorchRestore, out string, pid int, lazy bool) error {
	rep, err := measure.ParseRestore(out, lazy)
	if err != nil {
		return err
	}
	if rep.PID != pid {
		return fmt.Errorf("restored pid %d, want %d: %w", rep.PID, pid, measure.ErrOutput)
	}
	c.AllIn = append(c.AllIn, rep.Total)
	if lazy {
		c.Running, c.Faults = append(c.Running, rep.Running), append(c.Faults, rep.Faults)
		if m := servedLine.FindStringSubmatch(out); m != nil {
			c.Served = append(c.Served, m[1])
		}
	}
	return nil
}

// endPidfile kills the process a pidfile names, if it runs, and waits
// (at most 15 s) until it is gone.
func endPidfile(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	measure.KillAndReap(ctx, pid)
}
