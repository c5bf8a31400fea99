// Package engine orchestrates dump and restore. It holds no resource's
// logic of its own: each kind of state has a package that both dumps and
// restores it, and the engine calls them in order.
//
//	engine/proc    reads /proc (the only package that parses it)
//	engine/ptrace  freezes threads and injects system calls into them
//	engine/mem     memory: which pages a snapshot keeps; map, fill, lock
//	engine/fds     file descriptors, one file per kind; the broker of
//	               what a tree's processes share
//	engine/task    process and thread state: ids, credentials, signals,
//	               registers; the pids a restore needs free
//	engine/ns      the namespaces a restore makes or joins
//	engine/lazy    the lazy phase of a restore: a pager per process,
//	               working sets, the keeper of their userfaultfds
//	engine/image   the snapshot format: writer, reader, manifest; the
//	               page sources of a lazy restore (image.PageSource)
//	engine/uffd    the pager itself (userfaultfd)
//
// Dump and Restore are tables of named steps (runSteps): each is timed and
// logged at debug level (snapctl -v), and an error is a *StepError naming
// the step that failed. A failed dump leaves the processes running and the
// snapshot directory without a manifest; a failed restore kills what it
// created.
//
// The unit of both is a process tree, as CRIU's pstree: a single process
// is a tree of one. tree.go orders the processes (parents first); dump.go
// freezes and reads them all; restore.go lists the restore's steps once,
// from Restore down: the tree's (restore_check.go, restore_create.go) and
// each process's (restore_mem.go, restore_thread.go), then the lazy
// phase. What processes share (an inherited open file description, a pipe
// or socket pair between two of them, a shared memory object) goes through
// snapctl (fds.Broker).
//
// Restore can place the tree in new pid, mount and network namespaces
// (RestoreOptions.Namespaces, engine/ns), the original pids kept inside
// and a small init the root's parent there, so that one snapshot restores
// many times at once.
//
// The lazy restore's pages come from the image.PageSource the caller
// gives (RestoreOptions.Source): the snapshot's files, a lazyfs mount of
// it or a private mount; the engine does not know which.
package engine
