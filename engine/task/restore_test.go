package task

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// call is one system call a fake batch recorded.
type call struct {
	what string
	nr   int
	args []uint64
}

// fakeBatch records the calls and the scratch data a restore adds to a
// batch, as *syscalls.Calls would lay them out from dataBase.
type fakeBatch struct {
	calls []call
	data  []byte
}

const dataBase = 0x7000_0000

func (b *fakeBatch) Add(what string, nr int, args ...uint64) {
	b.calls = append(b.calls, call{what, nr, slices.Clone(args)})
}

func (b *fakeBatch) Data(p []byte) uint64 {
	a := dataBase + uint64(len(b.data))
	b.data = append(b.data, p...)
	for len(b.data)%8 != 0 {
		b.data = append(b.data, 0)
	}
	return a
}

func (b *fakeBatch) String(s string) uint64 { return b.Data(append([]byte(s), 0)) }

// at returns the n bytes of scratch data at addr.
func (b *fakeBatch) at(t *testing.T, addr uint64, n int) []byte {
	t.Helper()
	if addr < dataBase || addr-dataBase+uint64(n) > uint64(len(b.data)) {
		t.Fatalf("address %#x (%d bytes) outside the batch's data", addr, n)
	}
	return b.data[addr-dataBase : addr-dataBase+uint64(n)]
}

// cstring returns the NUL-terminated string at addr.
func (b *fakeBatch) cstring(t *testing.T, addr uint64) string {
	t.Helper()
	b.at(t, addr, 0)
	rest := b.data[addr-dataBase:]
	s, _, _ := strings.Cut(string(rest), "\x00")
	return s
}

// names returns a short name of each call: the system call, and a
// prctl's option.
func (b *fakeBatch) names() []string {
	sys := map[int]string{unix.SYS_SETGROUPS: "setgroups", unix.SYS_SETRESGID: "setresgid", unix.SYS_SETFSGID: "setfsgid",
		unix.SYS_SETRESUID: "setresuid", unix.SYS_SETFSUID: "setfsuid", unix.SYS_CAPSET: "capset",
		unix.SYS_RT_SIGACTION: "rt_sigaction", unix.SYS_UMASK: "umask", unix.SYS_CHROOT: "chroot", unix.SYS_CHDIR: "chdir",
		unix.SYS_PERSONALITY: "personality", unix.SYS_SET_TID_ADDRESS: "set_tid_address", unix.SYS_SET_ROBUST_LIST: "set_robust_list",
		unix.SYS_SIGALTSTACK: "sigaltstack", unix.SYS_RSEQ: "rseq"}
	prctl := map[uint64]string{unix.PR_CAPBSET_DROP: "CAPBSET_DROP", unix.PR_SET_KEEPCAPS: "KEEPCAPS", unix.PR_CAP_AMBIENT: "CAP_AMBIENT",
		unix.PR_SET_PDEATHSIG: "PDEATHSIG", unix.PR_SET_NO_NEW_PRIVS: "NO_NEW_PRIVS", unix.PR_SET_DUMPABLE: "DUMPABLE",
		unix.PR_SET_CHILD_SUBREAPER: "CHILD_SUBREAPER", unix.PR_SET_TIMERSLACK: "TIMERSLACK", unix.PR_SET_NAME: "NAME"}
	var out []string
	for _, c := range b.calls {
		switch {
		case c.nr == unix.SYS_PRCTL:
			out = append(out, "prctl "+prctl[c.args[0]])
		case sys[c.nr] != "":
			out = append(out, sys[c.nr])
		default:
			out = append(out, fmt.Sprint("syscall ", c.nr))
		}
	}
	return out
}

// TestThreadCredsOrder: a thread's credentials go in the order that
// keeps the privileges each step needs: the bounding set dropped first,
// permitted capabilities kept across the change of ids, groups and gids
// before uids, capabilities set after them, and the parent-death signal
// and no_new_privs last (changing credentials clears the former).
func TestThreadCredsOrder(t *testing.T) {
	const capNetBind, capSysAdmin = 10, 21
	st := &image.Process{Creds: image.Creds{
		UID: [4]uint32{1000, 1001, 1002, 1003}, GID: [4]uint32{100, 101, 102, 103}, Groups: []uint32{100, 27},
		CapBnd: ^uint64(0) &^ (1 << capSysAdmin), CapEff: 1 << capNetBind, CapPrm: 1<<capNetBind | 1<<33, CapInh: 1 << capNetBind,
		CapAmb: 1 << capNetBind, NoNewPrivs: true,
	}}
	var b fakeBatch
	(&restorer{st: st}).threadCredCalls(&b, &image.Thread{PdeathSig: 9})
	names := b.names()
	if names[0] != "prctl CAPBSET_DROP" || b.calls[0].args[1] != capSysAdmin {
		t.Fatalf("first call %s %v, want the drop of capability %d from the bounding set", names[0], b.calls[0].args, capSysAdmin)
	}
	for i, c := range b.calls[1:] {
		if c.nr == unix.SYS_PRCTL && c.args[0] == unix.PR_CAPBSET_DROP {
			t.Errorf("call %d drops capability %d, which the bounding set keeps", i+1, c.args[1])
		}
	}
	want := []string{"prctl CAPBSET_DROP", "prctl KEEPCAPS", "setgroups", "setresgid", "setfsgid", "setresuid", "setfsuid", "capset",
		"prctl CAP_AMBIENT", "prctl KEEPCAPS", "prctl PDEATHSIG", "prctl NO_NEW_PRIVS"}
	if !slices.Equal(names, want) {
		t.Fatalf("calls %v\nwant %v", names, want)
	}
	args := func(i int) []uint64 { return b.calls[i].args }
	if a := args(1); a[1] != 1 {
		t.Errorf("PR_SET_KEEPCAPS %d before the ids, want 1", a[1])
	}
	if a := args(2); a[0] != 2 || binary.LittleEndian.Uint32(b.at(t, a[1], 8)) != 100 || binary.LittleEndian.Uint32(b.at(t, a[1], 8)[4:]) != 27 {
		t.Errorf("setgroups %v, want the groups 100 and 27", a)
	}
	if a := args(3); !slices.Equal(a, []uint64{100, 101, 102}) {
		t.Errorf("setresgid %v", a)
	}
	if a := args(4); a[0] != 103 {
		t.Errorf("setfsgid %v", a)
	}
	if a := args(5); !slices.Equal(a, []uint64{1000, 1001, 1002}) {
		t.Errorf("setresuid %v", a)
	}
	if a := args(6); a[0] != 1003 {
		t.Errorf("setfsuid %v", a)
	}
	capset := b.at(t, args(7)[0], 32)
	le := binary.LittleEndian
	if args(7)[1] != args(7)[0]+8 || le.Uint32(capset) != unix.LINUX_CAPABILITY_VERSION_3 || le.Uint32(capset[4:]) != 0 {
		t.Errorf("capset header %x at %v", capset[:8], args(7))
	}
	got := [6]uint32{le.Uint32(capset[8:]), le.Uint32(capset[12:]), le.Uint32(capset[16:]), le.Uint32(capset[20:]), le.Uint32(capset[24:]), le.Uint32(capset[28:])}
	if want := [6]uint32{1 << capNetBind, 1 << capNetBind, 1 << capNetBind, 0, 1 << 1, 0}; got != want {
		t.Errorf("capset data (effective, permitted, inheritable; low then high) %x, want %x", got, want)
	}
	if a := args(8); a[1] != unix.PR_CAP_AMBIENT_RAISE || a[2] != capNetBind {
		t.Errorf("ambient %v, want the raise of %d", a, capNetBind)
	}
	if a := args(9); a[1] != 0 {
		t.Errorf("PR_SET_KEEPCAPS %d after capset, want 0", a[1])
	}
	if a := args(10); a[1] != 9 {
		t.Errorf("PR_SET_PDEATHSIG %d, want 9", a[1])
	}
}

// TestThreadCredsRoot: a root process with no groups to set keeps
// snapctl's ids: no setgroups, setres[ug]id.
func TestThreadCredsRoot(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root: the ids are set where snapctl is not root")
	}
	var b fakeBatch
	(&restorer{st: &image.Process{Creds: image.Creds{CapBnd: ^uint64(0)}}}).threadCredCalls(&b, &image.Thread{})
	want := []string{"prctl KEEPCAPS", "capset", "prctl KEEPCAPS"}
	if got := b.names(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
}

// TestProcessCalls: every signal's action is set (the dumped ones as
// dumped, the rest to the default), then the umask, directories (no
// chroot to /), personality and prctl settings.
func TestProcessCalls(t *testing.T) {
	st := &image.Process{Umask: 0o27, Cwd: "/srv", Root: "/", Personality: 0x400000, Dumpable: 1, ChildSubreaper: true,
		SigActions: []image.SigAction{{Signal: int(unix.SIGTERM), Handler: 0x401000, Flags: 0x14000000, Restorer: 0x402000, Mask: 1 << 1}}}
	var b fakeBatch
	(&restorer{st: st}).processCalls(&b)
	names := b.names()
	acts := 0
	for i, c := range b.calls {
		if c.nr != unix.SYS_RT_SIGACTION {
			names = names[i:]
			break
		}
		acts++
		sig := c.args[0]
		if sig == uint64(unix.SIGKILL) || sig == uint64(unix.SIGSTOP) {
			t.Errorf("rt_sigaction(%d): the kernel refuses it", sig)
		}
		act := b.at(t, c.args[1], 32)
		want := [4]uint64{}
		if sig == uint64(unix.SIGTERM) {
			want = [4]uint64{0x401000, 0x14000000, 0x402000, 1 << 1}
		}
		for j, w := range want {
			if got := binary.LittleEndian.Uint64(act[8*j:]); got != w {
				t.Errorf("rt_sigaction(%d) word %d = %#x, want %#x", sig, j, got, w)
			}
		}
		if c.args[3] != 8 {
			t.Errorf("rt_sigaction(%d) sigset size %d", sig, c.args[3])
		}
	}
	if acts != 64-2 {
		t.Errorf("%d signal actions set, want 62", acts)
	}
	want := []string{"umask", "chdir", "personality", "prctl DUMPABLE", "prctl CHILD_SUBREAPER"}
	if !slices.Equal(names, want) {
		t.Fatalf("calls after the signal actions %v, want %v", names, want)
	}
	if c := b.calls[acts+1]; b.cstring(t, c.args[0]) != "/srv" {
		t.Errorf("chdir to %q", b.cstring(t, c.args[0]))
	}
	st.Root, st.ChildSubreaper, st.TimerSlackNs = "/jail", false, 50000
	b = fakeBatch{}
	(&restorer{st: st}).processCalls(&b)
	names = b.names()[acts:]
	if want := []string{"umask", "chroot", "chdir", "personality", "prctl DUMPABLE", "prctl TIMERSLACK"}; !slices.Equal(names, want) {
		t.Errorf("calls %v, want %v", names, want)
	}
}

// TestThreadCalls: a thread's name is cut to what the kernel keeps, its
// alternate stack set without SS_ONSTACK (and not at all if disabled),
// its rseq area registered with its signature.
func TestThreadCalls(t *testing.T) {
	th := &image.Thread{Comm: "a-very-long-thread-name", ClearChildTID: 0x7f00_1000, RobustList: 0x7f00_2000, RobustListLen: 24,
		AltStack: image.AltStack{SP: 0x7f00_8000, Flags: ssOnStack, Size: 0x4000},
		Rseq:     &image.Rseq{Addr: 0x7f00_3000, Len: 32, Sig: 0x53053053}}
	var b fakeBatch
	threadCalls(&b, th)
	want := []string{"prctl NAME", "set_tid_address", "set_robust_list", "sigaltstack", "rseq"}
	if got := b.names(); !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
	if name := b.cstring(t, b.calls[0].args[1]); name != "a-very-long-thr" {
		t.Errorf("name %q, want its first 15 bytes", name)
	}
	ss := b.at(t, b.calls[3].args[0], 24)
	if sp, fl, n := binary.LittleEndian.Uint64(ss), binary.LittleEndian.Uint32(ss[8:]), binary.LittleEndian.Uint64(ss[16:]); sp != 0x7f00_8000 || fl != 0 || n != 0x4000 {
		t.Errorf("stack_t sp %#x flags %d size %#x", sp, fl, n)
	}
	if a := b.calls[4].args; !slices.Equal(a, []uint64{0x7f00_3000, 32, 0, 0x53053053}) {
		t.Errorf("rseq %v", a)
	}
	th.AltStack.Flags, th.RobustList, th.Rseq = ssDisable, 0, nil
	b = fakeBatch{}
	threadCalls(&b, th)
	if got, want := b.names(), []string{"prctl NAME", "set_tid_address"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
}

// TestSetIDs: the ids and credentials of /proc's status and stat are
// recorded; a process under seccomp, or two pid namespaces below ours,
// is refused.
func TestSetIDs(t *testing.T) {
	stat := &proc.Stat{PPid: 1, Pgrp: 40, Session: 41}
	s := &proc.Status{Umask: 0o22, Uid: [4]uint32{1, 2, 3, 4}, Gid: [4]uint32{5, 6, 7, 8}, Groups: []uint32{9}, CapEff: 3, CapBnd: 7,
		NSpid: []int{42, 1}, ShdPnd: 1 << 9}
	var st image.Process
	if err := setIDs(42, &st, s, stat); err != nil {
		t.Fatal(err)
	}
	if st.PPID != 1 || st.PGID != 40 || st.SID != 41 || st.Umask != 0o22 || st.Creds.UID != s.Uid || st.Creds.GID != s.Gid ||
		!slices.Equal(st.Creds.Groups, s.Groups) || st.Creds.CapEff != 3 || st.Creds.CapBnd != 7 || st.SigPending != 1<<9 {
		t.Errorf("recorded %+v from %+v", st, s)
	}
	if !slices.Equal(st.NSPID, []int{42, 1}) {
		t.Errorf("NSPID %v, want the pids in both namespaces", st.NSPID)
	}
	s.NSpid = []int{42}
	if st = (image.Process{}); setIDs(42, &st, s, stat) != nil || st.NSPID != nil {
		t.Errorf("NSPID %v of a process in our pid namespace", st.NSPID)
	}
	s.NSpid = []int{42, 7, 1}
	if err := setIDs(42, &image.Process{}, s, stat); !errors.Is(err, image.ErrUnsupported) {
		t.Errorf("two pid namespaces below: %v, want ErrUnsupported", err)
	}
	s.NSpid, s.Seccomp = nil, 2
	if err := setIDs(42, &image.Process{}, s, stat); !errors.Is(err, image.ErrUnsupported) {
		t.Errorf("seccomp: %v, want ErrUnsupported", err)
	}
}

// TestReadProcessSelf: the test's own process, through the real /proc.
func TestReadProcessSelf(t *testing.T) {
	var st image.Process
	if err := ReadProcess(os.Getpid(), &st); err != nil {
		t.Skip("own process not readable here:", err)
	}
	wd, _ := os.Getwd()
	if st.Cwd != wd || st.Comm == "" || st.Exe.Path == "" || st.PPID != os.Getppid() || len(st.Rlimits) == 0 || len(st.MM.Auxv) == 0 {
		t.Errorf("read %+v", st)
	}
}
