package codec

import "math"

// Choosing a block's shuffle on a sample. Trying both element sizes on
// the whole block, each plane with LZ4 or huff0, costs 10-20 times what
// plain LZ4 does, much of it compressing planes that end up raw and
// shuffles that end up not kept. The encoder first measures a sample of
// the block (samplePieces pieces of samplePiece bytes spread over it):
// the entropy of each plane, shuffled by each element size, which a
// histogram gives at the speed of memory. It then encodes the whole
// block with the one element size that looks best, stores raw without
// trying them the planes that look like noise, and does not try the
// shuffle at all on a block that cannot come near the 12.5% the rule
// asks. (LZ4 itself on a sample says little: it needs the history of a
// whole plane to find its matches.) Plain LZ4 of the whole block is
// always tried, cheap on memory it cannot compress, so that the rule's
// choice between Raw and LZ4 never depends on the sample: only whether
// and how a block shuffles does.

const (
	samplePieces = 4
	samplePiece  = 4 << 10
	sampleLen    = samplePieces * samplePiece
	// sampleMin: blocks below this are tried whole, both element sizes.
	sampleMin = 16 * samplePiece
	// sampleTry: a block whose estimate is not below this ratio (the
	// rule keeps a block below 7/8) is not tried shuffled.
	sampleTry = 0.90
	// sampleRawBits: a plane of at least this entropy (bits per byte)
	// is stored raw without trying.
	sampleRawBits = 7.6
	// sampleLZ4Overhead is added to a plane's entropy ratio to estimate
	// its LZ4 ratio (LZ4 codes no entropy, only repeats: a plane of
	// sign and exponent bytes, 2.7 bits of entropy, stores 0.66 of
	// itself with LZ4, 0.34 with huff0).
	sampleLZ4Overhead = 0.3
	// sampleTie: a larger element size is chosen only if its estimate
	// is lower by this much.
	sampleTie = 0.01
)

// shufflePlan is what the sample says to try on the whole block: the
// element size (0: no shuffle) and the planes to store raw (bit j).
type shufflePlan struct {
	elem int
	raw  uint8
}

// planShuffle looks at a sample of src (len(src) >= sampleMin): for each
// element size, the order-0 entropy of each plane of the shuffled
// sample, from which it estimates what the plane would store with
// method. It returns the element size whose estimate is the smallest,
// and as raw the planes so close to noise that no method would shrink
// them. lz4Kept says plain LZ4 of the whole block was kept: LZ4 then
// finds repeats that the entropy does not measure, and the block is
// tried shuffled whatever the estimate; otherwise a block whose estimate
// is not below sampleTry is not tried shuffled.
func (e *Encoder) planShuffle(src []byte, method int, lz4Kept bool) shufflePlan {
	if cap(e.sample) < 2*sampleLen {
		e.sample = make([]byte, 2*sampleLen)
	}
	sample, planes := e.sample[:sampleLen], e.sample[sampleLen:2*sampleLen]
	step := len(src) / samplePieces &^ 7
	for i := range samplePieces {
		copy(sample[i*samplePiece:(i+1)*samplePiece], src[i*step:])
	}
	best := shufflePlan{}
	bestEst := 2.0
	for _, elem := range shuffleElems {
		shuffle(planes, sample, elem)
		n := sampleLen / elem
		var raw uint8
		est := 0.0
		for j := range elem {
			h := entropy(planes[j*n : (j+1)*n])
			if h >= sampleRawBits {
				raw |= 1 << j
			}
			r := h / 8
			if method == planeLZ4 {
				r += sampleLZ4Overhead
			}
			if r >= 7.0/8 {
				r = 1
			}
			est += r / float64(elem)
		}
		// A larger element size must do clearly better: its planes are
		// shorter, which costs LZ4 matches.
		if est < bestEst-sampleTie {
			best, bestEst = shufflePlan{elem: elem, raw: raw}, est
		}
	}
	if !lz4Kept && bestEst >= sampleTry {
		return shufflePlan{}
	}
	return best
}

// entropy returns the order-0 entropy of p in bits per byte.
func entropy(p []byte) float64 {
	var hist [256]int
	for _, b := range p {
		hist[b]++
	}
	n := float64(len(p))
	h := 0.0
	for _, c := range hist {
		if c > 0 {
			q := float64(c) / n
			h -= q * math.Log2(q)
		}
	}
	return h
}
