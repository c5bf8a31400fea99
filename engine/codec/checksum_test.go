package codec

import "testing"

// Checksum is CRC32C, and its streaming forms agree with it.
func TestChecksum(t *testing.T) {
	b := []byte("123456789")
	if got := Checksum(b); got != 0xe3069283 { // the CRC-32C check value
		t.Fatalf("Checksum(123456789) = %#x, want 0xe3069283", got)
	}
	crc := uint32(0)
	for i := range b {
		crc = UpdateChecksum(crc, b[i:i+1])
	}
	if crc != Checksum(b) {
		t.Errorf("UpdateChecksum byte by byte = %#x, want %#x", crc, Checksum(b))
	}
	h := NewChecksum()
	h.Write(b[:4])
	h.Write(b[4:])
	if h.Sum32() != Checksum(b) {
		t.Errorf("NewChecksum = %#x, want %#x", h.Sum32(), Checksum(b))
	}
}
