/* The int8 linears: y[m, o] = sum_i w[o, i] x[m, i] with each row of x quantized to int8 blocks of 32 (a float32 scale
   per block: d = max |x| / 127, codes round(x * 127 / max |x|)), dotted against weights in GGUF blocks (Q4_1: d * q +
   m, q in 0..15; Q8_0: d * q) with exact int32 sums per block. Per output lane, a block then adds
   (float)isum * (d_w * d_x), and for Q4_1 m_w * (d_x * sum of the row's codes), in block order, by fused
   multiply-adds: the same operations on every ISA, so a row's numbers are the same whatever the ISA, the rows beside
   it or the threads (which split the outputs). The weights are repacked at load (weight_blocks.py) so a vector's
   lanes are I8_GROUP outputs: one pass over them serves every row, each 4 codes of a row broadcast to all lanes.

   The ISAs (int8.h's enum), each compiled whatever the build machine, run only where the CPU has them
   (int8_isa_ready): AVX-512 VNNI (vpdpbusd on 16 lanes), AVX-VNNI (vpdpbusd on 8), AVX2 (vpmaddubsw + vpmaddwd; no
   16-bit pair can saturate: 2 x 15 x 127 for Q4_1, 2 x 127 x 127 for Q8_0 by the sign trick) and plain C. vpdpbusd
   multiplies unsigned by signed bytes: Q8_0's signed codes enter it as q + 128, and 128 x the row's block sum comes
   off. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <immintrin.h>

#include "amx.h"
#include "api.h"
#include "int8.h"

#define INT8_PARALLEL_MIN 32768 /* multiply-adds below which a linear runs on one thread (cpu_decode.c's too) */
#define ROW_TILE 4              /* rows that share each unpacked weight block */
#ifndef PREFETCH_GROUPS
#define PREFETCH_GROUPS 2       /* weight groups ahead that a group's first row tile prefetches, block by block */
#endif
#ifndef PREFETCH_HINT
#define PREFETCH_HINT _MM_HINT_T0
#endif

/* A linear's input rows as int8 blocks: codes [rows, in], and per row and block (nb a row) the scale, the codes'
   sum and scale * sum. */
typedef struct {
    const int8_t *q;
    const float *d, *ds;
    const int32_t *sum;
    int in, nb, planes;
} rows_i8;

/* Row m's codes of plane p (int16 rows: plane 0 the high codes, plane 1 the low ones). */
static inline const int8_t *codes_of(const rows_i8 *x, int m, int p) {
    return x->q + ((int64_t)m * x->planes + p) * x->in;
}

/* One block of 32 values as codes c = round(x * largest / max |x|) (scale max |x| / largest), their sum, and the
   codes: int8 ones in `high` (largest 127, low NULL), or 16-bit ones (largest 32258) split into two planes of int8
   codes, c = 254 * high + low with |high|, |low| <= 127. Every ISA the same numbers: the largest magnitude is exact
   in any order, the rest is per value. */
static void quantize_block(const float *x, float largest, int8_t *high, int8_t *low, float *d, int32_t *sum) {
    float top = 0.0f;
    for (int j = 0; j < 32; j++) top = fabsf(x[j]) > top ? fabsf(x[j]) : top;   /* no libm call, as fmaxf is */
    float inv = top > 0.0f ? largest / top : 0.0f;
    int total = 0;
    for (int j = 0; j < 32; j++) {
        float c = rintf(x[j] * inv);
        c = c > largest ? largest : c < -largest ? -largest : c;
        float h = low ? rintf(c / 254.0f) : c;
        high[j] = (int8_t)h;
        if (low) low[j] = (int8_t)(c - 254.0f * h);
        total += (int)c;
    }
    *d = top / largest;
    *sum = total;
}

/* quantize_block in AVX-512, the same numbers: each value's code by the same float operations (rounding to
   nearest even, the 16-bit code's high plane as round(c / 254) and its low one c - 254 * high, exact). */
__attribute__((target("avx512f,avx512bw"))) static void quantize_block_512(const float *x, float largest,
                                                                          int8_t *high, int8_t *low, float *d,
                                                                          int32_t *sum) {
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    __m512 inv = _mm512_set1_ps(top > 0.0f ? largest / top : 0.0f);
    __m512 most = _mm512_set1_ps(largest), least = _mm512_set1_ps(-largest), base = _mm512_set1_ps(254.0f);
    const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m512 c[2] = {_mm512_roundscale_ps(_mm512_mul_ps(a, inv), round),
                   _mm512_roundscale_ps(_mm512_mul_ps(b, inv), round)};
    __m512i total = _mm512_setzero_si512();
    for (int i = 0; i < 2; i++) {
        c[i] = _mm512_min_ps(_mm512_max_ps(c[i], least), most);
        total = _mm512_add_epi32(total, _mm512_cvtps_epi32(c[i]));
        __m512 h = low ? _mm512_roundscale_ps(_mm512_div_ps(c[i], base), round) : c[i];
        _mm_storeu_si128((__m128i *)(high + 16 * i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(h)));
        if (low)
            _mm_storeu_si128((__m128i *)(low + 16 * i),
                             _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_sub_ps(c[i], _mm512_mul_ps(base, h)))));
    }
    *d = top / largest;
    *sum = _mm512_reduce_add_epi32(total);
}

/* A linear's input rows as blocks of int8 codes in `planes` planes (1: int8 rows; 2: int16 rows), each block by
   quantize_block (or its AVX-512 twin). */
static rows_i8 quantize(int isa, int planes, const float *x, int64_t ldx, int rows, int in, void *scratch) {
    int nb = in / 32;
    int8_t *q = scratch;
    float *d = (float *)(((uintptr_t)(q + (int64_t)rows * planes * in) + 63) & ~(uintptr_t)63), *ds = d + rows * nb;
    int32_t *sum = (int32_t *)(ds + rows * nb);
    rows_i8 out = {q, d, ds, sum, in, nb, planes};
    _Pragma("omp parallel for schedule(static) if (rows >= 16)")
    for (int m = 0; m < rows; m++)
        for (int b = 0; b < nb; b++) {
            int at = m * nb + b;
            const float *xb = x + m * ldx + b * 32;
            int8_t *high = q + ((int64_t)m * planes) * in + b * 32;
            float largest = planes == 2 ? 32258.0f : 127.0f;
            int8_t *low = planes == 2 ? high + in : NULL;
            if (isa == I8_AVX512_VNNI)
                quantize_block_512(xb, largest, high, low, d + at, sum + at);
            else
                quantize_block(xb, largest, high, low, d + at, sum + at);
            ds[at] = d[at] * (float)sum[at];
        }
    return out;
}

static inline int32_t codes4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- plain C: the reference every vector path equals ---- */
static void tile_scalar(const uint8_t *wg, int format, const rows_i8 *x, int m0, int rt, float *y, int64_t ldy,
                        int n, int64_t ahead) {
    (void)ahead;
    for (int r = 0; r < rt; r++) {
        int m = m0 + r;
        float acc[I8_GROUP] = {0};
        for (int b = 0; b < x->nb; b++) {
            int32_t c[32];      /* the row's codes: one plane, or 254 * high + low */
            for (int j = 0; j < 32; j++)
                c[j] = x->planes == 2 ? 254 * codes_of(x, m, 0)[b * 32 + j] + codes_of(x, m, 1)[b * 32 + j]
                                      : codes_of(x, m, 0)[b * 32 + j];
            float dx = x->d[m * x->nb + b], ds = x->ds[m * x->nb + b];
            if (format == I8_Q4_1) {
                const uint8_t *blk = wg + (int64_t)b * I8_Q4_1_BLOCK;
                const float *dw = (const float *)blk, *mw = dw + I8_GROUP;
                const uint8_t *codes = blk + 128;
                for (int o = 0; o < I8_GROUP; o++) {
                    int32_t s = 0;
                    for (int p = 0; p < 4; p++)
                        for (int k = 0; k < 4; k++) {
                            uint8_t byte = codes[64 * p + 4 * o + k];
                            s += (byte & 15) * c[4 * p + k] + (byte >> 4) * c[16 + 4 * p + k];
                        }
                    acc[o] = fmaf((float)s, dw[o] * dx, acc[o]);
                    acc[o] = fmaf(mw[o], ds, acc[o]);
                }
            } else {
                const uint8_t *blk = wg + (int64_t)b * I8_Q8_0_BLOCK;
                const float *dw = (const float *)blk;
                const int8_t *codes = (const int8_t *)(blk + 64);
                for (int o = 0; o < I8_GROUP; o++) {
                    int32_t s = 0;
                    for (int p = 0; p < 8; p++)
                        for (int k = 0; k < 4; k++) s += codes[64 * p + 4 * o + k] * c[4 * p + k];
                    acc[o] = fmaf((float)s, dw[o] * dx, acc[o]);
                }
            }
        }
        memcpy(y + (int64_t)r * ldy, acc, sizeof(float) * n);
    }
}

/* ---- AVX-512 VNNI: 16 lanes, one group a vector ---- */
#define T512 "avx512f,avx512bw,avx512vnni,fma"

__attribute__((target(T512))) static inline __m512i dp512(__m512i acc, __m512i w, const int8_t *c) {
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(codes4(c)));
}

__attribute__((target(T512), always_inline)) static inline void tile_q4_512(const uint8_t *wg, const rows_i8 *x,
                                                                             int m0, int rt, int planes, float *y,
                                                                             int64_t ldy, int n, int64_t ahead) {
    __m512 acc[ROW_TILE];
    for (int r = 0; r < rt; r++) acc[r] = _mm512_setzero_ps();
    const __m512i nibble = _mm512_set1_epi8(15);
    for (int b = 0; b < x->nb; b++) {
        const uint8_t *blk = wg + (int64_t)b * I8_Q4_1_BLOCK;
        for (int k = 0; ahead && k < I8_Q4_1_BLOCK; k += 64) _mm_prefetch((const char *)blk + ahead + k, PREFETCH_HINT);
        __m512 dw = _mm512_loadu_ps(blk), mw = _mm512_loadu_ps(blk + 64);
        __m512i lo[4], hi[4];
        for (int p = 0; p < 4; p++) {
            __m512i packed = _mm512_loadu_si512(blk + 128 + 64 * p);
            lo[p] = _mm512_and_si512(packed, nibble);
            hi[p] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
        }
        for (int r = 0; r < rt; r++) {
            int m = m0 + r;
            __m512i s = _mm512_setzero_si512();
            for (int plane = 0; plane < planes; plane++) {
                const int8_t *c = codes_of(x, m, plane) + b * 32;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++) {
                    s0 = dp512(s0, lo[p], c + 4 * p);
                    s1 = dp512(s1, hi[p], c + 16 + 4 * p);
                }
                s = plane ? _mm512_add_epi32(_mm512_mullo_epi32(s, _mm512_set1_epi32(254)), _mm512_add_epi32(s0, s1))
                          : _mm512_add_epi32(s0, s1);
            }
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x->d[m * x->nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->ds[m * x->nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < rt; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, (__mmask16)((1u << n) - 1), acc[r]);
}

__attribute__((target(T512), always_inline)) static inline void tile_q8_512(const uint8_t *wg, const rows_i8 *x,
                                                                             int m0, int rt, int planes, float *y,
                                                                             int64_t ldy, int n, int64_t ahead) {
    __m512 acc[ROW_TILE];
    for (int r = 0; r < rt; r++) acc[r] = _mm512_setzero_ps();
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < x->nb; b++) {
        const uint8_t *blk = wg + (int64_t)b * I8_Q8_0_BLOCK;
        for (int k = 0; ahead && k < I8_Q8_0_BLOCK; k += 64) _mm_prefetch((const char *)blk + ahead + k, PREFETCH_HINT);
        __m512 dw = _mm512_loadu_ps(blk);
        __m512i w[8];
        for (int p = 0; p < 8; p++) w[p] = _mm512_xor_si512(_mm512_loadu_si512(blk + 64 + 64 * p), bias);
        for (int r = 0; r < rt; r++) {
            int m = m0 + r;
            __m512i s = _mm512_setzero_si512();
            for (int plane = 0; plane < planes; plane++) {
                const int8_t *c = codes_of(x, m, plane) + b * 32;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int p = 0; p < 8; p += 2) {
                    s0 = dp512(s0, w[p], c + 4 * p);
                    s1 = dp512(s1, w[p + 1], c + 4 * p + 4);
                }
                s = plane ? _mm512_add_epi32(_mm512_mullo_epi32(s, _mm512_set1_epi32(254)), _mm512_add_epi32(s0, s1))
                          : _mm512_add_epi32(s0, s1);
            }
            s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * x->sum[m * x->nb + b]));
            __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x->d[m * x->nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
        }
    }
    for (int r = 0; r < rt; r++) _mm512_mask_storeu_ps(y + (int64_t)r * ldy, (__mmask16)((1u << n) - 1), acc[r]);
}

__attribute__((target(T512))) static void tile_avx512(const uint8_t *wg, int format, const rows_i8 *x, int m0, int rt,
                                                      float *y, int64_t ldy, int n, int64_t ahead) {
/* rt and the planes as constants, so each count's loops unroll */
#define TILE512_PLANES(k, planes) (format == I8_Q4_1 ? tile_q4_512(wg, x, m0, k, planes, y, ldy, n, ahead) \
                                                     : tile_q8_512(wg, x, m0, k, planes, y, ldy, n, ahead))
#define TILE512(k) (x->planes == 2 ? TILE512_PLANES(k, 2) : TILE512_PLANES(k, 1))
    switch (rt) {
    case 4: TILE512(4); break;
    case 3: TILE512(3); break;
    case 2: TILE512(2); break;
    default: TILE512(1);
    }
#undef TILE512
}

/* ---- 256-bit paths: a group as two halves of 8 lanes; AVX2's 4-code dot, or AVX-VNNI's vpdpbusd ---- */
#define T_AVX2 "avx2,fma"
#define T_VNNI "avx2,fma,avxvnni"

__attribute__((target(T_AVX2))) static inline __m256i dp_avx2(__m256i acc, __m256i u, const int8_t *c) {
    __m256i pairs = _mm256_maddubs_epi16(u, _mm256_set1_epi32(codes4(c)));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
/* Signed codes w times c: |w| times c with w's sign. */
__attribute__((target(T_AVX2))) static inline __m256i dps_avx2(__m256i acc, __m256i w, const int8_t *c) {
    __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_set1_epi32(codes4(c)), w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
__attribute__((target(T_VNNI))) static inline __m256i dp_vnni(__m256i acc, __m256i u, const int8_t *c) {
    return _mm256_dpbusd_avx_epi32(acc, u, _mm256_set1_epi32(codes4(c)));
}

/* Plane 0's sum, then 254 x it plus plane 1's (exact in int32). */
#define HIGH_THEN_LOW(plane, s, t) ((plane) ? _mm256_add_epi32(_mm256_mullo_epi32((s), _mm256_set1_epi32(254)), (t)) : (t))

/* One 8-lane half (lanes 8h..8h+7) of a group, `rt` rows; DP the 4-code dot of unsigned codes, SIGNED_DP that of
   Q8_0's signed ones (NULL: through DP as q + 128). */
#define DEFINE_TILE256(NAME, TARGET, DP, SIGNED_DP)                                                               \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_q4(                                   \
        const uint8_t *wg, const rows_i8 *x, int m0, int rt, int h, float *out) {                                 \
        __m256 acc[ROW_TILE];                                                                                     \
        for (int r = 0; r < rt; r++) acc[r] = _mm256_setzero_ps();                                                \
        const __m256i nibble = _mm256_set1_epi8(15);                                                              \
        for (int b = 0; b < x->nb; b++) {                                                                         \
            const uint8_t *blk = wg + (int64_t)b * I8_Q4_1_BLOCK;                                                 \
            __m256 dw = _mm256_loadu_ps((const float *)blk + 8 * h);                                              \
            __m256 mw = _mm256_loadu_ps((const float *)blk + 16 + 8 * h);                                         \
            __m256i lo[4], hi[4];                                                                                 \
            for (int p = 0; p < 4; p++) {                                                                         \
                __m256i packed = _mm256_loadu_si256((const __m256i *)(blk + 128 + 64 * p + 32 * h));              \
                lo[p] = _mm256_and_si256(packed, nibble);                                                         \
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);                                   \
            }                                                                                                     \
            for (int r = 0; r < rt; r++) {                                                                        \
                int m = m0 + r;                                                                                   \
                __m256i s = _mm256_setzero_si256();                                                               \
                for (int plane = 0; plane < x->planes; plane++) {                                                 \
                    const int8_t *c = codes_of(x, m, plane) + b * 32;                                             \
                    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();                             \
                    for (int p = 0; p < 4; p++) {                                                                 \
                        s0 = DP(s0, lo[p], c + 4 * p);                                                            \
                        s1 = DP(s1, hi[p], c + 16 + 4 * p);                                                       \
                    }                                                                                             \
                    s = HIGH_THEN_LOW(plane, s, _mm256_add_epi32(s0, s1));                                        \
                }                                                                                                 \
                __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[m * x->nb + b]));                            \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r]);                                   \
                acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->ds[m * x->nb + b]), acc[r]);                       \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < rt; r++) _mm256_storeu_ps(out + 16 * r + 8 * h, acc[r]);                               \
    }                                                                                                             \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_q8(                                   \
        const uint8_t *wg, const rows_i8 *x, int m0, int rt, int h, float *out) {                                 \
        __m256 acc[ROW_TILE];                                                                                     \
        for (int r = 0; r < rt; r++) acc[r] = _mm256_setzero_ps();                                                \
        for (int b = 0; b < x->nb; b++) {                                                                         \
            const uint8_t *blk = wg + (int64_t)b * I8_Q8_0_BLOCK;                                                 \
            __m256 dw = _mm256_loadu_ps((const float *)blk + 8 * h);                                              \
            __m256i w[8];                                                                                         \
            for (int p = 0; p < 8; p++) {                                                                         \
                w[p] = _mm256_loadu_si256((const __m256i *)(blk + 64 + 64 * p + 32 * h));                          \
                if (!SIGNED_DP) w[p] = _mm256_xor_si256(w[p], _mm256_set1_epi8((char)0x80));                       \
            }                                                                                                     \
            for (int r = 0; r < rt; r++) {                                                                        \
                int m = m0 + r;                                                                                   \
                __m256i s = _mm256_setzero_si256();                                                               \
                for (int plane = 0; plane < x->planes; plane++) {                                                 \
                    const int8_t *c = codes_of(x, m, plane) + b * 32;                                             \
                    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();                             \
                    for (int p = 0; p < 8; p += 2) {                                                              \
                        s0 = SIGNED_DP ? dps_avx2(s0, w[p], c + 4 * p) : DP(s0, w[p], c + 4 * p);                 \
                        s1 = SIGNED_DP ? dps_avx2(s1, w[p + 1], c + 4 * p + 4) : DP(s1, w[p + 1], c + 4 * p + 4);  \
                    }                                                                                             \
                    s = HIGH_THEN_LOW(plane, s, _mm256_add_epi32(s0, s1));                                        \
                }                                                                                                 \
                if (!SIGNED_DP) s = _mm256_sub_epi32(s, _mm256_set1_epi32(128 * x->sum[m * x->nb + b]));           \
                __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[m * x->nb + b]));                            \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r]);                                   \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < rt; r++) _mm256_storeu_ps(out + 16 * r + 8 * h, acc[r]);                              \
    }                                                                                                             \
    __attribute__((target(TARGET))) static void NAME(const uint8_t *wg, int format, const rows_i8 *x, int m0,      \
                                                     int rt, float *y, int64_t ldy, int n, int64_t ahead) {        \
        (void)ahead;                                                                                              \
        float out[ROW_TILE * I8_GROUP];                                                                           \
        for (int h = 0; h < 2; h++) {                                                                             \
            if (format == I8_Q4_1) {                                                                              \
                switch (rt) {                                                                                     \
                case 4: NAME##_q4(wg, x, m0, 4, h, out); break;                                                   \
                case 3: NAME##_q4(wg, x, m0, 3, h, out); break;                                                   \
                case 2: NAME##_q4(wg, x, m0, 2, h, out); break;                                                   \
                default: NAME##_q4(wg, x, m0, 1, h, out);                                                         \
                }                                                                                                 \
            } else {                                                                                              \
                switch (rt) {                                                                                     \
                case 4: NAME##_q8(wg, x, m0, 4, h, out); break;                                                   \
                case 3: NAME##_q8(wg, x, m0, 3, h, out); break;                                                   \
                case 2: NAME##_q8(wg, x, m0, 2, h, out); break;                                                   \
                default: NAME##_q8(wg, x, m0, 1, h, out);                                                         \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < rt; r++) memcpy(y + (int64_t)r * ldy, out + 16 * r, sizeof(float) * n);              \
    }
DEFINE_TILE256(tile_avx2, T_AVX2, dp_avx2, 1)
DEFINE_TILE256(tile_vnni, T_VNNI, dp_vnni, 0)

typedef void (*tile_fn)(const uint8_t *, int, const rows_i8 *, int, int, float *, int64_t, int, int64_t);
static const tile_fn TILES[I8_ISAS] = {tile_scalar, tile_avx2, tile_vnni, tile_avx512};

int int8_isa_ready(int isa) {
    __builtin_cpu_init();
    switch (isa) {
    case I8_SCALAR: return 1;
    case I8_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case I8_AVX_VNNI: return __builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("fma");
    case I8_AVX512_VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512vnni");
    default: return 0;
    }
}

void int8_linear(int isa, int planes, const void *w, int format, int out, int in, const float *x, int64_t ldx,
                 float *y, int64_t ldy, int rows, void *scratch) {
    rows_i8 q = quantize(isa, planes == 2 ? 2 : 1, x, ldx, rows, in, scratch);
    int64_t block = format == I8_Q4_1 ? I8_Q4_1_BLOCK : I8_Q8_0_BLOCK, group_bytes = block * (in / 32);
    tile_fn tile = TILES[isa >= 0 && isa < I8_ISAS ? isa : I8_SCALAR];
    int groups = (out + I8_GROUP - 1) / I8_GROUP;
    _Pragma("omp parallel for schedule(static) if ((int64_t)out * in * rows >= INT8_PARALLEL_MIN)")
    for (int g = 0; g < groups; g++) {
        int n = out - g * I8_GROUP < I8_GROUP ? out - g * I8_GROUP : I8_GROUP;
        const uint8_t *wg = (const uint8_t *)w + g * group_bytes;
        for (int m = 0; m < rows; m += ROW_TILE)
            tile(wg, format, &q, m, rows - m < ROW_TILE ? rows - m : ROW_TILE, y + m * ldy + g * I8_GROUP, ldy, n,
                 m == 0 ? PREFETCH_GROUPS * group_bytes : 0);
    }
}
