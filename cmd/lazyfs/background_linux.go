package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/lazyfs/lazyfs/cmd/internal/cli"
)

// readyEnv names the file descriptor on which a --background child
// reports to its parent: "ok\n" once the mount serves, or the error.
const readyEnv = "LAZYFS_READY_FD"

// readyTimeout bounds how long the parent waits for the child's report.
const readyTimeout = 2 * time.Minute

func isBackgroundChild() bool { return os.Getenv(readyEnv) != "" }

// startBackground re-executes lazyfs detached from the terminal (a new
// session, standard streams on /dev/null) and returns when the child
// reports that the mount is ready, or with the child's error.
func startBackground(ctx context.Context, args []string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("background: %w", err)
	}
	defer r.Close()
	exe, err := os.Executable()
	if err != nil {
		w.Close()
		return fmt.Errorf("background: %w", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), readyEnv+"=3")
	cmd.ExtraFiles = []*os.File{w} // fd 3 in the child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("background: start: %w", err)
	}
	msg := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(r, 64<<10))
		msg <- b
	}()
	var b []byte
	select {
	case b = <-msg:
	case <-ctx.Done():
		stop(cmd)
		return fmt.Errorf("background: %w", context.Cause(ctx))
	case <-time.After(readyTimeout):
		stop(cmd)
		return fmt.Errorf("background: the mount was not ready after %v", readyTimeout)
	}
	if string(b) == "ok\n" {
		return cmd.Process.Release()
	}
	werr := cmd.Wait()
	if len(b) > 0 {
		// The child's message, with its exit status: the sentinels
		// behind it stayed in the child.
		err := errors.New(string(bytes.TrimSpace(b)))
		if ee, ok := errors.AsType[*exec.ExitError](werr); ok && ee.ExitCode() > 0 {
			return cli.WithExit(ee.ExitCode(), err)
		}
		return err
	}
	return fmt.Errorf("background: lazyfs exited before the mount was ready: %v", werr)
}

// stopWait is how long a child that was asked to stop may take to unmount.
const stopWait = 10 * time.Second

// stop ends a child that is not ready yet: SIGTERM first, so that a mount
// it may have made is unmounted, then SIGKILL.
func stop(cmd *exec.Cmd) {
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopWait):
		cmd.Process.Kill()
		<-done
	}
}

// readiness returns the function a --background child calls once with
// the outcome of its mount; in the foreground it does nothing.
func readiness() func(error) {
	fd, err := strconv.Atoi(os.Getenv(readyEnv))
	if err != nil || fd < 3 {
		return func(error) {}
	}
	os.Unsetenv(readyEnv)
	syscall.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "ready")
	done := false
	return func(err error) {
		if done {
			return
		}
		done = true
		if err != nil {
			fmt.Fprintf(f, "%v\n", err)
		} else {
			io.WriteString(f, "ok\n")
		}
		f.Close()
	}
}
