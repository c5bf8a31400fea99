// Package mem dumps and restores the memory of a process: which mappings
// a snapshot describes and which of their pages it keeps (Dump, VMAs), and
// at restore how they are mapped again (Map), filled (Fill) and locked
// (Lock). The lazy half of a restore, serving pages on demand, is
// engine/uffd's; this package says which memory is lazy (Lazy).
//
// # Layers
//
// Pre-copy, the copying of a running process's memory before its dump,
// is engine/mem/precopy, which builds on this package; Dump takes its
// copy through the interface PreCopied and knows nothing more of it.
//
// What a restore asks of the process under restore goes through the
// narrow interfaces this package defines: Injector (system calls injected
// one at a time, data put in the process's scratch memory) and batch (the
// calls run together in one resume), which a *syscalls.Injector and its
// *syscalls.Calls satisfy. The package's tests put fakes in their place and
// check every call a layout asks for: its flags, protection and order.
// Mapped files and shared objects of a tree are opened through
// engine/fds, with Target.In.
//
// # Dump
//
// Private anonymous memory keeps its present and swapped pages, a
// private file mapping the pages it copied on write (the rest is the
// file's), and a shared anonymous or memfd object its data once, however
// many mappings it has.
//
// # Filling memory
//
// Most of an eager restore is page faults in the restored process: every
// page written is a fresh page the kernel allocates and zeroes, and a
// write through process_vm_writev or /proc/PID/mem faults it in on the
// writing thread. So the writes run on several goroutines at once. Better
// still, anonymous private memory is placed with UFFDIO_COPY: the kernel
// allocates each page and copies into it, with no fault and no zeroing.
// The process's anonymous VMAs are registered with a userfaultfd made
// inside it for the time of the fill; where userfaultfd is refused, and
// for other memory, the writes go through process_vm_writev, or
// /proc/PID/mem for mappings without write permission. Raw blocks, most of
// a snapshot of incompressible memory, are read by the writer itself,
// straight from the pages file, checked against their CRC32C and written:
// no decoder stage between. The other blocks (LZ4) are decoded in batches
// by codec.DecodeBlocks (with the restore's --decompress-threads) and
// handed to the same writers. Zero blocks are not written where the fresh
// mapping already reads as zeros. test/bench/BENCHMARKS.md has the
// measurements behind these choices.
package mem
