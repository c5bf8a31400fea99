package measure

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/lazyfs/lazyfs/test/bench/report"
)

// buildTimeout bounds each compiler run.
const buildTimeout = 5 * time.Minute

// Tools are the programs the harness runs.
type Tools struct {
	Snapctl     string
	Lazyfs      string
	Modelserver string
	Weights     string // the weightserver fixture
	Launch      string
	LZ4         string
	Cat         string
	GoVersion   string // of the snapctl binary
	Revision    string // the commit snapctl was built from, if Go stamped it
	LZ4Version  string
}

// BuildTools compiles (or finds) every program into dir.
func BuildTools(ctx context.Context, bin, dir string) (Tools, error) {
	var t Tools
	root, err := report.ModuleRoot()
	if err != nil {
		return t, err
	}
	if bin == "" {
		bin = dir
		if err := command(ctx, root, "go", "build", "-o", dir+"/", "./cmd/snapctl", "./cmd/lazyfs"); err != nil {
			return t, fmt.Errorf("build snapctl and lazyfs: %w", err)
		}
	}
	// Commands run in the work directory: absolute paths only.
	if bin, err = filepath.Abs(bin); err != nil {
		return t, fmt.Errorf("tools: %w", err)
	}
	t.Snapctl = filepath.Join(bin, "snapctl")
	t.Lazyfs = filepath.Join(bin, "lazyfs")
	for _, p := range []string{t.Snapctl, t.Lazyfs} {
		if _, err := os.Stat(p); err != nil {
			return t, fmt.Errorf("tools: %w (run make build, or drop -bin)", err)
		}
	}
	if info, err := buildinfo.ReadFile(t.Snapctl); err == nil {
		t.GoVersion = info.GoVersion
		t.Revision = revision(info.Settings)
	}
	if t.Revision == "" {
		t.Revision = gitRevision(ctx, root)
	}

	src := filepath.Join(root, "test", "fixtures")
	for _, name := range []string{"modelserver", "weightserver", "launch"} {
		out := filepath.Join(dir, name)
		if err := command(ctx, root, "gcc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-pthread",
			"-I", src, "-o", out, filepath.Join(src, name+".c")); err != nil {
			return t, fmt.Errorf("build fixture %s: %w", name, err)
		}
	}
	t.Modelserver = filepath.Join(dir, "modelserver")
	t.Weights = filepath.Join(dir, "weightserver")
	t.Launch = filepath.Join(dir, "launch")

	if t.LZ4, err = exec.LookPath("lz4"); err != nil {
		return t, fmt.Errorf("the lz4 baseline needs the lz4 command (apt-get install lz4): %w", err)
	}
	if out, err := exec.CommandContext(ctx, t.LZ4, "--version").CombinedOutput(); err == nil {
		t.LZ4Version = lz4Version(string(out))
	}
	if t.Cat, err = exec.LookPath("cat"); err != nil {
		return t, fmt.Errorf("the read baseline needs cat: %w", err)
	}
	return t, nil
}

// revision describes the commit in a binary's build settings:
// "commit 1a2b3c4d5e6f (2025-01-02T03:04:05Z)", with "plus uncommitted
// changes" when the tree was modified, or "unknown".
func revision(settings []debug.BuildSetting) string {
	var rev, at string
	modified := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	out := "commit " + rev[:min(12, len(rev))]
	if at != "" {
		out += " (" + at + ")"
	}
	if modified {
		out += " plus uncommitted changes"
	}
	return out
}

// gitRevision describes the checkout the harness runs in, for binaries
// built without VCS stamps (GOFLAGS=-buildvcs=false): make bench builds
// them from this tree.
func gitRevision(ctx context.Context, root string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "log", "-1", "--format=%h %cI").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		return "unknown"
	}
	desc := "commit " + f[0] + " (" + f[1] + ")"
	if st, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		desc += " plus uncommitted changes"
	}
	return desc
}

// lz4Version picks "v1.9.4" out of lz4 --version's banner.
func lz4Version(banner string) string {
	for _, w := range strings.Fields(banner) {
		if strings.HasPrefix(w, "v") && strings.Count(w, ".") >= 1 {
			return strings.TrimSuffix(w, ",")
		}
	}
	return strings.TrimSpace(banner)
}

// command runs a build step in dir and returns its output with any error.
func command(ctx context.Context, dir, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
