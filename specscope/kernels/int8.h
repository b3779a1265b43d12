/* The int8 linears (cpu_int8.c): rows quantized to int8 blocks of 32, dotted against weights in GGUF blocks with
   exact int32 sums, one vector ISA chosen at run time. cpu_decode.c's linear() calls them for the two I8 formats. */
#ifndef SPECSCOPE_INT8_H
#define SPECSCOPE_INT8_H
#include <stdint.h>

/* The vector ISAs of the int8 dot products (dims[INT8_ISA]); every one gives the same numbers bit for bit. */
enum { I8_SCALAR, I8_AVX2, I8_AVX_VNNI, I8_AVX512_VNNI, I8_ISAS };

#define I8_GROUP 16 /* outputs a weight group interleaves: the lanes of one AVX-512 vector */
/* Bytes of one 32-input block of a weight group: Q4_1 (d[16], m[16] float32, then 4 x 64 code bytes), Q8_0 (d[16],
   then 8 x 64 int8 codes). Byte k of lane o of code vector p holds input 4p + k of output o: for Q4_1 in its low
   nibble, and input 16 + 4p + k in its high one. */
#define I8_Q4_1_BLOCK 384
#define I8_Q8_0_BLOCK 576
/* Scratch bytes int8_linear needs for `rows` rows of `in` inputs in up to 2 planes: the codes, and per block its
   scale, its codes' sum and their product. */
#define INT8_SCRATCH(rows, in) ((int64_t)(rows) * (in) * 2 + (int64_t)(rows) * ((in) / 32) * 12 + 64)
#endif
