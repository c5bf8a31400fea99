package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/bench/harness"
	"github.com/lazyfs/lazyfs/test/bench/measure"
	"github.com/lazyfs/lazyfs/test/bench/report"
)

// The "tree" series: a process tree, nginx (a master and two workers of
// another uid), dumped and restored eagerly and lazily (a pager per
// process, through a private mount). Its memory is small and does not
// follow the size: what it measures is what a tree costs over one process
// (every process frozen, then made, one after the other).

func init() {
	harness.ExtraSeries = append(harness.ExtraSeries, harness.Series{Name: "tree", Measure: measureTree})
}

// treeNginxConf is nginx's configuration: dir holds its files.
const treeNginxConf = `daemon on;
master_process on;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path %[1]s/tmp;
	proxy_temp_path %[1]s/tmp;
	fastcgi_temp_path %[1]s/tmp;
	uwsgi_temp_path %[1]s/tmp;
	scgi_temp_path %[1]s/tmp;
	server { listen 127.0.0.1:%[2]d; root %[1]s/www; }
}
`

// treeNginx is one nginx of the series.
type treeNginx struct {
	dir, url, page string
	master         int
}

// startTreeNginx starts nginx in dir and waits until it serves.
func startTreeNginx(ctx context.Context, h *harness.Harness, dir string) (*treeNginx, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return nil, fmt.Errorf("nginx (Debian package nginx): %w", err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "www"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o755); err != nil { // the workers run as nobody
			return nil, err
		}
	}
	os.Remove(filepath.Join(dir, "nginx.pid"))
	port, err := measure.FreePort()
	if err != nil {
		return nil, err
	}
	n := &treeNginx{dir: dir, url: fmt.Sprintf("http://127.0.0.1:%d/", port), page: fmt.Sprintf("tree %d\n", time.Now().UnixNano())}
	if err := os.WriteFile(filepath.Join(dir, "www", "index.html"), []byte(n.page), 0o644); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, treeNginxConf, dir, port), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-c", conf, "-p", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nginx: %w\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "nginx.pid"))
	if err != nil {
		return nil, err
	}
	if n.master, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return nil, fmt.Errorf("nginx.pid: %w", err)
	}
	h.Live = n.master
	// Two workers, past their setuid.
	for {
		err := n.serves(ctx)
		if err == nil && treeWorkersReady(n.master) {
			return n, nil
		}
		select {
		case <-ctx.Done():
			n.kill(context.Background())
			h.Live = 0
			return nil, fmt.Errorf("nginx did not start serving: %w (%v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// treeWorkersReady reports whether master has two children, neither of
// them root any more.
func treeWorkersReady(master int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", master, master))
	if err != nil {
		return false
	}
	kids := strings.Fields(string(b))
	if len(kids) != 2 {
		return false
	}
	for _, k := range kids {
		// Status, not the owner of /proc/PID: a process that changed its
		// uid is not dumpable, and its /proc directory is root's.
		b, err := os.ReadFile("/proc/" + k + "/status")
		if err != nil {
			return false
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" && f[1] == "0" {
				return false
			}
		}
	}
	return true
}

// serves checks that nginx answers with its page.
func (n *treeNginx) serves(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", n.url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && (resp.StatusCode != http.StatusOK || string(b) != n.page) {
		err = fmt.Errorf("GET %s: %s %q", n.url, resp.Status, b)
	}
	return err
}

// kill kills the tree (its process group, the master's).
func (n *treeNginx) kill(ctx context.Context) error {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", n.master, n.master))
	unix.Kill(-n.master, unix.SIGKILL)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err := measure.KillAndReap(ctx, n.master)
	// Orphaned, the workers are the harness's (a subreaper) to reap.
	for _, p := range strings.Fields(string(b)) {
		if pid, _ := strconv.Atoi(p); pid > 0 {
			err = errors.Join(err, measure.KillAndReap(ctx, pid))
		}
	}
	return err
}

// measureTree runs the tree series: per run, nginx dumped and restored
// eagerly, then dumped and restored lazily.
func measureTree(ctx context.Context, h *harness.Harness, sr *report.SizeResult) error {
	// What the harness inherited from whatever started it must not leak
	// into nginx: it would lead outside the tree, and the dump refuses it.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return err
	}
	tr := &report.TreeResult{Server: "nginx: a master and 2 workers", Processes: 3}
	// The workers run as nobody: their directory is not under the work
	// directory, which is root's alone.
	dir, err := os.MkdirTemp("", "lazyfs-bench-nginx-")
	if err != nil {
		return err
	}
	snap := filepath.Join(h.Work, "snap-tree")
	defer os.RemoveAll(dir)
	defer os.RemoveAll(snap)
	for r := range h.Runs {
		for _, lazy := range []bool{false, true} {
			if err := treeOnce(ctx, h, tr, dir, snap, lazy); err != nil {
				return err
			}
		}
		h.Logf("tree run %d/%d: dump %s (frozen %s), eager %s, lazy running %s, all in %s", r+1, h.Runs,
			harness.Millis(tr.Dump[len(tr.Dump)-1]), harness.Millis(tr.Freeze[len(tr.Freeze)-1]), harness.Millis(tr.Eager[len(tr.Eager)-1]),
			harness.Millis(tr.Running[len(tr.Running)-1]), harness.Millis(tr.AllIn[len(tr.AllIn)-1]))
	}
	sr.Tree = tr
	return nil
}

// treeOnce starts nginx, dumps it and restores it once.
func treeOnce(ctx context.Context, h *harness.Harness, tr *report.TreeResult, dir, snap string, lazy bool) error {
	ctx, cancel := context.WithTimeout(ctx, h.OpTimeout())
	defer cancel()
	if err := os.RemoveAll(snap); err != nil {
		return err
	}
	n, err := startTreeNginx(ctx, h, dir)
	if err != nil {
		return err
	}
	defer n.kill(context.Background())
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", n.master, n.master))
	if err != nil {
		return err
	}
	out, err := h.Snapctl(ctx, "dump", "-t", strconv.Itoa(n.master), "-D", snap)
	if err != nil {
		return err
	}
	d, err := measure.ParseDump(out)
	if err != nil {
		return err
	}
	if !strings.Contains(out, "(3 processes,") {
		return fmt.Errorf("dump of nginx: %q: want 3 processes: %w", out, measure.ErrOutput)
	}
	// The harness is a subreaper: the dumped processes are its to reap,
	// the workers too once their master is gone.
	for _, p := range append(strings.Fields(string(b)), strconv.Itoa(n.master)) {
		pid, _ := strconv.Atoi(p)
		if err := measure.KillAndReap(ctx, pid); err != nil {
			return err
		}
	}
	tr.Dump, tr.Freeze = append(tr.Dump, d.Total), append(tr.Freeze, d.Freeze)
	if tr.Image, err = measure.DirSize(snap); err != nil {
		return err
	}
	args := []string{"restore", "-D", snap}
	if lazy {
		args = append(args, "--lazy")
	}
	if out, err = h.Snapctl(ctx, args...); err != nil {
		return err
	}
	rr, err := measure.ParseRestore(out, lazy)
	if err != nil {
		return err
	}
	if rr.PID != n.master {
		return fmt.Errorf("restored pid %d, want %d: %w", rr.PID, n.master, measure.ErrOutput)
	}
	if lazy {
		tr.Running, tr.AllIn = append(tr.Running, rr.Running), append(tr.AllIn, rr.Total)
	} else {
		tr.Eager = append(tr.Eager, rr.Total)
	}
	if !treeWorkersReady(n.master) {
		return errors.New("the restored nginx has not its two workers")
	}
	if err := n.serves(ctx); err != nil {
		return fmt.Errorf("the restored nginx: %w", err)
	}
	return nil
}
