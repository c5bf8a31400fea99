// Package sock dumps and restores sockets, the kind of descriptor with
// the most state of its own, one file per family as CRIU keeps sk-inet.c
// and sk-unix.c: what every socket has (socket.go: family, type, state,
// addresses, options), TCP and UDP sockets (inet.go), unix sockets and
// the data queued in a pair (unix.go), established TCP connections taken
// with TCP_REPAIR (tcp.go) under a network lock (netlock.go), and the
// stale file of a unix socket removed only through a trusted directory
// (stale.go).
//
// engine/fds calls it for each socket and never the other way: a Dumper
// describes the sockets of one process, calling back (Dumper.Outside)
// for a connection that --external names; a Restorer makes them again in
// the process through an Injector, asking the restore of every descriptor
// around it (Host) to keep a socket pair's ends out of the way until
// each is placed. The locks and repair state of --tcp-established
// (TCPRepair, NetLock, ReleaseNetLocks, ResetConnections) are the
// engine's to hold between the steps of a dump and a restore.
package sock
