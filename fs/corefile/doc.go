// Package corefile lays out and reads the ELF core file of one process of
// a snapshot, as gdb and readelf read a core the kernel wrote: the
// headers and notes built from the process's saved state, and one PT_LOAD
// per VMA whose bytes are read through the process's image.Reader when
// the file is read. A lazyfs mount serves it as MNT/PID/core (package
// fs); the layout and what each VMA contributes are described at File.
//
// core.go lays the file out and reads it; core_amd64.go writes the
// x86-64 structures of its notes; vdso.go serves the vDSO, which a
// snapshot does not hold, from the reading process's own when the
// snapshot was taken on a kernel of the same release.
package corefile
