// Package pagemap reads a process's page table state from
// /proc/PID/pagemap: which pages are present, swapped, file-backed,
// exclusively mapped, written since write protection was turned on.
//
// Open returns a Pagemap that answers in one of two ways: reading the
// file's 64-bit entries in bulk (MethodRead), or asking the kernel with the
// PAGEMAP_SCAN ioctl (MethodScan, Linux 6.7), which returns runs of pages
// by category without copying an entry per page. The scan is the default
// where the kernel has it (SetMethod changes it); either way Runs reports
// the runs of pages (Run) a Query selects by category.
// ReadEntries gives the raw entries. ReadFaultMapsZeroPage probes, with a
// page of the caller's own, whether a read fault maps the shared zero page
// on this kernel.
//
// Reading another process's pagemap needs PTRACE_MODE_READ on it. Page
// frame numbers are zero without CAP_SYS_ADMIN; nothing here depends on
// them. Entries read from a running process may be stale as soon as they
// are read: lazyfs reads a process whose threads are all ptrace-stopped.
package pagemap
