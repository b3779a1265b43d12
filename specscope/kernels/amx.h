/* The weight formats every linear reads, and the AMX linears (cpu_amx.c) that cpu_decode.c's linear() calls for
   the two AMX formats. */
#ifndef SPECSCOPE_AMX_H
#define SPECSCOPE_AMX_H
#include <stdint.h>

/* dims[FORMAT] / dims[HEAD_FORMAT] (backend/forward/weight_blocks.py's FORMATS). F32 .. Q8_0 hold the float32
   weights exactly (cpu_decode.c); AMX_BF16 and AMX_Q4_1 are the AMX linears' bfloat16 weights (cpu_amx.c); I8_Q4_1
   and I8_Q8_0 the int8 linears' GGUF blocks, their outputs interleaved (cpu_int8.c, int8.h). */
enum { F32, F16, BF16, Q4_1, Q8_0, AMX_BF16, AMX_Q4_1, I8_Q4_1, I8_Q8_0 };
#define IS_AMX(format) ((format) == AMX_BF16 || (format) == AMX_Q4_1)
#define IS_INT8(format) ((format) == I8_Q4_1 || (format) == I8_Q8_0)
typedef struct { float d, m; uint8_t q[16]; } q4_1_block;

#define TILE_ROWS 16 /* rows of a tile: outputs of a weight tile, query rows of a row tile */
#define TILE_IN 32   /* bfloat16 inputs per tile row */
#define AMX_PADDED(rows) (((rows) + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS)

/* y[m, o] = sum_i w[o, i] x[m, i] for `rows` rows, w in `format` (AMX_BF16 or AMX_Q4_1; out a multiple of 16, in
   of 32). scratch: room for AMX_PADDED(rows) * in floats. */
void amx_linear(const void *w, int format, int out, int in, const float *x, int64_t ldx, float *y, int64_t ldy,
                int rows, uint16_t *scratch);

/* y[m] += scale * B (A x[m]) at the rows with on[m], in AVX512-BF16 dot products (a rank of 16 leaves a tile
   product nothing to amortize its row conversions and sum moves over): A [rank, in] row-major bfloat16, B in rank
   pairs, [rank / 2, out, 2] bfloat16; rank a multiple of 16, in of 32, out of 16. cpu_decode.c's add_lora with
   bf16 matmuls. Each row is summed alone, in the same order whatever the rows or threads. */
void amx_lora(const void *a, const void *b, int rank, float scale, int out, int in, const float *x, int64_t ldx,
              float *y, int64_t ldy, int rows, const uint8_t *on);
#endif
