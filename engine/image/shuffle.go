package image

// FeatureShuffle is the format feature of snapshots with Shuffle blocks
// (block kind 3, codec.Shuffle: byte-shuffled planes, each raw, LZ4 or
// huff0). The writer adds it when it wrote one such block, so that a
// snapshot dumped with a shuffling codec whose memory had nothing to
// shuffle reads with older builds too.
const FeatureShuffle = "shuffle"

func init() { knownFeatures[FeatureShuffle] = true }
