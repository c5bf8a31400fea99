package measure

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/test/fixture"
)

// PollEvery is how often the harness polls a log, a port or a pid.
const PollEvery = 2 * time.Millisecond

// Server is a modelserver the harness started (or one a restore rebuilt:
// same pid, same port).
type Server struct {
	PID   int
	Port  int
	Ready fixture.Line
	Done  chan struct{} // closed once the original process is reaped
}

// BecomeSubreaper makes every orphaned descendant, restored servers among
// them, a child of this process, so that the harness reaps a killed server
// at once instead of waiting for init (1–2 s on this kind of machine) before
// its pid is free for the next restore.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	return nil
}

// FreePort returns a loopback port below the ephemeral range that is free
// now, so that neither the kernel nor other tests hand it out meanwhile.
func FreePort() (int, error) {
	for range 100 {
		port := 20000 + rand.IntN(10000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, errors.New("no free port in 20000-29999")
}

// StartServer starts fixture program prog (the modelserver or the
// weightserver, which take SIZE PORT first) with size bytes of memory and
// the arguments extra after the port, through launch (pristine signals and
// descriptors), in a session of its own, its output appended to logPath,
// and waits for its ready line.
func StartServer(ctx context.Context, t Tools, prog string, size uint64, extra []string, logPath, dir string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	from := int64(0)
	if st, err := os.Stat(logPath); err == nil {
		from = st.Size()
	}
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("server log: %w", err)
	}
	cmd := exec.Command(t.Launch, append([]string{prog, strconv.FormatUint(size, 10), strconv.Itoa(port)}, extra...)...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(prog), err)
	}
	s := &Server{PID: cmd.Process.Pid, Port: port, Done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(s.Done)
	}()
	readyCtx, cancel := context.WithTimeout(ctx, serverReadyTimeout+time.Duration(size>>30)*30*time.Second)
	s.Ready, err = WaitReady(readyCtx, logPath, from, s)
	cancel()
	if err != nil {
		cmd.Process.Kill()
		<-s.Done
		return nil, err
	}
	return s, nil
}

// serverReadyTimeout, plus 30 s per GiB of its memory, bounds a server's
// start up to its ready line (it fills its memory first: seconds at the
// sizes measured), so that a server that hangs is reported as such, not
// as the run's deadline.
const serverReadyTimeout = 2 * time.Minute

// WaitReady polls the log from offset for the server's ready line.
func WaitReady(ctx context.Context, logPath string, from int64, s *Server) (fixture.Line, error) {
	for {
		if b, err := os.ReadFile(logPath); err == nil && int64(len(b)) >= from {
			for _, text := range strings.Split(string(b[from:]), "\n") {
				l := fixture.ParseLine(text)
				if l.Event == "ready" && l.Fields["pid"] == strconv.Itoa(s.PID) {
					return l, nil
				}
			}
		}
		select {
		case <-s.Done:
			return fixture.Line{}, fmt.Errorf("the server exited before it was ready; log %s: %s", logPath, tail(logPath))
		case <-ctx.Done():
			return fixture.Line{}, fmt.Errorf("wait for the server's ready line: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// tail returns the last lines of a log, for errors.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.TrimSpace(string(b))
}

// WaitGone waits until the dumped original process has been reaped.
func (s *Server) WaitGone(ctx context.Context) error {
	select {
	case <-s.Done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the dumped server %d to exit: %w", s.PID, ctx.Err())
	}
}

// KillAndReap kills the process at pid (a restored server, our child
// through the subreaper, or an orphan init reaps) and waits until the pid
// is free.
func KillAndReap(ctx context.Context, pid int) error {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		switch {
		case got == pid:
			return nil
		case errors.Is(err, unix.ECHILD):
			// Not our child: gone once /proc no longer lists it.
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
				return nil
			}
		case err != nil && !errors.Is(err, unix.EINTR):
			return fmt.Errorf("wait for %d: %w", pid, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for pid %d to be free: %w", pid, ctx.Err())
		case <-time.After(PollEvery):
		}
	}
}

// Alive reports whether a process holds pid.
func Alive(pid int) bool {
	return unix.Kill(pid, 0) == nil
}

// Answer is one reply of the server and when it arrived.
type Answer struct {
	Line fixture.Line
	At   time.Duration // since the start passed to Converse
}

// Converse connects to the server on port, retrying every pollEvery while
// nothing listens, sends each request in turn on one connection and returns
// every answer with its time since start. A connection that breaks before
// the first answer (a restore in progress) is retried.
func Converse(ctx context.Context, port int, start time.Time, requests ...string) ([]Answer, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		answers, err := exchange(ctx, addr, start, requests)
		if err == nil {
			return answers, nil
		}
		if len(answers) > 0 {
			return nil, fmt.Errorf("ask %s %q: %w", addr, requests, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("ask %s %q: %w (last: %w)", addr, requests, ctx.Err(), err)
		case <-time.After(PollEvery):
		}
	}
}

// exchange is one connection's attempt of Converse.
func exchange(ctx context.Context, addr string, start time.Time, requests []string) ([]Answer, error) {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	r := bufio.NewReader(conn)
	var answers []Answer
	for _, req := range requests {
		if _, err := conn.Write([]byte(req + "\n")); err != nil {
			return answers, err
		}
		text, err := r.ReadString('\n')
		if err != nil {
			return answers, err
		}
		at := time.Since(start)
		l := fixture.ParseLine(strings.TrimSpace(text))
		if l.Event == "error" {
			return answers, fmt.Errorf("server answered %q", l.Text)
		}
		answers = append(answers, Answer{Line: l, At: at})
	}
	return answers, nil
}
