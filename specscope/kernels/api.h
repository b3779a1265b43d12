/* The C kernels' exported functions: cpu_decode.c and cpu_fold.c compile against these prototypes, and
   kernels/native.py declares them to cffi from this very file, so a caller's argument types are checked against
   the C definitions (a pointer of another element type is refused). Plain declarations only: cffi reads it as
   is, after <stdint.h>. */

int decode_step(const int64_t *dims, const float *eps_, const int64_t *tensors, const float *embed,
                const float *final_norm, const void *head, const int64_t *odd_rows, int64_t odd_count,
                const float *odd_values, int rows, const int64_t *ids, const int64_t *positions,
                const float *cos, const float *sin, const float *q_scale, const int64_t *prefix, int64_t ldp,
                const int64_t *lengths, const int64_t *write, float *k_cache, float *v_cache, int64_t layer_cache,
                const int64_t *own_first, const int64_t *own_count, const int64_t *lora, int lora_rank,
                float lora_scale, const uint8_t *lora_on, float *logits, float *hidden);

int64_t fold_gate(const float *h, int64_t branches, int64_t n, int64_t d, const int64_t *parents,
                  const int64_t *ancestors, int64_t depth, float delta2, uint8_t *recompute, int64_t *rows,
                  int64_t *source, int64_t *counts, int64_t *index);

void norm_rows(const float *h, const int64_t *rows, int64_t m, int64_t d, const float *weight, float eps,
               float *out);

void norm_rope(float *x, int64_t rows, int64_t heads, int64_t hd, const float *weight, float eps,
               const float *cos, const float *sin, const int64_t *position, const float *scale);

int amx_bf16_ready(void);

int int8_isa_ready(int isa);

void int8_linear(int isa, int planes, const void *w, int format, int out, int in, const float *x, int64_t ldx,
                 float *y, int64_t ldy, int rows, void *scratch);
