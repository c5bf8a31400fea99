package engine

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestPreCopyStateAtFreeze: what a process changes after the pre-copy
// rounds began and before the freeze is in the snapshot as it is at the
// freeze: a mapping made since (and its memory), a mapping's advice
// (VmFlags, invisible in /proc/PID/maps), a signal handler and a prctl
// value. Everything but the memory the rounds copied is read while the
// process is frozen; this checks nothing was taken earlier.
func TestPreCopyStateAtFreeze(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Traced: the harness must not wait for it, which would take the
	// ptrace stops from the tracer.
	p := fixture.StartWith(t, "changes", fixture.Options{Traced: true, Args: []string{"8M"}})
	buf, h2 := p.Ready.MustUint(t, "buf"), p.Ready.MustUint(t, "h2")
	var changed fixture.Line
	dir := filepath.Join(t.TempDir(), "snap")
	res, err := Dump(ctx, DumpOptions{
		PID: p.PID, Dir: dir, LeaveRunning: true,
		PreCopy: &PreCopyOptions{},
		beforeFreeze: func() {
			changed = p.MustRequest(t, ctx, syscall.SIGUSR2, "changed")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.PreCopy == nil || len(res.PreCopy.Rounds) == 0 {
		t.Fatalf("no pre-copy rounds: %+v", res.PreCopy)
	}
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.State(p.PID)
	if err != nil {
		t.Fatal(err)
	}
	newAddr, newSize := changed.MustUint(t, "new"), changed.MustUint(t, "newsize")
	var sawNew, sawBuf bool
	for _, v := range st.VMAs {
		if v.Start <= newAddr && newAddr+newSize <= v.End {
			sawNew = true
		}
		if v.Start == buf {
			sawBuf = true
			if !slices.Contains(v.VMFlags, "dc") {
				t.Errorf("buffer VMA %#x-%#x: VmFlags %v, want dc (MADV_DONTFORK given before the freeze)", v.Start, v.End, v.VMFlags)
			}
		}
	}
	if !sawNew || !sawBuf {
		t.Errorf("VMAs of the snapshot: the one mapped before the freeze at %#x: %v; the buffer at %#x: %v", newAddr, sawNew, buf, sawBuf)
	}
	r, err := s.OpenPages(p.PID, image.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, newSize)
	if _, err := r.ReadAt(got, int64(newAddr)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, int(newSize))) {
		t.Errorf("memory mapped before the freeze at %#x is not in the snapshot as written", newAddr)
	}
	var hup *image.SigAction
	for i := range st.SigActions {
		if st.SigActions[i].Signal == int(syscall.SIGHUP) {
			hup = &st.SigActions[i]
		}
	}
	if hup == nil || hup.Handler != h2 {
		t.Errorf("SIGHUP action %+v, want the handler h2 %#x set before the freeze", hup, h2)
	}
	if !st.ChildSubreaper {
		t.Error("child subreaper not recorded (set before the freeze)")
	}
	if st.Dumpable != 1 {
		t.Errorf("dumpable %d, want 1", st.Dumpable)
	}
}

// TestPreCopyExec: a process that execs between the pre-copy rounds and
// the freeze is dumped as the program it became, its memory read whole at
// the freeze: the rounds copied an address space that no longer exists,
// and the write tracking went with it.
func TestPreCopyExec(t *testing.T) {
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := fixture.StartWith(t, "changes", fixture.Options{Traced: true, Args: []string{"8M"}})
	var execd fixture.Line
	dir := filepath.Join(t.TempDir(), "snap")
	res, err := Dump(ctx, DumpOptions{
		PID: p.PID, Dir: dir, LeaveRunning: true,
		PreCopy: &PreCopyOptions{},
		beforeFreeze: func() {
			execd = p.MustRequest(t, ctx, syscall.SIGUSR1, "execd")
		},
	})
	if err != nil {
		t.Fatalf("dump of a process that exec'd during pre-copy: %v", err)
	}
	if res.PreCopy == nil || !res.PreCopy.Abandoned {
		t.Errorf("pre-copy result %+v: want it abandoned", res.PreCopy)
	}
	s, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf, size := execd.MustUint(t, "buf"), execd.MustUint(t, "size")
	r, err := s.OpenPages(p.PID, image.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, size)
	if _, err := r.ReadAt(got, int64(buf)); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if want := byte(i*13 + 5); got[i] != want {
			t.Fatalf("snapshot at %#x: %#x, want %#x (the exec'd program's buffer)", buf+uint64(i), got[i], want)
		}
	}
}
