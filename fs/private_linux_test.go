package fs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image/store"
	// s3:// addresses for the private mount's helper (this test binary).
	_ "github.com/lazyfs/lazyfs/engine/image/store/s3"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// privateChildEnv makes the test binary a process that mounts the
// snapshot in $privateChildEnv privately, prints "HELPER-PID MNT", reads
// through the mount and waits to be killed (TestMountPrivateStarterKilled).
const privateChildEnv = "LAZYFS_FS_TEST_PRIVATE_CHILD"

// privateEndpointEnv, for a child of privateChildEnv, is the object
// store of a dir at s3://.
const privateEndpointEnv = "LAZYFS_FS_TEST_PRIVATE_ENDPOINT"

func privateChildMain(dir string) int {
	m, err := MountPrivate(dir, pidA, Options{DirectIO: true, Remote: store.Options{Endpoint: os.Getenv(privateEndpointEnv)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%d %s\n", m.HelperPID(), m.mnt)
	buf := make([]byte, 1<<20)
	for {
		if _, err := m.ReadAt(buf, base); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
}

// snapshotMounted returns the lines of /proc/self/mountinfo of mounts of
// the snapshot in dir.
func snapshotMounted(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		if _, rest, ok := strings.Cut(line, " - "); ok {
			if f := strings.Fields(rest); len(f) > 1 && f[0] == FSType && f[1] == dir {
				out = append(out, strings.TrimSpace(line))
			}
		}
	}
	return out
}

// processGone waits up to wait for pid to exit (or be a zombie).
func processGone(pid int, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if s := string(b); strings.Contains(s[strings.LastIndexByte(s, ')')+1:], " Z ") {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkNothingLeft checks that no mount of the snapshot in dir, and no
// mountpoint directory mnt, is left.
func checkNothingLeft(t *testing.T, dir, mnt string) {
	t.Helper()
	if m := snapshotMounted(t, dir); len(m) > 0 {
		t.Errorf("mounts of the snapshot left behind: %q", m)
	}
	if _, err := os.Stat(mnt); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mountpoint %s left behind: %v", mnt, err)
	}
}

// TestMountPrivate reads a process's memory through a private mount:
// served by a helper process, in a namespace of its own as root (not
// visible here), and gone with the helper after Close.
func TestMountPrivate(t *testing.T) {
	testutil.RequireFUSE(t)
	s := writeSnapshot(t, 64<<10)
	m, err := MountPrivate(s.Dir, pidA, Options{DirectIO: true, CacheSize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	helper := m.HelperPID()
	if helper == os.Getpid() {
		t.Fatal("the mount is served by the process that reads it")
	}
	for _, v := range layout() {
		for _, c := range [][2]uint64{{v.Start, v.End - v.Start}, {v.Start + 5000, min(9000, v.End-v.Start-5000)}} {
			got := make([]byte, c[1])
			if n, err := m.ReadAt(got, int64(c[0])); err != nil || n != len(got) {
				t.Fatalf("ReadAt %#x+%#x = %d, %v", c[0], c[1], n, err)
			}
			if want := s.Memory(pidA, c[0], int(c[1])); !bytes.Equal(got, want) {
				t.Fatalf("ReadAt %#x+%#x differs from the snapshot's memory", c[0], c[1])
			}
		}
	}
	if os.Geteuid() == 0 {
		if l := snapshotMounted(t, s.Dir); len(l) > 0 {
			t.Errorf("the private mount is visible outside its helper: %q", l)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !processGone(helper, 0) {
		t.Errorf("helper %d still running after Close", helper)
	}
	checkNothingLeft(t, s.Dir, m.mnt)
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestMountPrivateError: a snapshot that cannot be mounted is an error
// from the helper, and the helper is gone.
func TestMountPrivateError(t *testing.T) {
	testutil.RequireFUSE(t)
	s := writeSnapshot(t, 64<<10)
	_, err := MountPrivate(s.Dir, 999999, Options{})
	if err == nil || !strings.Contains(err.Error(), "999999") {
		t.Fatalf("MountPrivate of a pid not in the snapshot: %v, want an error naming it", err)
	}
	if m := snapshotMounted(t, s.Dir); len(m) > 0 {
		t.Errorf("mounts of the snapshot left behind: %q", m)
	}
	if _, err := MountPrivate(t.TempDir(), pidA, Options{}); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("MountPrivate of an empty directory: %v, want an incomplete snapshot", err)
	}
}

// TestMountPrivateHelperKilled: a helper that dies makes reads fail,
// never hang, and Close cleans up after it.
func TestMountPrivateHelperKilled(t *testing.T) {
	testutil.RequireFUSE(t)
	s := writeSnapshot(t, 64<<10)
	m, err := MountPrivate(s.Dir, pidA, Options{DirectIO: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := syscall.Kill(m.HelperPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !processGone(m.HelperPID(), 5*time.Second) {
		t.Fatal("helper still running after SIGKILL")
	}
	read := make(chan error, 1)
	go func() {
		_, err := m.ReadAt(make([]byte, 1<<20), base)
		read <- err
	}()
	select {
	case err := <-read:
		if err == nil {
			t.Errorf("ReadAt through the mount of a dead helper succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReadAt through the mount of a dead helper hangs")
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Errorf("Close after the helper was killed: no error")
		}
	case <-time.After(2 * privateExitWait):
		t.Fatal("Close hangs")
	}
	checkNothingLeft(t, s.Dir, m.mnt)
}

// TestMountPrivateStarterKilled: when the process that mounted is
// SIGKILLed while reading, the helper unmounts and exits.
func TestMountPrivateStarterKilled(t *testing.T) {
	testutil.RequireFUSE(t)
	s := writeSnapshot(t, 64<<10)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), privateChildEnv+"="+s.Dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	var helper int
	var mnt string
	if _, serr := fmt.Sscanf(line, "%d %s", &helper, &mnt); err != nil || serr != nil {
		t.Fatalf("child: %q, %v\n%s", line, err, stderr.String())
	}
	time.Sleep(50 * time.Millisecond) // reading
	cmd.Process.Kill()
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child: %v, want killed\n%s", err, stderr.String())
	}
	if !processGone(helper, 5*time.Second) {
		t.Fatalf("helper %d still running 5s after its starter was killed", helper)
	}
	checkNothingLeft(t, s.Dir, mnt)
}

// TestMountPrivateStarterKilledDuringSetup: a starter killed while its
// helper is still setting up (here: listing a snapshot in an object store
// that accepts connections and never answers) leaves nothing behind: the
// helper cancels the store's reads, undoes its setup (its mountpoint
// directory) and exits, within a few seconds.
func TestMountPrivateStarterKilledDuringSetup(t *testing.T) {
	testutil.RequireFUSE(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "lazyfs-private-*"))
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), privateChildEnv+"=s3://snaps/stalled", privateEndpointEnv+"=http://"+ln.Addr().String(),
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=testtest", "AWS_REGION=us-east-1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	// The helper: the child's child, named PrivateArg0, with its
	// mountpoint directory made.
	helper := 0
	for deadline := time.Now().Add(10 * time.Second); helper == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no helper started\n%s", stderr.String())
		}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			st := string(b)
			f := strings.Fields(st[strings.LastIndexByte(st, ')')+1:])
			if len(f) > 1 && f[1] == strconv.Itoa(cmd.Process.Pid) {
				helper = pid
			}
		}
	}
	var made []string
	for deadline := time.Now().Add(10 * time.Second); len(made) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("helper %d made no mountpoint directory", helper)
		}
		now, _ := filepath.Glob(filepath.Join(os.TempDir(), "lazyfs-private-*"))
		for _, d := range now {
			if !slices.Contains(before, d) {
				made = append(made, d)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // listing, stalled
	cmd.Process.Kill()
	cmd.Wait()
	if !processGone(helper, 5*time.Second) {
		t.Fatalf("helper %d still running 5s after its starter was killed during setup", helper)
	}
	for _, d := range made {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the helper's mountpoint directory %s left behind: %v", d, err)
			os.Remove(d)
		}
	}
}
