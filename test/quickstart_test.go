package e2e

// README's Quick start, run as it is written: its first sh block, in a
// fresh directory whose bin/ holds the tools this test built, as README
// says to run it (from the repository, as root). Every command must
// succeed, the restored redis must answer with the value set before the
// dump, and the core read through the mount must hold it.

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/testutil"
)

// quickStart returns the first sh block after README's "## Quick start".
func quickStart(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no Quick start")
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 || strings.Contains(block, "\n## ") {
		t.Fatal("README.md's Quick start has no sh block")
	}
	return block
}

// repoRoot is the module's root (test/ is below it).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

func TestQuickStart(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireCommand(t, "redis-server", "redis-cli", "strings")
	block := quickStart(t)
	repo := t.TempDir()
	if err := os.Mkdir(filepath.Join(repo, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"snapctl", "lazyfs"} {
		if err := os.Symlink(buildTool(t, tool), filepath.Join(repo, "bin", tool)); err != nil {
			t.Fatal(err)
		}
	}
	demo := filepath.Join(repo, "demo")
	t.Cleanup(func() {
		// Whatever the block left if it stopped half-way.
		exec.Command(buildTool(t, "lazyfs"), "-u", filepath.Join(demo, "mnt")).Run()
		if b, err := os.ReadFile(filepath.Join(demo, "redis.pid")); err == nil {
			exec.Command("redis-cli", "-s", filepath.Join(demo, "redis.sock"), "shutdown", "nosave").Run()
			if pid := strings.TrimSpace(string(b)); pid != "" {
				exec.Command("kill", "-9", pid).Run()
			}
		}
	})
	ctx, cancel := context.WithTimeout(testContext(t), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", block)
	cmd.Dir = repo
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// What the test binary inherited must not lead outside the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		t.Fatalf("README's Quick start failed: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.Contains(out.String(), "dumped pid") || !strings.Contains(out.String(), "restored pid") {
		t.Errorf("the Quick start's output has no dump or restore:\n%s", out.String())
	}
	if strings.Count(out.String(), "hello") < 2 || lines[len(lines)-1] != "hello" {
		t.Errorf("want hello from the core, and last from the restored redis:\n%s", out.String())
	}
	if _, err := os.Stat(filepath.Join(demo, "mnt", "snapshot.json")); err == nil {
		t.Errorf("the Quick start left its mount")
	}
}
