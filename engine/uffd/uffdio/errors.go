package uffdio

import "errors"

// Sentinel results of the fill ioctls (Copy, ZeroPage).
var (
	// ErrExist: the first page of the range is already present.
	ErrExist = errors.New("uffd: page already present")
	// ErrAgain: the address space is changing under a non-cooperative
	// event (fork, mremap, madvise, munmap) that is queued and unread.
	ErrAgain = errors.New("uffd: address space changing, read events and retry")
	// ErrShort: only part of the range was placed.
	ErrShort = errors.New("uffd: range placed in part")
	// ErrNoVMA: no registered VMA holds the whole range.
	ErrNoVMA = errors.New("uffd: range not in one registered VMA")
	// ErrGone: the process's address space no longer exists.
	ErrGone = errors.New("uffd: process address space gone")
	// ErrUnexpected: a message of a kind not decoded here (DecodeMsg), or
	// one the caller did not register for.
	ErrUnexpected = errors.New("unexpected userfaultfd message")
)
