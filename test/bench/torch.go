package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/engine/units"
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
	extraSeries = append(extraSeries, series{Name: "torch", Measure: measureTorch})
}

// torchResult is the torch series.
type torchResult struct {
	Shape   string // layers and width
	Params  int64
	Weights uint64 // bytes of the model's parameters
	Memory  string // what the snapshot holds, as snapctl dump says
	Image   uint64 // the snapshot directory
	Maps    int    // mappings of the original process
	Dump    []time.Duration
	Freeze  []time.Duration
	// CRIU is the criu used ("criu 4.2 at /path"), or why none was.
	CRIU      string
	CRIUUsed  bool
	CRIUImage uint64
	CRIUDump  []time.Duration
	Restores  []*torchRestore
}

// torchRestore is one restore case of the series.
type torchRestore struct {
	Label   string // "eager", "lazy, --source mount", "CRIU lazy-pages"...
	CRIU    bool
	Cold    bool
	Ping    []time.Duration
	Token   []time.Duration
	Running []time.Duration // lazyfs lazy: "running after"
	AllIn   []time.Duration // lazyfs: eager "in", lazy "all memory in after"
	Faults  []int           // lazyfs lazy: faults served
	Served  []string        // lazyfs lazy: bytes served on faults, as printed
}

// torchShape is the model: GPT-2 small, or a small one for a smoke run.
func (h *harness) torchShape() []string {
	if h.smoke {
		return []string{"2", "256"}
	}
	return []string{"12", "768"}
}

// torchCases are the restores of each round, in order.
func torchCases(criu bool) []*torchRestore {
	var cs []*torchRestore
	for _, cold := range []bool{false, true} {
		for _, l := range []string{"eager", "lazy, --source mount", "lazy, --source direct"} {
			cs = append(cs, &torchRestore{Label: l, Cold: cold})
		}
		if criu {
			for _, l := range []string{"CRIU restore", "CRIU lazy-pages"} {
				cs = append(cs, &torchRestore{Label: l, Cold: cold, CRIU: true})
			}
		}
	}
	return cs
}

// torchSnap is a dumped torchserver: its directory, pid, port and answer.
type torchSnap struct {
	dir   string
	pid   int
	port  int
	token string // the original's answer, without its timing
}

func measureTorch(ctx context.Context, h *harness, sr *sizeResult) error {
	if !h.first {
		return nil
	}
	py := "/usr/bin/python3"
	if out, err := exec.CommandContext(ctx, py, "-I", "-c", "import torch").CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import torch (Debian package python3-torch): %w: %s", py, err, bytes.TrimSpace(out))
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	script := filepath.Join(root, "test", "fixtures", "torchserver.py")
	tr := &torchResult{Shape: strings.Join(h.torchShape(), " layers of width ")}
	criu, why := findCRIU(ctx)
	tr.CRIU, tr.CRIUUsed = why, criu != ""
	h.logf("torch: %s", why)

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
		s, err := h.dumpTorch(ctx, tr, py, script, criu, useCRIU)
		if err != nil {
			return fmt.Errorf("dump (criu %v): %w", useCRIU, err)
		}
		snaps[useCRIU] = s
	}
	tr.Restores = torchCases(criu != "")
	for r := range h.runs {
		for _, c := range tr.Restores {
			if err := h.torchRestoreOnce(ctx, c, snaps[c.CRIU], criu); err != nil {
				return fmt.Errorf("%s, cold %v: %w", c.Label, c.Cold, err)
			}
			last := len(c.Token) - 1
			h.logf("torch %-22s %s run %d/%d: ping %s, token %s", c.Label, coldName(c.Cold), r+1, h.runs, ms(c.Ping[last]), ms(c.Token[last]))
		}
	}
	// The dumps' other runs: a server for each tool started and dumped
	// again after the restores (a dump kills the process).
	for r := 1; r < h.runs; r++ {
		for _, useCRIU := range tools {
			s, err := h.dumpTorch(ctx, tr, py, script, criu, useCRIU)
			if err != nil {
				return fmt.Errorf("dump (criu %v): %w", useCRIU, err)
			}
			os.RemoveAll(s.dir)
		}
	}
	sr.Torch = tr
	return nil
}

func coldName(cold bool) string {
	if cold {
		return "cold"
	}
	return "warm"
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
func (h *harness) dumpTorch(ctx context.Context, tr *torchResult, py, script, criu string, useCRIU bool) (*torchSnap, error) {
	ctx, cancel := context.WithTimeout(ctx, h.opTimeout())
	defer cancel()
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	from := int64(0)
	if st, err := os.Stat(h.logPath); err == nil {
		from = st.Size()
	}
	logFile, err := os.OpenFile(h.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(h.tools.Launch, append([]string{py, "-I", script, strconv.Itoa(port)}, h.torchShape()...)...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = logFile, logFile, h.work
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return nil, err
	}
	srv := &server{PID: cmd.Process.Pid, Port: port, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(srv.done)
	}()
	h.live = srv.PID
	if srv.Ready, err = waitReady(ctx, h.logPath, from, srv); err != nil {
		cmd.Process.Kill()
		return nil, err
	}
	as, err := converse(ctx, port, time.Now(), "token")
	if err != nil {
		return nil, fmt.Errorf("original server: %w", err)
	}
	s := &torchSnap{pid: srv.PID, port: port, token: torchToken(as[0].Line)}
	if s.token == "" {
		return nil, fmt.Errorf("the original answered %q to token: %w", as[0].Line.Text, ErrOutput)
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
	s.dir = filepath.Join(h.work, name)
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
		if tr.CRIUImage, err = dirSize(s.dir); err != nil {
			return nil, err
		}
	} else {
		out, err := h.runSnapctl(ctx, "dump", "-t", strconv.Itoa(srv.PID), "-D", s.dir)
		if err != nil {
			return nil, err
		}
		d, err := parseDump(out)
		if err != nil {
			return nil, err
		}
		tr.Dump, tr.Freeze = append(tr.Dump, d.Total), append(tr.Freeze, d.Freeze)
		if m := dumpLine.FindStringSubmatch(out); m != nil {
			tr.Memory = m[3]
		}
		if tr.Image, err = dirSize(s.dir); err != nil {
			return nil, err
		}
	}
	if err := srv.waitGone(ctx); err != nil {
		return nil, err
	}
	h.live = 0
	return s, nil
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
func (h *harness) torchRestoreOnce(ctx context.Context, c *torchRestore, snap *torchSnap, criu string) error {
	ctx, cancel := context.WithTimeout(ctx, h.opTimeout())
	defer cancel()
	if alive(snap.pid) {
		return fmt.Errorf("pid %d is taken before the restore", snap.pid)
	}
	files, err := snapshotFiles(snap.dir)
	if err != nil {
		return err
	}
	if err := setCache(c.Cold, files...); err != nil {
		return err
	}
	var args []string
	prog := h.tools.Snapctl
	lazy := strings.HasPrefix(c.Label, "lazy")
	switch c.Label {
	case "eager":
		args = []string{"restore", "-D", snap.dir}
	case "lazy, --source mount":
		args = []string{"restore", "-D", snap.dir, "--lazy"}
	case "lazy, --source direct":
		args = []string{"restore", "-D", snap.dir, "--lazy", "--source", "direct"}
	case "CRIU restore", "CRIU lazy-pages":
		prog = criu
		args = []string{"restore", "-D", snap.dir, "--shell-job", "--tcp-established", "-d", "-o", "restore.log"}
		for _, f := range []string{"lazy-pages.socket", "lazy-pages.pid"} {
			os.Remove(filepath.Join(snap.dir, f))
		}
	}
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
	cmd.Stdout, cmd.Stderr, cmd.Dir = &out, &errOut, h.work
	if err := cmd.Start(); err != nil {
		return err
	}
	h.live = snap.pid
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
	as, askErr := converse(askCtx, snap.port, start, "ping", "token")
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
		rep, err := parseRestore(out.String(), lazy)
		if err != nil {
			return err
		}
		if rep.PID != snap.pid {
			return fmt.Errorf("restored pid %d, want %d: %w", rep.PID, snap.pid, ErrOutput)
		}
		c.AllIn = append(c.AllIn, rep.Total)
		if lazy {
			c.Running, c.Faults = append(c.Running, rep.Running), append(c.Faults, rep.Faults)
			if m := servedLine.FindStringSubmatch(out.String()); m != nil {
				c.Served = append(c.Served, m[1])
			}
		}
	}
	if err := killAndReap(ctx, snap.pid); err != nil {
		return err
	}
	h.live = 0
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
	killAndReap(ctx, pid)
}

func validateTorch(runs int, sr *sizeResult, bad func(string, ...any)) {
	tr := sr.Torch
	if tr == nil {
		return
	}
	if len(tr.Dump) != runs || len(tr.Freeze) != runs {
		bad("torch: %d dumps for %d runs", len(tr.Dump), runs)
	}
	if tr.CRIUUsed && len(tr.CRIUDump) != runs {
		bad("torch: %d CRIU dumps for %d runs", len(tr.CRIUDump), runs)
	}
	if len(tr.Restores) != len(torchCases(tr.CRIUUsed)) {
		bad("torch: %d restore cases, want %d", len(tr.Restores), len(torchCases(tr.CRIUUsed)))
	}
	for _, c := range tr.Restores {
		if len(c.Ping) != runs || len(c.Token) != runs {
			bad("torch %s %s: %d ping and %d token figures for %d runs", c.Label, coldName(c.Cold), len(c.Ping), len(c.Token), runs)
		}
		for i := range c.Ping {
			if i < len(c.Token) && c.Ping[i] > c.Token[i] {
				bad("torch %s: ping %s after token %s", c.Label, c.Ping[i], c.Token[i])
			}
		}
	}
}

// find returns the case labelled l, cold or warm.
func (tr *torchResult) find(l string, cold bool) *torchRestore {
	for _, c := range tr.Restores {
		if c.Label == l && c.Cold == cold {
			return c
		}
	}
	return nil
}

// ratio is a's median over b's, "—" without both.
func ratio(a, b []time.Duration) string {
	x, y := summarize(a), summarize(b)
	if !x.Valid() || !y.Valid() || y.Med == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", float64(x.Med)/float64(y.Med))
}

func renderTorch(m *md, sr *sizeResult) {
	tr := sr.Torch
	if tr == nil {
		return
	}
	m.p("### PyTorch server: first token")
	m.p("")
	m.p("`test/fixtures/torchserver.py` on Debian's python3-torch 1.13: a GPT-2-shaped transformer, %s (%d parameters, %s of float32 weights, drawn from N(0, 0.02) with a fixed seed), warmed up by one forward pass; the process maps %d regions, most of them libtorch's libraries, and its snapshot holds %s of memory in %s. A client starts with the restore command, connects every 2 ms until the server accepts, asks `ping`, then `token` (the next token of a fixed 8-token prompt: one forward pass, which reads every weight once); times are from the start of the command (for CRIU lazy-pages, of its daemon, started first) and every token is checked against the original's (argmax and a checksum of the logits). Default options: `snapctl dump -t PID -D DIR`, `snapctl restore -D DIR [--lazy [--source direct]]`.",
		tr.Shape, tr.Params, units.FormatSize(tr.Weights), tr.Maps, tr.Memory, units.FormatSize(tr.Image))
	m.p("")
	if tr.CRIUUsed {
		m.p("CRIU: %s, in the same rounds, each restore in turn: `criu dump -t PID -D DIR --shell-job --tcp-established` (image %s), `criu restore -D DIR --shell-job --tcp-established -d`, and for a lazy restore on the same host `criu lazy-pages -D DIR --daemon` then `criu restore ... --lazy-pages`.", tr.CRIU, units.FormatSize(tr.CRIUImage))
	} else {
		m.p("CRIU: %s.", tr.CRIU)
	}
	m.p("")
	m.header("", "lazyfs", "CRIU")
	m.row("dump", summarize(tr.Dump).String(), summarize(tr.CRIUDump).String())
	m.row("process frozen", summarize(tr.Freeze).String(), "—")
	m.p("")
	m.header("restore", "cache", "ping", "token", "token / lazyfs eager", "running after", "all memory in", "faults (served on them)")
	for _, c := range tr.Restores {
		eager := tr.find("eager", c.Cold)
		faults := "—"
		if len(c.Faults) > 0 && len(c.Served) == len(c.Faults) {
			faults = fmt.Sprintf("%d (%s)", median(c.Faults), c.Served[len(c.Served)/2])
		}
		m.row(c.Label, coldName(c.Cold), summarize(c.Ping).String(), summarize(c.Token).String(), ratio(c.Token, eager.Token),
			summarize(c.Running).String(), summarize(c.AllIn).String(), faults)
	}
	m.p("")
	if tr.CRIUUsed {
		for _, cold := range []bool{false, true} {
			mount, crl := tr.find("lazy, --source mount", cold), tr.find("CRIU lazy-pages", cold)
			cre := tr.find("CRIU restore", cold)
			m.p("- %s: lazy through the mount gives the first token at %s of CRIU lazy-pages', %s of CRIU's eager restore's.", coldName(cold), ratio(mount.Token, crl.Token), ratio(mount.Token, cre.Token))
		}
		m.p("- dump: %s of CRIU's.", ratio(tr.Dump, tr.CRIUDump))
		m.p("")
	}
}

// median is the middle of ns (the lower of the two middle ones).
func median(ns []int) int {
	if len(ns) == 0 {
		return 0
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
