package fds

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
)

// The tests below restore descriptors into a fake process (fakeProc):
// what the restore asks of the process, and what the process's table of
// descriptors holds after it, without ptrace.

// A pipe whose two ends are in the process is made once, filled with the
// bytes that were in flight, and each end placed at its number with its
// own flags.
func TestRestorePipePair(t *testing.T) {
	p := newFakeProc(t)
	st := &image.Process{PID: 10, FDs: []image.FD{
		{FD: 3, Kind: image.FDPipe, Flags: unix.O_RDONLY, Pipe: &image.Pipe{ID: 9, Size: 1 << 16, Buffered: []byte("in flight")}},
		{FD: 4, Kind: image.FDPipe, Flags: unix.O_WRONLY | unix.O_NONBLOCK, CloExec: true, Pipe: &image.Pipe{ID: 9}},
	}}
	if err := p.restore(st, RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	r, w := p.fd(3), p.fd(4)
	if len(p.table) != 2 {
		t.Errorf("table %s, want fds 3 and 4 only: the ends kept while placing are closed", p.tableString())
	}
	if r.name != "pipe#1:0" || w.name != "pipe#1:1" {
		t.Errorf("fd 3 is %s, fd 4 %s: want the read and write ends of one pipe", r.name, w.name)
	}
	if string(w.written) != "in flight" {
		t.Errorf("pipe refilled with %q, want %q", w.written, "in flight")
	}
	if r.flags&unix.O_NONBLOCK != 0 || w.flags&unix.O_NONBLOCK == 0 {
		t.Errorf("flags: read end %#o, write end %#o: want O_NONBLOCK on the write end only", r.flags, w.flags)
	}
	if !p.called("fcntl(6, 1031, 65536)") { // F_SETPIPE_SZ on the write end, kept at 6
		t.Errorf("the pipe's size was not set: %v", p.calls)
	}
	if !p.called("dup3(6, 4, 524288)") {
		t.Errorf("fd 4 not placed close-on-exec: %v", p.calls)
	}
}

// A regular file is opened with no symbolic link on its path, checked to
// be the file dumped, set at its offset unless it appends, and placed at
// its number.
func TestRestoreFileAtOffset(t *testing.T) {
	id := image.FileID{Path: "/data/log", Dev: 7, Ino: 42, Size: 5000}
	file := func(flags int) *image.Process {
		return &image.Process{PID: 10, FDs: []image.FD{
			{FD: 5, Kind: image.FDFile, Path: id.Path, Flags: flags, Pos: 1234, CloExec: true, File: &id},
		}}
	}
	t.Run("offset", func(t *testing.T) {
		p := newFakeProc(t)
		p.files[id.Path] = unix.Stat_t{Dev: 7, Ino: 42, Mode: unix.S_IFREG | 0o644, Size: 5000}
		if err := p.restore(file(unix.O_RDWR), RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		f := p.fd(5)
		if f.name != id.Path || f.pos != 1234 || f.flags&unix.O_ACCMODE != unix.O_RDWR || len(p.table) != 1 {
			t.Errorf("fd 5 is %s at %d, flags %#o (table %s): want %s at 1234, read-write, alone", f.name, f.pos, f.flags, p.tableString(), id.Path)
		}
		if want := "openat2(/data/log, 02000402, 0x6)"; p.calls[0] != want { // O_RDWR|O_NOCTTY|O_CLOEXEC, no links of either kind
			t.Errorf("opened with %s, want %s", p.calls[0], want)
		}
	})
	t.Run("append", func(t *testing.T) {
		p := newFakeProc(t)
		p.files[id.Path] = unix.Stat_t{Dev: 7, Ino: 42, Mode: unix.S_IFREG | 0o644, Size: 9000}
		if err := p.restore(file(unix.O_WRONLY|unix.O_APPEND), RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		if f := p.fd(5); f.pos != 0 || f.flags&unix.O_APPEND == 0 {
			t.Errorf("appending file at %d, flags %#o: want no seek, O_APPEND", f.pos, f.flags)
		}
	})
	t.Run("another file", func(t *testing.T) {
		p := newFakeProc(t)
		p.files[id.Path] = unix.Stat_t{Dev: 7, Ino: 43, Mode: unix.S_IFREG | 0o644, Size: 5000}
		err := p.restore(file(unix.O_RDWR), RestoreOptions{})
		if !errors.Is(err, ErrFileChanged) || !strings.Contains(err.Error(), "pid 10 fd 5 (file)") {
			t.Errorf("restore of a file replaced since: %v, want ErrFileChanged naming the descriptor", err)
		}
		if len(p.table) != 0 {
			t.Errorf("the other file is left open: %s", p.tableString())
		}
	})
}

// A listening socket gets its options, address and backlog again; one
// whose address another socket holds now is refused, naming it; an
// established connection comes back as a socket whose peer has closed.
func TestRestoreSocket(t *testing.T) {
	listener := func(reuse int) *image.Process {
		return &image.Process{PID: 10, FDs: []image.FD{{FD: 3, Kind: image.FDSocket, Socket: &image.Socket{
			ID: 1, Family: unix.AF_INET, Type: unix.SOCK_STREAM, State: "listen", Local: "127.0.0.1:8080", Backlog: 128,
			Options: map[string]int{"SO_REUSEADDR": reuse}}}}}
	}
	t.Run("listen", func(t *testing.T) {
		p := newFakeProc(t)
		if err := p.restore(listener(1), RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		s := p.fd(3)
		if s.name != "socket#1" || strings.Join(s.sockopt, " ") != "1/2=1" { // SOL_SOCKET/SO_REUSEADDR
			t.Errorf("fd 3 is %s with options %v, want a socket with SO_REUSEADDR", s.name, s.sockopt)
		}
		for _, c := range []string{"socket(2, 1, 0)", "bind(0)", "listen(0, 128)", "dup3(0, 3, 0)", "close(0)"} {
			if !p.called(c) {
				t.Errorf("no %s among %v", c, p.calls)
			}
		}
	})
	t.Run("address taken", func(t *testing.T) {
		p := newFakeProc(t)
		p.fail[unix.SYS_BIND] = unix.EADDRINUSE
		err := p.restore(listener(0), RestoreOptions{})
		if !errors.Is(err, unix.EADDRINUSE) {
			t.Fatalf("restore of a listener whose port is taken: %v, want EADDRINUSE", err)
		}
		for _, want := range []string{"pid 10 fd 3 (socket)", "bind 127.0.0.1:8080", "another socket holds it now", "no SO_REUSEADDR"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q does not say %q", err, want)
			}
		}
		if p.called("listen(0, 128)") {
			t.Errorf("listened on a socket it could not bind: %v", p.calls)
		}
	})
	t.Run("connection closed", func(t *testing.T) {
		p := newFakeProc(t)
		st := &image.Process{PID: 10, FDs: []image.FD{{FD: 3, Kind: image.FDSocket, Socket: &image.Socket{
			ID: 1, Family: unix.AF_INET, Type: unix.SOCK_STREAM, State: "established", Local: "127.0.0.1:8080", Peer: "127.0.0.1:40000"}}}}
		if err := p.restore(st, RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		if !p.called("shutdown(0, 0)") || p.called("bind(0)") || p.fd(3).name != "socket#1" {
			t.Errorf("a connection restored with %v, want a socket shut down for reading, not bound", p.calls)
		}
	})
}

// The locks of a descriptor are taken again once every descriptor is in
// place; one that another process holds now refuses the restore.
func TestRestoreLocks(t *testing.T) {
	id := image.FileID{Path: "/data/db", Dev: 7, Ino: 42, Size: 5000}
	st := &image.Process{PID: 10, FDs: []image.FD{{FD: 5, Kind: image.FDFile, Path: id.Path, Flags: unix.O_RDWR, File: &id,
		Locks: []image.Lock{{Kind: image.LockPOSIX, Write: true, Start: 10, End: 19}, {Kind: image.LockFlock, End: -1}}}}}
	t.Run("taken", func(t *testing.T) {
		p := newFakeProc(t)
		p.files[id.Path] = unix.Stat_t{Dev: 7, Ino: 42, Mode: unix.S_IFREG | 0o644, Size: 5000}
		if err := p.restore(st, RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		// F_SETLK of F_WRLCK on bytes 10-19, then LOCK_SH|LOCK_NB.
		if got, want := strings.Join(p.fd(5).locks, "; "), "fcntl 6 type 1 start 10 len 10; flock 0x5"; got != want {
			t.Errorf("locks taken: %s, want %s", got, want)
		}
	})
	t.Run("held", func(t *testing.T) {
		p := newFakeProc(t)
		p.files[id.Path] = unix.Stat_t{Dev: 7, Ino: 42, Mode: unix.S_IFREG | 0o644, Size: 5000}
		p.lockHeld = true
		err := p.restore(st, RestoreOptions{})
		if !errors.Is(err, ErrLockHeld) || !errors.Is(err, ErrFileChanged) || !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("restore of a lock held elsewhere: %v, want ErrLockHeld", err)
		}
		if !strings.Contains(err.Error(), "fd 5 (/data/db): a write posix lock on bytes 10-19") {
			t.Errorf("refusal %q does not name the lock", err)
		}
	})
}

// A descriptor shared with other processes of a tree cannot be restored
// without the tree: the snapshot is inconsistent.
func TestRestoreTreeFDAlone(t *testing.T) {
	p := newFakeProc(t)
	st := &image.Process{PID: 10, FDs: []image.FD{{FD: 3, Kind: image.FDPipe, Flags: unix.O_RDONLY, Pipe: &image.Pipe{ID: 9}, Tree: &image.FDTree{Shared: true}}}}
	if err := p.restore(st, RestoreOptions{}); !errors.Is(err, image.ErrCorrupt) {
		t.Errorf("a shared pipe end restored alone: %v, want image.ErrCorrupt", err)
	}
}
