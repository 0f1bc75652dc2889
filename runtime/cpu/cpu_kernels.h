/* runtime/cpu/cpu_kernels.h — the CPU runtime's builtin kernels (RtBuiltin, runtime/program.h).
 *
 * One function per builtin, on f32 / int32 buffers, multi-threaded over a ThreadPool
 * (NULL runs on the calling thread).  The meaning of each is the op of the same name in
 * the reference executor (ir/interp_ops.c): same formulas, f32 arithmetic.  Row sums are
 * vectorized with 8 partial accumulators and exp is a vectorized polynomial
 * (runtime/cpu/cpu_vec.h), so norms, softmax, cross-entropy and attention may differ from the
 * reference in the last bits (~1e-7 relative); rope, adamw, embedding(_grad) and all data
 * movement do the reference's operations in its order and match it bitwise.
 *
 * Every result is bitwise independent of the number of threads: no float sum is ever
 * split along a thread boundary (reductions across rows are split along the reduced-into
 * dimension instead, see each function).
 *
 * The typed functions do not round; cpu_builtin_run does: after a builtin it rounds every
 * float output whose RtBuf.round is set (and the in-place destination of accumulate,
 * assign and adamw's parameter), as the reference executor rounds results to their dtype.
 *
 * Errors: 0 ok, 2 bad input (a token id or target outside the vocabulary, a malformed
 * step), 1 run-time failure (out of memory), with a message in err.
 */
#ifndef LOOM_RUNTIME_CPU_KERNELS_H
#define LOOM_RUNTIME_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "runtime/program.h"
#include "runtime/cpu/threadpool.h"

/* ---- rounding to narrow float formats (bitwise as ir/types.c dtype_round) ---- */
float rt_round(RtRound r, float x);
void rt_round_buf(ThreadPool *tp, float *x, int64_t n, RtRound r);

/* ---- the dispatcher ---- */
/* Checks a builtin step: buffer counts, int/float kinds and element counts against i[].
   Run it once per step when a program is loaded; cpu_builtin_run trusts the step. */
int cpu_builtin_check(const RtStep *st, char *err, size_t errlen);
/* Runs builtin step st; bufs[k] is the address of st->bufs[k].  Rounds outputs. */
int cpu_builtin_run(ThreadPool *tp, Comm *comm, const RtStep *st, void *const *bufs, char *err, size_t errlen);
/* runtime/cpu/cpu_mesh.c: the builtins that depend on the rank (collectives, shard_slice/pad,
   target_pick, onehot); comm NULL: one rank (coordinates 0, collectives over 1 rank). */
int cpu_mesh_builtin_check(const RtStep *st, char *err, size_t errlen);
int cpu_mesh_builtin_run(ThreadPool *tp, Comm *comm, const RtStep *st, void *const *bufs, char *err, size_t errlen);
/* The collective an RT_B_COLL_START step starts, as its own step (which and i[] unpacked). */
void cpu_coll_unwrap(const RtStep *start, RtStep *out);

/* ---- normalization, softmax (rows of D; rows are split across threads) ---- */
void cpu_layernorm(ThreadPool *tp, const float *x, const float *w, const float *b, float *y, int64_t rows,
                   int64_t D, float eps);
void cpu_rmsnorm(ThreadPool *tp, const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps);
/* dw, db (db NULL for rmsnorm) are sums over rows: computed by a second pass split along
   D, each column summed over rows in row order. */
int cpu_layernorm_grad(ThreadPool *tp, const float *dy, const float *x, const float *w, float *dx, float *dw,
                       float *db, int64_t rows, int64_t D, float eps, char *err, size_t errlen);
int cpu_rmsnorm_grad(ThreadPool *tp, const float *dy, const float *x, const float *w, float *dx, float *dw,
                     int64_t rows, int64_t D, float eps, char *err, size_t errlen);
void cpu_softmax(ThreadPool *tp, const float *x, float *y, int64_t rows, int64_t D);
void cpu_softmax_grad(ThreadPool *tp, const float *dy, const float *y, float *dx, int64_t rows, int64_t D);

/* ---- attention (runtime/cpu/cpu_attention.c) ----
   q[B,T,H,Dh] k,v[B,S,KV,Dh] out[B,T,H,Dh]; query head h reads kv head h/(H/KV);
   causal: query t sees keys 0..t (requires T <= S); window > 0: and only keys s with t - s < window. */
int cpu_attention(ThreadPool *tp, const float *q, const float *k, const float *v, float *out, int64_t B,
                  int64_t T, int64_t H, int64_t Dh, int64_t S, int64_t KV, bool causal, int64_t window, float scale,
                  char *err, size_t errlen);
int cpu_attention_grad(ThreadPool *tp, const float *dout, const float *q, const float *k, const float *v,
                       float *dq, float *dk, float *dv, int64_t B, int64_t T, int64_t H, int64_t Dh, int64_t S,
                       int64_t KV, bool causal, int64_t window, float scale, char *err, size_t errlen);
/* x,y[B,T,H,Dh] (may be the same buffer); f: theta and the scaling (rt_rope_inv_freq) */
int cpu_rope(ThreadPool *tp, const float *x, float *y, int64_t B, int64_t T, int64_t H, int64_t Dh,
             int64_t offset, bool inverse, const double *f, int64_t seq_c, int64_t seq_n, bool zigzag, char *err,
             size_t errlen);

/* ---- generation with a KV cache (runtime/cpu/cpu_decode.c): the ops rope_at,
   attention_cached and kv_write (ir/ops.def); pos holds int32 positions [B,C] */
int cpu_rope_at(ThreadPool *tp, const float *x, const int32_t *pos, float *y, int64_t B, int64_t C, int64_t H,
                int64_t Dh, const double *f, char *err, size_t errlen);
int cpu_attention_cached(ThreadPool *tp, const float *q, const float *k, const float *v, const int32_t *pos, float *out,
                         int64_t B, int64_t C, int64_t H, int64_t Dh, int64_t S, int64_t KV, int64_t window,
                         float scale, char *err, size_t errlen);
/* cpu_moe.c: the mixture-of-experts ops (program.h's RT_B_TOPK .. RT_B_GROUPED_WGRAD). */
void cpu_topk(ThreadPool *tp, const float *x, int32_t *idx, int64_t rows, int64_t E, int64_t k);
int cpu_gather_last(const float *x, const int32_t *idx, float *y, int64_t rows, int64_t E, int64_t k, bool scatter,
                    char *err, size_t errlen);
int cpu_moe_sort(const int32_t *idx, int32_t *pos, int32_t *count, int64_t n, int64_t E, int64_t cap, char *err,
                 size_t errlen);
int cpu_moe_permute(ThreadPool *tp, int kind, const float *a, const float *b, const int32_t *pos, float *y, int64_t N,
                    int64_t k, int64_t D, int64_t R, char *err, size_t errlen);
int cpu_grouped_matmul(ThreadPool *tp, bool wgrad, const float *a, const float *b, const int32_t *cnt, float *y,
                       int64_t R, int64_t K, int64_t N, int64_t E, int64_t G, bool tb, char *err, size_t errlen);
int cpu_kv_write(float *cache, const float *x, const int32_t *pos, int64_t B, int64_t C, int64_t S, int64_t row,
                 char *err, size_t errlen);

/* ---- ring attention's blocks (runtime/cpu/cpu_attn_block.c): the ops attention_block and
   attention_block_grad (ir/ops.def); c is the rank's coordinate on the split sequence's axis */
typedef struct {
  int64_t B, Tq, H, Dh, Tk, KV;
  bool causal, zigzag;
  int64_t c, n, kv_shift, window;
  float scale;
} CpuAttnBlock;
int cpu_attn_block(ThreadPool *tp, const CpuAttnBlock *a, const float *q, const float *k, const float *v, float *o,
                   float *lse, char *err, size_t errlen);
int cpu_attn_block_grad(ThreadPool *tp, const CpuAttnBlock *a, const float *dout, const float *q, const float *k,
                        const float *v, const float *lse, const float *delta, float *dq, float *dk, float *dv, char *err,
                        size_t errlen);

/* ---- losses ---- */
int cpu_cross_entropy(ThreadPool *tp, const float *logits, const int32_t *targets, float *loss, int64_t rows,
                      int64_t V, char *err, size_t errlen);
int cpu_cross_entropy_grad(ThreadPool *tp, const float *dloss, const float *logits, const int32_t *targets,
                           float *dlogits, int64_t rows, int64_t V, char *err, size_t errlen);

/* ---- embedding (runtime/cpu/cpu_data.c) ---- */
/* split: the table holds rows [off, off + V) of a vocabulary split over ranks; other ids
   give zero rows (and no gradient).  Not split: every id must be in [0, V). */
int cpu_embedding(ThreadPool *tp, const float *table, const int32_t *ids, float *y, int64_t n_ids, int64_t V,
                  int64_t D, int64_t off, bool split, char *err, size_t errlen);
/* dtable = 0, then rows of dy scatter-added at their ids in id order; split along D. */
int cpu_embedding_grad(ThreadPool *tp, const float *dy, const int32_t *ids, float *dtable, int64_t n_ids,
                       int64_t V, int64_t D, int64_t off, bool split, char *err, size_t errlen);

/* ---- data movement (runtime/cpu/cpu_data.c); elements are 4 bytes (f32 or int32) ---- */
void cpu_transpose(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *xdims, const int64_t *perm);
void cpu_slice(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *xdims, const int64_t *start,
               const int64_t *end);
void cpu_pad(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *xdims, const int64_t *low,
             const int64_t *high);
/* y[outer, sum(sizes), inner] from xs[j][outer, sizes[j], inner] */
void cpu_concat(ThreadPool *tp, const void *const *xs, int n, void *y, int64_t outer, int64_t inner,
                const int64_t *sizes);
/* y[ydims] (row-major) from x at element offset sum_d c_d * xstrides[d] */
void cpu_broadcast(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *ydims,
                   const int64_t *xstrides);
void cpu_iota(ThreadPool *tp, void *y, bool is_int, int rank, const int64_t *dims, int dim);

/* ---- elementwise (runtime/cpu/cpu_kernels.c) ---- */
void cpu_copy(ThreadPool *tp, const void *x, void *y, int64_t n);   /* 4-byte elements */
/* int -> float, float -> int (truncates), or to bool (x != 0, as 0/1 int32) */
void cpu_cast(ThreadPool *tp, const void *x, bool x_int, void *y, bool y_int, bool y_bool, int64_t n);
void cpu_fill(ThreadPool *tp, void *y, bool is_int, double value, int64_t n);
void cpu_accumulate(ThreadPool *tp, void *dst, const void *x, bool is_int, int64_t n);
/* AdamW exactly as the reference (float per element, bias corrections in double): the new
   p, m, v into p_out, m_out, v_out, which may be p, m, v themselves (in place). */
void cpu_adamw(ThreadPool *tp, const float *p, const float *m, const float *v, const float *g, float gscale,
               float lr, double t, double beta1, double beta2, double eps, double weight_decay, int64_t n,
               float *p_out, float *m_out, float *v_out);

#endif
