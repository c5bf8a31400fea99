package e2e

// System V semaphores and message queues (test/fixtures/sysvipc.c: a
// keyed semaphore set, a keyed message queue and an IPC_PRIVATE one, as a
// server's accept mutex and work queues): after a restore the process
// finds them with their ids, values, owner, mode and messages, whether
// the restore took over the objects the dump left behind (the killed
// process's) or made them again (removed meanwhile, as on another
// machine). One another process used since the dump is taken over as it
// is now, with a warning; a key that names another object now refuses the
// restore, naming it.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/test/fixture"
	"github.com/lazyfs/lazyfs/test/testutil"
)

// sysvIPCRemove removes the semaphore sets and message queues of the keys
// and ids given.
func sysvIPCRemove(t *testing.T, keys []int32, ids map[string]int) {
	t.Helper()
	sems, err := kernel.ReadSysVSem()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := kernel.ReadSysVMsg()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sems {
		for _, k := range keys {
			if s.Key == k {
				unix.Syscall6(unix.SYS_SEMCTL, uintptr(s.ID), 0, unix.IPC_RMID, 0, 0, 0)
			}
		}
	}
	for _, q := range msgs {
		for _, k := range keys {
			if q.Key == k || q.Key == 0 && q.ID == ids["private_id"] {
				unix.Syscall(unix.SYS_MSGCTL, uintptr(q.ID), unix.IPC_RMID, 0)
			}
		}
	}
}

// probeMsgCopy reads a message of a queue of its own without taking it
// (MSG_COPY), as the dump reads queues: kernels without
// CONFIG_CHECKPOINT_RESTORE refuse it (ENOSYS), and such a dump is
// refused.
func probeMsgCopy() error {
	q, _, e := unix.Syscall(unix.SYS_MSGGET, 0, unix.IPC_CREAT|0o600, 0)
	if e != 0 {
		return fmt.Errorf("msgget: %w", e)
	}
	defer unix.Syscall(unix.SYS_MSGCTL, q, unix.IPC_RMID, 0)
	buf := []byte{1, 0, 0, 0, 0, 0, 0, 0, 'x'}
	if _, _, e := unix.Syscall6(unix.SYS_MSGSND, q, uintptr(unsafe.Pointer(&buf[0])), 1, unix.IPC_NOWAIT, 0, 0); e != 0 {
		return fmt.Errorf("msgsnd: %w", e)
	}
	if _, _, e := unix.Syscall6(unix.SYS_MSGRCV, q, uintptr(unsafe.Pointer(&buf[0])), 1, 0, unix.IPC_NOWAIT|0o40000, 0); e != 0 {
		return fmt.Errorf("msgrcv(MSG_COPY): %w", e)
	}
	return nil
}

func TestRestoreSysVIPC(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePtrace(t)
	testutil.RequireUserfaultfd(t)
	testutil.RequireFUSE(t)
	testutil.RequireKernel(t, "reading a message queue without taking its messages (MSG_COPY)", probeMsgCopy())
	buildTool(t, "snapctl")
	// What a process that was never dumped takes from its queues: the
	// fixture's messages are the same on every run.
	rkey := 0x51f00000 + os.Getpid()%0x10000*16 + 14
	ref := fixture.Start(t, "sysvipc", strconv.Itoa(rkey))
	rids := map[string]int{}
	for _, k := range []string{"sem_id", "msg_id", "private_id"} {
		rids[k], _ = strconv.Atoi(ref.Ready.Fields[k])
	}
	t.Cleanup(func() { sysvIPCRemove(t, []int32{int32(rkey), int32(rkey + 1)}, rids) })
	want := request(t, testContext(t), ref, syscall.SIGUSR2, "took")
	wantField(t, want, "sems", "4,7,9")
	for i, mode := range []string{"left behind", "made again", "made again lazily", "used since", "key taken"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testContext(t)
			key := 0x51f00000 + os.Getpid()%0x10000*16 + 2*i
			keys := []int32{int32(key), int32(key + 1)}
			p := fixture.Start(t, "sysvipc", strconv.Itoa(key))
			ids := map[string]int{}
			for _, k := range []string{"sem_id", "msg_id", "private_id"} {
				ids[k], _ = strconv.Atoi(p.Ready.Fields[k])
			}
			t.Cleanup(func() { sysvIPCRemove(t, keys, ids) })
			before := request(t, ctx, p, syscall.SIGUSR1, "report")
			wantField(t, before, "sems", "5,7,9")
			wantField(t, before, "qnum", "3")
			wantField(t, before, "private_qnum", "1")
			dir, si := dumpForRestore(t, ctx, p)
			if ipc := si.State.SysVIPC; ipc == nil || len(ipc.Sems) != 1 || len(ipc.Msgs) != 2 {
				t.Fatalf("the state holds System V IPC %+v: want 1 semaphore set and 2 message queues", ipc)
			}
			switch mode {
			case "used since":
				// Another process lowers a semaphore of the set left
				// behind, which it shares with the dumped process.
				op := [3]uint16{1, 0xffff, unix.IPC_NOWAIT} // sem 1, -1
				if _, _, e := unix.Syscall(unix.SYS_SEMOP, uintptr(ids["sem_id"]), uintptr(unsafe.Pointer(&op[0])), 1); e != 0 {
					t.Fatal(e)
				}
				r := restoreAndAdopt(t, p, dir)
				if !strings.Contains(r.Stderr, "taken over as it is now") {
					t.Errorf("no warning that the semaphore set changed since the dump:\n%s", r)
				}
				wantField(t, answersNormally(t, ctx, p, syscall.SIGUSR1, "report"), "sems", "5,6,9")
				lazyKill(t, ctx, p)
				return
			case "key taken":
				// The objects went, and another program made a set of
				// the key.
				sysvIPCRemove(t, keys, ids)
				other, _, e := unix.Syscall(unix.SYS_SEMGET, uintptr(key), 2, unix.IPC_CREAT|unix.IPC_EXCL|0o600)
				if e != 0 {
					t.Fatal(e)
				}
				r := runSnapctl(t, "restore", "-D", dir)
				wantRefused(t, ctx, r, exitUnsupported, p.PID, fmt.Sprintf("key %#x", key), fmt.Sprintf("semaphore set %d", other))
				return
			case "made again", "made again lazily":
				// Gone, as on another machine or after a reboot.
				sysvIPCRemove(t, keys, ids)
			}
			var flags []string
			if mode == "made again lazily" {
				flags = append(flags, "--lazy")
			}
			restoreAndAdopt(t, p, dir, flags...)
			after := answersNormally(t, ctx, p, syscall.SIGUSR1, "report")
			for _, k := range []string{"sems", "qnum", "private_qnum", "sem_mode", "sem_uid", "msg_mode"} {
				if a, b := after.Fields[k], before.Fields[k]; a != b {
					t.Errorf("%s: %s after the restore, %s before\n%s\n%s", k, a, b, after.Text, before.Text)
				}
			}
			// The messages are the ones sent, and the semaphores work.
			if mode == "made again" {
				// The restored process is the last to have used what the
				// restore made: a dump of it keeps them again.
				again := filepath.Join(t.TempDir(), "again")
				dumpPID(t, p.PID, again, "--leave-running")
				if ipc := openImage(t, again, p.PID).State.SysVIPC; ipc == nil || len(ipc.Sems) != 1 || len(ipc.Msgs) != 2 {
					t.Errorf("a dump of the restored process holds System V IPC %+v: want 1 semaphore set and 2 message queues", ipc)
				}
			}
			took := request(t, ctx, p, syscall.SIGUSR2, "took")
			for _, k := range []string{"sum", "private_sum", "sems"} {
				if took.Fields[k] != want.Fields[k] {
					t.Errorf("%s: %s after the restore, want %s", k, took.Fields[k], want.Fields[k])
				}
			}
			lazyKill(t, ctx, p)
		})
	}
}
