package ns

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lazyfs/lazyfs/engine/helper"
)

// InitArg0 is the argv[0] of the init of the pid namespace that a
// restore with Namespaces.PID makes: the running program, started as the
// namespace's pid 1 (and the stub the processes are cloned out of). This
// package registers InitMain under it with engine/helper, whose Main a
// program that sets Namespaces.PID calls first.
const InitArg0 = "lazyfs-pidns-init"

func init() { helper.Register(InitArg0, InitMain) }

// initSignals are the signals the init passes on to the restored process:
// those a supervisor sends to stop or reload a server.
var initSignals = []os.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM, unix.SIGUSR1, unix.SIGUSR2}

// InitMain is the init of a restore's pid namespace (args is its
// os.Args: InitArg0, the restored process's pid in the namespace).
// It reaps every process that ends in the namespace, passes initSignals
// on to the restored process, and returns, to exit with it, the
// restored process's exit status (128+N for a signal N) once it ends:
// the kernel then kills whatever is left in the namespace.
func InitMain(args []string) int {
	if len(args) != 2 {
		return 2
	}
	main, err := strconv.Atoi(args[1])
	if err != nil || main <= 1 || os.Getpid() != 1 {
		return 2
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, initSignals...)
	go func() {
		for s := range sigs {
			_ = unix.Kill(main, s.(syscall.Signal))
		}
	}()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// ECHILD: the process is gone and was reaped by nobody we
			// know of; nothing is left to wait for. (The init has no
			// stderr to say so.)
			return 1
		case pid != main:
			continue
		case ws.Signaled():
			return 128 + int(ws.Signal())
		default:
			return ws.ExitStatus()
		}
	}
}
