// Package proc reads what lazyfs needs to know about a process from /proc.
//
// Every file format has a parser that takes the file's bytes (or an
// io.Reader for files that can be large) and needs no privileges, so that it
// can be unit-tested on captured samples and fuzzed; a thin Read function
// beside it reads the live file for a pid. Parsers never panic on garbage,
// bound every count and length they accept, and report malformed input as an
// error wrapping ErrMalformed and limits exceeded as ErrTooLarge.
//
// The parsers of a process's /proc files are one package: they share the
// bounded-reading helpers and the malformed-input sentinels, and each file
// format is a file of its own. Readers that ask the kernel in other ways
// and what belongs to the kernel or a namespace rather than to a process
// are subpackages that use those sentinels: pagemap (page tables, also by
// ioctl), sockdiag (sockets, over netlink) and kernel (sysctls, System V
// IPC objects, mount tables, memory settings). Together they are the only
// code that parses /proc, a rule the rest of the tree keeps.
//
// # What is covered
//
//   - Memory map: ParseMaps, ParseSmaps, ReadMappings (Mapping, Perms,
//     VMFlags, Usage, Kind and the IsAnonPrivate / IsShmem / IsSpecial ...
//     helpers).
//   - Page table state: the subpackage pagemap reads /proc/PID/pagemap in
//     bulk or asks the kernel with the PAGEMAP_SCAN ioctl, and reports runs
//     of pages by category (present, swapped, file-mapped, ...).
//   - Process and task state: ParseStatus, ParseStat, ParseAuxv,
//     ParseLimits / Rlimits, comm, cmdline, cwd, root, exe, personality,
//     timer slack, tasks and children; Exists for whether a task id is
//     taken, zombies included.
//   - The kernel's own state: the subpackage kernel reads /proc/sys,
//     /proc/sysvipc and the memory settings under /sys.
//   - File descriptors: ReadFDs lists /proc/PID/fd with readlink targets,
//     classifies each (FDKind), parses /proc/PID/fdinfo/N (ParseFDInfo) and
//     stats the open file.
//   - Sockets: the subpackage sockdiag asks the kernel over netlink for
//     states, listen backlogs, pending connections and unix peers.
//   - Mounts: the subpackage kernel lists a mount namespace's mounts from
//     /proc/PID/mountinfo (Mounts).
//
// # Consistency
//
// /proc files are generated while they are read. For a running process two
// reads may disagree; lazyfs reads a process whose threads are all
// ptrace-stopped, where the memory map, fd table and page tables do not
// change between reads (the kernel may still reclaim or swap pages).
//
// # Privileges
//
// Reading another process's smaps, fdinfo, auxv and the mm fields of stat
// (and its pagemap, in the subpackage) needs PTRACE_MODE_READ on it (root,
// or the same user with a permissive Yama scope).
package proc
