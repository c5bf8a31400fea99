package lazy

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/uffd/uffdio"
	"github.com/lazyfs/lazyfs/engine/units"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// TestUnregisterExited: a process that exits after its last page is in and
// before snapctl unregisters its lazy ranges is reported as exited, not as
// a failed restore (the kernel refuses UFFDIO_UNREGISTER with ENOMEM once
// the address space is gone). It stays a zombie meanwhile, as a restored
// process does under snapctl's ptrace.
func TestUnregisterExited(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireUserfaultfd(t)
	p := fixture.StartWith(t, "uffdops", fixture.Options{Stdin: true})
	ask := func(cmd string) string {
		t.Helper()
		if _, err := fmt.Fprintln(p.Stdin, cmd); err != nil {
			t.Fatal(err)
		}
		l := p.Expect(t, "", 20*time.Second)
		if l.Event != "ok" {
			t.Fatalf("uffdops %q: %q", cmd, l.Text)
		}
		return strings.Join(l.Args, " ")
	}
	pfd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	fd, err := unix.PidfdGetfd(pfd, int(p.Ready.MustInt(t, "uffd")), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, _, err := uffdio.API(fd, uffdio.Features); err != nil {
		t.Fatal(err)
	}
	ask("close")
	const size = 1 << 20
	base, err := strconv.ParseUint(ask(fmt.Sprintf("map %x", size)), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	ranges := []units.Range{{Start: base, End: base + size/2}, {Start: base + size/2, End: base + size}}
	for _, rg := range ranges {
		if _, err := uffdio.Register(fd, rg.Start, rg.Len(), uffdio.RegisterModeMissing); err != nil {
			t.Fatal(err)
		}
	}

	// Alive: unregistered, not exited.
	if exited, err := unregisterLazy(fd, ranges[:1], p.PID); err != nil || exited {
		t.Fatalf("live process: unregisterLazy = %v, %v; want false, nil", exited, err)
	}

	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p.Alive() {
		if ctx.Err() != nil {
			t.Fatal("uffdops did not die")
		}
		time.Sleep(time.Millisecond)
	}
	exited, err := unregisterLazy(fd, ranges[1:], p.PID)
	if err != nil || !exited {
		t.Fatalf("process gone (a zombie): unregisterLazy = %v, %v; want true, nil", exited, err)
	}
}
