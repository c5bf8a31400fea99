package proc

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The samples in testdata/{fixture,redis,memcached,python} were captured
// on the development machine (Linux 6.18, x86-64) from the fixture program
// (testdata/fixture.c), redis-server 7, memcached 1.6 and python3 -m
// http.server, each with one client connected.

func readSample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseSampleSmaps(t testing.TB, name string) []Mapping {
	t.Helper()
	ms, err := ParseSmaps(bytes.NewReader(readSample(t, name)))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return ms
}

func kindCounts(ms []Mapping) map[Kind]int {
	c := map[Kind]int{}
	for i := range ms {
		c[ms[i].Kind()]++
	}
	return c
}

func TestSmapsRedis(t *testing.T) {
	ms := parseSampleSmaps(t, "redis/smaps")
	maps, err := ParseMaps(bytes.NewReader(readSample(t, "redis/maps")))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 117 || len(maps) != len(ms) {
		t.Fatalf("smaps %d mappings, maps %d; want 117 each", len(ms), len(maps))
	}
	var rss, anon uint64
	for i := range ms {
		m, p := ms[i], maps[i]
		if m.Start != p.Start || m.End != p.End || m.Perms != p.Perms || m.Path != p.Path || m.Inode != p.Inode || m.Dev != p.Dev || m.Offset != p.Offset {
			t.Errorf("mapping %d: smaps %v, maps %v", i, &m, &p)
		}
		if !m.HasSmaps || p.HasSmaps {
			t.Errorf("mapping %d: HasSmaps %v / %v", i, m.HasSmaps, p.HasSmaps)
		}
		if m.Usage.Size != m.Len() {
			t.Errorf("%v: Size %d, want %d", &m, m.Usage.Size, m.Len())
		}
		if !m.IsSpecial() && !m.Flags.Has(VMMayRead) {
			t.Errorf("%v: flags %v lack mr", &m, m.Flags)
		}
		rss += m.Usage.Rss
		anon += m.Usage.Anonymous
	}
	if rss == 0 || anon == 0 || anon > rss {
		t.Errorf("Rss %d Anonymous %d", rss, anon)
	}
	// The same classification the kernel-probes survey made of redis.
	want := map[Kind]int{KindAnon: 21, KindFilePrivate: 91, KindFileShared: 1, KindSpecial: 4}
	if got := kindCounts(ms); !equalCounts(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
	first := ms[0]
	if first.Path != "/usr/bin/redis-check-rdb" || first.Perms.String() != "r--p" || first.Dev != (Dev{0xfe, 0}) {
		t.Errorf("first mapping %v", &first)
	}
	if s := first.String(); !strings.HasPrefix(s, strconv.FormatUint(first.Start, 16)+"-") || !strings.HasSuffix(s, " r--p 00000000 fe:00 "+strconv.FormatUint(first.Inode, 10)+" /usr/bin/redis-check-rdb") {
		t.Errorf("String() = %q", s)
	}
}

func equalCounts(a, b map[Kind]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestSmapsFixture(t *testing.T) {
	ms := parseSampleSmaps(t, "fixture/smaps")
	byPath := map[string]*Mapping{}
	var anon8 *Mapping
	for i := range ms {
		m := &ms[i]
		byPath[m.Name()] = m
		if m.Path == "" && m.Len() == 11*PageSize && m.IsAnonPrivate() {
			anon8 = m // the 8-page private mapping merged with 3 pages of libc's bss-adjacent anon
		}
	}
	cases := []struct {
		name    string
		kind    Kind
		shared  bool
		deleted bool
		check   func(*Mapping) bool
	}{
		{"/SYSV00000000 (deleted)", KindShmem, true, true, (*Mapping).IsSysV},
		{"/memfd:lazyfs-memfd (deleted)", KindShmem, true, true, (*Mapping).IsMemfd},
		{"/dev/zero (deleted)", KindShmem, true, true, (*Mapping).IsShmem},
		{"/tmp/fx/fixture.data", KindFilePrivate, false, false, func(m *Mapping) bool { return !m.IsShmem() && !m.IsAnon() }},
		{"[heap]", KindAnon, false, false, (*Mapping).IsAnonPrivate},
		{"[stack]", KindAnon, false, false, (*Mapping).IsAnonPrivate},
		{"[vdso]", KindSpecial, false, false, (*Mapping).IsSpecial},
		{"[vvar]", KindSpecial, false, false, (*Mapping).IsSpecial},
		{"[vvar_vclock]", KindSpecial, false, false, (*Mapping).IsSpecial},
		{"[vsyscall]", KindSpecial, false, false, (*Mapping).IsSpecial},
	}
	for _, c := range cases {
		m := byPath[c.name]
		if m == nil {
			t.Errorf("%s: not found", c.name)
			continue
		}
		if m.Kind() != c.kind || m.Shared() != c.shared || m.Deleted != c.deleted || !c.check(m) {
			t.Errorf("%s: kind %v shared %v deleted %v", c.name, m.Kind(), m.Shared(), m.Deleted)
		}
	}
	if m := byPath["/dev/zero (deleted)"]; m.Dev != (Dev{0, 1}) || !m.Flags.Has(VMShared|VMMayShare) {
		t.Errorf("/dev/zero: dev %v flags %v", m.Dev, m.Flags)
	}
	if m := byPath["[stack]"]; !m.Flags.Has(VMGrowsDown) || m.Usage.Rss == 0 {
		t.Errorf("[stack]: flags %v rss %d", m.Flags, m.Usage.Rss)
	}
	if m := byPath["[vvar]"]; !m.Flags.Has(VMIO | VMPFNMap | VMDontExpand | VMDontDump) {
		t.Errorf("[vvar]: flags %v", m.Flags)
	}
	if m := byPath["/tmp/fx/fixture.data"]; m.Usage.Anonymous != PageSize {
		t.Errorf("fixture.data: Anonymous %d, want one page copied on write", m.Usage.Anonymous)
	}
	if anon8 == nil {
		t.Errorf("private anonymous mapping not found")
	}
}

func TestSmapsMemcachedPython(t *testing.T) {
	ms := parseSampleSmaps(t, "memcached/smaps")
	want := map[Kind]int{KindAnon: 38, KindFilePrivate: 35, KindSpecial: 4}
	if got := kindCounts(ms); !equalCounts(got, want) {
		t.Errorf("memcached kinds %v, want %v", got, want)
	}
	nh := 0
	for i := range ms {
		if ms[i].Flags.Has(VMNoHugePage) {
			nh++
		}
	}
	if nh != 18 {
		t.Errorf("memcached: %d mappings with nh, want 18", nh)
	}
	py, err := ParseMaps(bytes.NewReader(readSample(t, "python/maps")))
	if err != nil || len(py) != 152 {
		t.Fatalf("python maps: %d mappings, %v", len(py), err)
	}
}

func TestStatusSamples(t *testing.T) {
	s, err := ParseStatus(readSample(t, "redis/status"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "redis-server" || s.State != 'S' || s.Threads != 5 || s.SigCgt != 0x00000001000044ea || s.SigIgn != 0x3005 || s.Uid != [4]uint32{} {
		t.Errorf("redis status %+v", s)
	}
	s, err = ParseStatus(readSample(t, "fixture/status"))
	if err != nil {
		t.Fatal(err)
	}
	want := Status{Name: "fixture", State: 'S', Umask: 0o22, Tgid: 6192, Pid: 6192, PPid: 1,
		Groups: []uint32{}, NSpid: []int{6192}, Threads: 1, SigIgn: 6,
		CapPrm: 0x000001fffeffffff, CapEff: 0x000001fffeffffff, CapBnd: 0x000001fffeffffff}
	if !statusEqual(s, &want) {
		t.Errorf("fixture status\n got %+v\nwant %+v", s, &want)
	}
}

func statusEqual(a, b *Status) bool {
	return a.Name == b.Name && a.State == b.State && a.Umask == b.Umask && a.Tgid == b.Tgid && a.Pid == b.Pid &&
		a.PPid == b.PPid && a.TracerPid == b.TracerPid && a.Uid == b.Uid && a.Gid == b.Gid &&
		slicesEqual(a.Groups, b.Groups) && slicesEqual(a.NSpid, b.NSpid) && a.Threads == b.Threads &&
		a.NoNewPrivs == b.NoNewPrivs && a.Seccomp == b.Seccomp && a.SigBlk == b.SigBlk && a.SigIgn == b.SigIgn &&
		a.SigCgt == b.SigCgt && a.CapInh == b.CapInh && a.CapPrm == b.CapPrm && a.CapEff == b.CapEff &&
		a.CapBnd == b.CapBnd && a.CapAmb == b.CapAmb
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStatSamples(t *testing.T) {
	s, err := ParseStat(readSample(t, "fixture/stat"))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{Pid: 6192, Comm: "fixture", State: 'S', PPid: 1, Pgrp: 6181, Session: 3908, TPGid: -1,
		Flags: 4194560, Priority: 20, NumThreads: 1, StartTime: 52303, VSize: 2637824, RSS: 341,
		StartCode: 94871155736576, EndCode: 94871155740849, StartStack: 140735155983408, ExitSignal: 17, Processor: 1,
		StartData: 94871155752400, EndData: 94871155753304, StartBrk: 94872007847936,
		ArgStart: 140735155989156, ArgEnd: 140735155989177, EnvStart: 140735155989177, EnvEnd: 140735155990507}
	if *s != want {
		t.Errorf("fixture stat\n got %+v\nwant %+v", *s, want)
	}
	s, err = ParseStat(readSample(t, "redis/stat"))
	if err != nil || s.Comm != "redis-server" || s.NumThreads != 5 || s.EnvEnd == 0 {
		t.Errorf("redis stat %+v, %v", s, err)
	}
}

// TestStatStates parses the stat of a zombie (its mm fields printed as
// zero) and of a stopped process, as restore reads them for a pid in use
// and a thread in group stop.
func TestStatStates(t *testing.T) {
	for _, tc := range []struct {
		sample string
		state  byte
		exited bool
	}{
		{"zombie/stat", 'Z', true},
		{"stopped/stat", 'T', false},
		{"fixture/stat", 'S', false},
	} {
		s, err := ParseStat(readSample(t, tc.sample))
		if err != nil {
			t.Fatalf("%s: %v", tc.sample, err)
		}
		if s.State != tc.state || s.Exited() != tc.exited || s.Comm == "" {
			t.Errorf("%s: state %c exited %v comm %q, want %c %v", tc.sample, s.State, s.Exited(), s.Comm, tc.state, tc.exited)
		}
	}
	if s := (&Stat{State: 'X'}); !s.Exited() {
		t.Error("state X (dead) is not exited")
	}
}

func TestLimitsSample(t *testing.T) {
	l, err := ParseLimits(readSample(t, "fixture/limits"))
	if err != nil {
		t.Fatal(err)
	}
	if l[unix.RLIMIT_STACK] != (Rlimit{8388608, RlimInfinity}) || l[unix.RLIMIT_NOFILE] != (Rlimit{20000, 20000}) || l[13] != (Rlimit{}) || l[15] != (Rlimit{RlimInfinity, RlimInfinity}) {
		t.Errorf("limits %+v", l)
	}
}

func TestAuxvSample(t *testing.T) {
	a, err := ParseAuxv(readSample(t, "fixture/auxv"))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := a.Lookup(AtSysinfoEHDR); !ok || v != 0x7f876d2f6000 {
		t.Errorf("AT_SYSINFO_EHDR = %#x, %v", v, ok)
	}
	if v, ok := a.Lookup(AtPageSz); !ok || v != PageSize {
		t.Errorf("AT_PAGESZ = %d, %v", v, ok)
	}
	if a[len(a)-2] != AtNull || len(a)%2 != 0 {
		t.Errorf("auxv does not end with AT_NULL: %x", a)
	}
	if !bytes.Equal(a.Bytes(), readSample(t, "fixture/auxv")) {
		t.Errorf("Bytes() differs from the file")
	}
}

// sampleLinks reads a captured "N target" list of fd links.
func sampleLinks(t *testing.T, name string) map[int]string {
	t.Helper()
	out := map[int]string{}
	sc := bufio.NewScanner(bytes.NewReader(readSample(t, name)))
	for sc.Scan() {
		n, target, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		fd, err := strconv.Atoi(n)
		if err != nil {
			t.Fatal(err)
		}
		out[fd] = target
	}
	return out
}

func sampleFDInfo(t *testing.T, dir string, fd int) *FDInfo {
	t.Helper()
	fi, err := ParseFDInfo(readSample(t, dir+"/fdinfo/"+strconv.Itoa(fd)))
	if err != nil {
		t.Fatalf("%s fd %d: %v", dir, fd, err)
	}
	return fi
}

func TestFDInfoFixture(t *testing.T) {
	links := sampleLinks(t, "fixture/fd-links")
	for fd, target := range links {
		fi := sampleFDInfo(t, "fixture", fd)
		kind, _, _, _ := ClassifyTarget(target, 0)
		switch kind {
		case FDEventfd:
			if fi.Eventfd == nil || *fi.Eventfd != (EventfdInfo{Count: 5, Semaphore: true, ID: 1}) || fi.Flags != 0o4002 {
				t.Errorf("eventfd %+v flags %o", fi.Eventfd, fi.Flags)
			}
		case FDTimerfd:
			want := TimerfdInfo{ClockID: 1, Value: Timespec{83, 298339967}, Interval: Timespec{1, 500000000}}
			if fi.Timerfd == nil || *fi.Timerfd != want || fi.Flags&unix.O_CLOEXEC == 0 {
				t.Errorf("timerfd %+v flags %o", fi.Timerfd, fi.Flags)
			}
		case FDSignalfd:
			if fi.Signalfd == nil || fi.Signalfd.Mask != 1<<(unix.SIGUSR1-1)|1<<(unix.SIGUSR2-1) {
				t.Errorf("signalfd %+v", fi.Signalfd)
			}
		case FDEpoll:
			want := []EpollTarget{
				{TFD: 8, Events: 0x19, Data: 0x1122334400000008, Ino: 0x2926, Sdev: 9},
				{TFD: 4, Events: 0x1d, Data: 0x1122334400000004, Ino: 0x2925, Sdev: 0xf},
				{TFD: 3, Events: 0x80000019, Data: 0x1122334455667788, Ino: 0x40e, Sdev: 0x10},
			}
			if !slicesEqual(fi.Epoll, want) {
				t.Errorf("epoll %+v", fi.Epoll)
			}
		case FDInotify:
			if len(fi.Inotify) != 1 {
				t.Fatalf("inotify %+v", fi.Inotify)
			}
			w := fi.Inotify[0]
			if w.WD != 1 || w.Ino != 0x9840b7 || w.Sdev != 0xfe00000 || w.Mask != unix.IN_CREATE|unix.IN_DELETE || w.FHandleType != 1 ||
				!bytes.Equal(w.FHandle, []byte{0xb7, 0x40, 0x98, 0x00, 0xc5, 0xb3, 0xab, 0x58}) {
				t.Errorf("inotify %+v", w)
			}
		case FDPidfd:
			if fi.Pidfd == nil || fi.Pidfd.Pid != 6192 || !slicesEqual(fi.Pidfd.NSpid, []int{6192}) {
				t.Errorf("pidfd %+v", fi.Pidfd)
			}
		case FDUserfaultfd:
			if fi.Uffd == nil || *fi.Uffd != (UffdInfo{API: 0xaa, Ioctls: 0x80000000000001ff}) || len(fi.Extra) != 0 {
				t.Errorf("userfaultfd %+v, extra lines %q", fi.Uffd, fi.Extra)
			}
		case FDFile:
			if target == "/tmp/fx/fixture.data" && fi.Pos != 1234 {
				t.Errorf("fixture.data pos %d", fi.Pos)
			}
		case FDPipe:
			if fd == 4 && fi.Flags != unix.O_CLOEXEC {
				t.Errorf("pipe read end flags %o", fi.Flags)
			}
		}
	}
}

func TestFDInfoServers(t *testing.T) {
	// memcached: four eventfds (ids 2-5 in this capture) and five epolls.
	links := sampleLinks(t, "memcached/fd-links")
	var ids []int
	epolls := 0
	for fd := 0; fd < 32; fd++ {
		target, ok := links[fd]
		if !ok {
			continue
		}
		fi := sampleFDInfo(t, "memcached", fd)
		kind, _, _, _ := ClassifyTarget(target, 0)
		switch kind {
		case FDEventfd:
			ids = append(ids, fi.Eventfd.ID)
		case FDEpoll:
			epolls++
			if len(fi.Epoll) == 0 {
				t.Errorf("memcached epoll fd %d watches nothing", fd)
			}
		}
	}
	if !slicesEqual(ids, []int{2, 3, 4, 5}) || epolls != 5 {
		t.Errorf("memcached eventfd ids %v, %d epolls", ids, epolls)
	}
	fi := sampleFDInfo(t, "redis", 5)
	if len(fi.Epoll) != 3 || fi.Epoll[0] != (EpollTarget{TFD: 7, Events: 0x19, Data: 7, Ino: 10779, Sdev: 9}) {
		t.Errorf("redis epoll %+v", fi.Epoll)
	}
}

func TestClassifyTarget(t *testing.T) {
	cases := []struct {
		target  string
		mode    uint32
		kind    FDKind
		path    string
		deleted bool
		ino     uint64
	}{
		{"pipe:[10533]", unix.S_IFIFO, FDPipe, "", false, 10533},
		{"socket:[10534]", unix.S_IFSOCK, FDSocket, "", false, 10534},
		{"anon_inode:[eventfd]", 0, FDEventfd, "[eventfd]", false, 0},
		{"anon_inode:[eventpoll]", 0, FDEpoll, "[eventpoll]", false, 0},
		{"anon_inode:[timerfd]", 0, FDTimerfd, "[timerfd]", false, 0},
		{"anon_inode:[signalfd]", 0, FDSignalfd, "[signalfd]", false, 0},
		{"anon_inode:inotify", 0, FDInotify, "inotify", false, 0},
		{"anon_inode:[fanotify]", 0, FDFanotify, "[fanotify]", false, 0},
		{"anon_inode:[userfaultfd]", 0, FDUserfaultfd, "[userfaultfd]", false, 0},
		{"anon_inode:[pidfd]", 0, FDPidfd, "[pidfd]", false, 0},
		{"pidfd:[6193]", 0, FDPidfd, "", false, 6193},
		{"anon_inode:[io_uring]", 0, FDAnonInode, "[io_uring]", false, 0},
		{"net:[4026531840]", 0, FDNamespace, "net", false, 4026531840},
		{"/memfd:lazyfs-memfd (deleted)", unix.S_IFREG, FDMemfd, "/memfd:lazyfs-memfd", true, 0},
		{"/tmp/fx/fixture.deleted (deleted)", unix.S_IFREG, FDFile, "/tmp/fx/fixture.deleted", true, 0},
		{"/tmp/fx/fixture.fifo", unix.S_IFIFO, FDFIFO, "/tmp/fx/fixture.fifo", false, 0},
		{"/tmp/fx", unix.S_IFDIR, FDDir, "/tmp/fx", false, 0},
		{"/dev/null", unix.S_IFCHR, FDCharDev, "/dev/null", false, 0},
		{"/dev/vda", unix.S_IFBLK, FDBlockDev, "/dev/vda", false, 0},
		{"weird", 0, FDUnknown, "weird", false, 0},
		{"pipe:[x]", 0, FDUnknown, "pipe:[x]", false, 0},
	}
	for _, c := range cases {
		kind, path, deleted, ino := ClassifyTarget(c.target, c.mode)
		if kind != c.kind || path != c.path || deleted != c.deleted || ino != c.ino {
			t.Errorf("ClassifyTarget(%q) = %v %q %v %d, want %v %q %v %d", c.target, kind, path, deleted, ino, c.kind, c.path, c.deleted, c.ino)
		}
	}
}

func TestGroupPipes(t *testing.T) {
	fds := []FD{
		{Num: 3, Kind: FDPipe, Ino: 7, Info: &FDInfo{Flags: unix.O_CLOEXEC}},
		{Num: 4, Kind: FDPipe, Ino: 7, Info: &FDInfo{Flags: unix.O_WRONLY}},
		{Num: 5, Kind: FDSocket, Ino: 7},
		{Num: 6, Kind: FDPipe, Ino: 9, Info: &FDInfo{Flags: unix.O_WRONLY}},
		{Num: 8, Kind: FDPipe, Ino: 7, Info: &FDInfo{Flags: unix.O_WRONLY | unix.O_NONBLOCK}},
	}
	got := GroupPipes(fds)
	if len(got) != 2 || got[0].Ino != 7 || !slicesEqual(got[0].Readers, []int{3}) || !slicesEqual(got[0].Writers, []int{4, 8}) ||
		got[1].Ino != 9 || len(got[1].Readers) != 0 || !slicesEqual(got[1].Writers, []int{6}) {
		t.Errorf("GroupPipes = %+v", got)
	}
	if kind, _, _, ino := ClassifyTarget("pipe:[42]", 0); kind != FDPipe || ino != 42 {
		t.Errorf("pipe:[42]: %v inode %d", kind, ino)
	}
	if kind, _, _, ino := ClassifyTarget("socket:[43]", 0); kind != FDSocket || ino != 43 {
		t.Errorf("socket:[43]: %v inode %d", kind, ino)
	}
}
