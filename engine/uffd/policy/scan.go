package policy

// Scan is a thread's run of faults through memory in order, as the
// serving goroutine last saw it: where it started (Lo), where its last
// fault was served to (Front) and how far below its start the prefetcher
// has gone for it (Down). On: a scan was seen; a fault elsewhere that
// starts none (the interpreter between two arrays) leaves it on, the
// next scan replaces it.
type Scan struct {
	On              bool
	Lo, Front, Down uint64
	// Below is how far below Lo the prefetcher goes: ScanBelow, doubled
	// each time a scan starts in that window or right below it (a thread
	// going down a model's arrays, faulting where the prefetcher has not
	// been yet), as readahead grows its window on each hit.
	Below uint64
}

// ScanAhead is how far past a scan's front the prefetcher goes before it
// turns to the memory below the scan's start: the rest of the array being
// read (a layer's matrices are a few MiB), not the arrays above it, which
// the thread has read or reads last (a model's token embedding, read
// again by its output layer). The thread reads those megabytes in
// milliseconds; the prefetcher places them first and the chunks below in
// fewer. Once nothing is pending below within the scan's window
// (Scan.Below), it streams on past the front.
const ScanAhead = 8 << 20

// ScanBelow is how far below the start of a scan the prefetcher first
// fetches for it: the next array or two of a thread that reads arrays
// laid out at descending addresses (one mmap each, as malloc makes them
// for large arrays), each upwards, as a forward pass over a model's
// weights does. The window doubles while the thread's scans go on down
// (Scan.Start); further down, the memory is fetched in address order.
const ScanBelow = 32 << 20

// ScanBelowMax bounds Scan.Below, which doubles from ScanBelow.
const ScanBelowMax = 512 << 20

// Start records a scan that starts at lo.
func (sc *Scan) Start(lo uint64) {
	if sc.On && lo < sc.Lo && lo+sc.Below+ScanBelow >= sc.Lo {
		sc.Below = min(2*sc.Below, ScanBelowMax)
	} else {
		sc.Below = ScanBelow
	}
	sc.On, sc.Lo, sc.Down = true, lo, lo
}

// Follow records a scan fault of the run that started at runStart,
// served up to front: a scan that starts is followed above its front and
// below its start until another scan starts (a thread going through a
// model's arrays touches other memory between two of them).
func (sc *Scan) Follow(runStart, front uint64) {
	if !sc.On || sc.Lo != runStart {
		sc.Start(runStart)
	}
	sc.Front = front
}
