// Package precopy copies the memory of a process while it runs, so that
// the dump that follows (mem.Dump, with DumpOptions.PreCopy) need stop it
// only to copy what it wrote since the last copy (snapctl dump
// --pre-copy). Copy says how writes are tracked: asynchronous
// userfaultfd write-protection, read back with PAGEMAP_SCAN.
//
// It builds on engine/mem (the userfaultfd made inside the process,
// mem.UserfaultfdWith); mem knows a copy only through the interface
// mem.PreCopied, so the dependency runs one way.
package precopy
