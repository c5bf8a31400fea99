package mem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc/kernel"
)

// System V shared memory (PostgreSQL's postmaster and its children share
// one). The dump keeps a segment's contents as any shared object's, with
// its key, owner and mode (image.SysVShm). The restore makes a segment of
// that key in the restored process's IPC namespace (shmget, injected),
// gives it its owner and mode (IPC_SET) and attaches it where it was
// (shmat); its contents are written with the process's memory. The other
// processes of a tree attach the same segment. It gets the id it had if
// that is free (shm_next_id), else another, with a warning.
//
// A segment of the key may still exist: the dumped process's own, which
// a segment outlives (PostgreSQL never removes its while it runs). One
// that nothing has attached, of the same size, is taken over; one that
// is attached belongs to a process running now, and the restore is
// refused, naming the key.

// shmExec is SHM_EXEC, shmat's flag for an executable attach.
const shmExec = 0o100000

// ErrSysVKeyInUse: a System V segment of the key the restored process
// had is attached by a running process.
var ErrSysVKeyInUse = fmt.Errorf("%w: System V shared memory key in use", image.ErrUnsupported)

// SysVSegments are the System V segments of a restore, shared by the
// processes of a tree: the id each had at the dump mapped to the one it
// has now, and those the restore made, which a restore that fails removes
// (RemoveMade) so that nothing of it is left.
type SysVSegments struct {
	ids  map[int]int
	made []int
}

// NewSysVSegments returns an empty set.
func NewSysVSegments() *SysVSegments { return &SysVSegments{ids: map[int]int{}} }

// RemoveMade marks for destruction every segment the restore made: each
// goes once the processes that attached it (killed by now) are gone.
func (s *SysVSegments) RemoveMade() {
	for _, id := range s.made {
		unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	}
	s.made = nil
}

// attachSysV adds the shmat of v's segment to the batch, making the
// segment first if no process of the tree has.
func (r *mapper) attachSysV(v *image.VMA) error {
	s := v.Shmem.SysV
	if r.SysV == nil {
		r.SysV = NewSysVSegments()
	}
	id, ok := r.SysV.ids[s.ID]
	if !ok {
		var err error
		if id, err = r.makeSysV(v); err != nil {
			return err
		}
		r.SysV.ids[s.ID] = id
	}
	var flags uint64
	if v.Prot&unix.PROT_WRITE == 0 {
		flags |= unix.SHM_RDONLY
	}
	if v.Prot&unix.PROT_EXEC != 0 {
		flags |= shmExec
	}
	what := fmt.Sprintf("shmat System V segment %d (key %#x) at %x", id, uint32(s.Key), v.Start)
	r.mmaps = append(r.mmaps, mmapCall{r.calls.Len(), v.Start})
	r.calls.Add(what, unix.SYS_SHMAT, uint64(id), v.Start, flags)
	if !ok && s.Mode&kernel.ShmDest != 0 {
		// Marked for destruction at the dump: once attached. Linux lets
		// the other processes of the tree attach it by its id still.
		r.calls.Add(what+": IPC_RMID", unix.SYS_SHMCTL, uint64(id), unix.IPC_RMID, 0)
	}
	return nil
}

// makeSysV makes v's segment in the process, or takes over the one of its
// key that nothing has attached, and returns its id.
func (r *mapper) makeSysV(v *image.VMA) (int, error) {
	s := v.Shmem.SysV
	key := uint64(uint32(s.Key))
	if s.Mode&kernel.ShmDest != 0 {
		key = 0 // IPC_PRIVATE: its key was dropped when it was marked
	}
	// The id it had, if it is free: a program that kept it (in its
	// memory, in a file) finds its segment there again. The kernel takes
	// shm_next_id for the next segment made in the IPC namespace, then
	// forgets it; it refuses the id if it is taken (ENOSPC).
	nextID := os.WriteFile(shmNextID, []byte(strconv.Itoa(s.ID)), 0) == nil
	flags := unix.IPC_CREAT | unix.IPC_EXCL | uint64(s.Mode&0o777)
	id, err := r.in.Call(unix.SYS_SHMGET, key, v.Shmem.Size, flags)
	if nextID && err != nil {
		os.WriteFile(shmNextID, []byte("-1"), 0) // not taken: forget it
		if errors.Is(err, unix.ENOSPC) {
			id, err = r.in.Call(unix.SYS_SHMGET, key, v.Shmem.Size, flags)
		}
	}
	if errors.Is(err, unix.EEXIST) {
		return r.takeOverSysV(v)
	}
	if err != nil {
		return -1, fmt.Errorf("shmget(key %#x, %d bytes): %w", uint32(s.Key), v.Shmem.Size, err)
	}
	// Its owner and mode: struct shmid64_ds begins with struct
	// ipc64_perm, whose uid, gid and mode IPC_SET takes.
	var ds [120]byte
	binary.LittleEndian.PutUint32(ds[4:], s.UID)
	binary.LittleEndian.PutUint32(ds[8:], s.GID)
	binary.LittleEndian.PutUint32(ds[20:], s.Mode&0o777)
	at, err := r.in.Put(0, ds[:])
	if err != nil {
		return -1, err
	}
	if _, err := r.in.Call(unix.SYS_SHMCTL, id, unix.IPC_SET, at); err != nil {
		return -1, fmt.Errorf("shmctl(%d, IPC_SET, uid %d gid %d mode %o): %w", id, s.UID, s.GID, s.Mode&0o777, err)
	}
	r.SysV.made = append(r.SysV.made, int(id))
	if int(id) != s.ID {
		r.Log.Warn("System V segment made again under another id: a program that kept its id will not find it", "key", fmt.Sprintf("%#x", uint32(s.Key)), "id", id, "was", s.ID)
	}
	return int(id), nil
}

// shmNextID sets the id of the next System V segment made in our IPC
// namespace (root only); a variable for the tests, which must not set it.
var shmNextID = "/proc/sys/kernel/shm_next_id"

// takeOverSysV returns the id of the segment of v's key if nothing has it
// attached and it has v's size (the dumped process's own, left behind).
func (r *mapper) takeOverSysV(v *image.VMA) (int, error) {
	s := v.Shmem.SysV
	segs, err := kernel.ReadSysVShm()
	if err != nil {
		return -1, err
	}
	for _, seg := range segs {
		if seg.Key != s.Key {
			continue
		}
		if seg.Nattch != 0 {
			return -1, fmt.Errorf("%w: key %#x is segment %d, attached %d times (by pid %d, its creator, or others): stop what uses it first",
				ErrSysVKeyInUse, uint32(s.Key), seg.ID, seg.Nattch, seg.CPID)
		}
		if seg.Size != v.Shmem.Size {
			return -1, fmt.Errorf("%w: key %#x is segment %d of %d bytes, not the %d the process had: remove it (ipcrm -m %d) if it is a leftover",
				ErrSysVKeyInUse, uint32(s.Key), seg.ID, seg.Size, v.Shmem.Size, seg.ID)
		}
		r.Log.Info("System V segment taken over: nothing had it attached", "key", fmt.Sprintf("%#x", uint32(s.Key)), "id", seg.ID)
		return seg.ID, nil
	}
	return -1, fmt.Errorf("shmget(key %#x): it exists, but not in /proc/sysvipc/shm", uint32(s.Key))
}
