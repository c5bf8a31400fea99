package mem

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// call is a system call asked of the process: injected alone (Injector)
// or added to a batch.
type call struct {
	nr   int
	args []uint64
}

func (c call) String() string {
	name, ok := sysNames[c.nr]
	if !ok {
		name = fmt.Sprint("syscall ", c.nr)
	}
	args := make([]string, len(c.args))
	for i, a := range c.args {
		args[i] = fmt.Sprintf("%#x", a)
	}
	return name + "(" + strings.Join(args, ", ") + ")"
}

var sysNames = map[int]string{
	unix.SYS_MMAP: "mmap", unix.SYS_MPROTECT: "mprotect", unix.SYS_MADVISE: "madvise", unix.SYS_MUNMAP: "munmap",
	unix.SYS_MREMAP: "mremap", unix.SYS_CLOSE: "close", unix.SYS_CLOSE_RANGE: "close_range", unix.SYS_MLOCK: "mlock",
	unix.SYS_MLOCK2: "mlock2", unix.SYS_MEMFD_CREATE: "memfd_create", unix.SYS_FTRUNCATE: "ftruncate",
	unix.SYS_SHMGET: "shmget", unix.SYS_SHMCTL: "shmctl", unix.SYS_SHMAT: "shmat",
}

// scratchBase is where fakeInjector's scratch memory lies.
const scratchBase = 0x9000_0000

// fakeInjector records the calls injected into a process and the data
// put in its scratch memory, and answers each call with reply (if set;
// 0 otherwise).
type fakeInjector struct {
	calls  []call
	put    map[uint64][]byte // scratch address -> data put there
	closed []int
	reply  func(nr int, args []uint64) (uint64, error)
}

func (f *fakeInjector) Call(nr int, args ...uint64) (uint64, error) {
	f.calls = append(f.calls, call{nr, slices.Clone(args)})
	if f.reply != nil {
		return f.reply(nr, args)
	}
	return 0, nil
}

func (f *fakeInjector) CloseFD(fd int) error {
	f.closed = append(f.closed, fd)
	return nil
}

func (f *fakeInjector) Put(off int, b []byte) (uint64, error) {
	if f.put == nil {
		f.put = map[uint64][]byte{}
	}
	a := scratchBase + uint64(off)
	f.put[a] = slices.Clone(b)
	return a, nil
}

func (f *fakeInjector) PutString(off int, s string) (uint64, error) {
	return f.Put(off, append([]byte(s), 0))
}

// fakeBatch records the calls added to a batch; results are what they
// returned, as if run (0 if absent).
type fakeBatch struct {
	calls   []call
	what    []string
	results map[int]int64
}

func (b *fakeBatch) Add(what string, nr int, args ...uint64) {
	b.calls = append(b.calls, call{nr, slices.Clone(args)})
	b.what = append(b.what, what)
}

func (b *fakeBatch) Len() int             { return len(b.calls) }
func (b *fakeBatch) What(i int) string    { return b.what[i] }
func (b *fakeBatch) Result(i int) int64   { return b.results[i] }
func (b *fakeBatch) strings() []string    { return callStrings(b.calls) }
func (f *fakeInjector) strings() []string { return callStrings(f.calls) }

func callStrings(calls []call) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.String()
	}
	return out
}

// mmapArgs formats an mmap as call.String does.
func mmapArgs(addr, n uint64, prot, flags int, fd int64, off uint64) string {
	return call{unix.SYS_MMAP, []uint64{addr, n, uint64(prot), uint64(flags), uint64(fd), off}}.String()
}

// sameCalls fails t if got and want differ, listing both.
func sameCalls(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %s\n want %s", what, strings.Join(got, "\n      "), strings.Join(want, "\n      "))
	}
}

var discard = slog.New(slog.DiscardHandler)
