// SPDX-License-Identifier: Apache-2.0

#include "textflag.h"

// func Read(b []byte)
TEXT ·Read(SB), NOSPLIT, $0-24
	MOVQ b_base+0(FP), AX
	MOVQ b_len+8(FP), CX
	ADDQ AX, CX
	ANDQ $~63, AX // from the line b starts in
read:
	CMPQ AX, CX
	JAE  readdone
	PREFETCHT0 (AX)
	ADDQ $64, AX
	JMP  read
readdone:
	RET

// func Write(b []byte)
TEXT ·Write(SB), NOSPLIT, $0-24
	MOVQ b_base+0(FP), AX
	MOVQ b_len+8(FP), CX
	ADDQ AX, CX
	ANDQ $~63, AX // from the line b starts in
write:
	CMPQ AX, CX
	JAE  writedone
	// PREFETCHW (AX): 0F 0D /1, which the Go assembler has no name for.
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08
	ADDQ $64, AX
	JMP  write
writedone:
	RET
