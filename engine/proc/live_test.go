package proc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/test/testutil"
	"golang.org/x/sys/unix"
)

// fixture is a running testdata/fixture.c: a child of the test holding one
// of each kind of descriptor and mapping.
type fixture struct {
	pid   int
	bin   string
	dir   string
	facts map[string]string
}

func (f *fixture) int(t *testing.T, key string) int {
	t.Helper()
	v, err := strconv.ParseInt(f.facts[key], 0, 64)
	if err != nil {
		t.Fatalf("fixture fact %s=%q: %v", key, f.facts[key], err)
	}
	return int(v)
}

// pair returns the two numbers of a fact "a,b".
func (f *fixture) pair(t *testing.T, key string) (int, int) {
	t.Helper()
	a, b, _ := strings.Cut(f.facts[key], ",")
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil {
		t.Fatalf("fixture fact %s=%q", key, f.facts[key])
	}
	return x, y
}

func (f *fixture) addr(t *testing.T, key string) uint64 { return uint64(f.int(t, key)) }

// startFixture compiles and starts the fixture; it is stopped (stdin
// closed, then killed if it lingers) and waited for at cleanup.
func startFixture(t *testing.T) *fixture {
	t.Helper()
	cc := testutil.RequireCommand(t, "cc")
	dir := t.TempDir()
	bin := filepath.Join(dir, "fixture")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if out, err := exec.CommandContext(ctx, cc, "-O1", "-o", bin, "testdata/fixture.c").CombinedOutput(); err != nil {
		t.Fatalf("compile fixture: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin, dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	lines := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		var got []string
		for len(got) < 2 && sc.Scan() {
			got = append(got, sc.Text())
		}
		lines <- got
		io.Copy(io.Discard, stdout)
	}()
	var got []string
	select {
	case got = <-lines:
	case <-time.After(20 * time.Second):
		t.Fatal("fixture did not get ready in 20s")
	}
	if len(got) != 2 || got[0] != "ready" {
		t.Fatalf("fixture output %q", got)
	}
	f := &fixture{pid: cmd.Process.Pid, bin: bin, dir: dir, facts: map[string]string{}}
	for _, kv := range strings.Fields(got[1]) {
		k, v, _ := strings.Cut(kv, "=")
		f.facts[k] = v
	}
	return f
}

func findMapping(t *testing.T, ms []Mapping, start uint64) *Mapping {
	t.Helper()
	for i := range ms {
		if ms[i].Start <= start && start < ms[i].End {
			return &ms[i]
		}
	}
	t.Fatalf("no mapping contains %#x", start)
	return nil
}

func TestLiveMappings(t *testing.T) {
	f := startFixture(t)
	ms, err := ReadMappings(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := ReadMaps(f.pid)
	if err != nil || len(plain) != len(ms) {
		t.Fatalf("ReadMaps: %d mappings, %v; smaps has %d", len(plain), err, len(ms))
	}
	anon := f.addr(t, "anon")
	checks := []struct {
		key  string
		kind Kind
		test func(*Mapping) bool
	}{
		{"anon", KindAnon, (*Mapping).IsAnonPrivate},
		{"memfdmap", KindShmem, (*Mapping).IsMemfd},
		{"shanon", KindShmem, func(m *Mapping) bool { return m.Path == "/dev/zero" && m.Deleted }},
		{"devzero", KindShmem, (*Mapping).IsShmem},
		{"sysv", KindShmem, (*Mapping).IsSysV},
		{"fileprivate", KindFilePrivate, func(m *Mapping) bool { return m.Path == filepath.Join(f.dir, "fixture.data") }},
	}
	for _, c := range checks {
		m := findMapping(t, ms, f.addr(t, c.key))
		if m.Kind() != c.kind || !c.test(m) {
			t.Errorf("%s: %v kind %v", c.key, m, m.Kind())
		}
	}
	if f.facts["named"] == "1" {
		if m := findMapping(t, ms, anon); m.Path != "[anon:lazyfs-anon]" {
			t.Errorf("named anon mapping %v", m)
		}
	}
}

func TestLiveFDs(t *testing.T) {
	f := startFixture(t)
	fds, err := ReadFDs(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	byNum := map[int]*FD{}
	for i := range fds {
		byNum[fds[i].Num] = &fds[i]
	}
	kinds := map[string]FDKind{
		"efd": FDEventfd, "tfd": FDTimerfd, "sfd": FDSignalfd, "tcp4l": FDSocket, "tcp4c": FDSocket,
		"udp4": FDSocket, "unixl": FDSocket, "unixabs": FDSocket, "epoll": FDEpoll, "inotify": FDInotify,
		"memfd": FDMemfd, "dirfd": FDDir, "null": FDCharDev, "pidfd": FDPidfd, "deleted": FDFile,
		"fifo": FDFIFO, "file": FDFile, "zero": FDCharDev,
	}
	if f.int(t, "uffd") >= 0 {
		kinds["uffd"] = FDUserfaultfd
	}
	fd := func(key string) *FD {
		t.Helper()
		d := byNum[f.int(t, key)]
		if d == nil {
			t.Fatalf("fd %s not listed", key)
		}
		return d
	}
	for key, kind := range kinds {
		if d := fd(key); d.Kind != kind {
			t.Errorf("%s: fd %d -> %q kind %v, want %v", key, d.Num, d.Target, d.Kind, kind)
		}
	}
	if d := fd("efd"); d.Info.Eventfd == nil || d.Info.Eventfd.Count != 5 || !d.Info.Eventfd.Semaphore {
		t.Errorf("eventfd %+v", d.Info.Eventfd)
	}
	if d := fd("tfd"); d.Info.Timerfd == nil || d.Info.Timerfd.Interval != (Timespec{1, 500000000}) || d.Info.Timerfd.Value.Sec > 100 {
		t.Errorf("timerfd %+v", d.Info.Timerfd)
	}
	if d := fd("epoll"); len(d.Info.Epoll) != 3 {
		t.Errorf("epoll %+v", d.Info.Epoll)
	}
	if d := fd("deleted"); !d.Deleted || d.Path != filepath.Join(f.dir, "fixture.deleted") || d.Stat.Nlink != 0 {
		t.Errorf("deleted file %+v", d)
	}
	if d := fd("file"); d.Stat.Size != 4*PageSize || d.Info.Pos != 1234 || d.Info.Flags&unix.O_ACCMODE != unix.O_RDWR {
		t.Errorf("data file %+v info %+v", d.Stat, d.Info)
	}
	if d := fd("pidfd"); d.Info.Pidfd == nil || d.Info.Pidfd.Pid != f.pid {
		t.Errorf("pidfd %+v", d.Info.Pidfd)
	}
	pipes := GroupPipes(fds)
	rd, wr := f.pair(t, "pipe")
	found := false
	for _, p := range pipes {
		if slicesEqual(p.Readers, []int{rd}) && slicesEqual(p.Writers, []int{wr}) && p.Ino == byNum[rd].Ino {
			found = true
		}
	}
	if !found {
		t.Errorf("pipe %d,%d not grouped: %+v", rd, wr, pipes)
	}
}

func TestLiveProcessState(t *testing.T) {
	f := startFixture(t)
	st, err := ReadStatus(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != "fixture" || st.PPid != os.Getpid() || st.Threads != 1 || st.Tgid != f.pid {
		t.Errorf("status %+v", st)
	}
	if _, err := ReadTaskStatus(f.pid, f.pid); err != nil {
		t.Error(err)
	}
	s, err := ReadStat(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	if s.Comm != "fixture" || s.PPid != os.Getpid() || s.StartCode == 0 || s.StartCode >= s.EndCode || s.ArgStart >= s.ArgEnd || s.EnvStart > s.EnvEnd || s.StartBrk == 0 {
		t.Errorf("stat %+v", s)
	}
	if ts, err := ReadTaskStat(f.pid, f.pid); err != nil || ts.Pid != f.pid {
		t.Errorf("task stat %+v, %v", ts, err)
	}
	auxv, err := ReadAuxv(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := ReadMaps(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	vdso, ok := auxv.Lookup(AtSysinfoEHDR)
	if m := findMapping(t, ms, vdso); !ok || m.Path != "[vdso]" || m.Start != vdso {
		t.Errorf("AT_SYSINFO_EHDR %#x is not the [vdso] mapping %v", vdso, m)
	}
	lim, err := ReadLimits(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := ReadRlimits(f.pid)
	if err != nil {
		t.Fatal(err)
	}
	if *lim != *rl {
		t.Errorf("limits %+v\nprlimit %+v", lim, rl)
	}
	if exe, err := Exe(f.pid); err != nil || exe != f.bin {
		t.Errorf("Exe = %q, %v; want %q", exe, err, f.bin)
	}
	id, err := ExeFile(f.pid)
	want, err2 := StatFile(f.bin)
	if err != nil || err2 != nil || id != want || id.Size == 0 {
		t.Errorf("ExeFile = %+v, %v; want %+v, %v", id, err, want, err2)
	}
	cwd, _ := os.Getwd()
	if got, err := Cwd(f.pid); err != nil || got != cwd {
		t.Errorf("Cwd = %q, %v; want %q", got, err, cwd)
	}
	if got, err := Root(f.pid); err != nil || got != "/" {
		t.Errorf("Root = %q, %v", got, err)
	}
	if got, err := ReadComm(f.pid); err != nil || got != "fixture" {
		t.Errorf("ReadComm = %q, %v", got, err)
	}
	if got, err := ReadTaskComm(f.pid, f.pid); err != nil || got != "fixture" {
		t.Errorf("ReadTaskComm = %q, %v", got, err)
	}
	if got, err := ReadCmdline(f.pid); err != nil || !slicesEqual(got, []string{f.bin, f.dir}) {
		t.Errorf("ReadCmdline = %q, %v", got, err)
	}
	if got, err := Personality(f.pid); err != nil || got != 0 {
		t.Errorf("Personality = %#x, %v", got, err)
	}
	if got, err := TimerSlack(f.pid); err != nil || got == 0 {
		t.Errorf("TimerSlack = %d, %v", got, err)
	}
	if got, err := Tasks(f.pid); err != nil || !slicesEqual(got, []int{f.pid}) {
		t.Errorf("Tasks = %v, %v", got, err)
	}
	children, err := Children(os.Getpid())
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("kernel without CONFIG_PROC_CHILDREN")
	}
	found := false
	for _, c := range children {
		found = found || c == f.pid
	}
	if err != nil || !found {
		t.Errorf("Children(self) = %v, %v; want to contain %d", children, err, f.pid)
	}
}

func TestLiveSelf(t *testing.T) {
	pid := os.Getpid()
	ms, err := ReadMappings(pid)
	if err != nil {
		t.Fatal(err)
	}
	special := 0
	for i := range ms {
		if ms[i].IsSpecial() {
			special++
		}
	}
	if special == 0 {
		t.Errorf("no [vdso]/[vvar] among %d mappings", len(ms))
	}
	tasks, err := Tasks(pid)
	if err != nil || len(tasks) < 2 {
		t.Errorf("Tasks(self) = %v, %v; a Go process has several threads", tasks, err)
	}
	st, err := ReadStatus(pid)
	if err != nil || st.Threads < len(tasks)-8 || st.Pid != pid {
		t.Errorf("status %+v, %v", st, err)
	}
	if _, err := ReadFDs(pid); err != nil {
		t.Error(err)
	}
}

func TestLiveMissingProcess(t *testing.T) {
	// A pid above pid_max never exists.
	const pid = 1 << 23
	if _, err := ReadMappings(pid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadMappings: %v", err)
	}
	if _, err := ReadStatus(pid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadStatus: %v", err)
	}
	if _, err := ReadFDs(pid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadFDs: %v", err)
	}
}
