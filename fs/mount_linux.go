package fs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
)

// checkMountpoint returns the absolute, symlink-free path of a usable
// mountpoint: an existing directory that is not already a mount point.
func checkMountpoint(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", path, err)
	}
	// Ask mountinfo first: a request to a mount whose server is stuck
	// might never be answered.
	if m, err := findMount(abs); err == nil {
		return "", mountedOn(abs, m.fstype)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, abs, 0, unix.STATX_TYPE, &stx); err != nil {
		if errors.Is(err, syscall.ENOTCONN) {
			return "", fmt.Errorf("mountpoint %s: %w: a FUSE mount whose server is gone is still there (run lazyfs -u %s)", abs, ErrBusy, abs)
		}
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	if stx.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("mountpoint %s: %w", abs, syscall.ENOTDIR)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return "", mountedOn(abs, "")
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(abs, &sfs); err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	}
	if name, ok := kernelFS[sfs.Type]; ok {
		return "", fmt.Errorf("mountpoint %s: %w (%s): mount on a directory of a disk or tmpfs filesystem", abs, ErrKernelFS, name)
	}
	return abs, nil
}

// mountedOn is the refusal of mountpoint abs, a mount already, of file
// system type fstype ("" if unknown): a lazyfs mount is unmounted with
// lazyfs -u; any other (a system's /proc, /sys, /home) is not ours to
// unmount, and the user wants another directory.
func mountedOn(abs, fstype string) error {
	if fstype == "fuse."+Subtype {
		return fmt.Errorf("mountpoint %s: %w: a lazyfs mount is there already (unmount it first: lazyfs -u %s)", abs, ErrBusy, abs)
	}
	what := "a mount point"
	if fstype != "" {
		what = "the mount point of a " + fstype + " file system"
	}
	return fmt.Errorf("mountpoint %s: %w: it is %s: mount on an empty directory of your own (mkdir)", abs, ErrBusy, what)
}

// kernelFS are the filesystems whose directories the kernel makes (a
// process's /proc/PID, cgroups, sysfs): a mount over one would hide what
// the kernel shows there, or a process's own view of itself.
var kernelFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "proc",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.BPF_FS_MAGIC:        "bpf",
	unix.DEVPTS_SUPER_MAGIC:  "devpts",
	unix.PSTOREFS_MAGIC:      "pstore",
	unix.EFIVARFS_MAGIC:      "efivarfs",
	unix.NSFS_MAGIC:          "nsfs",
}

// CheckFUSE reports whether a lazyfs mount can work here: a /dev/fuse the
// caller may open read-write (opened, as root) and fusermount3 (every
// mount goes through it). It returns what it found, or an error wrapping
// ErrNoFUSE that says the fix. Mount makes the same check first; snapctl
// check reports it.
func CheckFUSE() (string, error) {
	return checkFUSEWith("/dev/fuse", os.Geteuid(), exec.LookPath, "/bin")
}

// checkFUSEWith is CheckFUSE for the device dev, the effective uid euid,
// and fusermount3 looked up with lookPath or in fallbackDir.
func checkFUSEWith(dev string, euid int, lookPath func(string) (string, error), fallbackDir string) (string, error) {
	seen := dev + " opens"
	if euid == 0 {
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("%w: open %s: %w (is the fuse module loaded? modprobe fuse)", ErrNoFUSE, dev, err)
		}
		unix.Close(fd)
	} else {
		if _, err := os.Stat(dev); err != nil {
			return "", fmt.Errorf("%w: %w (is the fuse module loaded? modprobe fuse)", ErrNoFUSE, err)
		}
		// fusermount3 opens the device with the caller's rights.
		if err := unix.Access(dev, unix.R_OK|unix.W_OK); err != nil {
			return "", fmt.Errorf("%w: %s: %w (run as root, or make it mode 0666 as distributions do)", ErrNoFUSE, dev, err)
		}
		seen = dev + " readable and writable"
	}
	bin, err := fusermountWith(lookPath, fallbackDir)
	if err != nil {
		return "", err
	}
	return seen + "; " + bin, nil
}

// fusermount returns the path of fusermount3 (or fusermount).
func fusermount() (string, error) { return fusermountWith(exec.LookPath, "/bin") }

func fusermountWith(lookPath func(string) (string, error), fallbackDir string) (string, error) {
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := lookPath(name); err == nil {
			return p, nil
		}
		if p := filepath.Join(fallbackDir, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: fusermount3 not found on PATH (install fuse3)", ErrNoFUSE)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// mountDev returns the device number of the file system mounted on mnt,
// from /proc/self/mountinfo: a stat of the mountpoint would be a request
// to the mount, which its own server must never make (a SIGKILL while
// such a request is in flight leaves the process unkillable).
func mountDev(mnt string) (uint64, error) {
	m, err := findMount(mnt)
	if err != nil {
		return 0, err
	}
	return m.dev, nil
}

// setReadahead writes the read-ahead window of the mount on mnt
// (/sys/class/bdi/MAJOR:MINOR/read_ahead_kb). The kernel starts a FUSE
// mount at 128 KiB whatever max_read and MaxReadAhead say, and only
// sends requests as large as its read-ahead window.
func setReadahead(mnt string, kb int) error {
	if kb < 0 {
		return nil
	}
	if kb == 0 {
		kb = DefaultReadaheadKB
	}
	dev, err := mountDev(mnt)
	if err != nil {
		return err
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(dev), unix.Minor(dev))
	return os.WriteFile(p, []byte(strconv.Itoa(kb)), 0)
}

// detach lazily unmounts mnt (umount -l): the name goes away at once, the
// file system when its last file is closed.
func detach(mnt string) error {
	if os.Geteuid() == 0 {
		return unix.Unmount(mnt, unix.MNT_DETACH)
	}
	bin, err := fusermount()
	if err != nil {
		return err
	}
	return runFusermount(bin, "-u", "-z", mnt)
}

// abortConnection aborts the FUSE connection of device dev through the
// fusectl file system: pending and future requests fail with ENOTCONN.
func abortConnection(dev uint64) error {
	// The connection is named after the kernel's dev_t of the super block.
	id := uint64(unix.Major(dev))<<20 | uint64(unix.Minor(dev))
	return os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", id), []byte("1"), 0)
}

func runFusermount(bin string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return fmt.Errorf("%s: %w: %s", filepath.Base(bin), err, msg)
		}
		return fmt.Errorf("%s: %w", filepath.Base(bin), err)
	}
	return nil
}

// Unmount unmounts the lazyfs mount on mountpoint, as `fusermount3 -u`
// does, for a mount served by another process (lazyfs -u). It refuses a
// path that is not a lazyfs mount (ErrNotMounted) and reports ErrBusy if
// files on it are open. It sends no request to the mount, so it works on
// a mount whose server is gone.
func Unmount(mountpoint string) error {
	abs, err := lazyfsMount(mountpoint)
	if err != nil {
		return err
	}
	m, err := findMount(abs)
	if err != nil {
		return fmt.Errorf("unmount %s: %w", abs, err)
	}
	if os.Geteuid() == 0 {
		err = unix.Unmount(abs, 0)
	} else {
		var bin string
		if bin, err = fusermount(); err == nil {
			err = runFusermount(bin, "-u", abs)
		}
	}
	if err != nil {
		if errors.Is(err, syscall.EBUSY) || strings.Contains(err.Error(), "busy") {
			return fmt.Errorf("unmount %s: %w: files on it are open (close them, or force: lazyfs -u --force): %w", abs, ErrBusy, err)
		}
		return fmt.Errorf("unmount %s: %w", abs, err)
	}
	return waitGone(abs, m.dev, unmountWait)
}

// unmountWait is how long Unmount waits for the file system to go once
// unmounted here.
const unmountWait = 5 * time.Second

// waitGone waits until the file system of dev, just unmounted from abs,
// is gone (its FUSE server then reads ENODEV and exits), or says what
// still holds it: another mount namespace's copy of the mount (one a host
// whose / is private never propagates the unmount to), or a detached
// mount's open files.
func waitGone(abs string, dev uint64, wait time.Duration) error {
	conn := fmt.Sprintf("/sys/fs/fuse/connections/%d", unix.Major(dev)<<20|unix.Minor(dev))
	_, fusectl := os.Stat("/sys/fs/fuse/connections")
	deadline := time.Now().Add(wait)
	for {
		holders := mountHolders(dev)
		_, err := os.Stat(conn)
		gone := fusectl != nil || errors.Is(err, os.ErrNotExist)
		if len(holders) == 0 && gone {
			return nil
		}
		if time.Now().After(deadline) {
			if len(holders) > 0 {
				return fmt.Errorf("unmounted %s here, but %w: the mount namespace of %s holds a copy of it (unmount it there: nsenter -m -t PID umount %s), and its server serves that until then", abs, ErrBusy, strings.Join(holders, ", "), abs)
			}
			return fmt.Errorf("unmounted %s here, but %w: files opened on it before are still open, and its server serves them until they are closed", abs, ErrBusy)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mountHolders names, for messages, a process of each mount namespace
// (ours included) that has a mount of the file system dev: "pid 42
// (redis-server)". Namespaces it may not read are skipped.
func mountHolders(dev uint64) []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	seen := map[string]bool{}
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		ms, err := kernel.Mounts(pid)
		if err != nil {
			continue
		}
		for _, m := range ms {
			if m.Dev == want {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				out = append(out, fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm))))
				break
			}
		}
	}
	return out
}

// detachLazyfs unmounts lazily (MNT_DETACH), in the mount namespace of
// the thread tid, every lazyfs mount, the mounts on them first.
func detachLazyfs(tid int) {
	ms, err := kernel.Mounts(tid)
	if err != nil {
		return
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].FSType == FSType {
			unix.Unmount(ms[i].Path, unix.MNT_DETACH)
		}
	}
}

// ForceUnmount aborts the FUSE connection of the lazyfs mount on
// mountpoint and unmounts it, even if files on it are open: they fail
// with ENOTCONN from then on. It frees a mount whose server is stuck or
// gone (a server killed while a request to its own mount was in flight
// cannot exit until the connection is aborted). As root it uses
// umount2(MNT_FORCE), which FUSE turns into an abort, then a lazy
// unmount; otherwise fusermount3 -u -z, which cannot abort.
func ForceUnmount(mountpoint string) error {
	abs, err := lazyfsMount(mountpoint)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		bin, err := fusermount()
		if err == nil {
			err = runFusermount(bin, "-u", "-z", abs)
		}
		if err != nil {
			return fmt.Errorf("force unmount %s: %w", abs, err)
		}
		return nil
	}
	// MNT_FORCE aborts the connection and may still fail with EBUSY while
	// the aborted requests unwind; the lazy unmount then always succeeds.
	if err := unix.Unmount(abs, unix.MNT_FORCE); err == nil {
		return nil
	}
	if err := unix.Unmount(abs, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("force unmount %s: %w", abs, err)
	}
	return nil
}

// CheckedMount is a running lazyfs mount of a snapshot, checked and held
// by a descriptor of its root directory: what is read from it is read
// from that mount, whatever becomes of its path (another mount over it, a
// symbolic link retargeted) after the check.
type CheckedMount struct {
	dir *os.File
	dev uint64
}

// OpenMount checks that mnt is a lazyfs mount of the snapshot whose
// manifest is manifest, made by root or the caller, and returns it held
// by a descriptor: the file system of the directory opened (by st_dev,
// in mountinfo) is lazyfs's, its FUSE server was started by one of them,
// and it serves those manifest bytes. A restore reads a process's memory
// from such a mount (snapctl restore --lazy --mount); the bytes it reads
// are checked against the snapshot's CRC32C besides.
func OpenMount(mnt string, manifest []byte) (*CheckedMount, error) {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", abs, err)
	}
	m := &CheckedMount{dir: os.NewFile(uintptr(fd), abs)}
	if err := m.check(manifest); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *CheckedMount) check(manifest []byte) error {
	abs := m.dir.Name()
	var st unix.Stat_t
	if err := unix.Fstat(int(m.dir.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", abs, err)
	}
	m.dev = st.Dev
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	e, ok := mountOfDev(b, st.Dev)
	if !ok {
		return fmt.Errorf("%s: %w: not a mount point", abs, ErrNotMounted)
	}
	if e.fstype != FSType {
		return fmt.Errorf("%s: %w (it is a %s mount)", abs, ErrNotMounted, e.fstype)
	}
	if euid := os.Geteuid(); e.userID != 0 && e.userID != euid {
		return fmt.Errorf("%s: %w: mounted by uid %d, neither the caller (uid %d) nor root", abs, image.ErrUntrusted, e.userID, euid)
	}
	f, err := m.open(image.ManifestName)
	if err != nil {
		return err
	}
	defer f.Close()
	got, err := io.ReadAll(io.LimitReader(f, int64(len(manifest))+1))
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name(), err)
	}
	if !bytes.Equal(got, manifest) {
		return fmt.Errorf("%s: %w: it serves another snapshot", abs, ErrNotMounted)
	}
	return nil
}

// OpenMem opens the memory file PID/mem of the mount.
func (m *CheckedMount) OpenMem(pid int) (*os.File, error) {
	return m.open(strconv.Itoa(pid), "mem")
}

// open opens the file at the path of components below the mount's root,
// one component at a time without following a symbolic link, each on the
// mount's own file system.
func (m *CheckedMount) open(components ...string) (*os.File, error) {
	at := int(m.dir.Fd())
	name := m.dir.Name()
	var fd int = -1
	for i, c := range components {
		flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i < len(components)-1 {
			flags |= unix.O_DIRECTORY
		}
		next, err := unix.Openat(at, c, flags, 0)
		name = filepath.Join(name, c)
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		fd, at = next, next
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Dev != m.dev {
			unix.Close(fd)
			return nil, fmt.Errorf("%s: %w: not on the mount checked", name, ErrNotMounted)
		}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Close releases the mount's descriptor.
func (m *CheckedMount) Close() error { return m.dir.Close() }

// mountOfDev returns the mountinfo entry of the file system whose st_dev
// is dev (the last one, if several).
func mountOfDev(b []byte, dev uint64) (mountEntry, bool) {
	var found mountEntry
	ok := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if e, good := parseMountLine(sc.Text()); good && e.dev == dev {
			found, ok = e, true
		}
	}
	return found, ok
}

// lazyfsMount returns the absolute path of mountpoint if a lazyfs file
// system is mounted there, and ErrNotMounted otherwise.
func lazyfsMount(mountpoint string) (string, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", fmt.Errorf("unmount %s: %w", mountpoint, err)
	}
	m, err := findMount(abs)
	if err != nil {
		return "", fmt.Errorf("unmount %s: %w", abs, err)
	}
	if m.fstype != FSType {
		return "", fmt.Errorf("unmount %s: %w (it is a %s mount)", abs, ErrNotMounted, m.fstype)
	}
	return abs, nil
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct {
	dev    uint64 // st_dev of the file system
	fstype string
	userID int // a FUSE mount's user_id: who mounted it; -1 if not said
}

// findMount returns the mount whose mount point is exactly mnt (the last
// one, if several are stacked), or ErrNotMounted. mnt must be absolute;
// it is compared as given and, if that fails, with its symlinks resolved
// (resolving touches the path, so it comes second).
func findMount(mnt string) (mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, err
	}
	if m, ok := parseMountinfo(b, mnt); ok {
		return m, nil
	}
	if real, err := filepath.EvalSymlinks(mnt); err == nil && real != mnt {
		if m, ok := parseMountinfo(b, real); ok {
			return m, nil
		}
	}
	return mountEntry{}, fmt.Errorf("%w: not a mount point", ErrNotMounted)
}

// parseMountinfo finds mnt in the text of /proc/self/mountinfo:
//
//	ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
func parseMountinfo(b []byte, mnt string) (mountEntry, bool) {
	var found mountEntry
	ok := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || unescapeMount(f[4]) != mnt {
			continue
		}
		if e, good := parseMountLine(sc.Text()); good {
			found, ok = e, true
		}
	}
	return found, ok
}

// parseMountLine parses a line of /proc/self/mountinfo.
func parseMountLine(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return mountEntry{}, false
	}
	var maj, min uint32
	if _, err := fmt.Sscanf(f[2], "%d:%d", &maj, &min); err != nil {
		return mountEntry{}, false
	}
	for i := 6; i+1 < len(f); i++ {
		if f[i] != "-" {
			continue
		}
		e := mountEntry{dev: unix.Mkdev(maj, min), fstype: f[i+1], userID: -1}
		if i+3 < len(f) {
			for _, o := range strings.Split(f[i+3], ",") {
				if v, isUID := strings.CutPrefix(o, "user_id="); isUID {
					if id, err := strconv.Atoi(v); err == nil {
						e.userID = id
					}
				}
			}
		}
		return e, true
	}
	return mountEntry{}, false
}

// unescapeMount undoes the octal escapes (\040 for a space...) of a path
// in /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// closeOnExecAll makes every descriptor of this process but the standard
// ones close-on-exec.
func closeOnExecAll() error {
	return unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
}
