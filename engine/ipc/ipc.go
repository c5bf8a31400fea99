// Package ipc dumps and restores System V semaphore sets and message
// queues. They belong to an IPC namespace, not to a process: the dump
// keeps those a process of the tree last operated on (a semaphore whose
// last semop was the tree's, a queue it last sent to or received from),
// with their key, id, owner, mode, values and messages. Restore makes
// them again in snapctl's IPC namespace, with their ids if free
// (sem_next_id, msg_next_id), or takes over the very object the dump saw
// (the same key and id) when it is still there: a dump that killed the
// processes leaves them behind, as their processes' deaths do. One that
// processes outside the tree used since is taken over as it is now, with
// a warning: they share it with the restored processes as they shared it
// with the dumped ones. A key that names another object now refuses the
// restore.
//
// Not kept: semaphore undo values (SEM_UNDO), which the kernel keeps per
// process and shows nowhere: a restored process that exits does not undo
// the operations it made before the dump.
package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
	"github.com/lazyfs/lazyfs/engine/ptrace/syscalls"
)

// ErrKeyInUse: a semaphore set or message queue of a key the processes
// had exists, and something operated on it or changed it since the dump.
var ErrKeyInUse = fmt.Errorf("%w: System V IPC key in use", image.ErrUnsupported)

// semctl and msgctl commands, and msgrcv's flag to read a message without
// taking it (linux/sem.h, linux/msg.h).
const (
	getPID  = 11
	getAll  = 13
	setAll  = 17
	msgCopy = 0o40000
	// Offsets in struct semid64_ds and msqid64_ds (x86-64): the
	// ipc64_perm's uid, gid and mode, then the queue's qbytes.
	permUID, permGID, permMode = 4, 8, 20
	msqQBytes                  = 88
	dsLen                      = 128 // either struct, rounded up
)

func semctl(id, num, cmd int, arg unsafe.Pointer) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), uintptr(num), uintptr(cmd), uintptr(arg), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func msgctl(id, cmd int, buf *[dsLen]byte) error {
	_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), uintptr(cmd), uintptr(unsafe.Pointer(buf)))
	if e != 0 {
		return e
	}
	return nil
}

// Dump reads the semaphore sets and message queues of our IPC namespace
// that a process of pids last operated on; nil if none.
func Dump(pids map[int]bool) (*image.SysVIPC, error) {
	sems, err := kernel.ReadSysVSem()
	if err != nil {
		return nil, err
	}
	msgs, err := kernel.ReadSysVMsg()
	if err != nil {
		return nil, err
	}
	var out image.SysVIPC
	for _, s := range sems {
		mine := false
		for i := 0; i < s.NSems && !mine; i++ {
			pid, err := semctl(s.ID, i, getPID, nil)
			if err != nil {
				return nil, fmt.Errorf("semaphore set %d (key %#x): GETPID: %w", s.ID, uint32(s.Key), err)
			}
			mine = pids[pid]
		}
		if !mine {
			continue
		}
		vals := make([]uint16, s.NSems)
		if _, err := semctl(s.ID, 0, getAll, unsafe.Pointer(&vals[0])); err != nil {
			return nil, fmt.Errorf("semaphore set %d (key %#x): GETALL: %w", s.ID, uint32(s.Key), err)
		}
		out.Sems = append(out.Sems, image.SysVSem{SysVIPCObject: image.SysVIPCObject{Key: s.Key, ID: s.ID, Mode: s.Mode & 0o777,
			UID: s.UID, GID: s.GID, OTime: s.OTime, CTime: s.CTime}, Values: vals})
	}
	for _, q := range msgs {
		if !pids[q.LSPID] && !pids[q.LRPID] {
			continue
		}
		m, err := dumpQueue(q)
		if err != nil {
			return nil, err
		}
		out.Msgs = append(out.Msgs, m)
	}
	if len(out.Sems) == 0 && len(out.Msgs) == 0 {
		return nil, nil
	}
	return &out, nil
}

// dumpQueue reads queue q's messages without taking them (MSG_COPY).
func dumpQueue(q kernel.SysVMsg) (image.SysVMsg, error) {
	m := image.SysVMsg{SysVIPCObject: image.SysVIPCObject{Key: q.Key, ID: q.ID, Mode: q.Mode & 0o777, UID: q.UID, GID: q.GID,
		OTime: q.STime, RTime: q.RTime, CTime: q.CTime}}
	var ds [dsLen]byte
	if err := msgctl(q.ID, unix.IPC_STAT, &ds); err != nil {
		return m, fmt.Errorf("message queue %d (key %#x): IPC_STAT: %w", q.ID, uint32(q.Key), err)
	}
	m.QBytes = binary.LittleEndian.Uint64(ds[msqQBytes:])
	if q.QNum == 0 {
		return m, nil
	}
	max := 8192
	if b, err := os.ReadFile("/proc/sys/kernel/msgmax"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			max = n
		}
	}
	buf := make([]byte, 8+max)
	for i := range q.QNum {
		n, _, e := unix.Syscall6(unix.SYS_MSGRCV, uintptr(q.ID), uintptr(unsafe.Pointer(&buf[0])), uintptr(max), uintptr(i),
			unix.IPC_NOWAIT|msgCopy, 0)
		if e == unix.ENOSYS {
			return m, fmt.Errorf("%w: message queue %d (key %#x) holds %d messages, which this kernel cannot read without taking them (MSG_COPY needs CONFIG_CHECKPOINT_RESTORE)",
				image.ErrUnsupported, q.ID, uint32(q.Key), q.QNum)
		}
		if e != 0 {
			return m, fmt.Errorf("message queue %d (key %#x): read message %d: %w", q.ID, uint32(q.Key), i, e)
		}
		m.Messages = append(m.Messages, image.SysVMessage{Type: int64(binary.LittleEndian.Uint64(buf)), Data: append([]byte(nil), buf[8:8+n]...)})
	}
	return m, nil
}

// Made are the objects a restore made, which a restore that fails
// removes (Remove).
type Made struct {
	sems, msgs []int
}

// Remove removes every object the restore made.
func (m *Made) Remove() {
	if m == nil {
		return
	}
	for _, id := range m.sems {
		semctl(id, 0, unix.IPC_RMID, nil)
	}
	for _, id := range m.msgs {
		var ds [dsLen]byte
		msgctl(id, unix.IPC_RMID, &ds)
	}
	m.sems, m.msgs = nil, nil
}

// Restore makes the semaphore sets and message queues of ipc, or takes
// over each that is still there as the dump saw it; made lists those it
// made, also when it fails. Their values and messages are put in by in, a
// restored process: the kernel records it as the last to operate on them
// (semctl GETPID, a queue's lspid), as the dumped processes were, so that
// a dump of the restored ones sees them again.
func Restore(ipc *image.SysVIPC, in *syscalls.Injector, log *slog.Logger) (made *Made, err error) {
	made = &Made{}
	if ipc == nil {
		return made, nil
	}
	sems, err := kernel.ReadSysVSem()
	if err != nil {
		return made, err
	}
	for _, s := range ipc.Sems {
		var cur *kernel.SysVSem
		for i := range sems {
			if names(s.SysVIPCObject, sems[i].Key, sems[i].ID) {
				cur = &sems[i]
			}
		}
		if cur != nil && cur.ID == s.ID && cur.NSems == len(s.Values) {
			vals := make([]uint16, cur.NSems)
			_, err := semctl(cur.ID, 0, getAll, unsafe.Pointer(&vals[0]))
			if err == nil && (cur.OTime != s.OTime || cur.CTime != s.CTime || !slices.Equal(vals, s.Values)) {
				log.Warn("System V semaphore set taken over as it is now: processes outside the restore used it since the dump", "key", fmt.Sprintf("%#x", uint32(s.Key)), "id", s.ID, "values", vals, "at the dump", s.Values)
			} else {
				log.Info("System V semaphore set taken over: the dump left it behind", "key", fmt.Sprintf("%#x", uint32(s.Key)), "id", s.ID)
			}
			continue
		}
		if cur != nil && s.Key != 0 {
			return made, fmt.Errorf("%w: key %#x is now semaphore set %d of %d semaphores, not set %d of %d the processes had: stop what uses it, or remove it (ipcrm -s %d) if it is a leftover",
				ErrKeyInUse, uint32(s.Key), cur.ID, cur.NSems, s.ID, len(s.Values), cur.ID)
		}
		id, err := makeSem(s, in)
		if id >= 0 {
			made.sems = append(made.sems, id)
		}
		if err != nil {
			return made, fmt.Errorf("semaphore set of key %#x: %w", uint32(s.Key), err)
		}
		if id != s.ID {
			log.Warn("System V semaphore set made again under another id: a program that kept its id will not find it", "key", fmt.Sprintf("%#x", uint32(s.Key)), "id", id, "was", s.ID)
		}
	}
	msgs, err := kernel.ReadSysVMsg()
	if err != nil {
		return made, err
	}
	for _, q := range ipc.Msgs {
		var cur *kernel.SysVMsg
		for i := range msgs {
			if names(q.SysVIPCObject, msgs[i].Key, msgs[i].ID) {
				cur = &msgs[i]
			}
		}
		if cur != nil && cur.ID == q.ID {
			if cur.STime != q.OTime || cur.RTime != q.RTime || cur.CTime != q.CTime || cur.QNum != len(q.Messages) {
				log.Warn("System V message queue taken over as it is now: processes outside the restore used it since the dump", "key", fmt.Sprintf("%#x", uint32(q.Key)), "id", q.ID, "messages", cur.QNum, "at the dump", len(q.Messages))
			} else {
				log.Info("System V message queue taken over: the dump left it behind", "key", fmt.Sprintf("%#x", uint32(q.Key)), "id", q.ID)
			}
			continue
		}
		if cur != nil && q.Key != 0 {
			return made, fmt.Errorf("%w: key %#x is now message queue %d, not queue %d the processes had: stop what uses it, or remove it (ipcrm -q %d) if it is a leftover",
				ErrKeyInUse, uint32(q.Key), cur.ID, q.ID, cur.ID)
		}
		id, err := makeMsg(q, in)
		if id >= 0 {
			made.msgs = append(made.msgs, id)
		}
		if err != nil {
			return made, fmt.Errorf("message queue of key %#x: %w", uint32(q.Key), err)
		}
		if id != q.ID {
			log.Warn("System V message queue made again under another id: a program that kept its id will not find it", "key", fmt.Sprintf("%#x", uint32(q.Key)), "id", id, "was", q.ID)
		}
	}
	return made, nil
}

// names reports whether the object of key and id listed now has obj's
// name: its key, or for an IPC_PRIVATE one (key 0), its id.
func names(obj image.SysVIPCObject, key int32, id int) bool {
	if obj.Key != 0 {
		return key == obj.Key
	}
	return key == 0 && id == obj.ID
}

// get makes an object with syscall nr (semget, msgget) and args after
// the key, with the id it had if that is free: the kernel takes
// /proc/sys/kernel/NAME_next_id for the next object made, then forgets
// it; it refuses an id that is taken (ENOSPC).
func get(nr uintptr, name string, obj image.SysVIPCObject, args ...uintptr) (int, error) {
	next := "/proc/sys/kernel/" + name + "_next_id"
	nextID := os.WriteFile(next, []byte(strconv.Itoa(obj.ID)), 0) == nil
	call := func() (int, error) {
		a := append([]uintptr{uintptr(uint32(obj.Key))}, args...)
		a = append(a, 0, 0, 0)
		r, _, e := unix.Syscall(nr, a[0], a[1], a[2])
		if e != 0 {
			return -1, e
		}
		return int(r), nil
	}
	id, err := call()
	if nextID && err != nil {
		os.WriteFile(next, []byte("-1"), 0) // not taken: forget it
		if errors.Is(err, unix.ENOSPC) {
			id, err = call()
		}
	}
	return id, err
}

// setOwner gives an object its owner and mode (IPC_SET on ds, which the
// caller filled with IPC_STAT).
func setOwner(ds *[dsLen]byte, obj image.SysVIPCObject) {
	binary.LittleEndian.PutUint32(ds[permUID:], obj.UID)
	binary.LittleEndian.PutUint32(ds[permGID:], obj.GID)
	binary.LittleEndian.PutUint32(ds[permMode:], obj.Mode)
}

// makeSem makes semaphore set s: key, id if free, owner, mode; and its
// values, set by in's process.
func makeSem(s image.SysVSem, in *syscalls.Injector) (int, error) {
	flags := uintptr(unix.IPC_CREAT | unix.IPC_EXCL | s.Mode)
	id, err := get(unix.SYS_SEMGET, "sem", s.SysVIPCObject, uintptr(len(s.Values)), flags)
	if err != nil {
		return -1, fmt.Errorf("semget(%d semaphores): %w", len(s.Values), err)
	}
	var ds [dsLen]byte
	if _, err := semctl(id, 0, unix.IPC_STAT, unsafe.Pointer(&ds)); err != nil {
		return id, fmt.Errorf("semctl(%d, IPC_STAT): %w", id, err)
	}
	setOwner(&ds, s.SysVIPCObject)
	if _, err := semctl(id, 0, unix.IPC_SET, unsafe.Pointer(&ds)); err != nil {
		return id, fmt.Errorf("semctl(%d, IPC_SET, uid %d gid %d mode %o): %w", id, s.UID, s.GID, s.Mode, err)
	}
	vals := make([]byte, 2*len(s.Values))
	for i, v := range s.Values {
		binary.LittleEndian.PutUint16(vals[2*i:], v)
	}
	at, err := in.Put(0, vals)
	if err != nil {
		return id, err
	}
	if _, err := in.Call(unix.SYS_SEMCTL, uint64(id), 0, setAll, at); err != nil {
		return id, fmt.Errorf("semctl(%d, SETALL): %w", id, err)
	}
	return id, nil
}

// makeMsg makes message queue q: key, id if free, owner, mode, size; and
// its messages in order, sent by in's process.
func makeMsg(q image.SysVMsg, in *syscalls.Injector) (int, error) {
	id, err := get(unix.SYS_MSGGET, "msg", q.SysVIPCObject, uintptr(unix.IPC_CREAT|unix.IPC_EXCL|q.Mode))
	if err != nil {
		return -1, fmt.Errorf("msgget: %w", err)
	}
	var ds [dsLen]byte
	if err := msgctl(id, unix.IPC_STAT, &ds); err != nil {
		return id, fmt.Errorf("msgctl(%d, IPC_STAT): %w", id, err)
	}
	setOwner(&ds, q.SysVIPCObject)
	binary.LittleEndian.PutUint64(ds[msqQBytes:], q.QBytes)
	if err := msgctl(id, unix.IPC_SET, &ds); err != nil {
		return id, fmt.Errorf("msgctl(%d, IPC_SET, uid %d gid %d mode %o qbytes %d): %w", id, q.UID, q.GID, q.Mode, q.QBytes, err)
	}
	for i, m := range q.Messages {
		buf := make([]byte, 8+len(m.Data))
		binary.LittleEndian.PutUint64(buf, uint64(m.Type))
		copy(buf[8:], m.Data)
		at, err := in.Put(0, buf)
		if err != nil {
			return id, err
		}
		if _, err := in.Call(unix.SYS_MSGSND, uint64(id), at, uint64(len(m.Data)), unix.IPC_NOWAIT); err != nil {
			return id, fmt.Errorf("msgsnd message %d of %d (%d bytes): %w", i+1, len(q.Messages), len(m.Data), err)
		}
	}
	return id, nil
}
