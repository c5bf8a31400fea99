// Package kernel reads state that belongs to the kernel (or to a
// namespace) rather than to one process: kernel parameters under /proc/sys
// (Sysctl, SysctlInt), the System V IPC objects of our IPC namespace from
// /proc/sysvipc (ReadSysVShm, ReadSysVSem, ReadSysVMsg), the mounts of a
// mount namespace from /proc/PID/mountinfo (Mounts), and the memory
// settings under /sys that change how fast memory is placed (ReadTHP,
// FreePageReporting).
//
// Like package proc's, its parsers bound what they read and report
// malformed input as an error wrapping proc.ErrMalformed and limits
// exceeded as proc.ErrTooLarge.
package kernel
