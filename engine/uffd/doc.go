// Package uffd serves a lazily restored process its memory through
// userfaultfd(2).
//
// # Layers
//
// The low layer is engine/uffd/uffdio: the userfaultfd ioctls (API,
// Register, Unregister, Copy, ZeroPage, Wake), the decoding of the 32-byte
// uffd_msg (Msg) and the sentinel errors a caller must tell apart
// (ErrExist, ErrAgain, ErrShort, ErrNoVMA, ErrGone). It knows nothing of
// the pager; engine/mem and engine/check use it alone.
//
// The policy is engine/uffd/policy: what a fault is served besides its own
// page (the rules under Serving below: its unit, a scan, the rest of an
// access, a stride, the working set's order, the latency hold, the zeros
// of a hole) is a pure function of the faults seen so far, a Planner the
// serving goroutine asks and then carries out. It has no descriptor, lock
// or clock, and is tested without userfaultfd.
//
// The high layer is the Pager. The restore code creates a userfaultfd
// inside the target (an injected syscall), takes it with pidfd_getfd,
// calls uffdio.API with uffdio.Features and registers the lazily restored
// anonymous private VMAs with uffdio.RegisterModeMissing. New then takes
// the fd, an io.ReaderAt that returns the snapshot's bytes at their
// virtual address (the lazyfs mount's MNT/<pid>/mem file, or an image
// reader), and the extents to serve (sorted, non-overlapping, page
// aligned; normally one image block clipped to its VMA). Run serves until
// every extent has been placed or dropped by an event. The pager knows
// nothing about the image format.
//
// # Serving
//
//   - A fault at an address inside a pending extent is served with the whole
//     extent (at most MaxFaultBytes around the address) in one UFFDIO_COPY,
//     or with less if Options.Unit says the source reads and checks a
//     smaller unit on its own (the few pages around the address, in a
//     block whose pages have checksums of their own): a thread that reads
//     a page here and there waits for that page, not for its block.
//     The second fault in a row on the page right after what the one
//     before brought in (or after memory already in place that follows
//     it), or a fault at the prefetcher's front (a thread reading through
//     memory the prefetcher has not reached), is a scan: it is served the
//     pending memory that follows as well, up to FaultAhead (1 MiB) on,
//     past what is already in place and past holes between mappings: a scan of 4 KiB blocks then faults once
//     per MiB, not once per page; and the prefetcher's cursor moves to
//     where it ended, so that streaming goes on ahead of the reader, in
//     its order. One such fault alone is the rest of the access before it
//     (8 bytes across a page boundary fault on both pages). A thread that
//     touches a page every few blocks is not a scan: each of its faults
//     brings in its own unit.
//   - A thread touching memory at a constant stride (three faults at one
//     distance: a page every 400 KiB, a column of a matrix) is served the
//     next strides ahead of it after each of its faults, 4, then 8, up to
//     64 at a time, read from the source in parallel and placed in order
//     while it works: it faults once per batch instead of once per page.
//     Each stride brings in as many pages as one access was seen to reach.
//     A thread that jumps elsewhere and goes on at the same stride (one
//     array after another) resumes it there with its window after one
//     fault; its strides read ahead stop where they enter the memory the
//     run before the jump walked (arrays at descending addresses, as mmap
//     lays them out, each read upwards).
//   - A fault on a page of the working set still to fetch (Options.First:
//     the thread touches it in the recorded order faster than the
//     prefetcher places it) brings in the ranges that follow it in that
//     order, up to 1 MiB, and the prefetcher goes on after them.
//   - Faults come first: after a fault that is not part of a scan (the
//     thread waits on the latency of each), every prefetch worker but
//     one holds back for a few milliseconds, so that the thread and the
//     fault service are not left waiting for a CPU.
//     Pages found present (EEXIST) are skipped page by page; a range that
//     crosses a VMA boundary (the process split the VMA) is split in halves.
//   - A fault anywhere else in a registered VMA (a hole in the snapshot, a
//     page already served and since dropped by MADV_DONTNEED) is served
//     zeros, from the faulting page to the next pending extent: for a read
//     fault the zero page (UFFDIO_ZEROPAGE, only page table entries) on up
//     to ZeroReadChunk bytes (2 MiB), twice as much each time a read fault
//     follows the zeros the last one mapped, up to 64 MiB (a process
//     reading through zero memory, in order or at a stride, faults a few
//     times, not once per 2 MiB), for a write fault a copy of zeros (which
//     saves the copy-on-write fault that would follow) on up to ZeroChunk.
//   - With Options.Prefetch the pager streams every pending extent in
//     address order, in chunks of up to PrefetchChunk bytes. With
//     Options.Workers, that many threads each claim a chunk, read it and
//     place it, while the serving thread serves faults and events; without,
//     the serving thread copies chunks that a helper goroutine reads ahead
//     (ReadAhead), and reads the userfaultfd between two chunks, so that a
//     fault never waits behind more than one chunk. Workers are faster: on
//     two vCPUs, 1.2-1.4 GB/s against 0.9-1.1 from a source that computes
//     its bytes at LZ4 speed (BenchmarkPrefetch), and a lazy restore of 806
//     MiB all in after 0.37-0.44 s against 0.47-0.69 s. Every worker takes
//     a CPU from the process and the fault service, though: see
//     engine's lazyWorkers for the measured choice.
//
// Faults and events are handled by one goroutine locked to its OS thread
// (optionally pinned with Options.Affinity): on small machines a wakeup
// across CPUs costs tens of microseconds, more than copying 4 KiB.
// Options.Spin trades a busy CPU for fewer of those wakeups. A pager idle
// with pages pending probes every 100 ms whether the process still exists
// (no event reports an exit) with a copy that cannot place anything.
//
// Copies from several threads are kept right against events this way: the
// kernel refuses a copy (EAGAIN) while an event is queued and unread, but
// once the serving thread has read it the process goes on (zaps a
// MADV_DONTNEED range, say) before the event is applied to the pending
// set. So the serving thread reads and applies messages holding a
// read-write lock for writing, and every copy, with the look at the
// pending set it is based on, is made holding it for reading.
//
// # Events
//
// The userfaultfd must have the event features in uffdio.Features
// enabled; Run checks /proc/self/fdinfo and refuses one that has not
// (ErrFeatures), because without them the pager could serve snapshot data
// where the process has since dropped or moved its memory.
//
//   - REMOVE (madvise DONTNEED/FREE/REMOVE): the range reads as zeros from
//     now on; its pending pages are dropped. With Options.Shared (shared
//     memory, where DONTNEED keeps the pages) it ends Run with an error.
//   - UNMAP: the range's pending pages are dropped.
//   - REMAP (mremap): the range's pending pages move to the new address; the
//     source is still read at the old (snapshot) address.
//   - FORK: the child's userfaultfd (installed in our fd table by the read)
//     gets its own pager over the same source and a copy of the pending set
//     at fork time; Run returns once the parent and every child are done.
//
// The kernel refuses copies with EAGAIN while an event is queued and
// unread, so the pending set is always current when a copy lands: after any
// read, events are applied before the faults read with them are served, and
// a fault is always served according to the current state.
//
// # Errors
//
// A read error or short read from the source, or an unexpected ioctl error,
// ends Run with a *ServeError naming the address. The pager never places a
// page it could not read and never zero-fills a page that should hold data;
// the caller must then kill the process (tree). A forked child's
// userfaultfd is closed when the child has been fully served (or has
// exited); on error or cancellation it stays open, so the child blocks
// rather than reads zeros, until Close.
//
// # For the caller
//
// When Run returns nil, unregister and close the fd promptly: holes are
// still registered until then (their faults wait), and an event queued
// after Run decided to return blocks the process until the fd is closed.
// If Stats().Exited, the address space is gone: UFFDIO_UNREGISTER then
// fails (ENOMEM); just close.
//
// # Limits
//
// VMAs marked MADV_WIPEONFORK must not be registered: a child forked during
// the lazy phase would be served snapshot data where the kernel gives it
// zeros. Without Prefetch, Run ends only when every extent has faulted in
// (or the context ends).
//
// The fault-serving thread and the prefetch workers act on the same
// userfaultfd registrations and the same set of pages still missing,
// which must change under one lock and one set of rules: that is why they
// are one package. A server's state is grouped by what guards it (the
// serving goroutine's own, the pending set under pend.mu, the stats under
// stat.mu), and checklocks annotations (+checklocks) on the fields and
// on the functions that need a lock held say which, for a tool to check.
// The pending set itself, a plain data structure, is engine/uffd/pending;
// the keeper that holds copies of the userfaultfds, engine/uffd/keeper.
package uffd
