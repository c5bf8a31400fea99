package fds

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/image"
	"github.com/lazyfs/lazyfs/engine/proc"
)

type pipeEnds struct {
	readers, writers []int
	buffered         []byte
	read             bool
}

// pipe records one end of a pipe. Both ends must be in the process (or
// in the tree: treePipe), or --external name it; the bytes buffered in
// it are stored with its lowest read end.
func (fx *fdDumper) pipe(f *proc.FD, out image.FD) (image.FD, error) {
	if fx.tree != nil && fx.tree.pipes[f.Ino] != nil {
		return fx.treePipe(f, out)
	}
	ends := fx.pipes[f.Ino]
	out.Kind = image.FDPipe
	out.Pipe = &image.Pipe{ID: f.Ino}
	if ends == nil || len(ends.readers) == 0 || len(ends.writers) == 0 {
		if fx.ext.matches(f) {
			fx.external(f, &out, fmt.Sprintf("pipe:[%d]", f.Ino))
			return out, nil
		}
		where := "the process"
		if fx.tree != nil {
			where = "the tree"
		}
		return out, fmt.Errorf("%w: pipe:[%d] has its other end outside %s: dump with --external fd[%d] (or pipe[%d], or stdio for fds 0-2) to record it, and restore with --inherit-fd", image.ErrUnsupported, f.Ino, where, f.Num, f.Ino)
	}
	if f.Num == ends.readers[0] {
		if !ends.read {
			b, size, err := fx.peekPipe(f.Num)
			if err != nil {
				return out, fmt.Errorf("read buffered bytes: %w", err)
			}
			ends.buffered, ends.read = b, true
			out.Pipe.Size = size
		}
		out.Pipe.Buffered = ends.buffered
	}
	return out, nil
}

// peekPipe copies the bytes buffered in a pipe of the process without
// consuming them: tee(2) duplicates them into a pipe of our own.
func (fx *fdDumper) peekPipe(num int) ([]byte, int, error) {
	src, err := unix.PidfdGetfd(fx.pidfd, num, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(src)
	size, err := unix.FcntlInt(uintptr(src), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("F_GETPIPE_SZ: %w", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, 0, err
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, size); err != nil {
		return nil, 0, fmt.Errorf("F_SETPIPE_SZ %d: %w", size, err)
	}
	n, err := unix.Tee(src, p[1], size, unix.SPLICE_F_NONBLOCK)
	if errors.Is(err, unix.EAGAIN) {
		return nil, size, nil // empty
	}
	if err != nil {
		return nil, 0, fmt.Errorf("tee: %w", err)
	}
	buf := make([]byte, n)
	if _, err := unix.Read(p[0], buf); err != nil {
		return nil, 0, err
	}
	return buf, size, nil
}

// pipe returns this end of the pipe, creating the pipe (with its buffered
// bytes) the first time one of its ends is met.
func (fc *fdCreator) pipe(f *image.FD, nonblock uint64) (int, error) {
	ends, ok := fc.pipes[f.Pipe.ID]
	if !ok {
		at, _ := fc.in.Scratch()
		if _, err := fc.in.Call(unix.SYS_PIPE2, at, unix.O_CLOEXEC); err != nil {
			return -1, fmt.Errorf("pipe2: %w", err)
		}
		var err error
		if ends, err = fc.KeepPair(at); err != nil {
			return -1, err
		}
		fc.pipes[f.Pipe.ID] = ends
		// Find the dumped size and bytes, stored with one read end.
		for _, g := range fc.st.FDs {
			if g.Pipe == nil || g.Pipe.ID != f.Pipe.ID || (g.Pipe.Size == 0 && len(g.Pipe.Buffered) == 0) {
				continue
			}
			if g.Pipe.Size > 0 {
				if _, err := fc.in.Call(unix.SYS_FCNTL, uint64(ends[1]), unix.F_SETPIPE_SZ, uint64(g.Pipe.Size)); err != nil {
					return -1, fmt.Errorf("F_SETPIPE_SZ %d: %w", g.Pipe.Size, err)
				}
			}
			if err := fc.write(ends[1], g.Pipe.Buffered); err != nil {
				return -1, fmt.Errorf("refill pipe with %d bytes: %w", len(g.Pipe.Buffered), err)
			}
		}
	}
	end := ends[1]
	if f.Flags&unix.O_ACCMODE == unix.O_RDONLY {
		end = ends[0]
	}
	// Its file status flags are set once it is at its number (placeOne:
	// the same open file description).
	return end, nil
}
