// Package engine orchestrates dump and restore. It holds no resource's
// logic of its own: each kind of state has a package that both dumps and
// restores it (memory engine/mem, descriptors engine/fds, process and
// thread state engine/task, namespaces engine/ns, the lazy phase
// engine/lazy; docs/architecture.md), and the engine calls them in order.
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
// from Restore down: the tree's (restore_check.go, restore_create.go),
// each process's (restore_mem.go, restore_thread.go), then the lazy phase,
// whose pages come from the image.PageSource the caller gives (the
// snapshot's files, a lazyfs mount, a private mount: the engine does not
// know which). Restore can place the tree in new pid, mount and network
// namespaces, the original pids kept inside, so that one snapshot restores
// many times at once.
package engine
