/* One decode step of our decoder, fused for the CPU: independent query rows, each with its own prefix slots.
   A short causal chunk is a run of rows whose slot tables extend by one row each (backend/forward/fused_step.py):
   every row's K/V is written before any row attends, so each sees the rows before it. A row of a bidirectional
   block attends to its prefix slots and to every row of its block, from the step's own K/V, whether or not it
   writes them. One step may hold causal rows and blocks of any widths side by side.

   A 1-row forward of a small model is op-bound in eager PyTorch (some 200 dispatched ops per token, each a few
   microseconds); here every layer is one pass of plain loops, and each weight is streamed once per step for
   all rows. The arithmetic is the eager forward's (HF's RMSNorm, rotate-half RoPE, GQA softmax attention over
   the paged KV, SiLU-gated FFN) in float32, in another summation order. The weights stay in the checkpoint's
   own format (float16 / bfloat16 when every value is one, else float32) and are widened exactly on load:
   the same products as the float32 model, half the bytes to stream. Built with cpu_fold.c into one library
   (kernels/native.py); backend/forward/fused_step.py lays out the tables below. */
#include <limits.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "simd.h"
#include "amx.h"
#include "api.h"
#include "int8.h"

/* Weight formats (dims[FORMAT] for the projections, dims[HEAD_FORMAT] for the embedding and the head; the enum in
   amx.h): the checkpoint's own values, widened to float32 exactly where they are read. Q4_1 and Q8_0 hold rows of
   32-value blocks (the GGUF quantizations, their scales widened to float32; backend/forward/weight_blocks.py finds
   them in the float32 weights and packs them): Q4_1 value = d * q + m (q in 0..15, nibble j of block byte j % 16,
   low nibble for j < 16), Q8_0 value = d * q (int8 q). d * q is exact in float32, so either is the float32
   weight bit for bit. AMX_BF16 and AMX_Q4_1 are the formats that round: bfloat16 weights on AMX tiles, rows
   rounded to bfloat16 where they enter a linear (cpu_amx.c), on CPUs with AMX, when asked for. I8_Q4_1 and I8_Q8_0
   are the GGUF blocks of the int8 linears (cpu_int8.c), which round each row to int8 blocks where it enters a
   linear (in dims[INT8_PLANES] planes: 1, int8 codes; 2, 16-bit codes as two int8 planes), in the vector ISA
   dims[INT8_ISA] (int8.h). */
typedef struct { float d; int8_t q[32]; } q8_0_block;
/* Per-layer tensors, in this order, in the `tensors` table (0 = absent). Projections are row-major [out, in]
   in the weight format; norms and biases float32. */
enum { IN_NORM, POST_NORM, Q_NORM, K_NORM, WQ, WK, WV, WO, WGATE, WUP, WDOWN, BQ, BK, BV, BO, N_TENSORS };
/* The adapted projections, in the lora table's order: LORA_OF(WQ) = 0 .. LORA_OF(WDOWN) = 6. */
#define N_LORA 7
#define LORA_OF(name) ((name) - WQ)
/* Dimensions, in this order, in the `dims` table. */
enum { LAYERS, HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, FORMAT, HEAD_FORMAT, INT8_ISA, INT8_PLANES };

/* Weight rows are requested PREFETCH_AHEAD elements ahead of their loads, into L1 (locality 3) unless
   kernels/native.py asks for the non-temporal hint (locality 0, 256 ahead) on AMD CPUs: on an EPYC it measured ~8 %
   faster than no prefetch. On a Sapphire Rapids Xeon that hint made a token 2.2x slower (1550 vs 690 us), and t0
   at 1024 elements was the best there, 6 % ahead of no explicit prefetch (per-token time of `specscope bench
   --modes ar --no-peer`, one build against the other; docs/performance.md). */
#ifndef PREFETCH_LOCALITY
#define PREFETCH_LOCALITY 3
#endif
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 1024
#endif

/* Work (multiply-adds) below which a linear runs on one thread: a parallel region costs a few microseconds. Threads
   split a linear's outputs, so every output is summed as on one thread and the numbers do not depend on their
   count. */
#define PARALLEL_MIN 32768
#define LORA_OUTS 64   /* an adapter's B outputs a thread takes at a time (a multiple of every VW) */

/* Query rows that share each weight load on the streaming pass: their accumulators (ROW_BLOCK x 4 vectors, one
   vector step at a time) and the 4 weight vectors stay in registers (16 on AVX2, where the x loads are the FMAs'
   memory operands). */
#if VW == 8
#define ROW_BLOCK 3
#else
#define ROW_BLOCK 4
#endif
/* Forwards of fewer than WIDE_ROWS rows are memory-bound: the streaming pass reads each 4 weight rows once,
   widening them in registers, for all the rows. On AVX2, wider forwards are compute-bound: for float32 and the
   block formats a linear then widens TILE_OUTS weight rows at a time into a float32 tile (float32 rows are read
   where they are), once per forward, and runs each query row over it with every vector step in one loop: 12
   accumulators (6 outputs x 2 steps) and 14 contiguous loads per 12 FMAs (the streaming pass's 4 x 3 loads 24:
   the compiler reloads the weights per row). On an AVX2 EPYC an 8-row forward of the default model took 35-37 ms
   this way, against 44-62 ms with 6 outputs x 2 rows one vector step at a time, and 60 ms on the streaming pass
   over float32 copies. With AVX-512's 32 registers the streaming pass keeps 4 rows x 4 outputs in registers and
   stays ahead at any row count: on an AVX-512 EPYC, 8 rows took 13-14 ms on it against 18-24 ms over the tiles
   (docs/performance.md). Float16 and bfloat16 widen in one instruction and stay on the streaming pass: on the
   tiny model's 256-wide rows the tiles were slower (isd 497 against 614 tok/s). */
#if VW == 8
#define WIDE_ROWS 4
#else
#define WIDE_ROWS INT_MAX
#endif
#define TILE_OUTS 6
#ifdef _OPENMP
#define THREAD omp_get_thread_num()
#else
#define THREAD 0
#endif

/* Per format: the bytes of a row of `in` values, the address of value i of a row (for prefetches), the VW values
   from value j (a multiple of VW) and value k alone (a row's tail). */
#define F32_BYTES(in) ((int64_t)(in) * 4)
#define F32_AT(row, i) ((row) + (int64_t)(i) * 4)
#define F32_LOAD(row, j) vload((const float *)(row) + (j))
#define F32_VALUE(row, k) (((const float *)(row))[k])
#define F16_BYTES(in) ((int64_t)(in) * 2)
#define F16_AT(row, i) ((row) + (int64_t)(i) * 2)
#define F16_LOAD(row, j) vload_f16((const uint16_t *)(row) + (j))
#define F16_VALUE(row, k) f16_value((const uint16_t *)(row) + (k))
#define BF16_LOAD(row, j) vload_bf16((const uint16_t *)(row) + (j))
#define BF16_VALUE(row, k) bf16_value((const uint16_t *)(row) + (k))
#define Q4_1_BYTES(in) ((int64_t)(in) / 32 * (int64_t)sizeof(q4_1_block))
#define Q4_1_AT(row, i) ((row) + (int64_t)(i) / 32 * (int64_t)sizeof(q4_1_block))
#define Q4_1_OF(row, j) ((const q4_1_block *)(row) + (j) / 32)
#define Q4_1_LOAD(row, j) vload_q4(Q4_1_OF(row, j)->q + ((j) & 15), (j) & 16, Q4_1_OF(row, j)->d, Q4_1_OF(row, j)->m)
#define Q4_1_VALUE(row, k) q4_value(Q4_1_OF(row, k), k)
#define Q8_0_BYTES(in) ((int64_t)(in) / 32 * (int64_t)sizeof(q8_0_block))
#define Q8_0_AT(row, i) ((row) + (int64_t)(i) / 32 * (int64_t)sizeof(q8_0_block))
#define Q8_0_OF(row, j) ((const q8_0_block *)(row) + (j) / 32)
#define Q8_0_LOAD(row, j) vload_q8(Q8_0_OF(row, j)->q + ((j) & 31), Q8_0_OF(row, j)->d)
#define Q8_0_VALUE(row, k) ((float)Q8_0_OF(row, k)->q[(k) & 31] * Q8_0_OF(row, k)->d)

static inline float q4_value(const q4_1_block *b, int64_t k) {
    return fmaf((float)((k & 16 ? b->q[k & 15] >> 4 : b->q[k & 15]) & 15), b->d, b->m);
}

/* y[o] = sum_i w[o, i] x[i] for one row over a wide forward's weight rows tr (float32, n of them real). Every
   output accumulates its products in the same order as the streaming pass and a lone row do: LANES partial sums
   over the vector steps, lane_sum, then the tail. */
static inline __attribute__((always_inline)) void wide_row(const float *const *tr, int n, int in, const float *x,
                                                           float *y) {
    vec acc[TILE_OUTS][STEPS];
    for (int r = 0; r < TILE_OUTS; r++)
        for (int u = 0; u < STEPS; u++) acc[r][u] = vzero();
    int i = 0;
    for (; i + LANES <= in; i += LANES)
        for (int u = 0; u < STEPS; u++) {
            vec xj = vload(x + i + u * VW);
            for (int r = 0; r < TILE_OUTS; r++) acc[r][u] = vfma(vload(tr[r] + i + u * VW), xj, acc[r][u]);
        }
    for (int r = 0; r < n; r++) {
        float s = lane_sum(acc[r]);
        for (int k = i; k < in; k++) s += tr[r][k] * x[k];
        y[r] = s;
    }
}

/* y[m, o] = sum_i w[o, i] x[m, i] for `rows` rows, each (row, output) summed in the same order whatever the
   rows' count, so a chunk row is the decode step's number bit for bit. The streaming pass: per 4 weight rows,
   ROW_BLOCK query rows share each weight load (and its widening), the weights prefetched ahead (see
   PREFETCH_LOCALITY). WIDE (float32, the block formats): from WIDE_ROWS rows on, over float32 tiles instead. */
#define DEFINE_LINEAR(NAME, BYTES, AT, LOAD, SCALAR, WIDE)                                                        \
    static inline __attribute__((always_inline)) void NAME##_block(const uint8_t *const *wr, int n, int in,   \
                                                                   const float *x, int64_t ldx, float *y, \
                                                                   int64_t ldy, int rb, int prefetch) {   \
        vec acc[ROW_BLOCK][4][STEPS];                                                                         \
        int i = 0;                                                                                            \
        for (int u = 0; u < STEPS; u++) { /* each vector step is its own chain: one at a time fits registers */ \
            vec part[ROW_BLOCK][4];                                                                           \
            for (int b = 0; b < rb; b++)                                                                      \
                for (int r = 0; r < 4; r++) part[b][r] = vzero();                                             \
            for (i = 0; i + LANES <= in; i += LANES) {                                                        \
                int j = i + u * VW;                                                                           \
                if (prefetch && u == 0)                                                                       \
                    for (int r = 0; r < 4; r++) __builtin_prefetch(AT(wr[r], i + PREFETCH_AHEAD), 0, PREFETCH_LOCALITY); \
                if (prefetch > 1 && u == 0) /* more row blocks follow: fetch the next 4 weight rows meanwhile */ \
                    for (int r = 0; r < 4; r++) __builtin_prefetch(AT(wr[r] + 4 * BYTES(in), i), 0, 3);          \
                vec w0 = LOAD(wr[0], j), w1 = LOAD(wr[1], j), w2 = LOAD(wr[2], j), w3 = LOAD(wr[3], j);   \
                for (int b = 0; b < rb; b++) {                                                                \
                    const float *xj = x + b * ldx + j;                                                        \
                    part[b][0] = vfma(w0, vload(xj), part[b][0]);                                             \
                    part[b][1] = vfma(w1, vload(xj), part[b][1]);                                             \
                    part[b][2] = vfma(w2, vload(xj), part[b][2]);                                             \
                    part[b][3] = vfma(w3, vload(xj), part[b][3]);                                             \
                }                                                                                             \
            }                                                                                                 \
            for (int b = 0; b < rb; b++)                                                                      \
                for (int r = 0; r < 4; r++) acc[b][r][u] = part[b][r];                                        \
        }                                                                                                     \
        for (int b = 0; b < rb; b++) {                                                                        \
            const float *xb = x + b * ldx;                                                                    \
            float s[4] = {lane_sum(acc[b][0]), lane_sum(acc[b][1]), lane_sum(acc[b][2]), lane_sum(acc[b][3])}; \
            for (int k = i; k < in; k++)                                                                      \
                for (int r = 0; r < 4; r++) s[r] += SCALAR(wr[r], k) * xb[k];                                \
            for (int r = 0; r < n; r++) y[b * ldy + r] = s[r];                                                \
        }                                                                                                     \
    }                                                                                                         \
    /* TILE_OUTS weight rows wr widened into tile [TILE_OUTS, in] (the values LOAD gives: exact). */         \
    static inline void NAME##_widen(const uint8_t *const *wr, int in, float *tile) {                          \
        for (int r = 0; r < TILE_OUTS; r++) {                                                                 \
            int j = 0;                                                                                        \
            for (; j + VW <= in; j += VW) vstore(tile + (int64_t)r * in + j, LOAD(wr[r], j));                 \
            for (; j < in; j++) tile[(int64_t)r * in + j] = SCALAR(wr[r], j);                                 \
        }                                                                                                     \
    }                                                                                                         \
    static void NAME##_wide(const void *w, int out, int in, const float *x, int64_t ldx, float *y,           \
                            int64_t ldy, int rows, float *tiles) {                                            \
        _Pragma("omp parallel if ((int64_t)out * in * rows >= PARALLEL_MIN)")                                  \
        {                                                                                                     \
            int direct = BYTES(1) == 4; /* float32 rows are their own tile */                                 \
            float *tile = direct ? NULL : tiles + (int64_t)THREAD * TILE_OUTS * in;                           \
            _Pragma("omp for schedule(static)")                                                                \
            for (int o = 0; o < out; o += TILE_OUTS) {                                                        \
                int n = out - o < TILE_OUTS ? out - o : TILE_OUTS;                                            \
                const uint8_t *wr[TILE_OUTS];                                                                 \
                const float *tr[TILE_OUTS];                                                                   \
                for (int r = 0; r < TILE_OUTS; r++) wr[r] = (const uint8_t *)w + (o + (r < n ? r : 0)) * BYTES(in); \
                if (!direct) NAME##_widen(wr, in, tile);                                                      \
                for (int r = 0; r < TILE_OUTS; r++)                                                           \
                    tr[r] = direct ? (const float *)wr[r] : tile + (int64_t)(r < n ? r : 0) * in;             \
                for (int m = 0; m < rows; m++) wide_row(tr, n, in, x + m * ldx, y + m * ldy + o);             \
            }                                                                                                 \
        }                                                                                                     \
    }                                                                                                         \
    static void NAME(const void *w, int out, int in, const float *x, int64_t ldx, float *y, int64_t ldy,     \
                     int rows, float *tiles) {                                                              \
        if (WIDE && rows >= WIDE_ROWS) {                                                                      \
            NAME##_wide(w, out, in, x, ldx, y, ldy, rows, tiles);                                             \
            return;                                                                                           \
        }                                                                                                     \
        _Pragma("omp parallel for schedule(static) if ((int64_t)out * in * rows >= PARALLEL_MIN)")                \
        for (int o = 0; o < out; o += 4) {                                                                    \
            int n = out - o < 4 ? out - o : 4;                                                                \
            const uint8_t *wr[4];                                                                             \
            for (int r = 0; r < 4; r++) wr[r] = (const uint8_t *)w + (o + (r < n ? r : 0)) * BYTES(in);       \
            int m = 0;                                                                                        \
            for (; m + ROW_BLOCK <= rows; m += ROW_BLOCK)                                                     \
                NAME##_block(wr, n, in, x + m * ldx, ldx, y + m * ldy + o, ldy, ROW_BLOCK,                    \
                             m == 0 ? 1 + (rows > ROW_BLOCK && o + 4 < out) : 0);                             \
            /* the last rows share one pass too (a literal count each: unrolled) */                         \
            if (rows - m == 3) NAME##_block(wr, n, in, x + m * ldx, ldx, y + m * ldy + o, ldy, 3, m == 0);   \
            else if (rows - m == 2) NAME##_block(wr, n, in, x + m * ldx, ldx, y + m * ldy + o, ldy, 2, m == 0); \
            else if (rows - m == 1) NAME##_block(wr, n, in, x + m * ldx, ldx, y + m * ldy + o, ldy, 1, m == 0); \
        }                                                                                                     \
    }
DEFINE_LINEAR(linear_f32, F32_BYTES, F32_AT, F32_LOAD, F32_VALUE, 1)
DEFINE_LINEAR(linear_f16, F16_BYTES, F16_AT, F16_LOAD, F16_VALUE, 0)
DEFINE_LINEAR(linear_bf16, F16_BYTES, F16_AT, BF16_LOAD, BF16_VALUE, 0)
DEFINE_LINEAR(linear_q4_1, Q4_1_BYTES, Q4_1_AT, Q4_1_LOAD, Q4_1_VALUE, 1)
DEFINE_LINEAR(linear_q8_0, Q8_0_BYTES, Q8_0_AT, Q8_0_LOAD, Q8_0_VALUE, 1)

/* tiles: room for TILE_OUTS * in floats per thread (a wide forward's widened weight rows), for the AMX formats
   amx_linear's scratch (AMX_PADDED(rows) * in floats), for the int8 formats int8_linear's (INT8_SCRATCH bytes). */
static void linear(const void *w, int format, int isa, int planes, const float *bias, int out, int in,
                   const float *x, int64_t ldx, float *y, int64_t ldy, int rows, float *tiles) {
    switch (format) {
    case F32: linear_f32(w, out, in, x, ldx, y, ldy, rows, tiles); break;
    case F16: linear_f16(w, out, in, x, ldx, y, ldy, rows, tiles); break;
    case BF16: linear_bf16(w, out, in, x, ldx, y, ldy, rows, tiles); break;
    case Q4_1: linear_q4_1(w, out, in, x, ldx, y, ldy, rows, tiles); break;
    case Q8_0: linear_q8_0(w, out, in, x, ldx, y, ldy, rows, tiles); break;
    case I8_Q4_1:
    case I8_Q8_0: int8_linear(isa, planes, w, format, out, in, x, ldx, y, ldy, rows, tiles); break;
    default: amx_linear(w, format, out, in, x, ldx, y, ldy, rows, (uint16_t *)tiles);
    }
    if (bias)
        for (int m = 0; m < rows; m++)
            for (int o = 0; o < out; o++) y[m * ldy + o] += bias[o];
}

/* The largest of n values (exact in any order): LANES running maxima, then the tail. */
static float largest(const float *x, int64_t n) {
    vec acc[STEPS];
    for (int u = 0; u < STEPS; u++) acc[u] = vset1(-INFINITY);
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int u = 0; u < STEPS; u++) acc[u] = vmax(acc[u], vload(x + i + u * VW));
    float lanes[LANES], top = -INFINITY;
    for (int u = 0; u < STEPS; u++) vstore(lanes + u * VW, acc[u]);
    for (int k = 0; k < LANES; k++) top = lanes[k] > top ? lanes[k] : top;
    for (; i < n; i++) top = x[i] > top ? x[i] : top;
    return top;
}

/* x[i] = e^(x[i] - shift) for n values, in vectors, and their sum (LANES partial sums and lane_sum, then the tail
   in order); the last n % LANES through zero-padded vectors, so every value takes the same lane arithmetic
   (simd.h's vexp) and the sum is the same on every ISA. */
static float exp_sum(float *x, int64_t n, float shift) {
    vec acc[STEPS];
    for (int u = 0; u < STEPS; u++) acc[u] = vzero();
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int u = 0; u < STEPS; u++) {
            vec e = vexp(vsub(vload(x + i + u * VW), vset1(shift)));
            vstore(x + i + u * VW, e);
            acc[u] = vadd(acc[u], e);
        }
    float total = lane_sum(acc);
    if (i < n) {
        float tail[LANES] = {0};
        memcpy(tail, x + i, sizeof(float) * (n - i));
        for (int u = 0; u < STEPS; u++) vstore(tail + u * VW, vexp(vsub(vload(tail + u * VW), vset1(shift))));
        memcpy(x + i, tail, sizeof(float) * (n - i));
        for (int64_t j = 0; j < n - i; j++) total += tail[j];
    }
    return total;
}

static inline vec silu_times(vec g, vec u) { return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), u); }

/* gate[i] = SiLU(gate[i]) * up[i] for n values (elementwise: threads split them, the same numbers). */
static void silu_mul(float *gate, const float *up, int64_t n) {
    int64_t whole = n / VW;
    _Pragma("omp parallel for schedule(static) if (n >= 8192)")
    for (int64_t b = 0; b < whole; b++) vstore(gate + b * VW, silu_times(vload(gate + b * VW), vload(up + b * VW)));
    if (whole * VW < n) {
        int64_t i = whole * VW;
        float g[VW] = {0}, u[VW] = {0};
        memcpy(g, gate + i, sizeof(float) * (n - i));
        memcpy(u, up + i, sizeof(float) * (n - i));
        vstore(g, silu_times(vload(g), vload(u)));
        memcpy(gate + i, g, sizeof(float) * (n - i));
    }
}

/* Key j's value row: its prefix slot's (j < length), or the step's own row j - length. */
static inline const float *value_row(const float *v_layer, const int64_t *prefix, int64_t length, const float *own_v,
                                     int64_t slot_stride, int64_t j) {
    return j < length ? v_layer + prefix[j] * slot_stride : own_v + (j - length) * slot_stride;
}

/* out[d] = sum_j p[j] value_j[d], for `vectors` vectors of outputs from d: each output a chain of fmas over the
   keys in order (the numbers of a scalar loop), its accumulator in a register; `offset` picks the head's values
   within a row. */
static inline void weighted_values(const float *p, int64_t keys, const float *v_layer, const int64_t *prefix,
                                   int64_t length, const float *own_v, int64_t slot_stride, int64_t offset, int d,
                                   int vectors, float *out) {
    vec acc[4 * STEPS];
    for (int u = 0; u < vectors; u++) acc[u] = vzero();
    for (int64_t j = 0; j < keys; j++) {
        const float *vj = value_row(v_layer, prefix, length, own_v, slot_stride, j) + offset + d;
        vec pj = vset1(p[j]);
        for (int u = 0; u < vectors; u++) acc[u] = vfma(pj, vload(vj + u * VW), acc[u]);
    }
    for (int u = 0; u < vectors; u++) vstore(out + d + u * VW, acc[u]);
}

/* Softmax attention of head h of one row over its prefix slots, then `own` rows of this step's k/v (the row itself,
   or its whole block) (GQA), scale 1/sqrt(head_dim). scores: room for length + own values. */
static void attend_head(const int64_t *dims, int h, const float *q, const float *own_k, const float *own_v, int own,
                        const float *k_layer, const float *v_layer, const int64_t *prefix, int64_t length,
                        float *scores, float *out) {
    int heads = (int)dims[HEADS], kv_heads = (int)dims[KV_HEADS], hd = (int)dims[HEAD_DIM];
    int g = h / (heads / kv_heads);
    int64_t slot_stride = (int64_t)kv_heads * hd, keys = length + own;
    float scale = 1.0f / sqrtf((float)hd);
    const float *qh = q + h * hd;
    for (int64_t j = 0; j < length; j++)
        scores[j] = dot(qh, k_layer + prefix[j] * slot_stride + g * hd, hd) * scale;
    for (int i = 0; i < own; i++)
        scores[length + i] = dot(qh, own_k + i * slot_stride + g * hd, hd) * scale;
    float total = exp_sum(scores, keys, largest(scores, keys));
    for (int64_t j = 0; j < keys; j++) scores[j] /= total;
    float *oh = out + h * hd;
    int d = 0;
    for (; d + 4 * LANES <= hd; d += 4 * LANES)
        weighted_values(scores, keys, v_layer, prefix, length, own_v, slot_stride, g * hd, d, 4 * STEPS, oh);
    for (; d + LANES <= hd; d += LANES)
        weighted_values(scores, keys, v_layer, prefix, length, own_v, slot_stride, g * hd, d, STEPS, oh);
    for (; d < hd; d++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < keys; j++)
            sum = fmaf(scores[j], value_row(v_layer, prefix, length, own_v, slot_stride, j)[g * hd + d], sum);
        oh[d] = sum;
    }
}

/* y[o .. end) += scale * (B u)[o .. end) for one row's u = A x (bt: B transposed, [rank, out]): a lane per output
   summing its r products in order. */
static inline void lora_out(const float *bt, int64_t out, int rank, float scale, int o, int end, const float *u,
                            float *y) {
    for (; o + VW <= end; o += VW) {
        vec acc = vzero();
        for (int r = 0; r < rank; r++) acc = vfma(vload(bt + r * out + o), vset1(u[r]), acc);
        vstore(y + o, vfma(acc, vset1(scale), vload(y + o)));
    }
    for (; o < end; o++) {
        float s = 0.0f;
        for (int r = 0; r < rank; r++) s += bt[r * out + o] * u[r];
        y[o] += scale * s;
    }
}

/* y[m] += scale * B (A x[m]) for the rows m with on[m]: a rank-r LoRA, float32 A [r, in] and B transposed,
   bt [r, out]. t = A x[m] is r dot products; B t runs over `out` in vectors, each lane one output summing its r
   products. (As dot products of B's r-long rows, every output paid a lane sum: 3 adapted rows of the default
   model cost ~2 ms more a forward.) Both halves split over the threads by outputs, A's 4 rows a task (as
   linear_f32 groups them), B's LORA_OUTS outputs a task for every adapted row, so each sum is the one a lone
   thread makes. (On one thread the adapter of 2 of the default model's MASK rows costs ~1.4 ms of a 3-row int16
   verify of 6 ms: the short runs of A's and B's rows wait on memory.)
   tmp: room for rows * (in + r) values. */
static void add_lora(const float *a, const float *bt, int rank, float scale, int out, int in, const float *x,
                     int64_t ldx, float *y, int64_t ldy, int rows, const uint8_t *on, float *tmp) {
    int n = 0;
    for (int m = 0; m < rows; m++)
        if (on[m]) memcpy(tmp + (int64_t)n++ * in, x + m * ldx, sizeof(float) * in);
    if (!n) return;
    float *t = tmp + (int64_t)n * in;
    _Pragma("omp parallel if ((int64_t)(out + in) * rank * n >= PARALLEL_MIN / 4)")
    {
        _Pragma("omp for schedule(static)")
        for (int r = 0; r < rank; r += 4)
            linear_f32(a + (int64_t)r * in, rank - r < 4 ? rank - r : 4, in, tmp, in, t + r, rank, n, NULL);
        _Pragma("omp for schedule(static)")
        for (int o = 0; o < out; o += LORA_OUTS)
            for (int m = 0, i = 0; m < rows; m++)
                if (on[m]) lora_out(bt, out, rank, scale, o, o + LORA_OUTS < out ? o + LORA_OUTS : out,
                                    t + (int64_t)i++ * rank, y + m * ldy);
    }
}

/* One decode step for `rows` requests.
   tensors [layers, N_TENSORS] point at each layer's weights (see the enum), projections in dims[FORMAT]. embed
   [vocab, hidden] is float32 (only the rows of `ids` are read); head [vocab, hidden] is in dims[HEAD_FORMAT],
   but for its odd_count rows odd_rows, whose logits come from their float32 values odd_values [odd_count,
   hidden] instead (rows a block format cannot hold). positions [rows]; cos/sin [P, head_dim] and q_scale [P] (or NULL)
   are tables by position, covering every row's position. prefix [rows, ldp] slot ids with lengths [rows];
   write [rows] the slot each row's K/V goes to, -1 for a row that writes none (NULL: none does). k/v caches
   [layers, slots, kv_heads, head_dim], their layers layer_cache elements apart. own_first, own_count [rows]: row
   m attends to its table, then to this step's K/V of rows own_first[m] .. own_first[m] + own_count[m] - 1:
   itself (a causal row), or its whole block (a row of a bidirectional block) (NULL: every row itself).
   lora [layers, 2 * N_LORA] (or NULL): each adapted projection's float32 A [rank, in] and B transposed [rank, out]
   (with AMX projections: A, and B in rank pairs, in bfloat16; amx.h) (0 = none), in LORA_OF order,
   scaled by lora_scale and added at the rows with lora_on[m] (NULL: none).
   logits [rows, vocab]; hidden [rows, hidden] (or NULL: not wanted) the final norm's outputs, the states the head
   reads. Returns 0, or -1 when memory ran out. */
int decode_step(const int64_t *dims, const float *eps_, const int64_t *tensors, const float *embed,
                const float *final_norm, const void *head, const int64_t *odd_rows, int64_t odd_count,
                const float *odd_values, int rows, const int64_t *ids, const int64_t *positions,
                const float *cos, const float *sin, const float *q_scale, const int64_t *prefix, int64_t ldp,
                const int64_t *lengths, const int64_t *write, float *k_cache, float *v_cache, int64_t layer_cache,
                const int64_t *own_first, const int64_t *own_count, const int64_t *lora, int lora_rank,
                float lora_scale, const uint8_t *lora_on, float *logits, float *hidden) {
    int D = (int)dims[HIDDEN], I = (int)dims[INTER], H = (int)dims[HEADS], Hkv = (int)dims[KV_HEADS];
    int hd = (int)dims[HEAD_DIM], V = (int)dims[VOCAB];
    int fmt = (int)dims[FORMAT], head_fmt = (int)dims[HEAD_FORMAT];
    float eps = eps_[0];
    int64_t max_len = 0;
    for (int m = 0; m < rows; m++) max_len = lengths[m] > max_len ? lengths[m] : max_len;
    int qs = H * hd, kvs = Hkv * hd;
    int64_t own = 1;   /* the widest window of the step's own rows */
    for (int m = 0; own_count && m < rows; m++) own = own_count[m] > own ? own_count[m] : own;
#ifdef _OPENMP
    int threads = omp_get_max_threads();
#else
    int threads = 1;
#endif
    int widest = I > qs ? I : qs;
    widest = widest > D ? widest : D;
    int adapt = lora && lora_on;
    size_t lora_tmp = adapt && !IS_AMX(fmt) ? (size_t)rows * (widest + lora_rank) : 0; /* add_lora's tmp */
    int64_t score_room = max_len + own;
    size_t tile_room = rows >= WIDE_ROWS ? (size_t)threads * TILE_OUTS * widest : 0;
    if (IS_AMX(fmt) || IS_AMX(head_fmt)) /* amx_linear's scratch */
        tile_room = (size_t)AMX_PADDED(rows) * widest + 32;
    if (IS_INT8(fmt) || IS_INT8(head_fmt)) /* int8_linear's */
        tile_room = (size_t)INT8_SCRATCH(rows, widest) / sizeof(float) + 1;
    int isa = (int)dims[INT8_ISA], planes = (int)dims[INT8_PLANES];
    float *buf = malloc(sizeof(float) * ((size_t)rows * (2 * D + 2 * qs + 2 * kvs + 2 * I) + lora_tmp
                                         + (size_t)threads * score_room + tile_room));
    if (!buf) return -1;
    float *h = buf, *x = h + rows * D, *q = x + rows * D, *k = q + rows * qs, *v = k + rows * kvs;
    float *att = v + rows * kvs, *gate = att + rows * qs, *up = gate + rows * I, *tmp = up + rows * I;
    float *scores = tmp + lora_tmp, *tiles = scores + (size_t)threads * score_room;

    for (int m = 0; m < rows; m++)
        memcpy(h + m * D, embed + ids[m] * D, sizeof(float) * D);

    for (int l = 0; l < (int)dims[LAYERS]; l++) {
        const int64_t *t = tensors + l * N_TENSORS;
        const int64_t *adapter = lora ? lora + (int64_t)l * 2 * N_LORA : NULL;
#define W(name) ((const void *)(intptr_t)t[name])
#define F(name) ((const float *)(intptr_t)t[name])
#define PROJECT(name, bias, out, in, src, ldx, dst, ldy)                                                        \
        do {                                                                                                  \
            linear(W(name), fmt, isa, planes, bias, out, in, src, ldx, dst, ldy, rows, tiles);                            \
            if (adapt && adapter[2 * LORA_OF(name)] && IS_AMX(fmt))                                         \
                amx_lora((const void *)(intptr_t)adapter[2 * LORA_OF(name)],                                  \
                         (const void *)(intptr_t)adapter[2 * LORA_OF(name) + 1], lora_rank, lora_scale,       \
                         out, in, src, ldx, dst, ldy, rows, lora_on);                                         \
            else if (adapt && adapter[2 * LORA_OF(name)])                                                     \
                add_lora((const float *)(intptr_t)adapter[2 * LORA_OF(name)],                                 \
                         (const float *)(intptr_t)adapter[2 * LORA_OF(name) + 1], lora_rank, lora_scale, out, \
                         in, src, ldx, dst, ldy, rows, lora_on, tmp);                                         \
        } while (0)
        for (int m = 0; m < rows; m++) rms_norm(h + m * D, F(IN_NORM), eps, D, x + m * D);
        PROJECT(WQ, F(BQ), qs, D, x, D, q, qs);
        PROJECT(WK, F(BK), kvs, D, x, D, k, kvs);
        PROJECT(WV, F(BV), kvs, D, x, D, v, kvs);
        float *k_layer = k_cache + l * layer_cache, *v_layer = v_cache + l * layer_cache;
        for (int m = 0; m < rows; m++) {
            float *qm = q + m * qs, *km = k + m * kvs, *vm = v + m * kvs;
            if (t[Q_NORM]) {
                for (int i = 0; i < H; i++) rms_norm(qm + i * hd, F(Q_NORM), eps, hd, qm + i * hd);
                for (int i = 0; i < Hkv; i++) rms_norm(km + i * hd, F(K_NORM), eps, hd, km + i * hd);
            }
            const float *cos_m = cos + positions[m] * hd, *sin_m = sin + positions[m] * hd;
            rope(qm, H, hd, cos_m, sin_m, q_scale ? q_scale[positions[m]] : 1.0f);
            rope(km, Hkv, hd, cos_m, sin_m, 1.0f);
            if (write && write[m] >= 0) {
                memcpy(k_layer + write[m] * kvs, km, sizeof(float) * kvs);
                memcpy(v_layer + write[m] * kvs, vm, sizeof(float) * kvs);
            }
        }
        _Pragma("omp parallel for collapse(2) schedule(static) if (rows * H * (max_len + own) >= 4096)")
        for (int m = 0; m < rows; m++)
            for (int hh = 0; hh < H; hh++) {
                int64_t first = own_first ? own_first[m] : m;
#ifdef _OPENMP
                float *room = scores + (int64_t)omp_get_thread_num() * score_room;
#else
                float *room = scores;
#endif
                attend_head(dims, hh, q + m * qs, k + first * kvs, v + first * kvs,
                            own_count ? (int)own_count[m] : 1, k_layer, v_layer, prefix + m * ldp, lengths[m], room,
                            att + m * qs);
            }
        PROJECT(WO, F(BO), D, qs, att, qs, x, D);
        for (int i = 0; i < rows * D; i++) h[i] += x[i];
        for (int m = 0; m < rows; m++) rms_norm(h + m * D, F(POST_NORM), eps, D, x + m * D);
        PROJECT(WGATE, NULL, I, D, x, D, gate, I);
        PROJECT(WUP, NULL, I, D, x, D, up, I);
        silu_mul(gate, up, (int64_t)rows * I);
        PROJECT(WDOWN, NULL, D, I, gate, I, x, D);
        for (int i = 0; i < rows * D; i++) h[i] += x[i];
#undef PROJECT
#undef W
#undef F
    }
    for (int m = 0; m < rows; m++) rms_norm(h + m * D, final_norm, eps, D, x + m * D);
    if (hidden) memcpy(hidden, x, sizeof(float) * (size_t)rows * D);
    linear(head, head_fmt, isa, planes, NULL, V, D, x, D, logits, V, rows, tiles);
    for (int64_t e = 0; e < odd_count; e++)   /* the sums a float32 head gives (a linear output is one dot) */
        for (int m = 0; m < rows; m++) logits[m * V + odd_rows[e]] = dot(odd_values + e * D, x + m * D, D);
    free(buf);
    return 0;
}
