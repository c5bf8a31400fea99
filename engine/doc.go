// Package engine orchestrates dump and restore: it freezes a process with
// engine/ptrace, reads its state through engine/proc, writes and reads
// snapshots with engine/image, and serves lazy restores with engine/uffd.
//
// Dump and Restore are lists of named steps; an error names the step that
// failed. A failed dump leaves the process running and the snapshot
// directory without a manifest; a failed restore kills what it created.
package engine
