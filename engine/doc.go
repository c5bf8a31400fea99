// Package engine orchestrates dump and restore. It holds no resource's
// logic of its own: each kind of state has a package that both dumps and
// restores it, and the engine calls them in order.
//
//	engine/proc    reads /proc (the only package that parses it)
//	engine/ptrace  freezes threads and injects system calls into them
//	engine/mem     memory: which pages a snapshot keeps; map, fill, lock
//	engine/fds     file descriptors, one file per kind
//	engine/task    process and thread state: ids, credentials, signals,
//	               registers
//	engine/image   the snapshot format: writer, reader, manifest
//	engine/uffd    the lazy restore's pager (userfaultfd)
//
// Dump and Restore are tables of named steps (runSteps): each is timed and
// logged at debug level (snapctl -v), and an error is a *StepError naming
// the step that failed. A failed dump leaves the process running and the
// snapshot directory without a manifest; a failed restore kills what it
// created.
//
// A dump covers the process and all its descendants, a restore every
// process of the snapshot: tree.go, dump.go and restore_tree.go walk them
// in one order (parents first) and link what they share (fds.DumpTree,
// fds.MakeShared, mem.TreeObjects) through snapctl (broker).
//
// Restore can place the process in new pid, mount and network namespaces
// (RestoreOptions.Namespaces, restore_ns.go), its original pid kept inside
// and a small init its parent there (pidns_init.go), so that one snapshot
// restores many times at once.
//
// The lazy restore's pages come from an io.ReaderAt the caller gives
// (RestoreOptions.Lazy): a lazyfs mount's mem file or the snapshot's own
// reader; the engine does not know which.
package engine
