package codec

// unshuffle2SSE2 and unshuffle4SSE2 interleave planes of n bytes each
// (n a multiple of 16) into dst with SSE2 unpack instructions, which every
// x86-64 CPU has (shuffle_amd64.s).
//
//go:noescape
func unshuffle2SSE2(dst, p0, p1 *byte, n int)

//go:noescape
func unshuffle4SSE2(dst, p0, p1, p2, p3 *byte, n int)

// unshuffleVector unshuffles the longest prefix of 16-element groups with
// SSE2 and returns how many elements it did.
func unshuffleVector(dst []byte, planes [][]byte) int {
	e := len(planes)
	n := len(dst) / e &^ 15
	if n == 0 {
		return 0
	}
	switch e {
	case 2:
		_, _ = planes[0][n-1], planes[1][n-1]
		_ = dst[2*n-1]
		unshuffle2SSE2(&dst[0], &planes[0][0], &planes[1][0], n)
	case 4:
		_, _, _, _ = planes[0][n-1], planes[1][n-1], planes[2][n-1], planes[3][n-1]
		_ = dst[4*n-1]
		unshuffle4SSE2(&dst[0], &planes[0][0], &planes[1][0], &planes[2][0], &planes[3][0], n)
	default:
		return 0
	}
	return n
}
