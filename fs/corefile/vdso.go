package corefile

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A snapshot holds no vDSO bytes (a restore maps the restoring kernel's),
// but debuggers read the vDSO from the core to unwind through it (its
// CFI) and to name its functions. Every process of one kernel maps the
// same vDSO image, so when the snapshot was taken on a kernel of the same
// release as the mount's, and the vDSO mappings have the same size, the
// core serves the mount's own vDSO; otherwise the vDSO's PT_LOAD has no
// bytes.

// hostVDSO is this process's vDSO and the running kernel's release, read
// once.
var hostVDSO = sync.OnceValues(func() ([]byte, string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, ""
	}
	b, err := readOwnVDSO()
	if err != nil {
		return nil, ""
	}
	return b, unix.ByteSliceToString(u.Release[:])
})

// vdsoFor returns the vDSO bytes the core of a snapshot taken on kernel
// release serves for a vDSO mapping of size bytes, or nil.
func vdsoFor(release string, size uint64) []byte {
	b, host := hostVDSO()
	if release == "" || release != host || uint64(len(b)) != size {
		return nil
	}
	return b
}

// readOwnVDSO reads the [vdso] mapping of this process.
func readOwnVDSO() ([]byte, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[5] != "[vdso]" {
			continue
		}
		var lo, hi uint64
		if _, err := fmt.Sscanf(f[0], "%x-%x", &lo, &hi); err != nil || hi <= lo || hi-lo > 1<<20 {
			return nil, fmt.Errorf("[vdso] %q", f[0])
		}
		mem, err := os.Open("/proc/self/mem")
		if err != nil {
			return nil, err
		}
		defer mem.Close()
		b := make([]byte, hi-lo)
		if _, err := mem.ReadAt(b, int64(lo)); err != nil {
			return nil, err
		}
		if !bytes.HasPrefix(b, []byte(elf.ELFMAG)) {
			return nil, fmt.Errorf("[vdso] is not an ELF image")
		}
		return b, nil
	}
	return nil, fmt.Errorf("no [vdso] mapping")
}
