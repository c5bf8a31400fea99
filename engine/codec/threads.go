package codec

import "runtime"

// MinThreadBytes is the least decoded LZ4 output per decoding thread.
//
// Measured with BenchmarkThreadCrossover (one batch of heap-like records in
// 64 KiB LZ4 blocks, 2-vCPU guest, medians): two threads lose to one up to
// 256 KiB batches (the wake-up of the other vCPU costs ~20-25 µs), break
// even near 384 KiB, and win ×1.35 at 512 KiB, ×1.45 at 1 MiB, ×1.5 at
// 2 MiB and ×1.7 at 4 MiB. A thread therefore needs 1 MiB of output to pay
// for itself well, leaving the other CPU to the FUSE server or the restored
// process for smaller batches.
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
