package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine"
	"github.com/lazyfs/lazyfs/engine/check"
	"github.com/lazyfs/lazyfs/engine/codec"
	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// Restore tests: a fixture is dumped (which kills it), restored with
// `snapctl restore` (or engine.Restore where the test must see the
// process before it runs), adopted, and checked through its own answers
// and through /proc.

// dumpForRestore dumps p, which the dump kills, waits until its pid is
// free and returns the snapshot directory and its image.
func dumpForRestore(t *testing.T, ctx context.Context, p *fixture.Proc, flags ...string) (string, *snapImage) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snap")
	r := dumpPID(t, p.PID, dir, flags...)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if _, err := p.WaitExit(ctx); err != nil {
		t.Fatalf("the process outlived its dump: %v", err)
	}
	return dir, openImage(t, dir, p.PID)
}

// restoreEachWay restores the snapshot in dir of p's process three ways,
// each a subtest: eagerly, lazily through the private mount and lazily
// with --source direct. check runs during the lazy phase and once the
// restore is over; restored, if not nil, after that, with the mode's
// name ("eager", "lazy-mount", "lazy-direct"). The process is killed at
// the end of each.
func restoreEachWay(t *testing.T, ctx context.Context, p *fixture.Proc, dir string, check func(t *testing.T, when string), restored func(t *testing.T, mode string)) {
	t.Helper()
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"eager", nil},
		{"lazy-mount", []string{"--source", "mount"}},
		{"lazy-direct", []string{"--source", "direct"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if mode.name == "eager" {
				restoreAndAdopt(t, p, dir)
			} else {
				l := startLazy(t, dir, mode.flags...)
				l.waitRunning(t, ctx)
				if err := p.Adopt(); err != nil {
					t.Fatal(err)
				}
				check(t, "during the lazy phase")
				l.mustFinish(t, ctx, p.PID)
			}
			check(t, "restored")
			if restored != nil {
				restored(t, mode.name)
			}
			if err := p.Kill(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// restoreAndAdopt runs snapctl restore -D dir, fails the test unless it
// succeeds, and makes p control the restored process.
func restoreAndAdopt(t *testing.T, p *fixture.Proc, dir string, flags ...string) cmdResult {
	t.Helper()
	r := mustSnapctl(t, append([]string{"restore", "-D", dir}, flags...)...)
	t.Logf("%s", strings.TrimSpace(r.Stdout))
	if !strings.Contains(r.Stdout, "restored pid "+strconv.Itoa(p.PID)) {
		t.Errorf("restore output does not name pid %d: %q", p.PID, r.Stdout)
	}
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	return r
}

// taskIDs lists the thread ids of pid, sorted.
func taskIDs(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatalf("task %q", e.Name())
		}
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// readProcFile returns /proc/PID/<name> (or task/TID/<name>) trimmed.
func readProcFile(t *testing.T, format string, args ...any) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/"+format, args...))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// statFields returns the fields of /proc/PID/stat after the command name:
// [0] is the state, [1] the ppid, [2] the pgrp, [3] the session.
func statFields(t *testing.T, pid int) []string {
	t.Helper()
	s := readProcFile(t, "%d/stat", pid)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// pidGone waits until no process holds pid (a killed restore's zombie is
// reaped by init), and reports whether it went.
func pidGone(ctx context.Context, pid int) bool {
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stubLeft reports processes started as restore stubs that are still
// there.
func stubLeft(t *testing.T) []int {
	t.Helper()
	// Only this test binary's snapctl's stubs: other runs on the machine
	// (another checkout's tests) have stubs of their own.
	snapctl := buildTool(t, "snapctl")
	var out []int
	for _, pid := range cmdlineHolders(t, "lazyfs-restore-stub") {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && l == snapctl {
			out = append(out, pid)
		}
	}
	return out
}

// processesOf lists the processes whose executable is exe.
func processesOf(t *testing.T, exe string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && l == exe {
			out = append(out, pid)
		}
	}
	return out
}

// wantRefused checks that a restore failed cleanly: exit status code, an
// error naming each of names, no process at pid and no stub left.
func wantRefused(t *testing.T, ctx context.Context, r cmdResult, code, pid int, names ...string) {
	t.Helper()
	if r.Code != code {
		t.Fatalf("restore exit %d, want %d\n%s", r.Code, code, r)
	}
	for _, n := range names {
		if !strings.Contains(r.Stderr, n) {
			t.Errorf("restore error does not name %q:\n%s", n, r.Stderr)
		}
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !pidGone(gctx, pid) {
		t.Errorf("a process holds pid %d after the failed restore: %s", pid, readProcFile(t, "%d/stat", pid))
	}
	if s := stubLeft(t); len(s) > 0 {
		t.Errorf("restore stubs left behind: %v", s)
	}
}

func TestRestoreCounter(t *testing.T) {
	tc := newCase(t, "counter", "256M")
	ctx, p := tc.Ctx, tc.P
	sum := p.Ready.MustUint(t, "checksum")
	before := request(t, ctx, p, syscall.SIGUSR1, "report")

	_, si := tc.Dump()
	atDump := binary.LittleEndian.Uint64(si.read(t, p.Ready.MustUint(t, "counter_addr"), 8))
	if atDump < before.MustUint(t, "counter") {
		t.Fatalf("counter in the image %d, below the %d reported before the dump", atDump, before.MustUint(t, "counter"))
	}

	tc.Restore()
	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	if got := l.MustUint(t, "checksum"); got != sum {
		t.Errorf("restored checksum %#x, want %#x", got, sum)
	}
	if c := l.MustUint(t, "counter"); c < atDump || c > atDump+100000 {
		t.Errorf("restored counter %d, dumped at %d: not carrying on from the dump", c, atDump)
	}
	marker, _ := p.Ready.Value("marker")
	if m, err := p.ReadMemory(p.Ready.MustUint(t, "marker_addr"), len(marker)); err != nil || string(m) != marker {
		t.Errorf("marker on the restored heap %q (%v), want %q", m, err, marker)
	}
	time.Sleep(20 * time.Millisecond)
	if l2 := request(t, ctx, p, syscall.SIGUSR1, "report"); l2.MustUint(t, "counter") <= l.MustUint(t, "counter") {
		t.Errorf("counter stuck after the restore: %q then %q", l.Text, l2.Text)
	}
}

// TestRestoreMemoryExact restores a process left stopped, compares every
// dumped block with its memory and its mappings with the image, and
// only then lets it run.
func TestRestoreMemoryExact(t *testing.T) {
	tc := newCase(t, "counter", "16M")
	ctx, p := tc.Ctx, tc.P
	dir, si := tc.Dump()

	snap, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	res, err := engine.Restore(ctx, engine.RestoreOptions{Snapshot: snap, LeaveStopped: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Adopt(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restored %d bytes, running after %v", res.Filled, res.ToRunning)
	for _, tid := range taskIDs(t, p.PID) {
		if st := statFields(t, tid)[0]; st != "T" {
			t.Fatalf("thread %d in state %s, want T (left stopped)", tid, st)
		}
	}

	// The kernel writes a thread's rseq area (cpu ids) when rseq is
	// registered: those bytes may differ.
	var skip [][2]uint64
	for _, th := range si.State.Threads {
		if th.Rseq != nil {
			skip = append(skip, [2]uint64{th.Rseq.Addr, th.Rseq.Addr + uint64(th.Rseq.Len)})
		}
	}
	var blocks, bytesCompared uint64
	for b := range si.Pages.Blocks() {
		want := si.read(t, b.Addr, uint64(b.Len))
		got, err := p.ReadMemory(b.Addr, int(b.Len))
		if err != nil {
			t.Fatalf("block %d at %#x: %v", b.Index, b.Addr, err)
		}
		for _, s := range skip {
			if s[0] < b.End() && b.Addr < s[1] {
				lo, hi := max(s[0], b.Addr)-b.Addr, min(s[1], b.End())-b.Addr
				clear(want[lo:hi])
				clear(got[lo:hi])
			}
		}
		if i := firstDiff(want, got); i >= 0 {
			t.Errorf("block %d (%s) at %#x: memory differs from the image at %#x: %#x, want %#x",
				b.Index, b.Kind, b.Addr, b.Addr+uint64(i), got[i], want[i])
		}
		blocks++
		bytesCompared += uint64(b.Len)
	}
	t.Logf("%d blocks, %d bytes equal to the image", blocks, bytesCompared)

	// Every VMA of the image, and nothing else, with its permissions.
	var got, want []string
	for _, m := range readMaps(t, p.PID) {
		if m.Name != "[vsyscall]" {
			got = append(got, fmt.Sprintf("%x-%x %s %s", m.Start, m.End, m.Perms, m.Name))
		}
	}
	for _, v := range si.State.VMAs {
		if v.Kind == image.VMAVsyscall {
			continue
		}
		name := v.Name
		if v.File != nil {
			name = v.File.Path
		}
		want = append(want, fmt.Sprintf("%x-%x %s %s", v.Start, v.End, image.Perms(v), name))
	}
	if !slices.Equal(got, want) {
		t.Errorf("restored mappings differ from the image:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}

	if err := p.Cont(); err != nil {
		t.Fatal(err)
	}
	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	if got := l.MustUint(t, "checksum"); got != p.Ready.MustUint(t, "checksum") {
		t.Errorf("restored checksum %#x, want %#x", got, p.Ready.MustUint(t, "checksum"))
	}
}

func TestRestoreThreads(t *testing.T) {
	tc := newCase(t, "threads")
	ctx, p := tc.Ctx, tc.P
	tids := taskIDs(t, p.PID)
	if len(tids) != 5 {
		t.Fatalf("threads fixture has tasks %v, want 5", tids)
	}
	before := request(t, ctx, p, syscall.SIGUSR1, "report")

	tc.Dump()
	tc.Restore()

	if got := taskIDs(t, p.PID); !slices.Equal(got, tids) {
		t.Errorf("restored thread ids %v, want %v", got, tids)
	}
	first := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	wantField(t, first, "ring_ok", "1")
	wantField(t, first, "state_ok", "1")
	if first.MustUint(t, "t0") < before.MustUint(t, "t0") {
		t.Errorf("restored counters behind the dump: %q, before %q", first.Text, before.Text)
	}
	// Every worker keeps taking its turn.
	workers := []string{"t0", "t1", "t2", "t3"}
	advanced := func(l fixture.Line) bool {
		for _, k := range workers {
			if l.MustUint(t, k) < first.MustUint(t, k)+3 {
				return false
			}
		}
		return true
	}
	last := first
	for i := 0; i < 200 && !advanced(last); i++ {
		time.Sleep(10 * time.Millisecond)
		last = request(t, ctx, p, syscall.SIGUSR1, "report")
	}
	if !advanced(last) {
		t.Errorf("workers did not all advance after the restore: %q then %q", first.Text, last.Text)
	}
	wantField(t, last, "ring_ok", "1")
	wantField(t, last, "state_ok", "1")

	// pthread_join needs each worker's clear_child_tid to wake main.
	joined := request(t, ctx, p, syscall.SIGUSR2, "joined")
	wantField(t, joined, "ring_ok", "1")
	wantField(t, joined, "state_ok", "1")
	if _, err := p.WaitExit(ctx); err != nil {
		t.Errorf("restored process did not exit after joining its threads: %v", err)
	}
}

func TestRestoreBlocked(t *testing.T) {
	testutil.RequirePtrace(t)
	t.Run("pipe", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.Start(t, "blocked", "pipe")
		pw := p.Ready.MustInt(t, "pipe_w")
		request(t, ctx, p, syscall.SIGUSR1, "read")
		if _, err := p.WaitLine(ctx, "read "); err != nil { // move past it
			t.Fatal(err)
		}

		dir, si := dumpForRestore(t, ctx, p)
		for _, th := range si.State.Threads {
			want := int64(unix.SYS_READ)
			if th.TID != p.PID {
				want = unix.SYS_CLOCK_NANOSLEEP
			}
			if th.Syscall != want {
				t.Errorf("thread %d dumped in system call %d, want %d", th.TID, th.Syscall, want)
			}
		}
		restoreAndAdopt(t, p, dir)

		// The sleeper's nanosleep lost its restart block with the old
		// process: it returns EINTR once, and the fixture sleeps again.
		woke, err := p.WaitLine(ctx, "woke ")
		if err != nil {
			t.Fatal(err)
		}
		wantField(t, woke, "ret", "-1")
		wantField(t, woke, "errno", strconv.Itoa(int(unix.EINTR)))
		if rem := woke.MustInt(t, "remaining"); rem < 3000 || rem > 3600 {
			t.Errorf("nanosleep remaining %ds after the restore, want close to 3600", rem)
		}

		// The main thread's read was restarted: a byte written into the
		// pipe from outside reaches it.
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", p.PID, pw), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write([]byte{0x5a})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		l, err := p.WaitLine(ctx, "read ")
		if err != nil {
			t.Fatal(err)
		}
		wantField(t, l, "byte", "0x5a")
		l = answersNormally(t, ctx, p, syscall.SIGUSR1, "read")
		wantField(t, l, "seq", "2")
		wantField(t, l, "byte", "0x02")

		lines, err := p.Lines()
		if err != nil {
			t.Fatal(err)
		}
		var woken int
		for _, l := range lines {
			switch l.Event {
			case "woke":
				woken++
			case "read-eintr":
				t.Errorf("the blocked read saw EINTR: %q", l.Text)
			}
		}
		if woken != 1 {
			t.Errorf("the sleeper woke %d times, want once (the lost restart)", woken)
		}
	})
	t.Run("tick", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.Start(t, "blocked", "tick")
		if _, err := p.WaitLine(ctx, "tick "); err != nil {
			t.Fatal(err)
		}
		dir, _ := dumpForRestore(t, ctx, p)
		lines, err := p.Lines()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, l := range lines {
			if l.Event == "tick" {
				n = l.MustInt(t, "n")
			}
		}
		restoreAndAdopt(t, p, dir)
		// The ticks carry on one by one from the last before the dump.
		prev := int64(0)
		for prev < n+2 {
			l, err := p.WaitLine(ctx, "tick ")
			if err != nil {
				t.Fatal(err)
			}
			got := l.MustInt(t, "n")
			if prev != 0 && got != prev+1 {
				t.Fatalf("tick %d after tick %d (last before the dump: %d)", got, prev, n)
			}
			prev = got
		}
		l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
		if l.MustInt(t, "ticks") < prev {
			t.Errorf("report %q after tick %d", l.Text, prev)
		}
	})
}

func TestRestoreSignals(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "signals")
	rt1 := syscall.Signal(p.Ready.MustInt(t, "rt1_signo"))
	wantField(t, request(t, ctx, p, syscall.SIGUSR2, "got"), "onstack", "1")
	request(t, ctx, p, syscall.SIGHUP, "got")
	request(t, ctx, p, rt1, "got")
	// SIGWINCH is blocked: it stays pending, through the dump too.
	if err := p.Signal(syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	before := request(t, ctx, p, syscall.SIGUSR1, "report")
	wantField(t, before, "pending_winch", "1")
	stBefore := procStatus(t, p.PID)

	dir, _ := dumpForRestore(t, ctx, p)
	restoreAndAdopt(t, p, dir)

	stAfter := procStatus(t, p.PID)
	for _, k := range []string{"SigBlk", "SigIgn", "SigCgt", "ShdPnd"} {
		if stAfter[k] != stBefore[k] {
			t.Errorf("%s %s after the restore, %s before", k, stAfter[k], stBefore[k])
		}
	}
	// Ignored stays ignored.
	if err := p.Signal(syscall.SIGPIPE); err != nil {
		t.Fatal(err)
	}
	wantField(t, request(t, ctx, p, syscall.SIGUSR2, "got"), "onstack", "1")
	wantField(t, request(t, ctx, p, syscall.SIGHUP, "got"), "onstack", "0")
	wantField(t, request(t, ctx, p, rt1, "got"), "onstack", "0")
	after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	for k, want := range map[string]int64{"usr1": 2, "usr2": 2, "hup": 2, "rt1": 2, "onstack_usr2": 2,
		"stack_errors": 0, "actions_ok": 1, "mask_ok": 1, "altstack_ok": 1, "pending_winch": 1,
		"rt1_pid": int64(os.Getpid()), "rt1_code": 0} {
		wantField(t, after, k, strconv.FormatInt(want, 10))
	}
}

// vmFlagsOf returns the VmFlags of every VMA of pid in [lo, hi), by start
// address, keeping only the given mnemonics.
func vmFlagsOf(t *testing.T, pid int, lo, hi uint64, keep []string) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	var cur uint64
	in := false
	for _, line := range strings.Split(readProcFile(t, "%d/smaps", pid), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if a, b, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			start, err1 := strconv.ParseUint(a, 16, 64)
			end, err2 := strconv.ParseUint(b, 16, 64)
			if err1 == nil && err2 == nil {
				cur, in = start, start < hi && lo < end
				continue
			}
		}
		if in && f[0] == "VmFlags:" {
			var fl []string
			for _, x := range f[1:] {
				if slices.Contains(keep, x) {
					fl = append(fl, x)
				}
			}
			out[cur] = strings.Join(fl, " ")
		}
	}
	return out
}

func TestRestoreMappings(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "mappings")
	rep := request(t, ctx, p, syscall.SIGUSR1, "report")
	type region struct {
		name     string
		writable bool
		addr, n  uint64
		before   []byte
		flags    map[uint64]string
		mapName  string
	}
	regions := []*region{{name: "private", writable: true}, {name: "shared_ro"}, {name: "memfd", writable: true},
		{name: "shared_anon", writable: true}, {name: "madv", writable: true}, {name: "mlock", writable: true}}
	keep := []string{"dc", "wf", "nh", "dd", "lo", "sh", "mw", "wr"}
	names := func(pid int) map[uint64]string {
		out := map[uint64]string{}
		for _, m := range readMaps(t, pid) {
			out[m.Start] = m.Name
		}
		return out
	}
	mapNames := names(p.PID)
	for _, r := range regions {
		r.addr, r.n = p.Ready.MustUint(t, r.name+"_addr"), p.Ready.MustUint(t, r.name+"_len")
		b, err := p.ReadMemory(r.addr, int(r.n))
		if err != nil {
			t.Fatal(err)
		}
		r.before = b
		r.flags = vmFlagsOf(t, p.PID, r.addr, r.addr+r.n, keep)
		r.mapName = mapNames[r.addr]
	}
	memfd := p.Ready.MustInt(t, "memfd_fd")

	dir, _ := dumpForRestore(t, ctx, p)
	restoreAndAdopt(t, p, dir)

	after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	mapNames = names(p.PID)
	for _, r := range regions {
		if got, want := after.MustUint(t, r.name), rep.MustUint(t, r.name); got != want {
			t.Errorf("%s: checksum %#x after the restore, %#x before", r.name, got, want)
		}
		if got := vmFlagsOf(t, p.PID, r.addr, r.addr+r.n, keep); !maps.Equal(got, r.flags) {
			t.Errorf("%s: VmFlags %v after the restore, %v before", r.name, got, r.flags)
		}
		if mapNames[r.addr] != r.mapName {
			t.Errorf("%s: mapping of %q after the restore, %q before", r.name, mapNames[r.addr], r.mapName)
		}
	}
	wantField(t, after, "memfd_read_ok", "1")
	orig, _ := p.Ready.Value("private_file_orig")
	wantField(t, after, "private_file", orig)
	if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", p.PID, memfd)); err != nil || !strings.HasPrefix(l, "/memfd:lazyfs-memfd") {
		t.Errorf("fd %d of the restored process: %q %v, want the memfd", memfd, l, err)
	}
	if st := procStatus(t, p.PID); st["VmLck"] != "16 kB" {
		t.Errorf("VmLck %q, want the 16 kB mlocked", st["VmLck"])
	}

	// Every writable region takes a write: private copy-on-write, the
	// memfd (seen through its fd too), shared anonymous, madvised, locked.
	bump := request(t, ctx, p, syscall.SIGUSR2, "bump")
	for _, r := range regions {
		want := bytes.Clone(r.before)
		if r.writable {
			for o := 0; o < len(want); o += pageSize {
				want[o]++
			}
		}
		if got := bump.MustUint(t, r.name); got != fixture.Checksum(want) {
			t.Errorf("%s after a write: checksum %#x, want %#x", r.name, got, fixture.Checksum(want))
		}
	}
	wantField(t, bump, "memfd_read_ok", "1")
	wantField(t, bump, "private_file", orig)
}

func TestRestorePython(t *testing.T) {
	tc := newCaseWith(t, CaseOptions{Fixture: "pystate.py", Python: true})
	ctx, p := tc.Ctx, tc.P
	sum, _ := p.Ready.Value("checksum")
	before := request(t, ctx, p, syscall.SIGUSR1, "report")

	tc.Dump()
	tc.Restore()

	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	wantField(t, l, "checksum", sum)
	wantField(t, l, "entries", p.Ready.Fields["entries"])
	if l.MustUint(t, "counter") < before.MustUint(t, "counter") {
		t.Errorf("counter %d after the restore, %d before the dump", l.MustUint(t, "counter"), before.MustUint(t, "counter"))
	}
}

func TestRestoreTwice(t *testing.T) {
	tc := newCase(t, "counter", "8M")
	ctx, p := tc.Ctx, tc.P
	sum := p.Ready.MustUint(t, "checksum")
	_, si := tc.Dump()
	atDump := binary.LittleEndian.Uint64(si.read(t, p.Ready.MustUint(t, "counter_addr"), 8))
	for i := range 2 {
		tc.Restore()
		l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
		if l.MustUint(t, "checksum") != sum || l.MustUint(t, "counter") < atDump {
			t.Errorf("restore %d: %q, want checksum %#x and counter >= %d", i, l.Text, sum, atDump)
		}
		if err := p.Kill(ctx); err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
	}
}

// TestRestoreAddressInUse: a copy restored beside the running original in
// a pid namespace of its own, but in the same network namespace, cannot
// bind the original's listening port: the restore is refused, names the
// address and says --netns new, and nothing of it is left running.
func TestRestoreAddressInUse(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.StartRedis(t)
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, p.PID, dir, "--leave-running")
	r := runSnapctl(t, "restore", "-D", dir, "--pidns")
	if r.Code == 0 || !strings.Contains(r.Stderr, fmt.Sprintf("bind 127.0.0.1:%d", p.Port)) || !strings.Contains(r.Stderr, "--netns new") {
		t.Errorf("restore beside the original in its network namespace: want a refusal naming the address and --netns new\n%s", r)
	}
	if s := stubLeft(t); len(s) > 0 {
		t.Errorf("restore stubs left behind: %v", s)
	}
	if reply, err := fixture.Redis(ctx, p.Port, "PING"); err != nil || reply != "PONG" {
		t.Errorf("the original after the refused restore: %q, %v", reply, err)
	}
}

func TestRestorePIDInUse(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "counter", "4M")
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	dumpPID(t, p.PID, dir, "--leave-running")

	r := runSnapctl(t, "restore", "-D", dir)
	if r.Code != exitPIDInUse || !strings.Contains(r.Stderr, strconv.Itoa(p.PID)) || !strings.Contains(r.Stderr, "--pidns --netns new") {
		t.Errorf("restore over a live pid: exit %d, want %d and an error naming pid %d and --pidns --netns new\n%s", r.Code, exitPIDInUse, p.PID, r)
	}
	if got := processesOf(t, exe); !slices.Equal(got, []int{p.PID}) {
		t.Errorf("processes running %s: %v, want only the original %d", exe, got, p.PID)
	}
	if s := stubLeft(t); len(s) > 0 {
		t.Errorf("restore stubs left behind: %v", s)
	}
	answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	if st := p.ExitState(); st != nil {
		t.Errorf("the original exited: %v", st)
	}
}

func TestRestoreFileChanged(t *testing.T) {
	testutil.RequirePtrace(t)
	later := time.Now().Add(time.Hour)
	t.Run("mapping", func(t *testing.T) {
		ctx := testContext(t)
		p := fixture.Start(t, "mappings")
		path := filepath.Join(p.Dir, "private.dat")
		dir, _ := dumpForRestore(t, ctx, p)
		if err := os.Chtimes(path, later, later); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, ctx, runSnapctl(t, "restore", "-D", dir), exitFileChanged, p.PID, path)
	})
	t.Run("exe", func(t *testing.T) {
		// A private fixture cache: the binary is modified.
		t.Setenv(fixture.CacheDirEnv, t.TempDir())
		ctx := testContext(t)
		p := fixture.Start(t, "counter", "4M")
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID))
		if err != nil {
			t.Fatal(err)
		}
		dir, _ := dumpForRestore(t, ctx, p)
		if err := os.Chtimes(exe, later, later); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, ctx, runSnapctl(t, "restore", "-D", dir), exitFileChanged, p.PID, exe)
	})
}

// TestRestoreFailureKillsProcess makes a late step fail (the log file,
// open for writing, became immutable: the check before the restore sees
// the same file, the open in the file-descriptor step fails even for
// root) and checks that what the restore had built is gone.
func TestRestoreFailureKillsProcess(t *testing.T) {
	tc := newCase(t, "counter", "4M")
	ctx, p := tc.Ctx, tc.P
	dir, _ := tc.Dump()
	if err := setImmutable(p.LogPath, true); err != nil {
		t.Skipf("cannot make the log immutable on this filesystem: %v", err)
	}
	t.Cleanup(func() {
		if err := setImmutable(p.LogPath, false); err != nil {
			t.Errorf("clear immutable flag of %s: %v", p.LogPath, err)
		}
	})
	r := runSnapctl(t, "restore", "-D", dir)
	// Opening an immutable file for writing is EPERM, even for root.
	wantRefused(t, ctx, r, exitNoPrivilege, p.PID, "file descriptors", p.LogPath)
}

// kernelThreadState is what one thread registered with the kernel.
type kernelThreadState struct {
	Comm      string
	Rseq      ptrace.RseqConfig
	AltStack  syscalls.AltStack
	TidAddr   uint64
	RobustPtr uint64
}

// threadStateEnv runs TestRestoreStateHelper in a process of its own:
// "PID" reads the per-thread state of PID, "PID,TID" first gives PID and
// its thread TID state to preserve. A test cannot trace its own child
// (its exec.Cmd's wait would take the ptrace stops).
const threadStateEnv = "LAZYFS_E2E_THREAD_STATE"

// State given by TestRestoreStateHelper.
const (
	stateUmask       = 0o027
	statePersonality = 0x0040000 // ADDR_NO_RANDOMIZE
	stateAltSize     = 64 << 10
	stateWorkerName  = "lazy-worker"
)

// threadStates runs the helper on pid (setting up worker's state first
// if worker is not 0) and returns what it read.
func threadStates(t *testing.T, ctx context.Context, pid, worker int) map[int]kernelThreadState {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	arg := strconv.Itoa(pid)
	if worker != 0 {
		arg += "," + strconv.Itoa(worker)
	}
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestRestoreStateHelper$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), threadStateEnv+"="+arg)
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if js, ok := strings.CutPrefix(line, "STATE "); ok && err == nil {
			var m map[int]kernelThreadState
			if err := json.Unmarshal([]byte(js), &m); err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("thread state helper on %s: %v\n%s", arg, err, out)
	return nil
}

func TestRestoreStateHelper(t *testing.T) {
	arg := os.Getenv(threadStateEnv)
	if arg == "" {
		t.Skip("run by TestRestoreProcessState in a process of its own")
	}
	spid, sworker, _ := strings.Cut(arg, ",")
	pid, err := strconv.Atoi(spid)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ptrace.New()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	proc, err := tr.Seize(pid, ptrace.SeizeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := proc.Detach(); err != nil {
			t.Errorf("detach %d: %v", pid, err)
		}
	}()
	if sworker != "" {
		worker, err := strconv.Atoi(sworker)
		if err != nil {
			t.Fatal(err)
		}
		giveState(t, proc, worker)
	}
	out := map[int]kernelThreadState{}
	for _, th := range proc.Threads() {
		var s kernelThreadState
		if s.Rseq, err = th.Rseq(); err != nil {
			t.Fatal(err)
		}
		in, err := syscalls.New(th, pageSize)
		if err != nil {
			t.Fatal(err)
		}
		s.AltStack, err = in.SigAltStack()
		if err == nil {
			s.TidAddr, err = in.TidAddress()
		}
		if cerr := in.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		if s.RobustPtr, _, err = ptrace.RobustList(th.Tid()); err != nil {
			t.Fatal(err)
		}
		s.Comm = readProcFile(t, "%d/task/%d/comm", pid, th.Tid())
		out[th.Tid()] = s
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("STATE %s\n", b)
}

// giveState gives the frozen process umask, personality and
// no_new_privs, and its thread worker a name and an alternate signal
// stack.
func giveState(t *testing.T, proc *ptrace.Process, worker int) {
	t.Helper()
	call := func(in *syscalls.Injector, nr int, args ...uint64) uint64 {
		t.Helper()
		r, err := in.Call(nr, args...)
		if err != nil {
			t.Fatalf("inject %d in %d: %v", nr, in.Thread().Tid(), err)
		}
		return r
	}
	in, err := syscalls.New(proc.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	call(in, unix.SYS_UMASK, stateUmask)
	call(in, unix.SYS_PERSONALITY, statePersonality)
	call(in, unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	th := proc.Thread(worker)
	if th == nil {
		t.Fatalf("no thread %d", worker)
	}
	if in, err = syscalls.New(th, pageSize); err != nil {
		t.Fatal(err)
	}
	scratch, _ := in.Scratch()
	if err := proc.WriteMem(scratch, append([]byte(stateWorkerName), 0)); err != nil {
		t.Fatal(err)
	}
	call(in, unix.SYS_PRCTL, unix.PR_SET_NAME, scratch)
	stack := call(in, unix.SYS_MMAP, 0, stateAltSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	ss := make([]byte, 24) // stack_t
	binary.LittleEndian.PutUint64(ss[0:], stack)
	binary.LittleEndian.PutUint64(ss[16:], stateAltSize)
	if err := proc.WriteMem(scratch, ss); err != nil {
		t.Fatal(err)
	}
	call(in, unix.SYS_SIGALTSTACK, scratch, 0)
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreProcessState gives the threads fixture state that a fresh
// process would not have (a thread name, an alternate signal stack on a
// worker, umask, personality, no_new_privs, an RLIMIT_NOFILE soft limit) and checks
// that it all survives, with each thread's rseq registration, robust list
// and clear_child_tid, the working directory and the session.
func TestRestoreProcessState(t *testing.T) {
	testutil.RequirePtrace(t)
	ctx := testContext(t)
	p := fixture.Start(t, "threads")
	worker := taskIDs(t, p.PID)[2]
	before := threadStates(t, ctx, p.PID, worker)
	if s := before[worker]; s.Comm != stateWorkerName || s.AltStack.Size != stateAltSize {
		t.Fatalf("worker %d not set up: %+v", worker, s)
	}
	for tid, s := range before {
		if s.Rseq.Ptr == 0 || s.TidAddr == 0 || s.RobustPtr == 0 {
			t.Fatalf("thread %d lacks rseq, clear_child_tid or a robust list: %+v", tid, s)
		}
	}
	const nofile = 777
	var lim unix.Rlimit
	if err := unix.Prlimit(p.PID, unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = nofile
	if err := unix.Prlimit(p.PID, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	limits := readProcFile(t, "%d/limits", p.PID)
	request(t, ctx, p, syscall.SIGUSR1, "report")

	dir, _ := dumpForRestore(t, ctx, p)
	restoreAndAdopt(t, p, dir)

	if after := threadStates(t, ctx, p.PID, 0); !maps.Equal(after, before) {
		t.Errorf("per-thread state after the restore:\n%+v\nbefore:\n%+v", after, before)
	}
	st := procStatus(t, p.PID)
	if st["Umask"] != fmt.Sprintf("%04o", stateUmask) {
		t.Errorf("umask %s, want %04o", st["Umask"], stateUmask)
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs %q after the restore, want 1", st["NoNewPrivs"])
	}
	if got := readProcFile(t, "%d/personality", p.PID); got != fmt.Sprintf("%08x", statePersonality) {
		t.Errorf("personality %s, want %08x", got, statePersonality)
	}
	if got := readProcFile(t, "%d/limits", p.PID); got != limits || !strings.Contains(got, " 777 ") {
		t.Errorf("limits after the restore:\n%s\nbefore:\n%s", got, limits)
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p.PID)); err != nil || cwd != p.Dir {
		t.Errorf("cwd %q (%v), want %q", cwd, err, p.Dir)
	}
	if f := statFields(t, p.PID); f[2] != strconv.Itoa(p.PID) || f[3] != strconv.Itoa(p.PID) {
		t.Errorf("process group %s, session %s: want the restored process to lead both (%d)", f[2], f[3], p.PID)
	}
	l := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
	wantField(t, l, "ring_ok", "1")
	wantField(t, l, "state_ok", "1")
}

// TestRestoreCorruptBlock flips a byte of a Raw and of an LZ4 block in the
// pages file: the restore fails on the block's checksum, naming the pages
// file and the block, before the process runs, and leaves nothing behind.
func TestRestoreCorruptBlock(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, kind := range []codec.Kind{codec.Raw, codec.LZ4} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := testContext(t)
			p := fixture.Start(t, "counter", "4M")
			dir, si := dumpForRestore(t, ctx, p)
			var blk image.Block
			for b := range si.Pages.Blocks() {
				if b.Kind == kind {
					blk = b
				}
			}
			if blk.Kind != kind {
				t.Fatalf("no %s block in the image", kind)
			}
			path := filepath.Join(dir, si.Pages.Name())
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			stored := make([]byte, blk.StoredLen)
			if _, err := f.ReadAt(stored, int64(blk.Off)); err != nil {
				t.Fatal(err)
			}
			// A byte whose flip the block's checksum sees: in an LZ4
			// block of repetitive memory, a match offset may change and
			// decode to the same bytes.
			off := -1
			for i := len(stored) / 2; i < len(stored) && off < 0; i++ {
				stored[i] ^= 0x40
				if codec.DecodeChecked(make([]byte, blk.Len), blk.Kind, stored, blk.CRC) != nil {
					off = i
				} else {
					stored[i] ^= 0x40
				}
			}
			if off < 0 {
				t.Fatalf("no byte of the second half of block %d changes what it decodes to", blk.Index)
			}
			_, err = f.WriteAt(stored[off:off+1], int64(blk.Off)+int64(off))
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			r := runSnapctl(t, "restore", "-D", dir)
			wantRefused(t, ctx, r, exitBadSnapshot, p.PID, "fill memory", si.Pages.Name(), fmt.Sprintf("%#x", blk.Addr))
		})
	}
}

// setImmutable sets or clears FS_IMMUTABLE_FL on path.
func setImmutable(path string, on bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetInt(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, flags)
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h (not in x/sys/unix).
const fsImmutableFL = 0x00000010

// runCheck runs `snapctl check --json` with env (nil: ours), through
// prefix (a command such as unshare) if given, and returns the exit
// status and the features by name.
func runCheck(t *testing.T, env []string, prefix ...string) (int, map[string]check.Feature, cmdResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), commandTimeout)
	defer cancel()
	args := append(prefix, buildTool(t, "snapctl"), "check", "--json")
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := cmdResult{Args: args, Stdout: stdout.String(), Stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%v\n%s", err, r)
	}
	var feats []check.Feature
	if err := json.Unmarshal([]byte(r.Stdout), &feats); err != nil {
		t.Fatalf("check --json: %v\n%s", err, r)
	}
	out := map[string]check.Feature{}
	for _, f := range feats {
		out[f.Name] = f
	}
	return r.Code, out, r
}

func TestCheck(t *testing.T) {
	testutil.RequirePtrace(t)
	names := []string{"ptrace", "clone3 set_tid", "PR_SET_MM_MAP", "userfaultfd", "uffd WP_ASYNC", "PAGEMAP_SCAN", "TCP_REPAIR", "FUSE"}
	wantOK := func(t *testing.T, feats map[string]check.Feature, except ...string) {
		t.Helper()
		for _, n := range names {
			f, ok := feats[n]
			if want := !slices.Contains(except, n); !ok || f.OK != want || f.Detail == "" {
				t.Errorf("%s: %+v (reported: %v), want OK=%v with a reason", n, f, ok, want)
			}
		}
	}

	t.Run("all", func(t *testing.T) {
		testutil.RequireUserfaultfd(t)
		testutil.RequireFUSE(t)
		code, feats, r := runCheck(t, nil)
		if code != 0 {
			t.Errorf("exit %d, want 0\n%s", code, r)
		}
		wantOK(t, feats)
		if s := cmdlineHolders(t, "lazyfs-check-stub"); len(s) > 0 {
			t.Errorf("check left its stub running: %v", s)
		}
	})
	t.Run("no-fusermount", func(t *testing.T) {
		testutil.RequireUserfaultfd(t)
		testutil.RequireRoot(t)
		unshare, mount := testutil.RequireCommand(t, "unshare"), testutil.RequireCommand(t, "mount")
		// Off PATH is not enough: fs, like go-fuse, also looks in /bin. In a
		// private mount namespace, /dev/null (not a regular file) hides
		// those too.
		hide := fmt.Sprintf(`for f in /bin/fusermount3 /bin/fusermount; do
			if [ -e "$f" ]; then %s --bind /dev/null "$f" || exit 1; fi
		done; exec "$@"`, mount)
		env := append(os.Environ(), "PATH="+t.TempDir())
		code, feats, r := runCheck(t, env, unshare, "-m", "--propagation", "private", "/bin/sh", "-c", hide, "sh")
		if code != exitNoPrivilege || !strings.Contains(r.Stderr, "FUSE") {
			t.Errorf("exit %d, want %d and an error naming FUSE\n%s", code, exitNoPrivilege, r)
		}
		wantOK(t, feats, "FUSE")
	})
	t.Run("user-namespace", func(t *testing.T) {
		// Root of a new user namespace: it may trace its children, but not
		// choose pids in the pid namespace it does not own.
		unshare := testutil.RequireCommand(t, "unshare")
		if out, err := exec.Command(unshare, "-U", "-r", "true").CombinedOutput(); err != nil {
			t.Skipf("no user namespaces here: %v %s", err, out)
		}
		code, feats, r := runCheck(t, nil, unshare, "-U", "-r")
		if code != exitNoPrivilege {
			t.Errorf("exit %d, want %d\n%s", code, exitNoPrivilege, r)
		}
		if f := feats["clone3 set_tid"]; f.OK || !strings.Contains(f.Detail, "not permitted") {
			t.Errorf("clone3 set_tid in a user namespace: %+v, want missing: not permitted", f)
		}
		if !feats["ptrace"].OK {
			t.Errorf("ptrace in a user namespace: %+v", feats["ptrace"])
		}
	})
}

// cmdlineHolders lists the processes whose command line starts with
// argv0.
func cmdlineHolders(t *testing.T, argv0 string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.HasPrefix(b, []byte(argv0+"\x00")) {
			out = append(out, pid)
		}
	}
	return out
}
