package task

import (
	"fmt"
	"os"
	"strings"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// capNames are the capabilities' names, by number (linux/capability.h).
var capNames = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE"}

// capName names capability c.
func capName(c int) string {
	if c < len(capNames) {
		return capNames[c]
	}
	return fmt.Sprintf("capability %d", c)
}

// CheckCapabilities refuses, before anything is made, a process whose
// capabilities snapctl cannot give it: ones snapctl itself lacks (run in
// a container with fewer), or ones this kernel does not know.
func CheckCapabilities(st *image.Process) error {
	c := st.Creds
	want := c.CapBnd | c.CapPrm | c.CapEff | c.CapInh | c.CapAmb
	own, err := proc.ReadStatus(os.Getpid())
	if err != nil {
		return err
	}
	last := lastCap()
	var missing []string
	for cp := 0; cp < 64; cp++ {
		if want&(1<<cp) != 0 && (own.CapPrm&(1<<cp) == 0 || cp > last) {
			missing = append(missing, capName(cp))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the process had %s, which snapctl cannot give it: it lacks them itself (or this kernel does not know them); run snapctl with them",
			os.ErrPermission, strings.Join(missing, ", "))
	}
	return nil
}
