package ptrace

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds every wait for a tracee unless options say
// otherwise.
const DefaultTimeout = 10 * time.Second

// pollInterval is how often an idle tracer looks at its tracees when no
// SIGCHLD woke it (signals are a hint, not a guarantee).
const pollInterval = 10 * time.Millisecond

// A Tracer owns one OS thread that makes every ptrace request and every
// wait. Its methods, and those of the Processes, Threads and Injectors it
// hands out, are safe for concurrent use; requests are serialised.
type Tracer struct {
	reqs    chan request
	quit    chan struct{}
	done    chan struct{}
	sigchld chan os.Signal
	once    sync.Once
	tid     int // OS thread id of the tracer goroutine; set before New returns

	// Owned by the tracer goroutine.
	procs   map[int]*Process // by tgid
	threads map[int]*Thread  // by tid, every tracee thread we hold
	regBuf  []byte           // PTRACE_GETREGSET buffer
}

type request struct {
	fn   func() error
	errc chan error
}

// New starts a tracer and its locked OS thread.
func New() (*Tracer, error) {
	t := &Tracer{
		reqs:    make(chan request),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
		sigchld: make(chan os.Signal, 1),
		procs:   make(map[int]*Process),
		threads: make(map[int]*Thread),
	}
	signal.Notify(t.sigchld, unix.SIGCHLD)
	ready := make(chan int)
	go t.loop(ready)
	t.tid = <-ready
	return t, nil
}

// loop is the tracer goroutine. It never unlocks its OS thread: when it
// returns the thread exits, and the kernel detaches (or, with
// PTRACE_O_EXITKILL, kills) any tracee still attached to it.
func (t *Tracer) loop(ready chan<- int) {
	runtime.LockOSThread()
	defer close(t.done)
	ready <- unix.Gettid()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		var tick <-chan time.Time
		if len(t.threads) > 0 {
			tick = ticker.C
		}
		select {
		case r := <-t.reqs:
			r.errc <- t.run(r.fn)
		case <-t.sigchld:
			t.service()
		case <-tick:
			t.service()
		case <-t.quit:
			t.shutdown()
			return
		}
	}
}

// run calls fn and turns a panic into an error, so that a bug in a request
// does not take the tracer thread (and every tracee's state) down with it.
func (t *Tracer) run(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("ptrace: panic in tracer request: %v\n%s", r, debug.Stack())
		}
	}()
	return fn()
}

// Do runs fn on the tracer thread and returns its error. Methods of this
// Tracer's Processes, Threads and Injectors called inside fn run directly
// (no hand-off), which makes bursts of requests cheaper: 14-27 µs per
// injected getpid inside one Do against 33-100 µs as separate calls on a
// 2-vCPU VM (BenchmarkInjectGetpid*). fn may also make raw ptrace calls on the tracees. fn must
// not call Close.
func (t *Tracer) Do(fn func() error) error {
	if t.onThread() {
		return fn()
	}
	errc := make(chan error, 1)
	select {
	case t.reqs <- request{fn: fn, errc: errc}:
	case <-t.done:
		return ErrClosed
	}
	select {
	case err := <-errc:
		return err
	case <-t.done:
		return ErrClosed
	}
}

// onThread reports whether the caller is the tracer goroutine: a locked OS
// thread runs no other goroutine, so comparing thread ids is exact.
func (t *Tracer) onThread() bool { return unix.Gettid() == t.tid }

// Close detaches every process still attached (processes started by
// StartStopped are killed), then stops the tracer thread. It is safe to
// call more than once.
func (t *Tracer) Close() error {
	t.once.Do(func() {
		close(t.quit)
		<-t.done
		signal.Stop(t.sigchld)
	})
	return nil
}

func (t *Tracer) shutdown() {
	for _, p := range t.procs {
		if p.owned {
			_ = p.kill()
		} else {
			_ = p.detach()
		}
	}
}
