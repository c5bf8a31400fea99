package codec

import "runtime"

// MinThreadBytes is the least decoded LZ4 output per decoding thread: below
// it, waking another thread costs more than it saves. Measured on a 2-vCPU
// guest with BenchmarkThreadCrossover (see decoder_bench_test.go): waking a
// goroutine on the other vCPU costs ~20-25 µs, and LZ4 decodes heap-like
// data at ~3 GB/s, so a second thread pays off from about 256 KiB of output
// and gives most of its ×1.9 from 1 MiB on.
const MinThreadBytes = 1 << 20

// Threads returns how many goroutines decode a batch whose LZ4 blocks
// decode to batchBytes bytes in lz4Blocks blocks, for the
// --decompress-threads value opt:
//
//	opt == 1 (or < 0)  one: serial
//	opt == 0           automatic: no more than the CPUs this process may
//	                   run on (affinity mask, and GOMAXPROCS)
//	opt > 1            an explicit maximum, not limited by the CPUs
//
// In every case there are no more threads than LZ4 blocks in the batch and
// no more than one per MinThreadBytes of LZ4 output: Zero and Raw blocks are
// a memset or a copy and do not justify a thread of their own (they are
// shared out among the threads the LZ4 blocks justify).
func Threads(opt int, batchBytes int64, lz4Blocks int) int {
	cpus := 1
	if opt == 0 {
		cpus = affinityCPUs()
	}
	return threads(opt, cpus, MinThreadBytes, batchBytes, lz4Blocks)
}

// threads is Threads with the CPU count and the least work per thread
// given (benchmarks measure the crossover with minBytes 1).
func threads(opt, cpus int, minBytes, batchBytes int64, lz4Blocks int) int {
	if opt == 1 || opt < 0 {
		return 1
	}
	limit := lz4Blocks
	if byWork := batchBytes / max(minBytes, 1); byWork < int64(limit) {
		limit = int(byWork)
	}
	if opt == 0 {
		limit = min(limit, cpus)
	} else {
		limit = min(limit, opt)
	}
	return max(limit, 1)
}

// affinityCPUs is the number of CPUs this process may run on.
func affinityCPUs() int {
	n := runtime.GOMAXPROCS(0)
	if a := schedCPUs(); a > 0 {
		n = min(n, a)
	}
	return max(n, 1)
}
