// Package uffdio is the userfaultfd(2) kernel interface, and nothing
// more: the ioctls (API, Register, Unregister, Copy, ZeroPage, Wake), the
// reading and decoding of the 32-byte uffd_msg (ReadMsgs, Msg), and the
// feature, mode and ioctl bits of include/uapi/linux/userfaultfd.h.
//
// The results a caller must tell apart are sentinels: ErrExist (the first
// page of the range is already present), ErrAgain (the address space is
// changing under a non-cooperative event: read the pending events, then
// retry), ErrShort (the kernel stopped part way: retry the rest to learn
// why), ErrNoVMA (no registered VMA holds the whole range) and ErrGone
// (the process's address space is gone).
//
// The pager that serves a process its memory through these calls is
// engine/uffd; engine/mem and engine/check call them directly.
package uffdio
