package proc

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMapsMalformed(t *testing.T) {
	long := "1000-2000 r--p 00000000 fe:00 1 /" + strings.Repeat("a", maxLine) + "\n"
	cases := []struct {
		name, in string
		smaps    bool
		want     error
	}{
		{"garbage", "zzz\n", false, ErrMalformed},
		{"reversed range", "2000-1000 r--p 00000000 fe:00 1 /x\n", false, ErrMalformed},
		{"bad perms", "1000-2000 rwzp 00000000 fe:00 1 /x\n", false, ErrMalformed},
		{"short perms", "1000-2000 rw 00000000 fe:00 1 /x\n", false, ErrMalformed},
		{"bad share", "1000-2000 rw-q 00000000 fe:00 1 /x\n", false, ErrMalformed},
		{"bad device", "1000-2000 r--p 00000000 fe00 1 /x\n", false, ErrMalformed},
		{"bad inode", "1000-2000 r--p 00000000 fe:00 -1 /x\n", false, ErrMalformed},
		{"truncated", "1000-2000 r--p 0000", false, ErrMalformed},
		{"overlap", "1000-3000 r--p 00000000 fe:00 1 /x\n2000-4000 r--p 00000000 fe:00 1 /x\n", false, ErrMalformed},
		{"line too long", long, false, ErrTooLarge},
		{"bad counter", "1000-2000 r--p 00000000 fe:00 1 /x\nRss: abc kB\n", true, ErrMalformed},
		{"bad unit", "1000-2000 r--p 00000000 fe:00 1 /x\nRss: 4 MB\n", true, ErrMalformed},
		{"huge counter", "1000-2000 r--p 00000000 fe:00 1 /x\nRss: 99999999999999999 kB\n", true, ErrMalformed},
		{"bad THPeligible", "1000-2000 r--p 00000000 fe:00 1 /x\nTHPeligible: 2\n", true, ErrMalformed},
		{"field before header", "Rss: 4 kB\n", true, ErrMalformed},
		{"long VmFlags mnemonic", "1000-2000 r--p 00000000 fe:00 1 /x\nVmFlags: rd abcdefghij\n", true, ErrMalformed},
	}
	for _, c := range cases {
		_, err := parseMaps(strings.NewReader(c.in), c.smaps)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
}

func TestParseMapsEdgeCases(t *testing.T) {
	in := "" +
		"1000-2000 rw-p 00000000 00:00 0 \n" +
		"2000-3000 rw-s 00000000 00:01 5                          /memfd:a b (deleted)\n" +
		"3000-4000 r--p 00001000 103:0a 77                        /path with  spaces\n" +
		"4000-5000 rw-p 00000000 00:00 0                          [anon:my name]\n" +
		"5000-6000 rw-s 00000000 00:01 9                          [anon_shmem:x]\n" +
		"6000-7000 r--p 00000000 00:00 0                          [uprobes]\n" +
		"7000-8000 rw-p 00000000 00:05 3                          /dev/zero\n" +
		"\n"
	ms, err := ParseMaps(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 7 {
		t.Fatalf("%d mappings", len(ms))
	}
	want := []struct {
		path    string
		deleted bool
		kind    Kind
	}{
		{"", false, KindAnon},
		{"/memfd:a b", true, KindShmem},
		{"/path with  spaces", false, KindFilePrivate},
		{"[anon:my name]", false, KindAnon},
		{"[anon_shmem:x]", false, KindShmem},
		{"[uprobes]", false, KindSpecial},
		{"/dev/zero", false, KindFilePrivate},
	}
	for i, w := range want {
		m := &ms[i]
		if m.Path != w.path || m.Deleted != w.deleted || m.Kind() != w.kind {
			t.Errorf("mapping %d: %q deleted %v kind %v; want %q %v %v", i, m.Path, m.Deleted, m.Kind(), w.path, w.deleted, w.kind)
		}
	}
	if ms[2].Dev != (Dev{0x103, 0xa}) || ms[2].Offset != 0x1000 || ms[2].Dev.String() != "103:0a" {
		t.Errorf("device %v offset %#x", ms[2].Dev, ms[2].Offset)
	}
	if ms[1].Name() != "/memfd:a b (deleted)" || ms[1].Perms.String() != "rw-s" {
		t.Errorf("Name %q Perms %v", ms[1].Name(), ms[1].Perms)
	}
}

func TestVMFlags(t *testing.T) {
	f, err := ParseVMFlags("rd wr mr mw me ac sd zz yy ")
	if err != nil {
		t.Fatal(err)
	}
	if !f.Has(VMRead|VMWrite|VMAccount|VMSoftDirty) || f.Has(VMExec) || !slicesEqual(f.Unknown(), []string{"zz", "yy"}) {
		t.Errorf("flags %v", f)
	}
	if got := f.String(); got != "rd wr mr mw me ac sd zz yy" {
		t.Errorf("String() = %q", got)
	}
	if u := f.Unknown(); !slicesEqual(u, []string{"zz", "yy"}) {
		t.Errorf("Unknown() = %q", u)
	}
	if f.With(VMExec).Known() != f.Known()|VMExec {
		t.Errorf("With")
	}
	if len(vmFlagNames) != 40 || VMMPX != 1<<39 {
		t.Errorf("flag table and constants disagree: %d names, VMMPX %#x", len(vmFlagNames), uint64(VMMPX))
	}
	many := strings.Repeat("q1 ", maxUnknownVMFlags+1)
	if _, err := ParseVMFlags(many); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many unknown flags: %v", err)
	}
}

func TestParseStatusMalformed(t *testing.T) {
	base := "Name:\tx\nPid:\t5\n"
	cases := map[string]string{
		"no name":      "Pid:\t5\n",
		"uid count":    base + "Uid:\t1 2 3\n",
		"uid value":    base + "Uid:\t1 2 3 x\n",
		"sig mask":     base + "SigBlk:\txyz\n",
		"umask":        base + "Umask:\t0089\n",
		"group":        base + "Groups:\t1 -2\n",
		"empty state":  base + "State:\n",
		"threads":      base + "Threads:\t99999999999\n",
		"vm swap unit": base + "VmSwap:\t12 MB\n",
		"vm swap":      base + "VmSwap:\t-12 kB\n",
		"ns pid":       base + "NSpid:\t5 x\n",
	}
	for name, in := range cases {
		if _, err := ParseStatus([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	groups := base + "Groups:\t" + strings.Repeat("1 ", maxGroups+1) + "\n"
	if _, err := ParseStatus([]byte(groups)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many groups: %v", err)
	}
	nspid := base + "NSpid:\t" + strings.Repeat("1 ", 65) + "\n"
	if _, err := ParseStatus([]byte(nspid)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many pid namespaces: %v", err)
	}
	s, err := ParseStatus([]byte(base + "Groups:\t4 24 27\nNoNewPrivs:\t1\nSeccomp:\t2\nTracerPid:\t77\n"))
	if err != nil || !slicesEqual(s.Groups, []uint32{4, 24, 27}) || !s.NoNewPrivs || s.Seccomp != 2 || s.TracerPid != 77 {
		t.Errorf("status %+v, %v", s, err)
	}
}

// statLine builds a stat line with comm and 50 fields after it, field n
// (from 3) set to n.
func statLine(comm string) string {
	var b strings.Builder
	b.WriteString("42 (" + comm + ") S")
	for n := 4; n <= 52; n++ {
		b.WriteString(" " + strconv.Itoa(n))
	}
	return b.String() + "\n"
}

func TestParseStatComm(t *testing.T) {
	for _, comm := range []string{"a", "a b", "x) (y", ")", "((", ""} {
		s, err := ParseStat([]byte(statLine(comm)))
		if err != nil {
			t.Fatalf("comm %q: %v", comm, err)
		}
		if s.Comm != comm || s.Pid != 42 || s.PPid != 4 || s.StartCode != 26 || s.StartStack != 28 || s.ExitSignal != 38 ||
			s.StartData != 45 || s.EnvEnd != 51 || s.ExitCode != 52 {
			t.Errorf("comm %q: %+v", comm, s)
		}
	}
	// A 2.6-era line with 44 fields: the mm fields after 44 stay zero.
	old := statLine("old")
	old = old[:strings.Index(old, " 45 ")] + "\n"
	if s, err := ParseStat([]byte(old)); err != nil || s.StartData != 0 || s.Policy != 41 {
		t.Errorf("44-field stat: %+v, %v", s, err)
	}
	bad := map[string]string{
		"no parens":  "42 x S 1 2\n",
		"few fields": "42 (x) S 1 2 3\n",
		"bad state":  strings.Replace(statLine("x"), ") S ", ") SS ", 1),
		"bad field":  strings.Replace(statLine("x"), " 26 ", " -26 ", 1),
		"bad pid":    "x" + statLine("x"),
	}
	for name, in := range bad {
		if _, err := ParseStat([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestParseFDInfoMalformed(t *testing.T) {
	base := "pos:\t0\nflags:\t02\nmnt_id:\t1\nino:\t5\n"
	cases := map[string]string{
		"no flags":       "pos:\t0\n",
		"octal":          "pos:\t0\nflags:\t09\n",
		"eventfd count":  base + "eventfd-count: xyz\n",
		"epoll":          base + "tfd: 3 data: 1\n",
		"epoll value":    base + "tfd: x events: 1\n",
		"inotify handle": base + "inotify wd:1 ino:2 sdev:3 mask:4 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:abcd\n",
		"inotify no wd":  base + "inotify ino:2\n",
		"timespec":       base + "it_value: (1 2)\n",
		"no colon":       base + "garbage\n",
		"pidfd":          base + "Pid:\t-5\n",
		"uffd API":       base + "API:\taa:0\n",
		"uffd API hex":   base + "API:\taa:zz:1ff\n",
		"uffd pending":   base + "pending:\t-1\n",
		"tty index":      base + "tty-index:\t-1\n",
		"pidfd ns pids":  base + "Pid:\t5\nNSpid:\t5 x\n",
	}
	for name, in := range cases {
		if _, err := ParseFDInfo([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	fi, err := ParseFDInfo([]byte(base + "pending:\t2\ntotal:\t7\nAPI:\taa:1c0:80000000000001ff\n"))
	if err != nil || fi.Uffd == nil || *fi.Uffd != (UffdInfo{Pending: 2, Total: 7, API: 0xaa, Features: 0x1c0, Ioctls: 0x80000000000001ff}) {
		t.Errorf("userfaultfd fdinfo %+v, %v", fi, err)
	}
	fi, err = ParseFDInfo([]byte(base + "lock:\t1: POSIX  ADVISORY  WRITE 1 fe:00:5 0 EOF\nfanotify flags:10 event-flags:0\n"))
	if err != nil || len(fi.Locks) != 1 || len(fi.Extra) != 1 || fi.Flags != unix.O_RDWR || fi.Ino != 5 {
		t.Errorf("fdinfo %+v, %v", fi, err)
	}
}

func TestParseAuxvMalformed(t *testing.T) {
	if _, err := ParseAuxv(make([]byte, 15)); !errors.Is(err, ErrMalformed) {
		t.Errorf("odd length: %v", err)
	}
	noNull := bytes.Repeat([]byte{6, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0}, 4)
	if _, err := ParseAuxv(noNull); !errors.Is(err, ErrMalformed) {
		t.Errorf("no AT_NULL: %v", err)
	}
	long := bytes.Repeat([]byte{6, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0}, maxAuxvWords)
	if _, err := ParseAuxv(append(long, make([]byte, 16)...)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too long: %v", err)
	}
	a, err := ParseAuxv(append(noNull[:16], make([]byte, 32)...))
	if err != nil || len(a) != 4 || a[0] != AtPageSz {
		t.Errorf("trailing bytes after AT_NULL: %x, %v", a, err)
	}
	if _, ok := a.Lookup(AtEntry); ok {
		t.Errorf("Lookup found a missing entry")
	}
}

func TestParseLimitsMalformed(t *testing.T) {
	good := string(readSample(t, "fixture/limits"))
	missing := strings.Replace(good, "Max open files", "Max open filez", 1)
	if _, err := ParseLimits([]byte(missing)); !errors.Is(err, ErrMalformed) {
		t.Errorf("missing row: %v", err)
	}
	bad := strings.Replace(good, "20000                20000", "20000                lots", 1)
	if _, err := ParseLimits([]byte(bad)); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad value: %v", err)
	}
}

func TestParseCmdlineAndPids(t *testing.T) {
	if a, err := ParseCmdline([]byte("redis-server 127.0.0.1:6379\x00\x00rest")); err != nil || !slicesEqual(a, []string{"redis-server 127.0.0.1:6379", "", "rest"}) {
		t.Errorf("cmdline %q, %v", a, err)
	}
	if a, err := ParseCmdline(nil); err != nil || a != nil {
		t.Errorf("empty cmdline %q, %v", a, err)
	}
	if p, err := ParsePidList([]byte("12 34 \n")); err != nil || !slicesEqual(p, []int{12, 34}) {
		t.Errorf("pid list %v, %v", p, err)
	}
	if _, err := ParsePidList([]byte("12 x")); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad pid list: %v", err)
	}
}
