package syscalls

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/ptrace"
)

// The helpers below pass arguments to injected calls through the
// Injector's scratch memory: Put writes bytes there and returns their
// address in the tracee, Get reads them back after the call.

// AtFDCWD is AT_FDCWD as a system call argument.
var AtFDCWD = func() uint64 { v := int64(unix.AT_FDCWD); return uint64(v) }()

// Put writes b into the scratch memory at offset off and returns its
// address in the tracee.
func (in *Injector) Put(off int, b []byte) (uint64, error) {
	if off < 0 || off+len(b) > in.scratchLen || in.scratch == 0 {
		return 0, fmt.Errorf("injector of thread %d: %d bytes at scratch offset %d do not fit its %d bytes", in.tid, len(b), off, in.scratchLen)
	}
	a := in.scratch + uint64(off)
	return a, in.p.WriteMem(a, b)
}

// PutString writes s NUL-terminated into the scratch memory at off and
// returns its address.
func (in *Injector) PutString(off int, s string) (uint64, error) {
	if off+len(s)+1 > in.scratchLen {
		return 0, fmt.Errorf("string of %d bytes does not fit the scratch area", len(s))
	}
	return in.Put(off, append([]byte(s), 0))
}

// Get reads len(b) bytes of the scratch memory at off.
func (in *Injector) Get(off int, b []byte) error {
	if off < 0 || off+len(b) > in.scratchLen || in.scratch == 0 {
		return fmt.Errorf("injector of thread %d: %d bytes at scratch offset %d are outside its %d bytes", in.tid, len(b), off, in.scratchLen)
	}
	return in.p.ReadMem(in.scratch+uint64(off), b)
}

// CloseFD injects close(fd).
func (in *Injector) CloseFD(fd int) error {
	_, err := in.Call(unix.SYS_CLOSE, uint64(fd))
	return err
}

// OpenAt2 injects openat2(AT_FDCWD, path, {flags, mode, resolve}) and
// returns the descriptor the tracee got: with resolve
// RESOLVE_NO_SYMLINKS, no component of path may be a symbolic link (the
// kernel refuses with ELOOP), so a path recorded at the dump cannot be
// redirected by a link planted since.
func (in *Injector) OpenAt2(path string, flags int, mode uint32, resolve uint64) (int, error) {
	how := make([]byte, unix.SizeofOpenHow)
	binary.LittleEndian.PutUint64(how[0:], uint64(flags))
	binary.LittleEndian.PutUint64(how[8:], uint64(mode))
	binary.LittleEndian.PutUint64(how[16:], resolve)
	at, err := in.Put(0, how)
	if err != nil {
		return -1, err
	}
	p, err := in.PutString(len(how), path)
	if err != nil {
		return -1, err
	}
	fd, err := in.Call(unix.SYS_OPENAT2, AtFDCWD, p, at, uint64(len(how)))
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return int(fd), nil
}

// Fstat injects fstat(fd) and returns what the tracee sees of its
// descriptor fd.
func (in *Injector) Fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	b := bytesOf(&st)
	at, err := in.Put(0, make([]byte, len(b)))
	if err != nil {
		return st, err
	}
	if _, err := in.Call(unix.SYS_FSTAT, uint64(fd), at); err != nil {
		return st, fmt.Errorf("fstat %d: %w", fd, err)
	}
	return st, in.Get(0, b)
}

// OpenReq is one file of OpenAt2All: OpenAt2's arguments.
type OpenReq struct {
	Path    string
	Flags   int
	Mode    uint32
	Resolve uint64
}

// OpenAt2All is OpenAt2 of many files, and FstatAll of what it opened:
// an openat2 of every file in one resume and an fstat of every
// descriptor in another, as many files at a time as the scratch memory
// holds. A process that maps hundreds of libraries (an interpreter with
// PyTorch) opens them in a few resumes instead of two each. fds[i] is the
// descriptor of reqs[i] and sts[i] what fstat says of it, or errs[i] says
// why not (fds[i] is then -1, or the descriptor fstat failed on, for the
// caller to close); err is a failure to inject at all, after which every
// descriptor opened is closed.
func (in *Injector) OpenAt2All(reqs []OpenReq) (fds []int, sts []unix.Stat_t, errs []error, err error) {
	fds = make([]int, len(reqs))
	sts = make([]unix.Stat_t, len(reqs))
	errs = make([]error, len(reqs))
	for i := range fds {
		fds[i] = -1
	}
	defer func() {
		if err != nil {
			for _, fd := range fds {
				if fd >= 0 {
					in.CloseFD(fd)
				}
			}
		}
	}()
	how := make([]byte, unix.SizeofOpenHow)
	var st unix.Stat_t
	statLen := len(bytesOf(&st))
	for lo := 0; lo < len(reqs); {
		// A chunk: each file's open_how, path and stat buffer, and
		// its two table entries.
		c := in.NewCalls()
		hi, used := lo, 0
		for hi < len(reqs) {
			need := len(how) + (len(reqs[hi].Path)+8)&^7 + statLen + 2*ptrace.BatchEntry
			if hi > lo && used+need > in.scratchLen {
				break
			}
			used += need
			hi++
		}
		for _, r := range reqs[lo:hi] {
			binary.LittleEndian.PutUint64(how[0:], uint64(r.Flags))
			binary.LittleEndian.PutUint64(how[8:], uint64(r.Mode))
			binary.LittleEndian.PutUint64(how[16:], r.Resolve)
			at := c.Data(how)
			c.Add("open "+r.Path, unix.SYS_OPENAT2, AtFDCWD, c.String(r.Path), at, uint64(len(how)))
		}
		if err := in.execCalls(c); err != nil {
			return fds, sts, errs, err
		}
		stat := in.NewCalls()
		bufs := make([]uint64, hi-lo)
		for i := lo; i < hi; i++ {
			r := c.Result(i - lo)
			if e := ptrace.Errno(r); e != nil {
				errs[i] = fmt.Errorf("open %s: %w", reqs[i].Path, e)
				continue
			}
			fds[i] = int(r)
			bufs[i-lo] = stat.Data(make([]byte, statLen))
			stat.Add("fstat "+reqs[i].Path, unix.SYS_FSTAT, uint64(fds[i]), bufs[i-lo])
		}
		if err := in.execCalls(stat); err != nil {
			return fds, sts, errs, err
		}
		out := make([]byte, len(stat.data))
		if err := in.Get(0, out); err != nil {
			return fds, sts, errs, err
		}
		k := 0
		for i := lo; i < hi; i++ {
			if fds[i] < 0 {
				continue
			}
			if e := ptrace.Errno(stat.Result(k)); e != nil {
				errs[i] = fmt.Errorf("fstat %s: %w", reqs[i].Path, e)
			} else {
				copy(bytesOf(&sts[i]), out[bufs[i-lo]-in.scratch:])
			}
			k++
		}
		lo = hi
	}
	return fds, sts, errs, nil
}
