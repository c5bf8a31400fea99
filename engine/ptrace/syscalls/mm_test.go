package syscalls

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc"
	"github.com/lazyfs/lazyfs/engine/ptrace"
	"github.com/lazyfs/lazyfs/test/fixture"
)

// SetMM with the values a stub has changes nothing and succeeds; one
// with a start_code above end_code is refused by the kernel; one whose
// auxv does not fit the scratch memory is refused before any injection.
func TestSetMM(t *testing.T) {
	tr := newTracer(t)
	stub, err := tr.StartStopped(fixture.Build(t, "sleeper"), []string{"stub"}, ptrace.StartOptions{Options: unix.PTRACE_O_EXITKILL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stub.Kill() })
	in, err := New(stub.Leader(), pageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	scratch, _ := in.Scratch()
	if _, err := in.Call(unix.SYS_PRCTL, unix.PR_SET_MM, unix.PR_SET_MM_MAP_SIZE, scratch); err != nil {
		t.Fatal(err)
	}
	if size, err := readUint64(stub, scratch); err != nil || uint32(size) != MMMapSize {
		t.Fatalf("PR_SET_MM_MAP_SIZE = %d, %v; SetMM writes %d", uint32(size), err, MMMapSize)
	}
	st, err := proc.ReadStat(stub.Pid())
	if err != nil {
		t.Fatal(err)
	}
	auxv, err := proc.ReadAuxv(stub.Pid())
	if err != nil {
		t.Fatal(err)
	}
	brk, err := in.Brk()
	if err != nil {
		t.Fatal(err)
	}
	mm := MM{StartCode: st.StartCode, EndCode: st.EndCode, StartData: st.StartData, EndData: st.EndData,
		StartBrk: st.StartBrk, Brk: brk, StartStack: st.StartStack, ArgStart: st.ArgStart, ArgEnd: st.ArgEnd,
		EnvStart: st.EnvStart, EnvEnd: st.EnvEnd, Auxv: auxv}
	if err := in.SetMM(mm, -1); err != nil {
		t.Fatalf("SetMM with the stub's own values: %v", err)
	}
	bad := mm
	bad.StartCode, bad.EndCode = mm.EndCode, mm.StartCode
	if err := in.SetMM(bad, -1); !errors.Is(err, unix.EINVAL) {
		t.Errorf("SetMM with start_code > end_code: %v, want EINVAL", err)
	}
	huge := mm
	huge.Auxv = make([]uint64, pageSize)
	if err := in.SetMM(huge, -1); err == nil || !strings.Contains(err.Error(), "scratch") {
		t.Errorf("SetMM with an auxv larger than the scratch memory: %v", err)
	}
}
