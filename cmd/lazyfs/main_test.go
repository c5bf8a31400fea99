package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/image/imagetest"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// The tests run this test binary as lazyfs: with mainEnv set, TestMain is
// main.
const mainEnv = "LAZYFS_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		main()
	}
	os.Exit(m.Run())
}

const pid = 31

// snapshot writes a small snapshot and returns its directory.
func snapshot(t *testing.T) *imagetest.Snapshot {
	t.Helper()
	s, err := imagetest.Write(filepath.Join(t.TempDir(), "snap"), image.Options{BlockSize: 64 << 10, Mode: codec.Compress},
		imagetest.Process{PID: pid, Seed: 4, VMAs: []imagetest.VMA{
			{Start: 0x7f0000000000, End: 0x7f0000000000 + 64<<12, Prot: unix.PROT_READ | unix.PROT_WRITE, Content: imagetest.Patchwork, Name: "[heap]"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mountpoint(t *testing.T) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// lazyfs returns a command running lazyfs with args, bounded in time.
func lazyfs(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	return cmd
}

// isMount reports whether dir is a mount point, from mountinfo: the test
// never touches a mount it is not sure is served.
func isMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		panic(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds or 10 seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// cleanupMount unmounts mnt at the end of the test if it is still mounted.
func cleanupMount(t *testing.T, mnt string) {
	t.Cleanup(func() {
		if isMount(mnt) {
			t.Errorf("%s still mounted at the end of the test", mnt)
			unix.Unmount(mnt, unix.MNT_FORCE)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
}

func TestSignalUnmounts(t *testing.T) {
	testutil.RequireFUSE(t)
	s := snapshot(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			mnt := mountpoint(t)
			cleanupMount(t, mnt)
			cmd := lazyfs(t, s.Dir, mnt)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			waitFor(t, "the mount", func() bool { return isMount(mnt) })
			if _, err := os.Stat(filepath.Join(mnt, "snapshot.json")); err != nil {
				t.Fatal(err)
			}
			cmd.Process.Signal(sig)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("lazyfs after %v: %v\n%s", sig, err, stderr.String())
			}
			if isMount(mnt) {
				t.Errorf("%s still mounted after %v", mnt, sig)
			}
		})
	}
}

func TestBackgroundAndUnmount(t *testing.T) {
	testutil.RequireFUSE(t)
	s := snapshot(t)
	mnt := mountpoint(t)
	cleanupMount(t, mnt)
	logFile := filepath.Join(t.TempDir(), "log")
	out, err := lazyfs(t, "--background", "--log", logFile, s.Dir, mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("lazyfs --background: %v\n%s", err, out)
	}
	// returned only once ready: no waiting needed
	want := imagetestMemory(s)
	got, err := os.ReadFile(filepath.Join(mnt, "31", "regions", "7f0000000000-7f0000040000-rw-p-heap"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read the region right after --background returned: %v", err)
	}
	if out, err := lazyfs(t, "-u", mnt).CombinedOutput(); err != nil {
		t.Fatalf("lazyfs -u: %v\n%s", err, out)
	}
	if isMount(mnt) {
		t.Fatalf("%s still mounted after lazyfs -u", mnt)
	}
	// the detached server saw the unmount and exited, after logging it
	waitFor(t, "the background server to log its exit", func() bool {
		b, _ := os.ReadFile(logFile)
		return strings.Contains(string(b), "msg=unmounted")
	})
}

// TestUnmountDeadMount: a server killed with SIGKILL leaves a mount whose
// files fail with ENOTCONN; lazyfs refuses to mount over it and -u clears
// it.
func TestUnmountDeadMount(t *testing.T) {
	testutil.RequireFUSE(t)
	s := snapshot(t)
	mnt := mountpoint(t)
	cleanupMount(t, mnt)
	logFile := filepath.Join(t.TempDir(), "log")
	cmd := lazyfs(t, "--log", logFile, s.Dir, mnt)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it only once it serves: a SIGKILL while the server's own
	// start-up requests to its mount are in flight leaves an unkillable
	// process (see TestForceUnmount).
	waitFor(t, "the server to serve", func() bool {
		b, _ := os.ReadFile(logFile)
		return strings.Contains(string(b), "msg=serving")
	})
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.ReadDir(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("readdir of a mount whose server was killed: %v, want ENOTCONN", err)
	}
	out, err := lazyfs(t, s.Dir, mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "lazyfs -u") {
		t.Errorf("mount over a dead mount: %v\n%s\nwant a refusal that suggests lazyfs -u", err, out)
	}
	if out, err := lazyfs(t, "-u", mnt).CombinedOutput(); err != nil {
		t.Fatalf("lazyfs -u of a dead mount: %v\n%s", err, out)
	}
	if isMount(mnt) {
		t.Errorf("%s still mounted", mnt)
	}
}

// TestForceUnmount: -u refuses a mount with an open file, -u --force
// aborts it; the server then exits cleanly.
func TestForceUnmount(t *testing.T) {
	testutil.RequireFUSE(t)
	testutil.RequireRoot(t) // without root, --force can only detach
	s := snapshot(t)
	mnt := mountpoint(t)
	cleanupMount(t, mnt)
	cmd := lazyfs(t, s.Dir, mnt)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(t, "the mount", func() bool { return isMount(mnt) })
	f, err := os.Open(filepath.Join(mnt, "31", "mem"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, err := lazyfs(t, "-u", mnt).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--force") {
		t.Errorf("lazyfs -u with a file open: %v\n%s\nwant a refusal that suggests --force", err, out)
	}
	if out, err := lazyfs(t, "-u", "--force", mnt).CombinedOutput(); err != nil {
		t.Fatalf("lazyfs -u --force: %v\n%s", err, out)
	}
	if isMount(mnt) {
		t.Errorf("%s still mounted after -u --force", mnt)
	}
	if _, err := f.ReadAt(make([]byte, 8), 0x7f0000000000); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("read on the aborted mount: %v, want ENOTCONN", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("server after -u --force: %v", err)
	}
}

func imagetestMemory(s *imagetest.Snapshot) []byte {
	return s.Memory(pid, 0x7f0000000000, 64<<12)
}

func TestErrors(t *testing.T) {
	testutil.RequireFUSE(t)
	s := snapshot(t)
	incomplete := filepath.Join(t.TempDir(), "incomplete")
	os.CopyFS(incomplete, os.DirFS(s.Dir))
	os.Remove(filepath.Join(incomplete, image.ManifestName))
	corrupt := filepath.Join(t.TempDir(), "corrupt")
	os.CopyFS(corrupt, os.DirFS(s.Dir))
	if err := os.Truncate(filepath.Join(corrupt, image.ManifestName), 10); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)

	busy := mountpoint(t)
	cleanupMount(t, busy)
	if out, err := lazyfs(t, "--background", s.Dir, busy).CombinedOutput(); err != nil {
		t.Fatalf("lazyfs --background: %v\n%s", err, out)
	}
	t.Cleanup(func() { lazyfs(t, "-u", busy).Run() })

	// The status is the contract; want is what the message must name (or,
	// for the statuses that several failures share, what it must say).
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no manifest", []string{incomplete, mountpoint(t)}, cli.ExitBadSnapshot, incomplete},
		{"no manifest in background", []string{"--background", incomplete, mountpoint(t)}, cli.ExitBadSnapshot, incomplete},
		{"corrupt manifest", []string{corrupt, mountpoint(t)}, cli.ExitBadSnapshot, filepath.Join(corrupt, image.ManifestName)},
		{"missing snapshot", []string{filepath.Join(t.TempDir(), "nope"), mountpoint(t)}, cli.ExitFailure, "no such file or directory"},
		{"mountpoint busy", []string{s.Dir, busy}, cli.ExitFailure, "a lazyfs mount is there already (unmount it first: lazyfs -u " + busy},
		{"mountpoint busy in background", []string{"--background", s.Dir, busy}, cli.ExitFailure, "lazyfs -u " + busy},
		// Not ours to unmount: another directory is what is wanted.
		{"mountpoint /proc", []string{s.Dir, "/proc"}, cli.ExitFailure, "the mount point of a proc file system: mount on an empty directory"},
		{"mountpoint is a file", []string{s.Dir, file}, cli.ExitFailure, "not a directory"},
		{"unmount a plain directory", []string{"-u", t.TempDir()}, cli.ExitFailure, "not a lazyfs mount"},
		{"one operand", []string{s.Dir}, cli.ExitUsage, "want SNAPSHOT and MOUNTPOINT"},
		{"bad size", []string{"--cache-size", "12Q", s.Dir, mountpoint(t)}, cli.ExitUsage, "invalid size"},
		{"unknown flag", []string{"--frobnicate", s.Dir, mountpoint(t)}, cli.ExitUsage, "unknown option --frobnicate"},
		{"mistyped flag", []string{"--cache-szie", "1G", s.Dir, mountpoint(t)}, cli.ExitUsage, "unknown option --cache-szie: did you mean --cache-size?"},
		{"-u with two operands", []string{"-u", s.Dir, busy}, cli.ExitUsage, "-u takes one MOUNTPOINT"},
		{"--force without -u", []string{"--force", s.Dir, busy}, cli.ExitUsage, "--force goes with -u"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := lazyfs(t, tc.args...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("lazyfs %q: %v, want exit code %d\n%s", tc.args, err, tc.code, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("lazyfs %q says\n%s\nwant it to mention %q", tc.args, out, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	out, err := lazyfs(t, "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"usage: lazyfs [options] SNAPSHOT MOUNTPOINT", "--cache-size", "--decompress-threads",
		"--allow-other", "--background", "--debug", "-u MOUNTPOINT", "--force", "PID/mem", "SEEK_DATA", "regions/START-END-PERMS"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	// SIGINT and SIGTERM stop a mount as asked (TestSignalUnmounts: exit
	// 0): the help promises no 130.
	if strings.Contains(string(out), "130") || !strings.Contains(string(out), "lazyfs exits 0") {
		t.Errorf("--help lists 130 for lazyfs, or does not say a signal exits 0:\n%s", out)
	}
}

func TestVersion(t *testing.T) {
	out, err := lazyfs(t, "--version").Output()
	if err != nil || string(out) != "lazyfs "+engine.Version+"\n" {
		t.Errorf("lazyfs --version: %v, %q", err, out)
	}
}

func TestParseArgs(t *testing.T) {
	var out bytes.Buffer
	c, err := parseArgs([]string{"snap", "--cache-size", "1G", "mnt", "--decompress-threads", "0", "--allow-other"}, &out, &out)
	if err != nil {
		t.Fatal(err)
	}
	o := c.options(t.Context())
	if c.snapshot != "snap" || c.mountpoint != "mnt" || o.CacheSize != 1<<30 || o.DecompressThreads != 0 || !o.AllowOther {
		t.Errorf("parsed %+v, options %+v", c, o)
	}
	c, err = parseArgs([]string{"--", "-snap", "mnt"}, &out, &out)
	if err != nil || c.snapshot != "-snap" {
		t.Errorf("after --: %+v, %v", c, err)
	}
	c, err = parseArgs([]string{"a", "b"}, &out, &out)
	if err != nil || c.options(t.Context()).CacheSize != 256<<20 || c.threads != 1 || c.options(t.Context()).AllowOther {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}
