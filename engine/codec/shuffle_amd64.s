#include "textflag.h"

// func unshuffle2SSE2(dst, p0, p1 *byte, n int)
// n is a multiple of 16 and at least 16.
TEXT ·unshuffle2SSE2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX

loop2:
	MOVOU (SI), X0
	MOVOU (DX), X1
	MOVOU X0, X2
	PUNPCKLBW X1, X0 // a0 b0 a1 b1 ... a7 b7
	PUNPCKHBW X1, X2 // a8 b8 ... a15 b15
	MOVOU X0, (DI)
	MOVOU X2, 16(DI)
	ADDQ $16, SI
	ADDQ $16, DX
	ADDQ $32, DI
	DECQ CX
	JNZ  loop2
	RET

// func unshuffle4SSE2(dst, p0, p1, p2, p3 *byte, n int)
// n is a multiple of 16 and at least 16.
TEXT ·unshuffle4SSE2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), DX
	MOVQ p2+24(FP), R8
	MOVQ p3+32(FP), R9
	MOVQ n+40(FP), CX
	SHRQ $4, CX

loop4:
	MOVOU (SI), X0
	MOVOU (DX), X1
	MOVOU (R8), X2
	MOVOU (R9), X3
	MOVOU X0, X4
	PUNPCKLBW X1, X0 // a0 b0 ... a7 b7
	PUNPCKHBW X1, X4 // a8 b8 ... a15 b15
	MOVOU X2, X5
	PUNPCKLBW X3, X2 // c0 d0 ... c7 d7
	PUNPCKHBW X3, X5 // c8 d8 ... c15 d15
	MOVOU X0, X1
	PUNPCKLWL X2, X0 // elements 0-3
	PUNPCKHWL X2, X1 // elements 4-7
	MOVOU X4, X3
	PUNPCKLWL X5, X4 // elements 8-11
	PUNPCKHWL X5, X3 // elements 12-15
	MOVOU X0, (DI)
	MOVOU X1, 16(DI)
	MOVOU X4, 32(DI)
	MOVOU X3, 48(DI)
	ADDQ $16, SI
	ADDQ $16, DX
	ADDQ $16, R8
	ADDQ $16, R9
	ADDQ $64, DI
	DECQ CX
	JNZ  loop4
	RET
