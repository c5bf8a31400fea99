package uffdio

import (
	"encoding/binary"
	"errors"
	"testing"
)

func rawMsg(event byte, a, b, c uint64) []byte {
	buf := make([]byte, MsgSize)
	buf[0] = event
	binary.NativeEndian.PutUint64(buf[8:], a)
	binary.NativeEndian.PutUint64(buf[16:], b)
	binary.NativeEndian.PutUint64(buf[24:], c)
	return buf
}

func TestDecodeMsg(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want Msg
	}{
		{"pagefault", rawMsg(EventPagefault, PagefaultFlagWrite, 0x7f0000001234, 4242), Msg{Event: EventPagefault, Flags: PagefaultFlagWrite, Addr: 0x7f0000001234, TID: 4242}},
		{"fork", rawMsg(EventFork, 17, 0, 0), Msg{Event: EventFork, UFD: 17}},
		{"remap", rawMsg(EventRemap, 0x1000, 0x9000, 0x3000), Msg{Event: EventRemap, From: 0x1000, To: 0x9000, Len: 0x3000}},
		{"remove", rawMsg(EventRemove, 0x1000, 0x5000, 0), Msg{Event: EventRemove, Start: 0x1000, End: 0x5000}},
		{"unmap", rawMsg(EventUnmap, 0x2000, 0x4000, 0), Msg{Event: EventUnmap, Start: 0x2000, End: 0x4000}},
	} {
		got, err := DecodeMsg(tc.b)
		if err != nil || got != tc.want {
			t.Errorf("%s: DecodeMsg = %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
		if got.String() == "" {
			t.Errorf("%s: empty String", tc.name)
		}
	}
	if _, err := DecodeMsg(make([]byte, 31)); err == nil {
		t.Error("short message decoded")
	}
	if _, err := DecodeMsg(rawMsg(0x42, 0, 0, 0)); !errors.Is(err, ErrUnexpected) {
		t.Errorf("unknown event: err %v, want ErrUnexpected", err)
	}
}
