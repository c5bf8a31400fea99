package fds

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// fakeProc stands for the process under restore: an injector that runs
// the system calls the restore asks for on a table of descriptors of its
// own, records each, and answers as scripted. It knows the calls the
// restore of files, pipes, sockets and locks makes, and fails the test on
// any other.
type fakeProc struct {
	t       *testing.T
	scratch []byte
	table   map[int]*fakeFile
	calls   []string // each call as it was asked, by name and arguments
	objects int      // objects made so far, to name the next one
	// files are what OpenAt2 opens and Fstat says of it, by path.
	files map[string]unix.Stat_t
	// fail makes every call of a system call fail with an errno.
	fail map[int]unix.Errno
	// lockHeld: another process holds every lock the restore takes.
	lockHeld bool
}

// fakeFile is an open file description of the fake process.
type fakeFile struct {
	name    string // "pipe#1:r", "socket#2", "/data/log"...
	flags   int    // its file status flags (open, F_SETFL)
	pos     int64
	written []byte   // what was written or sent to it
	sockopt []string // the options set on it, "level/opt=v"
	locks   []string // the locks taken through it
}

// fakeScratch is where the fake's scratch memory is, as the process sees it.
const fakeScratch = 0x7f0000000000

func newFakeProc(t *testing.T) *fakeProc {
	return &fakeProc{t: t, scratch: make([]byte, 16<<10), table: map[int]*fakeFile{}, files: map[string]unix.Stat_t{}, fail: map[int]unix.Errno{}}
}

// restore restores the descriptors of st in the fake process.
func (p *fakeProc) restore(st *image.Process, o RestoreOptions) error {
	fc := newFDCreator(p, 4242, st, map[uint64]int{}, o)
	defer fc.close()
	return fc.restore(p.t.Context())
}

// newObject names a new object of kind and returns a file of it.
func (p *fakeProc) newObject(kind string) *fakeFile {
	p.objects++
	return &fakeFile{name: fmt.Sprintf("%s#%d", kind, p.objects)}
}

// install puts f at the lowest free number at or above from.
func (p *fakeProc) install(f *fakeFile, from int) int {
	for fd := from; ; fd++ {
		if p.table[fd] == nil {
			p.table[fd] = f
			return fd
		}
	}
}

// at returns the scratch memory at the process address a.
func (p *fakeProc) at(a uint64, n int) []byte {
	off := int(a - fakeScratch)
	if a < fakeScratch || off+n > len(p.scratch) {
		p.t.Fatalf("address %#x (%d bytes) is outside the scratch memory", a, n)
	}
	return p.scratch[off : off+n]
}

func (p *fakeProc) Scratch() (uint64, int) { return fakeScratch, len(p.scratch) }

func (p *fakeProc) Put(off int, b []byte) (uint64, error) {
	copy(p.scratch[off:], b)
	return fakeScratch + uint64(off), nil
}

func (p *fakeProc) PutString(off int, s string) (uint64, error) {
	return p.Put(off, append([]byte(s), 0))
}

func (p *fakeProc) Get(off int, b []byte) error {
	copy(b, p.scratch[off:])
	return nil
}

func (p *fakeProc) CloseFD(fd int) error {
	_, err := p.Call(unix.SYS_CLOSE, uint64(fd))
	return err
}

func (p *fakeProc) OpenAt2(path string, flags int, mode uint32, resolve uint64) (int, error) {
	p.calls = append(p.calls, fmt.Sprintf("openat2(%s, %#o, %#x)", path, flags, resolve))
	if _, ok := p.files[path]; !ok {
		return -1, fmt.Errorf("open %s: %w", path, unix.ENOENT)
	}
	f := &fakeFile{name: path, flags: flags &^ (unix.O_CLOEXEC | unix.O_NOCTTY)}
	return p.install(f, 0), nil
}

func (p *fakeProc) Fstat(fd int) (unix.Stat_t, error) {
	p.calls = append(p.calls, fmt.Sprintf("fstat(%d)", fd))
	f := p.table[fd]
	if f == nil {
		return unix.Stat_t{}, fmt.Errorf("fstat %d: %w", fd, unix.EBADF)
	}
	return p.files[f.name], nil
}

func (p *fakeProc) Call(nr int, args ...uint64) (uint64, error) {
	r, err := p.Syscall(nr, args...)
	if err != nil {
		return 0, err
	}
	if e := ptrace.Errno(r); e != nil {
		return 0, &ptrace.SyscallError{Nr: nr, Errno: e.(unix.Errno)}
	}
	return uint64(r), nil
}

func (p *fakeProc) Batch(off int, calls []ptrace.BatchCall) error {
	for i := range calls {
		calls[i].Result = p.syscall(calls[i].Nr, calls[i].Args[:])
	}
	return nil
}

func (p *fakeProc) Syscall(nr int, args ...uint64) (int64, error) {
	a := make([]uint64, 6)
	copy(a, args)
	return p.syscall(nr, a), nil
}

// syscall runs one call on the table and returns its raw result.
func (p *fakeProc) syscall(nr int, a []uint64) int64 {
	p.calls = append(p.calls, callName(nr, a))
	if e, ok := p.fail[nr]; ok {
		return -int64(e)
	}
	fd := int(a[0])
	f := p.table[fd]
	switch nr {
	case unix.SYS_CLOSE, unix.SYS_LSEEK, unix.SYS_WRITE, unix.SYS_SENDTO, unix.SYS_SETSOCKOPT,
		unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_SHUTDOWN, unix.SYS_FLOCK, unix.SYS_FCNTL, unix.SYS_DUP3:
		if f == nil {
			return -int64(unix.EBADF)
		}
	}
	switch nr {
	case unix.SYS_PIPE2, unix.SYS_SOCKETPAIR:
		kind, at := "pipe", a[0]
		if nr == unix.SYS_SOCKETPAIR {
			kind, at = "socketpair", a[3]
		}
		obj := p.newObject(kind)
		r := p.install(&fakeFile{name: obj.name + ":0"}, 0)
		w := p.install(&fakeFile{name: obj.name + ":1"}, 0)
		b := p.at(at, 8)
		binary.LittleEndian.PutUint32(b, uint32(r))
		binary.LittleEndian.PutUint32(b[4:], uint32(w))
		return 0
	case unix.SYS_SOCKET:
		return int64(p.install(p.newObject("socket"), 0))
	case unix.SYS_CLOSE:
		delete(p.table, fd)
	case unix.SYS_DUP3:
		p.table[int(a[1])] = f
		return int64(a[1])
	case unix.SYS_LSEEK:
		f.pos = int64(a[1])
		return f.pos
	case unix.SYS_WRITE, unix.SYS_SENDTO:
		f.written = append(f.written, p.at(a[1], int(a[2]))...)
		return int64(a[2])
	case unix.SYS_SETSOCKOPT:
		f.sockopt = append(f.sockopt, fmt.Sprintf("%d/%d=%d", a[1], a[2], binary.LittleEndian.Uint32(p.at(a[3], 4))))
	case unix.SYS_FLOCK:
		if p.lockHeld {
			return -int64(unix.EWOULDBLOCK)
		}
		f.locks = append(f.locks, fmt.Sprintf("flock %#x", a[1]))
	case unix.SYS_FCNTL:
		return p.fcntl(f, a)
	case unix.SYS_BIND, unix.SYS_LISTEN, unix.SYS_SHUTDOWN, unix.SYS_CONNECT:
	default:
		p.t.Fatalf("the fake process does not know system call %s", callName(nr, a))
	}
	return 0
}

func (p *fakeProc) fcntl(f *fakeFile, a []uint64) int64 {
	switch a[1] {
	case unix.F_DUPFD_CLOEXEC, unix.F_DUPFD:
		return int64(p.install(f, int(a[2])))
	case unix.F_SETFL:
		f.flags = f.flags&unix.O_ACCMODE | int(a[2])
	case unix.F_SETFD, unix.F_SETPIPE_SZ:
	case unix.F_SETLK, unix.F_OFD_SETLK:
		if p.lockHeld {
			return -int64(unix.EAGAIN)
		}
		b := p.at(a[2], 32)
		f.locks = append(f.locks, fmt.Sprintf("fcntl %d type %d start %d len %d", a[1], binary.LittleEndian.Uint16(b),
			int64(binary.LittleEndian.Uint64(b[8:])), int64(binary.LittleEndian.Uint64(b[16:]))))
	default:
		p.t.Fatalf("the fake process does not know fcntl command %d", a[1])
	}
	return 0
}

// callName names a call as the tests expect it.
func callName(nr int, a []uint64) string {
	name := map[int]string{unix.SYS_CLOSE: "close", unix.SYS_DUP3: "dup3", unix.SYS_FCNTL: "fcntl", unix.SYS_LSEEK: "lseek",
		unix.SYS_PIPE2: "pipe2", unix.SYS_WRITE: "write", unix.SYS_SOCKET: "socket", unix.SYS_SOCKETPAIR: "socketpair",
		unix.SYS_SETSOCKOPT: "setsockopt", unix.SYS_BIND: "bind", unix.SYS_LISTEN: "listen", unix.SYS_SHUTDOWN: "shutdown",
		unix.SYS_FLOCK: "flock", unix.SYS_SENDTO: "sendto", unix.SYS_CONNECT: "connect"}[nr]
	if name == "" {
		name = fmt.Sprintf("syscall%d", nr)
	}
	n := map[string]int{"close": 1, "dup3": 3, "fcntl": 3, "lseek": 3, "pipe2": 0, "write": 1, "socket": 3, "socketpair": 3,
		"setsockopt": 3, "bind": 1, "listen": 2, "shutdown": 2, "flock": 2, "sendto": 1, "connect": 1}[name]
	var args []string
	for _, v := range a[:n] {
		args = append(args, fmt.Sprint(v))
	}
	return name + "(" + strings.Join(args, ", ") + ")"
}

// fd returns the file at fd, failing the test if none is.
func (p *fakeProc) fd(fd int) *fakeFile {
	p.t.Helper()
	f := p.table[fd]
	if f == nil {
		p.t.Fatalf("fd %d is not open in the fake process: %v", fd, p.tableString())
	}
	return f
}

// tableString shows the table, for an error.
func (p *fakeProc) tableString() string {
	var b strings.Builder
	for fd := range 64 {
		if f := p.table[fd]; f != nil {
			fmt.Fprintf(&b, " %d=%s", fd, f.name)
		}
	}
	return b.String()
}

// called reports whether the fake process was asked for call.
func (p *fakeProc) called(call string) bool {
	for _, c := range p.calls {
		if c == call {
			return true
		}
	}
	return false
}
