// Package fds dumps and restores file descriptors. Each kind keeps both
// halves in its own file, as CRIU keeps pipes.c and sk-unix.c: regular
// files, directories, devices, FIFOs and memfds (file.go), pipes
// (pipe.go), eventfd, epoll, timerfd and signalfd (event.go),
// descriptors leading outside the process (or the tree) that a restore
// is handed (external.go), and what the processes of a tree share
// (tree.go: DumpTree, Tree). Kinds with much state of their own are
// packages of their own: sockets (engine/fds/sock) and terminals
// (engine/fds/tty); so is the broker that holds, during the restore of a
// tree, what its processes share (engine/fds/broker).
//
// Dump reads a frozen process's descriptors from /proc, sock_diag and,
// for what only a descriptor tells (buffered pipe bytes, queued socket
// data, socket options), copies taken with pidfd_getfd. Restore injects
// the system calls that recreate each object in the process under
// restore, at its number, through an injector (injector.go: what a
// *syscalls.Injector does, narrowed to what the restore asks, so that tests
// can answer in the process's place). CheckRestorable and CheckFile
// refuse, before a restore creates anything, what it could not restore or
// what is no longer the file that was dumped.
//
// The subpackages never import fds: fds dispatches each descriptor by
// its kind and hands a subpackage what it needs: the process's
// descriptors, a pidfd, a logger, the injector (which the subpackage
// names by its own interface, a part of fds's), and callbacks for what
// stays here (sock.Host: keeping both ends of a pair out of the way until
// each is placed; sock.Dumper.Outside and tty.Dumper.Outside: recording
// a descriptor that leads outside, or refusing it). They share nothing
// else with fds but engine/image's types (a descriptor is an image.FD),
// so no package of common types sits between them.
//
// A descriptor the format cannot describe (an inotify instance, a pipe
// whose other end is outside the process, or the tree, and that External does not
// name, a deleted file) is refused at the dump with an error wrapping
// image.ErrUnsupported that names the process and the descriptor.
package fds
