package codec

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks report MB/s of decoded (original) bytes. Run them with a short
// -benchtime; the inputs are generated once per data kind.

const benchInput = 16 << 20

var benchData = struct {
	sync.Mutex
	m map[string][]byte
}{m: map[string][]byte{}}

func benchInputOf(kind dataKind, n int) []byte {
	benchData.Lock()
	defer benchData.Unlock()
	key := fmt.Sprint(kind, n)
	if b, ok := benchData.m[key]; ok {
		return b
	}
	b := genData(kind, n, 42)
	benchData.m[key] = b
	return b
}

// BenchmarkEncode is one core applying the block rule and the CRC, as each
// Pipeline worker does.
func BenchmarkEncode(b *testing.B) {
	for _, kind := range allDataKinds {
		data := benchInputOf(kind, benchInput)
		for _, bs := range blockSizes {
			b.Run(fmt.Sprintf("%s/%s", kind, sizeName(bs)), func(b *testing.B) {
				var enc Encoder
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					for off := 0; off < len(data); off += bs {
						blk := data[off : off+bs]
						enc.Encode(blk, Compress)
						Checksum(blk)
					}
				}
			})
		}
	}
}

// BenchmarkDecode is one core decoding and checking every block
// (DecodeChecked), as each DecodeBlocks thread does.
func BenchmarkDecode(b *testing.B) {
	for _, kind := range allDataKinds {
		data := benchInputOf(kind, benchInput)
		for _, bs := range blockSizes {
			b.Run(fmt.Sprintf("%s/%s", kind, sizeName(bs)), func(b *testing.B) {
				type stored struct {
					kind Kind
					b    []byte
					crc  uint32
				}
				var blocks []stored
				for off := 0; off < len(data); off += bs {
					k, s := Encode(nil, data[off:off+bs], Compress)
					blocks = append(blocks, stored{k, s, Checksum(data[off : off+bs])})
				}
				dst := make([]byte, bs)
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					for _, s := range blocks {
						if err := DecodeChecked(dst, s.kind, s.b, s.crc); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkPipeline encodes through a Pipeline with 1 and 2 workers.
func BenchmarkPipeline(b *testing.B) {
	for _, kind := range []dataKind{dataMixed, dataRecords} {
		data := benchInputOf(kind, 4*benchInput)
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/256K/workers%d", kind, workers), func(b *testing.B) {
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					p := NewPipeline(context.Background(), PipelineOptions{Workers: workers},
						func(*Encoded) error { return nil })
					for off := 0; off < len(data); off += DefaultBlockSize {
						if err := p.Submit(data[off:off+DefaultBlockSize], nil); err != nil {
							b.Fatal(err)
						}
					}
					if err := p.Close(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecodeBlocks decodes 64 MiB at the default block size from an
// in-memory ReaderAt with 1, 2 and automatic threads, beside a plain copy
// of the same bytes as the reference.
func BenchmarkDecodeBlocks(b *testing.B) {
	for _, kind := range []dataKind{dataMixed, dataRecords} {
		data := benchInputOf(kind, 64<<20)
		e := encodeAll(b, data, DefaultBlockSize, 0, Compress)
		for _, threads := range []int{1, 2, 0} {
			b.Run(fmt.Sprintf("%s/threads%d", kind, threads), func(b *testing.B) {
				src := bytes.NewReader(e.pages)
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					err := DecodeBlocks(context.Background(), src, e.blocks, DecodeOptions{Threads: threads},
						func(int, [][]byte) error { return nil })
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(fmt.Sprintf("%s/copy", kind), func(b *testing.B) {
			dst := make([]byte, len(data))
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				copy(dst, data)
			}
		})
	}
}

// BenchmarkThreadCrossover decodes one batch of heap-like records (LZ4
// blocks of 64 KiB) already in memory, with one thread or two regardless of
// MinThreadBytes: the batch size where two threads start to win is where
// MinThreadBytes belongs. Each iteration pays the wake-up of the second
// thread, as every batch does.
func BenchmarkThreadCrossover(b *testing.B) {
	const bs = 64 << 10
	data := benchInputOf(dataRecords, 4<<20)
	e := encodeAll(b, data, bs, 0, Compress)
	for _, size := range []int{128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("batch%s/threads%d", sizeName(size), threads), func(b *testing.B) {
				d := &decoder{src: bytes.NewReader(e.pages), blocks: e.blocks[:size/bs],
					threads: threads, minThread: 1, batchBytes: size}
				var bt batch
				ctx := context.Background()
				if d.fill(ctx, &bt, 0); bt.err != nil || len(bt.blocks) != size/bs {
					b.Fatalf("fill: %d blocks, %v", len(bt.blocks), bt.err)
				}
				b.SetBytes(int64(size))
				for b.Loop() {
					if n, err := d.decode(ctx, &bt); err != nil || n != len(bt.blocks) {
						b.Fatal(n, err)
					}
				}
			})
		}
	}
}

// codecKinds are the memory the codec benchmarks compare the modes on:
// trained weights as bf16 and float32, and heap records.
var codecKinds = []dataKind{dataBF16Normal, dataF32Normal, dataRecords}

// BenchmarkCodecDecode is one core decoding and checking 256 KiB blocks
// (DecodeChecked) of each codec, as each DecodeBlocks thread does. It
// reports the ratio of stored to original bytes; MB/s are of decoded
// bytes.
func BenchmarkCodecDecode(b *testing.B) {
	for _, kind := range codecKinds {
		data := benchInputOf(kind, benchInput)
		for _, mode := range []Mode{Compress, ShuffleLZ4, ShuffleHuff} {
			b.Run(fmt.Sprintf("%s/%s", kind, mode), func(b *testing.B) {
				type stored struct {
					kind Kind
					b    []byte
					crc  uint32
				}
				var blocks []stored
				total := 0
				for off := 0; off < len(data); off += DefaultBlockSize {
					src := data[off : off+DefaultBlockSize]
					k, s := Encode(nil, src, mode)
					blocks = append(blocks, stored{k, s, Checksum(src)})
					total += len(s)
				}
				dst := make([]byte, DefaultBlockSize)
				b.SetBytes(int64(len(data)))
				cpu := startThreadCPU()
				n := 0
				for b.Loop() {
					for _, s := range blocks {
						if err := DecodeChecked(dst, s.kind, s.b, s.crc); err != nil {
							b.Fatal(err)
						}
					}
					n++
				}
				b.ReportMetric(float64(total)/float64(len(data)), "ratio")
				cpu.report(b, int64(n*len(data)))
			})
		}
	}
}

// BenchmarkCodecEncode is one core encoding 256 KiB blocks with each
// codec and taking their CRC, as each Pipeline worker does.
func BenchmarkCodecEncode(b *testing.B) {
	for _, kind := range codecKinds {
		data := benchInputOf(kind, benchInput)
		for _, mode := range []Mode{Compress, ShuffleLZ4, ShuffleHuff} {
			b.Run(fmt.Sprintf("%s/%s", kind, mode), func(b *testing.B) {
				var enc Encoder
				b.SetBytes(int64(len(data)))
				cpu := startThreadCPU()
				n := 0
				for b.Loop() {
					for off := 0; off < len(data); off += DefaultBlockSize {
						blk := data[off : off+DefaultBlockSize]
						enc.Encode(blk, mode)
						Checksum(blk)
					}
					n++
				}
				cpu.report(b, int64(n*len(data)))
			})
		}
	}
}

// threadCPU measures the CPU time of the benchmark's thread, so that a
// rate per core holds on a machine whose other tenants take the CPUs:
// wall-clock MB/s then measure the neighbours.
type threadCPU struct{ start time.Duration }

func threadTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startThreadCPU locks the goroutine to its thread (until the benchmark
// function returns) and starts measuring.
func startThreadCPU() threadCPU {
	runtime.LockOSThread()
	return threadCPU{threadTime()}
}

// report adds the metric "MB/cpu-s": bytes per second of the thread's CPU
// time.
func (c threadCPU) report(b *testing.B, bytes int64) {
	if d := threadTime() - c.start; d > 0 {
		b.ReportMetric(float64(bytes)/1e6/d.Seconds(), "MB/cpu-s")
	}
	runtime.UnlockOSThread()
}
