package policy

// ZeroReadMax bounds what a read fault zero-fills as it doubles (see
// ZeroRead): 64 MiB of zero pages is 16,384 page table entries.
const ZeroReadMax = 64 << 20

// ZeroRead returns how much zero memory a read fault on page outside
// every extent is served, at most, from the page on: ZeroReadChunk, or
// for a fault within a chunk past the last read fault's zeros (a thread
// reading on through zero memory, or at a stride), twice as much as that
// one, up to ZeroReadMax: zero pages cost only their page table entries,
// and each fault a round trip.
func (pl *Planner) ZeroRead(page uint64) uint64 {
	chunk := pl.ZeroReadChunk
	if end := pl.zeroLo + pl.zeroLen; pl.zeroLen > 0 && page >= end && page < end+pl.zeroChunk {
		chunk = max(chunk, min(2*pl.zeroChunk, ZeroReadMax))
	}
	pl.zeroChunk = chunk
	return chunk
}

// Zeroed records that a read fault's zeros were mapped on [page, page+n).
func (pl *Planner) Zeroed(page, n uint64) { pl.zeroLo, pl.zeroLen = page, n }
