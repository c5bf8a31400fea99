// Package tty dumps and restores descriptors on terminals, as CRIU's
// tty.c: pseudo-terminal pairs whose master the processes hold, rebuilt
// with their settings, size and queued bytes (pty.go), and terminals
// outside the processes, handed the caller's own at restore --shell-job
// (terminal.go).
//
// engine/fds calls it for each character device and never the other
// way: a Dumper describes one process's descriptors on terminals,
// calling back (Dumper.Outside) for a terminal outside, which fds records
// as leading outside or refuses. At restore, MakePairs makes the new
// pairs in snapctl for the broker to hand out; fds gives each process
// its ends, and SetCTTY makes a slave a session's controlling terminal.
package tty
