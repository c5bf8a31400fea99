package fds

import "encoding/binary"

// epollEvent is struct epoll_event, packed on x86-64: 12 bytes.
func epollEvent(events uint32, data uint64) []byte {
	ev := make([]byte, 12)
	binary.LittleEndian.PutUint32(ev[0:], events)
	binary.LittleEndian.PutUint64(ev[4:], data)
	return ev
}
