/* What every C kernel here shares: the float16 / bfloat16 widening, the LANES-wide vector steps of this CPU's
   ISA, their one lane sum, and the row ops built on them (dot, HF's RMSNorm, rotate-half RoPE). One summation
   order for all of them, whatever the ISA, so the decode step and the folded verify's ops give the same numbers
   for the same row. Included by cpu_decode.c and cpu_fold.c, which build into one library (kernels/native.py). */
#ifndef SPECSCOPE_SIMD_H
#define SPECSCOPE_SIMD_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

static inline float f32_value(const float *p) { return *p; }
static inline float bf16_value(const uint16_t *p) {
    uint32_t bits = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline float f16_value(const uint16_t *p) {
    uint32_t h = *p, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    float f;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {  /* zero or subnormal: man * 2^-24, exact in float32 */
        f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, sizeof f);
        bits |= sign;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* LANES-wide vector steps: AVX-512 (one register), AVX2 + F16C (two), or plain C (VW 1). The lanes and the order
   of their final sum are the same in all three, so the result does not depend on the vector ISA. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define VW 16
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vec vload_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vec vload_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec vset1(float a) { return _mm512_set1_ps(a); }
static inline void vstore(float *p, vec a) { _mm512_storeu_ps(p, a); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(a, vset1(lo)), vset1(hi)); }
static inline vec vround(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for integral n in [-126, 127], built in the exponent bits */
static inline vec vpow2(vec n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
/* VW codes of a 32-value block (kernels' Q4_1 / Q8_0 layouts, cpu_decode.c): `half` picks the high nibbles. */
static inline vec vload_q4(const uint8_t *q, int half, float d, float m) {
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    c = _mm512_and_si512(half ? _mm512_srli_epi32(c, 4) : c, _mm512_set1_epi32(15));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(d), _mm512_set1_ps(m));
}
static inline vec vload_q8(const int8_t *q, float d) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), _mm512_set1_ps(d));
}
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define VW 8
typedef __m256 vec;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vec vload_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vec vload_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec vset1(float a) { return _mm256_set1_ps(a); }
static inline void vstore(float *p, vec a) { _mm256_storeu_ps(p, a); }
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm256_div_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(a, vset1(lo)), vset1(hi)); }
static inline vec vround(vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vec vpow2(vec n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vec vload_q4(const uint8_t *q, int half, float d, float m) {
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    c = _mm256_and_si256(half ? _mm256_srli_epi32(c, 4) : c, _mm256_set1_epi32(15));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(d), _mm256_set1_ps(m));
}
static inline vec vload_q8(const int8_t *q, float d) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), _mm256_set1_ps(d));
}
#else
#define VW 1
typedef float vec;
static inline vec vzero(void) { return 0.0f; }
static inline vec vload(const float *p) { return *p; }
static inline vec vload_f16(const uint16_t *p) { return f16_value(p); }
static inline vec vload_bf16(const uint16_t *p) { return bf16_value(p); }
static inline vec vfma(vec a, vec b, vec c) { return fmaf(a, b, c); }
static inline vec vsub(vec a, vec b) { return a - b; }
static inline vec vset1(float a) { return a; }
static inline void vstore(float *p, vec a) { *p = a; }
static inline vec vadd(vec a, vec b) { return a + b; }
static inline vec vmul(vec a, vec b) { return a * b; }
static inline vec vdiv(vec a, vec b) { return a / b; }
static inline vec vmax(vec a, vec b) { return fmaxf(a, b); }
static inline vec vclamp(vec a, float lo, float hi) { return fminf(fmaxf(a, lo), hi); }
static inline vec vround(vec a) { return nearbyintf(a); }
static inline vec vpow2(vec n) {
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline vec vload_q4(const uint8_t *q, int half, float d, float m) {
    return fmaf((float)((half ? *q >> 4 : *q) & 15), d, m);
}
static inline vec vload_q8(const int8_t *q, float d) { return (float)*q * d; }
#endif
#define STEPS (LANES / VW)

/* e^x lane by lane, the same numbers for every ISA (every lane is the same IEEE operations):
   x clamped to [-87, 88] (so 2^n stays a normal float: e^-87 ~ 1.6e-38 stands for anything smaller), x = n ln2 +
   r with |r| <= ln2 / 2 (ln2 in two parts, Cephes' split), e^r by Cephes' expf polynomial (~1 ulp), times 2^n.
   (A libm expf call per value cost a decode step ~3 ns a value: SiLU's and the softmax's, some 100 k a row.) */
static inline vec vexp(vec x) {
    x = vclamp(x, -87.0f, 88.0f);
    vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vec p = vfma(vset1(1.9875691500e-4f), r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    vec e = vfma(p, vmul(r, r), r);
    return vmul(vadd(e, vset1(1.0f)), vpow2(n));
}

/* The sum of the LANES lanes as one tree, the same for every ISA: lane k + lane k+8, then k + k+4, k + k+2 and
   k + k+1 (a few vector adds, where a lane-by-lane sum was 16 dependent ones per output). */
static inline float lane_sum(const vec *acc) {
#if VW == 16 || VW == 8
#if VW == 16
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc[0]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[0]), 1)));
#else
    __m256 h = _mm256_add_ps(acc[0], acc[1]);
#endif
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
#else
    float t[LANES];
    for (int k = 0; k < LANES; k++) t[k] = acc[k];
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int k = 0; k < width; k++) t[k] += t[k + width];
    return t[0];
#endif
}

/* sum_i a[i] b[i] over n values: LANES partial sums, then lane_sum, then the tail. */
static inline float dot(const float *a, const float *b, int64_t n) {
    vec acc[STEPS];
    for (int u = 0; u < STEPS; u++) acc[u] = vzero();
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int u = 0; u < STEPS; u++) acc[u] = vfma(vload(a + i + u * VW), vload(b + i + u * VW), acc[u]);
    float s = lane_sum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out = weight * (x * rsqrt(mean(x^2) + eps)), over n values (HF's RMSNorm in float32); out may be x. */
static inline void rms_norm(const float *x, const float *weight, float eps, int64_t n, float *out) {
    float r = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * r);
}

/* Rotate-half RoPE of `heads` heads of head_dim values in place, with this row's cos/sin [head_dim], each result
   then times `by` (llama-4's query scale; 1: none). */
static inline void rope(float *x, int64_t heads, int64_t head_dim, const float *cos, const float *sin, float by) {
    int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * head_dim;
        for (int64_t d = 0; d < half; d++) {
            float a = v[d], b = v[d + half];
            v[d] = (a * cos[d] - b * sin[d]) * by;
            v[d + half] = (b * cos[d + half] + a * sin[d + half]) * by;
        }
    }
}
#endif
