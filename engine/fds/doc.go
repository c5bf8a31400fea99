// Package fds dumps and restores file descriptors. Each kind keeps both
// halves in its own file, as CRIU keeps pipes.c and sk-unix.c: regular
// files, directories, devices, FIFOs and memfds (file.go), pipes
// (pipe.go), eventfd, epoll, timerfd and signalfd (event.go), sockets
// (socket.go, with socket_inet.go and socket_unix.go for each family),
// established TCP connections taken with TCP_REPAIR (tcp.go) under a
// network lock (netlock.go), descriptors leading outside the process (or
// the tree) that a restore is handed (external.go), and what the
// processes of a tree share (tree.go: DumpTree, MakeShared, Tree).
//
// Dump reads a frozen process's descriptors from /proc, sock_diag and,
// for what only a descriptor tells (buffered pipe bytes, queued socket
// data, socket options), copies taken with pidfd_getfd. Restore injects
// the system calls that recreate each object in the process under
// restore, at its number, through a ptrace.Injector. CheckRestorable and CheckFile
// refuse, before a restore creates anything, what it could not restore or
// what is no longer the file that was dumped.
//
// A descriptor the format cannot describe (an inotify instance, a pipe
// whose other end is outside the process, or the tree, and that External does not
// name, a deleted file) is refused at the dump with an error wrapping
// image.ErrUnsupported that names the process and the descriptor.
package fds
