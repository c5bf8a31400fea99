package s3

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

// Lock is what a dump's lock object says of the dump that wrote it: enough
// to tell, on the dump's own host, whether it still runs (its pid with the
// same start time, since the same boot), and elsewhere who to ask.
type Lock struct {
	Host   string
	BootID string // /proc/sys/kernel/random/boot_id of the host
	// PIDNS names the dump's pid namespace (/proc/self/ns/pid): containers
	// share a host's boot id, and may share its hostname, but a pid means
	// something only in its own namespace.
	PIDNS   string
	PID     int       // the dumping snapctl's
	Start   uint64    // its start time, in clock ticks after boot
	Started time.Time // when it took the lock
}

// LockState is what can be known of a lock's dump from here.
type LockState int

const (
	// LockUnknown: the dump ran on another host (or the lock says too
	// little): it may still run.
	LockUnknown LockState = iota
	// LockRunning: the dump runs on this host.
	LockRunning
	// LockGone: the dump ran on this host and is gone (its pid ended, or
	// the host rebooted since): what it left can be cleared.
	LockGone
)

func (s LockState) String() string {
	switch s {
	case LockRunning:
		return "running"
	case LockGone:
		return "gone"
	}
	return "unknown"
}

// lockMagic is a lock object's first line.
const lockMagic = "lazyfs dump lock"

// ourLock describes the calling process as a lock's dump.
func ourLock() Lock {
	l := Lock{PID: os.Getpid(), Started: time.Now().UTC().Truncate(time.Second)}
	l.Host, _ = os.Hostname()
	l.BootID = bootID()
	l.PIDNS = pidNS()
	if st, err := proc.ReadStat(l.PID); err == nil {
		l.Start = st.StartTime
	}
	return l
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// pidNS names the caller's pid namespace: the link /proc/self/ns/pid
// (pid:[INODE]).
func pidNS() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}

// encode writes l as a lock object's text: a magic line, then one
// "key: value" line per field, readable with cat.
func (l Lock) encode() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\nhost: %s\nboot_id: %s\npid_ns: %s\npid: %d\nstart_ticks: %d\nstarted: %s\n",
		lockMagic, l.Host, l.BootID, l.PIDNS, l.PID, l.Start, l.Started.Format(time.RFC3339))
	return b.Bytes()
}

// parseLock reads a lock object's text. A lock of an older format, or
// one that is not text of ours, gives a zero Lock and false.
func parseLock(b []byte) (Lock, bool) {
	var l Lock
	sc := bufio.NewScanner(bytes.NewReader(b))
	if !sc.Scan() || sc.Text() != lockMagic {
		return l, false
	}
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		switch k {
		case "host":
			l.Host = v
		case "boot_id":
			l.BootID = v
		case "pid_ns":
			l.PIDNS = v
		case "pid":
			l.PID, _ = strconv.Atoi(v)
		case "start_ticks":
			l.Start, _ = strconv.ParseUint(v, 10, 64)
		case "started":
			l.Started, _ = time.Parse(time.RFC3339, v)
		}
	}
	return l, l.Host != "" && l.PID > 0
}

// State tells whether l's dump still runs, as far as this host can know:
// only a dump of this boot of this host, in the caller's own pid
// namespace, can be looked up (a container on the same host, with its
// own pid namespace, is another host here).
func (l Lock) State() LockState {
	host, _ := os.Hostname()
	if l.Host == "" || l.Host != host || l.BootID == "" {
		return LockUnknown
	}
	if l.BootID != bootID() {
		return LockGone // a process does not outlive its host's boot
	}
	if l.PIDNS == "" || l.PIDNS != pidNS() {
		return LockUnknown
	}
	st, err := proc.ReadStat(l.PID)
	if err != nil || st.Exited() || st.StartTime != l.Start {
		return LockGone
	}
	return LockRunning
}

// describe names l's dump for a message: pid, host and start.
func (l Lock) describe() string {
	if l.PID == 0 {
		return "a dump of an older lazyfs, which does not say where it ran"
	}
	age := ""
	if !l.Started.IsZero() {
		age = fmt.Sprintf(", started %s (%s ago)", l.Started.Format(time.RFC3339), time.Since(l.Started).Truncate(time.Second))
	}
	return fmt.Sprintf("the dump of pid %d on host %s%s", l.PID, l.Host, age)
}

// readLock reads the lock object of the prefix; found is false if there
// is none.
func (c *client) readLock(ctx context.Context) (l Lock, found bool, err error) {
	text, found, err := c.readSmall(ctx, lockName)
	if err != nil || !found {
		return l, found, err
	}
	l, _ = parseLock([]byte(text))
	return l, true, nil
}

// lockedError is the error of a dump that finds the prefix locked by l:
// image.ErrLocked, saying whose lock it is and, when that dump cannot be
// running, how to clear what it left.
func lockedError(a Address, l Lock) error {
	switch l.State() {
	case LockRunning:
		return fmt.Errorf("%s: %w: %s, which is running", a, image.ErrLocked, l.describe())
	case LockGone:
		return fmt.Errorf("%s: %w: %s, which is gone: clear what it left with `snapctl cleanup -D %s`", a, image.ErrLocked, l.describe(), a)
	}
	return fmt.Errorf("%s: %w: %s: if that dump no longer runs, clear what it left with `snapctl cleanup --force -D %s`", a, image.ErrLocked, l.describe(), a)
}

// notFound tells whether err is the store's answer that an object does
// not exist.
func notFound(err error) bool {
	var nsk interface{ ErrorCode() string }
	if errors.As(err, &nsk) {
		switch nsk.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return true
		}
	}
	return false
}
