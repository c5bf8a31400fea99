package proc

import (
	"encoding/binary"
	"fmt"
)

// Auxiliary vector types (elf.h) lazyfs looks up.
const (
	AtNull        = 0
	AtPHDR        = 3
	AtPageSz      = 6
	AtBase        = 7
	AtEntry       = 9
	AtRandom      = 25
	AtExecFn      = 31
	AtSysinfoEHDR = 33
	AtMinSigStkSz = 51
)

// maxAuxvWords bounds the auxiliary vector (the kernel's saved_auxv holds
// AT_VECTOR_SIZE = 2*(2+20+AT_VECTOR_SIZE_ARCH+1) words, about 50).
const maxAuxvWords = 1024

// Auxv is the auxiliary vector as the raw 64-bit words of /proc/PID/auxv,
// type and value alternating, up to and including the AT_NULL pair: the
// form PR_SET_MM_MAP takes back.
type Auxv []uint64

// ParseAuxv parses /proc/PID/auxv: little-endian (native, on x86-64) pairs
// of 64-bit words until AT_NULL. Bytes after AT_NULL are ignored; input
// without AT_NULL is malformed.
func ParseAuxv(b []byte) (Auxv, error) {
	if len(b)%16 != 0 {
		return nil, Malformed("auxv length not a multiple of 16", nil)
	}
	for i := 0; i+16 <= len(b); i += 16 {
		if i/8 >= maxAuxvWords {
			return nil, fmt.Errorf("%w: auxv longer than %d words", ErrTooLarge, maxAuxvWords)
		}
		if binary.LittleEndian.Uint64(b[i:]) == AtNull {
			a := make(Auxv, (i+16)/8)
			for j := range a {
				a[j] = binary.LittleEndian.Uint64(b[8*j:])
			}
			return a, nil
		}
	}
	return nil, Malformed("auxv without AT_NULL", nil)
}

// Lookup returns the value of the first entry of type typ.
func (a Auxv) Lookup(typ uint64) (uint64, bool) {
	for i := 0; i+1 < len(a); i += 2 {
		if a[i] == typ {
			return a[i+1], true
		}
		if a[i] == AtNull {
			break
		}
	}
	return 0, false
}

// Bytes returns the vector as little-endian bytes, as /proc shows it.
func (a Auxv) Bytes() []byte {
	b := make([]byte, 8*len(a))
	for i, w := range a {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return b
}

// ReadAuxv reads /proc/PID/auxv.
func ReadAuxv(pid int) (Auxv, error) {
	b, err := ReadFile(pidPath(pid, "auxv"), 8*maxAuxvWords)
	if err != nil {
		return nil, fmt.Errorf("read auxv: %w", err)
	}
	a, err := ParseAuxv(b)
	if err != nil {
		return nil, fmt.Errorf("parse auxv of %d: %w", pid, err)
	}
	return a, nil
}
