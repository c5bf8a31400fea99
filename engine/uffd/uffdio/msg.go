package uffdio

import (
	"encoding/binary"
	"fmt"
)

// MsgSize is the size of struct uffd_msg.
const MsgSize = 32

// Event types of uffd_msg.
const (
	EventPagefault = 0x12
	EventFork      = 0x13
	EventRemap     = 0x14
	EventRemove    = 0x15
	EventUnmap     = 0x16
)

// Page-fault flags.
const (
	PagefaultFlagWrite = 1 << 0
	PagefaultFlagWP    = 1 << 1
	PagefaultFlagMinor = 1 << 2
)

// Msg is a decoded uffd_msg. Which fields are set depends on Event:
//
//	EventPagefault  Addr, Flags, TID (TID with FeatureThreadID)
//	EventFork       UFD: the child's userfaultfd, now in our fd table
//	EventRemap      From, To, Len
//	EventRemove     Start, End (madvise DONTNEED/FREE/REMOVE)
//	EventUnmap      Start, End
type Msg struct {
	Event      uint8
	Addr       uint64
	Flags      uint64
	TID        uint32
	UFD        int
	From, To   uint64
	Len        uint64
	Start, End uint64
}

// DecodeMsg decodes one uffd_msg (native byte order, which is the
// kernel's; the structure is packed and the same on every arch).
func DecodeMsg(b []byte) (Msg, error) {
	if len(b) < MsgSize {
		return Msg{}, fmt.Errorf("decode uffd_msg: %d bytes, want %d", len(b), MsgSize)
	}
	ne := binary.NativeEndian
	m := Msg{Event: b[0]}
	a, c, d := ne.Uint64(b[8:]), ne.Uint64(b[16:]), ne.Uint64(b[24:])
	switch m.Event {
	case EventPagefault:
		m.Flags, m.Addr, m.TID = a, c, ne.Uint32(b[24:])
	case EventFork:
		m.UFD = int(ne.Uint32(b[8:]))
	case EventRemap:
		m.From, m.To, m.Len = a, c, d
	case EventRemove, EventUnmap:
		m.Start, m.End = a, c
	default:
		return m, fmt.Errorf("decode uffd_msg: event %#x: %w", m.Event, ErrUnexpected)
	}
	return m, nil
}

func (m Msg) String() string {
	switch m.Event {
	case EventPagefault:
		return fmt.Sprintf("pagefault addr=%#x flags=%#x tid=%d", m.Addr, m.Flags, m.TID)
	case EventFork:
		return fmt.Sprintf("fork ufd=%d", m.UFD)
	case EventRemap:
		return fmt.Sprintf("remap %#x -> %#x len %#x", m.From, m.To, m.Len)
	case EventRemove:
		return fmt.Sprintf("remove %#x-%#x", m.Start, m.End)
	case EventUnmap:
		return fmt.Sprintf("unmap %#x-%#x", m.Start, m.End)
	}
	return fmt.Sprintf("event %#x", m.Event)
}
