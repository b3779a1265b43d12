/* SpecFold's per-layer gate and packing for the CPU (kernels/packed_forward.py), one call instead of some twenty
   small tensor ops: the relative residual gate of every (branch, position) against its parent branch, the
   recomputed rows packed in flat order, and for every row the packed index of its source (itself, or its
   nearest ancestor that recomputes that position). The same rule as kernels/gate.py: recompute where
   ||h_i - h_par||^2 > delta^2 ||h_par||^2 (row 0 always), float32 sums in another order. */
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
