package syscalls

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// MM is what prctl(PR_SET_MM, PR_SET_MM_MAP) sets in a process: the
// fields of struct prctl_mm_map and the auxiliary vector.
type MM struct {
	StartCode, EndCode uint64
	StartData, EndData uint64
	StartBrk, Brk      uint64
	StartStack         uint64
	ArgStart, ArgEnd   uint64
	EnvStart, EnvEnd   uint64
	Auxv               []uint64
}

// MMMapSize is sizeof(struct prctl_mm_map) as SetMM writes it; the kernel
// reports its own through PR_SET_MM_MAP_SIZE.
const MMMapSize = 104

// SetMM injects prctl(PR_SET_MM, PR_SET_MM_MAP) with mm and exeFD (a
// descriptor in the target of the new exe, or -1 to keep it), through the
// start of the scratch memory. The kernel requires the old exe to be
// unmapped before it changes, and CAP_SYS_RESOURCE or
// CAP_CHECKPOINT_RESTORE.
func (in *Injector) SetMM(mm MM, exeFD int) error {
	auxv := make([]byte, 8*len(mm.Auxv))
	for i, w := range mm.Auxv {
		binary.LittleEndian.PutUint64(auxv[8*i:], w)
	}
	if err := in.NeedScratch(MMMapSize + len(auxv)); err != nil {
		return fmt.Errorf("PR_SET_MM_MAP with %d bytes of auxv: %w", len(auxv), err)
	}
	at := in.scratch
	m := make([]byte, MMMapSize, MMMapSize+len(auxv))
	le := binary.LittleEndian
	for i, f := range []uint64{mm.StartCode, mm.EndCode, mm.StartData, mm.EndData, mm.StartBrk, mm.Brk, mm.StartStack,
		mm.ArgStart, mm.ArgEnd, mm.EnvStart, mm.EnvEnd, at + MMMapSize} {
		le.PutUint64(m[8*i:], f)
	}
	le.PutUint32(m[96:], uint32(len(auxv)))
	le.PutUint32(m[100:], uint32(int32(exeFD)))
	if err := in.p.WriteMem(at, append(m, auxv...)); err != nil {
		return err
	}
	if _, err := in.Call(unix.SYS_PRCTL, unix.PR_SET_MM, unix.PR_SET_MM_MAP, at, MMMapSize); err != nil {
		return fmt.Errorf("prctl(PR_SET_MM_MAP): %w", err)
	}
	return nil
}
