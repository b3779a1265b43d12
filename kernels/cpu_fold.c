/* SpecFold's folded verify on the CPU (kernels/packed_forward.py), the parts of a layer that are many small tensor
   ops and no matmul, one call each: the gate and the packing (the relative residual of every (branch, position)
   against its parent branch, the recomputed rows packed in flat order, and for every row the packed index of its
   source: itself, or its nearest ancestor that recomputes that position; the rule of kernels/gate.py, recompute
   where ||h_i - h_par||^2 > delta^2 ||h_par||^2, row 0 always), the packed rows' input RMSNorm, and their
   q/k-norm, RoPE and query scale. float32, sums in another order than PyTorch's. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
typedef float lanes __attribute__((vector_size(LANES * sizeof(float))));   /* GCC/Clang vector extension */

/* ||x - y||^2 and ||y||^2 over d values, each as LANES partial sums (in registers), then lane by lane. */
static void residual(const float *x, const float *y, int64_t d, float *diff, float *norm) {
    lanes dl = {0}, nl = {0}, a, b;
    int64_t i = 0;
    for (; i + LANES <= d; i += LANES) {
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, y + i, sizeof b);
        a -= b;
        dl += a * a;
        nl += b * b;
    }
    float ds = 0, ns = 0;
    for (int k = 0; k < LANES; k++) {
        ds += dl[k];
        ns += nl[k];
    }
    for (; i < d; i++) {
        float e = x[i] - y[i];
        ds += e * e;
        ns += y[i] * y[i];
    }
    *diff = ds;
    *norm = ns;
}

/* h [branches, n, d] float32; parents [branches] (row 0 its own); ancestors [branches, depth]: each row's chain
   to row 0, padded with 0. Writes recompute [branches * n] (0/1), rows (the recomputed flat indices, ascending),
   source [branches * n] (an index into rows), counts [branches] (recomputed positions per row); `index`
   [branches * n] is scratch. Returns how many rows recompute. */
int64_t fold_gate(const float *h, int64_t branches, int64_t n, int64_t d, const int64_t *parents,
                  const int64_t *ancestors, int64_t depth, float delta2, uint8_t *recompute, int64_t *rows,
                  int64_t *source, int64_t *counts, int64_t *index) {
    for (int64_t i = 0; i < branches; i++) {
        counts[i] = 0;
        for (int64_t p = 0; p < n; p++) {
            int on = 1;
            if (i) {
                float diff, norm;
                residual(h + (i * n + p) * d, h + (parents[i] * n + p) * d, d, &diff, &norm);
                on = diff > delta2 * norm;
            }
            recompute[i * n + p] = (uint8_t)on;
            counts[i] += on;
        }
    }
    int64_t count = 0;
    for (int64_t f = 0; f < branches * n; f++)
        if (recompute[f]) {
            index[f] = count;
            rows[count++] = f;
        }
    for (int64_t i = 0; i < branches; i++)
        for (int64_t p = 0; p < n; p++)
            for (int64_t a = 0; a < depth; a++) {
                int64_t f = ancestors[i * depth + a] * n + p;
                if (recompute[f]) {
                    source[i * n + p] = index[f];
                    break;
                }
            }
    return count;
}

/* The sum of v[0..d) squared, as LANES partial sums added lane by lane. */
static float squares(const float *v, int64_t d) {
    lanes acc = {0}, a;
    int64_t i = 0;
    for (; i + LANES <= d; i += LANES) {
        memcpy(&a, v + i, sizeof a);
        acc += a * a;
    }
    float sum = 0;
    for (int k = 0; k < LANES; k++) sum += acc[k];
    for (; i < d; i++) sum += v[i] * v[i];
    return sum;
}

/* out [m, d]: HF's RMSNorm (float32 statistics, then the weight) of h's rows `rows` (h [*, d]): the packed rows'
   input norm of a layer, gathered and normed in one pass. */
void norm_rows(const float *h, const int64_t *rows, int64_t m, int64_t d, const float *weight, float eps,
               float *out) {
    for (int64_t r = 0; r < m; r++) {
        const float *x = h + rows[r] * d;
        float *y = out + r * d;
        float inv = 1.0f / sqrtf(squares(x, d) / (float)d + eps);
        for (int64_t i = 0; i < d; i++) y[i] = weight[i] * (x[i] * inv);
    }
}

/* In place on x [rows, heads, hd] (hd even): the model's q/k-norm (RMSNorm over each head with weight [hd];
   NULL: none), HF's rotate-half RoPE at each row's position (cos, sin [positions, hd] tables), then the
   llama-4 query scale of that position (scale [positions]; NULL: none), as Attention.position does them. */
void norm_rope(float *x, int64_t rows, int64_t heads, int64_t hd, const float *weight, float eps,
               const float *cos, const float *sin, const int64_t *position, const float *scale) {
    int64_t half = hd / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + position[r] * hd, *s = sin + position[r] * hd;
        float by = scale ? scale[position[r]] : 1.0f;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (r * heads + h) * hd;
            if (weight) {
                float inv = 1.0f / sqrtf(squares(v, hd) / (float)hd + eps);
                for (int64_t i = 0; i < hd; i++) v[i] = weight[i] * (v[i] * inv);
            }
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                float first = a * c[i], second = b * s[i];             /* rotate_half(v) = [-v2, v1] */
                float third = b * c[i + half], fourth = a * s[i + half];
                v[i] = (first - second) * by;
                v[i + half] = (third + fourth) * by;
            }
        }
    }
}
