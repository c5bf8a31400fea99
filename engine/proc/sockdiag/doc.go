// Package sockdiag asks the kernel about a process's sockets over the
// NETLINK_SOCK_DIAG netlink family: QueryInet and QueryUnix list the inet
// and unix sockets of a process's network namespace with their states,
// listen backlogs, pending connections and unix peers, which /proc does not
// show.
//
// The reply parsers, ParseInetDiag and ParseUnixDiag, take the bytes of a
// batch of netlink messages and need no privileges, so that they can be
// unit-tested and fuzzed. Like the parsers of package proc they never panic
// on garbage, bound every count they accept, and report malformed input as
// an error wrapping proc.ErrMalformed and limits exceeded as
// proc.ErrTooLarge.
//
// Querying a network namespace other than the caller's needs CAP_SYS_ADMIN
// (setns).
package sockdiag
