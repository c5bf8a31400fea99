package codec

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
)

// TestPipelineInParent: blocks the InParent hook claims are emitted as
// Parent blocks with their CRC32C and nothing stored; zero blocks are
// never asked about; others are encoded; an error of the hook stops the
// pipeline.
func TestPipelineInParent(t *testing.T) {
	data := genData(dataRecords, 16*PageSize, 1)
	clear(data[4*PageSize : 8*PageSize])
	var mu sync.Mutex // the hook is asked on every encoding goroutine at once
	asked := map[int]bool{}
	var got []Encoded
	p := NewPipeline(context.Background(), PipelineOptions{Workers: 2, Mode: Compress, PageChecksums: true,
		InParent: func(src []byte, crc uint32, tag any) (bool, error) {
			if crc != Checksum(src) {
				t.Errorf("block %d: crc %08x, not its CRC32C", tag, crc)
			}
			mu.Lock()
			asked[tag.(int)] = true
			mu.Unlock()
			return tag.(int)%2 == 0, nil
		}}, func(e *Encoded) error {
		c := *e
		c.Stored = bytes.Clone(e.Stored)
		got = append(got, c)
		return nil
	})
	for i := range 4 {
		if err := p.Submit(data[i*4*PageSize:(i+1)*4*PageSize], i); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for i, e := range got {
		src := data[i*4*PageSize : (i+1)*4*PageSize]
		switch {
		case i == 1:
			if e.Kind != Zero || asked[1] {
				t.Errorf("zero block: kind %s, asked %v", e.Kind, asked[1])
			}
		case i%2 == 0:
			if e.Kind != Parent || e.Stored != nil || e.CRC != Checksum(src) || len(e.PageCRCs) != 0 {
				t.Errorf("block %d: %s, %d stored, crc %08x", i, e.Kind, len(e.Stored), e.CRC)
			}
		default:
			if e.Kind == Parent || e.Kind == Zero || e.CRC != Checksum(src) {
				t.Errorf("block %d: %s", i, e.Kind)
			}
		}
	}
	if err := Decode(make([]byte, PageSize), Parent, nil); !errors.Is(err, ErrUndecodable) {
		t.Errorf("Decode of a Parent block: %v", err)
	}

	boom := errors.New("boom")
	p = NewPipeline(context.Background(), PipelineOptions{InParent: func([]byte, uint32, any) (bool, error) { return false, boom }},
		func(*Encoded) error { return nil })
	p.Submit(data[:4*PageSize], 0)
	if err := p.Close(); !errors.Is(err, boom) {
		t.Errorf("an error of InParent: Close returned %v", err)
	}
}
