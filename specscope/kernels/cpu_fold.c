/* SpecFold's folded verify on the CPU (backend/forward/packed.py), the parts of a layer that are many small tensor
   ops and no matmul, one call each: the gate and the packing (the relative residual of every (branch, position)
   against its parent branch, the recomputed rows packed in flat order, and for every row the packed index of its
   source: itself, or its nearest ancestor that recomputes that position; the rule of kernels/gate.py, recompute
   where ||h_i - h_par||^2 > delta^2 ||h_par||^2, row 0 always), the packed rows' input RMSNorm, and their
   q/k-norm, RoPE and query scale, on simd.h's row ops. float32, sums in another order than PyTorch's. */
#include "simd.h"
#include "api.h"

/* ||x - y||^2 and ||y||^2 over d values, each as LANES partial sums and simd.h's lane sum. */
static void residual(const float *x, const float *y, int64_t d, float *diff, float *norm) {
    vec dl[STEPS], nl[STEPS];
    for (int u = 0; u < STEPS; u++) dl[u] = nl[u] = vzero();
    int64_t i = 0;
    for (; i + LANES <= d; i += LANES)
        for (int u = 0; u < STEPS; u++) {
            vec b = vload(y + i + u * VW), a = vsub(vload(x + i + u * VW), b);
            dl[u] = vfma(a, a, dl[u]);
            nl[u] = vfma(b, b, nl[u]);
        }
    float ds = lane_sum(dl), ns = lane_sum(nl);
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

/* out [m, d]: HF's RMSNorm (float32 statistics, then the weight) of h's rows `rows` (h [*, d]): the packed rows'
   input norm of a layer, gathered and normed in one pass. */
void norm_rows(const float *h, const int64_t *rows, int64_t m, int64_t d, const float *weight, float eps,
               float *out) {
    for (int64_t r = 0; r < m; r++) rms_norm(h + rows[r] * d, weight, eps, d, out + r * d);
}

/* In place on x [rows, heads, hd] (hd even): the model's q/k-norm (RMSNorm over each head with weight [hd];
   NULL: none), HF's rotate-half RoPE at each row's position (cos, sin [positions, hd] tables), then the
   llama-4 query scale of that position (scale [positions]; NULL: none), as Attention.position does them. */
void norm_rope(float *x, int64_t rows, int64_t heads, int64_t hd, const float *weight, float eps,
               const float *cos, const float *sin, const int64_t *position, const float *scale) {
    for (int64_t r = 0; r < rows; r++) {
        float *v = x + r * heads * hd;
        if (weight)
            for (int64_t h = 0; h < heads; h++) rms_norm(v + h * hd, weight, eps, hd, v + h * hd);
        rope(v, heads, hd, cos + position[r] * hd, sin + position[r] * hd, scale ? scale[position[r]] : 1.0f);
    }
}
