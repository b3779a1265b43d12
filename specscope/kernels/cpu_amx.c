/* Linears on Intel AMX tiles in bfloat16: weights rounded to bfloat16, each query row rounded to bfloat16 where it
   enters the linear, products summed in float32 by the tile unit. One TDPBF16PS multiplies 16 outputs x 32 inputs
   of weights by 32 inputs x 16 rows, so a forward of 1 to 16 rows costs the same instructions and the same weight
   stream: on a 2-core Sapphire Rapids the weights' memory traffic is the cost, whatever the rows.

   Every (row, output) is summed in the same order whatever the number of rows or threads (rows are independent in
   the tile product, threads split the outputs, the inputs run in order 32 at a time), so a verify row is the
   decode step's number bit for bit, as on the float32 paths, and the lossless equalities hold in this precision.

   The weights are the tile product's left operand, 16 output rows x 32 inputs, in one of two layouts:
   - AMX_BF16: row-major bfloat16 [out, in], loaded into a tile where it lies;
   - AMX_Q4_1: GGUF Q4_1 blocks (amx.h's q4_1_block), under half the bytes, in tile order: per 16 output rows and
     chunk of 32 inputs, the 16 rows' blocks one after another (one stream for the prefetchers). Each block is
     widened in registers to the bfloat16 of its float32 values d * q + m (the values AMX_BF16 holds for those
     weights), through a 16-entry table of the block, then loaded as a tile.
   The rows are the right operand, in the pair order TDPBF16PS reads (rows_to_pairs).
   Built without AMX (another CPU, or a compiler without it), amx_bf16_ready() is 0 and nothing here runs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "api.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask for the AMX tile state, once per process */
#define XFEATURE_XTILEDATA 18
#define AHEAD 4 /* Q4_1 chunks between a prefetch and its use */
#define LORA_THREADED_ROWS 2 /* adapted rows from which threads split them */
#define ROW_INDEX _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int amx_bf16_ready(void) {
    static int ready = -1;
    if (ready < 0) ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return ready;
}

/* rows x in float32 (row stride ldx), rounded to bfloat16 (nearest even), as the tile product's right operand:
   per block of 16 rows and chunk of 32 inputs, 16 x 16 pairs, pair (k, n) = inputs 2k, 2k + 1 of row n (rows past
   `rows` zero). out: room for AMX_PADDED(rows) * in values; scratch: as many again, where the rows go in bfloat16
   first. */
static void rows_to_pairs(const float *x, int64_t ldx, int rows, int in, uint32_t *out, uint16_t *scratch) {
    int padded = AMX_PADDED(rows), chunks = in / TILE_IN;
    for (int m = 0; m < rows; m++)
        for (int i = 0; i < in; i += 16)
            _mm256_storeu_si256((__m256i *)(scratch + (int64_t)m * in + i),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + m * ldx + i)));
    const int *pairs = (const int *)scratch; /* row m's pair p at m * in / 2 + p */
    const __m512i rows_apart = _mm512_mullo_epi32(ROW_INDEX, _mm512_set1_epi32(in / 2));
    for (int b = 0; b < padded / TILE_ROWS; b++) {
        int live = rows - b * TILE_ROWS < TILE_ROWS ? rows - b * TILE_ROWS : TILE_ROWS;
        __mmask16 real = (__mmask16)((1u << live) - 1);
        for (int c = 0; c < chunks; c++) {
            uint32_t *tile = out + ((int64_t)b * chunks + c) * TILE_ROWS * TILE_ROWS;
            const int *from = pairs + (int64_t)b * TILE_ROWS * (in / 2) + c * TILE_ROWS;
            for (int k = 0; k < TILE_ROWS; k++) /* tile row k: pair k of the 16 rows */
                _mm512_storeu_si512(tile + k * TILE_ROWS,
                                   _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), real, rows_apart, from + k, 4));
        }
    }
}

/* The 16 weight rows from `row` of chunk c as a tile: where they lie (AMX_BF16), or widened into stage. */
static inline const uint16_t *weight_tile(const void *w, int format, int64_t row, int in, int c, uint16_t *stage,
                                          int64_t *stride) {
    if (format == AMX_BF16) {
        *stride = 2 * (int64_t)in;
        return (const uint16_t *)w + row * in + c * TILE_IN;
    }
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const q4_1_block *blocks = (const q4_1_block *)w + (row * (in / TILE_IN) + (int64_t)c * TILE_ROWS);
    for (int line = 0; line < TILE_ROWS * (int)sizeof(q4_1_block); line += 64) /* the chunk AHEAD chunks on */
        __builtin_prefetch((const char *)(blocks + AHEAD * TILE_ROWS) + line, 0, 3);
    for (int r = 0; r < TILE_ROWS; r++) {
        const q4_1_block *b = blocks + r;
        __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->q));
        __m512i index = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bytes, _mm256_set1_epi16(15))),
                                           _mm256_srli_epi16(bytes, 4), 1);
        __m256bh table = _mm512_cvtneps_pbh(_mm512_fmadd_ps(codes, _mm512_set1_ps(b->d), _mm512_set1_ps(b->m)));
        _mm512_store_si512(stage + r * TILE_IN,
                           _mm512_permutexvar_epi16(index, _mm512_castsi256_si512((__m256i)table)));
    }
    *stride = 2 * TILE_IN;
    return stage;
}

#define LOAD_WEIGHTS(reg, g)                                                                                 \
    do {                                                                                                     \
        int64_t stride;                                                                                      \
        const uint16_t *a = weight_tile(w, format, (int64_t)(t + (g)) * TILE_ROWS, in, c, stage[g], &stride); \
        _tile_loadd(reg, a, stride);                                                                         \
    } while (0)
#define PAIRS(b) (pairs + (((int64_t)(b)) * chunks + c) * TILE_ROWS * TILE_ROWS)

/* Copy a 16 outputs x 16 rows sum tile to y (rows past `live` dropped): row n is the tile's column n. */
static inline void put(const float *sums, int live, float *y, int64_t ldy) {
    const __m512i outputs_apart = _mm512_mullo_epi32(ROW_INDEX, _mm512_set1_epi32(TILE_ROWS));
    for (int n = 0; n < live; n++) _mm512_storeu_ps(y + n * ldy, _mm512_i32gather_ps(outputs_apart, sums + n, 4));
}

void amx_linear(const void *w, int format, int out, int in, const float *x, int64_t ldx, float *y, int64_t ldy,
                int rows, uint16_t *scratch) {
    int chunks = in / TILE_IN, tiles = out / TILE_ROWS, blocks = AMX_PADDED(rows) / TILE_ROWS;
    uint32_t *pairs = (uint32_t *)scratch;
    rows_to_pairs(x, ldx, rows, in, pairs, scratch + (int64_t)AMX_PADDED(rows) * in);
#pragma omp parallel if ((int64_t)out * in >= 32768)
    {
        /* tmm0-3 sums (2 output tiles x 2 row blocks), tmm4-5 the weights of the 2 output tiles, tmm6-7 the rows */
        tile_config cfg = {.palette = 1};
        for (int t = 0; t < 8; t++) cfg.rows[t] = TILE_ROWS, cfg.colsb[t] = 64;
        _tile_loadconfig(&cfg);
        uint16_t stage[2][TILE_ROWS * TILE_IN] __attribute__((aligned(64)));
        float sums[4][TILE_ROWS * TILE_ROWS] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t += 2) {
            int pair = t + 1 < tiles;
            for (int b = 0; b < blocks; b += 2) {
                int two = b + 1 < blocks;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int c = 0; c < chunks; c++) {
                    LOAD_WEIGHTS(4, 0);
                    _tile_loadd(6, PAIRS(b), 64);
                    _tile_dpbf16ps(0, 4, 6);
                    if (pair) {
                        LOAD_WEIGHTS(5, 1);
                        _tile_dpbf16ps(1, 5, 6);
                    }
                    if (two) {
                        _tile_loadd(7, PAIRS(b + 1), 64);
                        _tile_dpbf16ps(2, 4, 7);
                        if (pair) _tile_dpbf16ps(3, 5, 7);
                    }
                }
                _tile_stored(0, sums[0], 64);
                _tile_stored(1, sums[1], 64);
                _tile_stored(2, sums[2], 64);
                _tile_stored(3, sums[3], 64);
                for (int h = 0; h <= two; h++) {
                    int first = (b + h) * TILE_ROWS, live = rows - first < TILE_ROWS ? rows - first : TILE_ROWS;
                    for (int g = 0; g <= pair; g++)
                        put(sums[2 * h + g], live, y + first * ldy + (int64_t)(t + g) * TILE_ROWS, ldy);
                }
            }
        }
        _tile_release();
    }
}

/* The rows' products with A, t[m] = A x[m], as bf16 dot products (x[m] rounded to bfloat16 as it enters the
   linear), 16 of A's rows at a time. */
static void lora_down(const uint16_t *a, int rank, int in, const float *xm, float *t) {
    for (int r0 = 0; r0 < rank; r0 += 16) {
        __m512 acc[16];
        for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
        for (int i = 0; i < in; i += TILE_IN) {
            __m512bh xs = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xm + i + 16), _mm512_loadu_ps(xm + i));
            for (int j = 0; j < 16; j++)
                acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(a + (int64_t)(r0 + j) * in + i), xs);
        }
        for (int j = 0; j < 16; j++) t[r0 + j] = _mm512_reduce_add_ps(acc[j]);
    }
}

/* ym += scale * B t, t rounded to bfloat16 and multiplied by B's rank pairs 4 vectors of outputs at a time. */
static void lora_up(const uint32_t *bp, int rank, float scale, int out, const float *t, float *ym) {
    uint32_t pairs[rank / 2];
    for (int r = 0; r < rank; r += 16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)pairs + r), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(t + r)));
    const __m512 s = _mm512_set1_ps(scale);
    int o = 0;
    for (; o + 64 <= out; o += 64) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int k = 0; k < rank / 2; k++) {
            __m512bh tk = (__m512bh)_mm512_set1_epi32((int)pairs[k]);
            for (int v = 0; v < 4; v++)
                acc[v] = _mm512_dpbf16_ps(acc[v], (__m512bh)_mm512_loadu_si512(bp + (int64_t)k * out + o + 16 * v), tk);
        }
        for (int v = 0; v < 4; v++)
            _mm512_storeu_ps(ym + o + 16 * v, _mm512_fmadd_ps(acc[v], s, _mm512_loadu_ps(ym + o + 16 * v)));
    }
    for (; o < out; o += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int k = 0; k < rank / 2; k++)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(bp + (int64_t)k * out + o),
                                   (__m512bh)_mm512_set1_epi32((int)pairs[k]));
        _mm512_storeu_ps(ym + o, _mm512_fmadd_ps(acc, s, _mm512_loadu_ps(ym + o)));
    }
}

void amx_lora(const void *a, const void *b, int rank, float scale, int out, int in, const float *x, int64_t ldx,
              float *y, int64_t ldy, int rows, const uint8_t *on) {
    int adapted[rows], n = 0;
    for (int m = 0; m < rows; m++)
        if (on[m]) adapted[n++] = m;
#pragma omp parallel for schedule(static) if (n >= LORA_THREADED_ROWS)
    for (int i = 0; i < n; i++) {
        float t[rank];
        lora_down((const uint16_t *)a, rank, in, x + adapted[i] * ldx, t);
        lora_up((const uint32_t *)b, rank, scale, out, t, y + adapted[i] * ldy);
    }
}

#else

int amx_bf16_ready(void) { return 0; }

/* Unreachable: the AMX formats are packed only where amx_bf16_ready(). */
void amx_linear(const void *w, int format, int out, int in, const float *x, int64_t ldx, float *y, int64_t ldy,
                int rows, uint16_t *scratch) {
    (void)w, (void)format, (void)out, (void)in, (void)x, (void)ldx, (void)y, (void)ldy, (void)rows, (void)scratch;
    abort();
}

void amx_lora(const void *a, const void *b, int rank, float scale, int out, int in, const float *x, int64_t ldx,
              float *y, int64_t ldy, int rows, const uint8_t *on) {
    (void)a, (void)b, (void)rank, (void)scale, (void)out, (void)in, (void)x, (void)ldx, (void)y, (void)ldy;
    (void)rows, (void)on;
    abort();
}

#endif
