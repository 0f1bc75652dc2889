/* codegen/cuda/lower_moe.c — the mixture of experts' matmuls as one strided-batched cuBLASLt
 * GEMM (LOOM_CUDA_MOE_GEMM=batched).  The default lowering (lower.c) runs grouped_matmul and
 * grouped_matmul_wgrad as the tiled kernels of kernels/moe.cuh over the device-side counts:
 * one launch, only the rows routed, but loom's own tiles.  With a capacity (spec
 * capacity_factor: every expert keeps at most cap rows, moe_count's "capacity") the groups
 * fit [E, cap, D] whatever the routing, so each matmul can be cuBLASLt's: the groups copied
 * into scratch padded with zero rows (loom_moe_pad), one GEMM of batch E, and for the forward
 * and the data gradient the products copied back to the groups' rows (loom_moe_unpad).  The
 * zero rows make zero products, which are never copied back, and add nothing to the weight
 * gradient's sums: no masking.  The price is the padding's FLOPs (E cap against the rows
 * routed) and the copies' bytes; tests/gpu/OWED.md check 9 measures which is faster.
 *
 * Without a capacity (dropless routing, or expert parallelism's received counts, whose groups
 * are source rank x expert) nothing bounds a group but the rows, and the grouped kernels stay:
 * their step's label says so (`loom ir --cost`).
 */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

#include <stdlib.h>
#include <string.h>

#define MOE_PAD_E 1024   /* kernels/moe.cuh's LOOM_MOE_PAD_E: the offsets a block holds */

int cl_moe_gemm_mode(Lower *L, bool *batched) {
  const char *e = getenv("LOOM_CUDA_MOE_GEMM");
  *batched = false;
  if (!e || !*e || !strcmp(e, "grouped")) return 0;
  if (!strcmp(e, "batched")) {
    *batched = true;
    return 0;
  }
  return cl_fail(L, "LOOM_CUDA_MOE_GEMM=%s: set it to grouped (the default) or batched", e);
}

/* The capacity the counts operand was made under: moe_count's, one group per expert; 0 when
   none (dropless, or counts that are not moe_count's, as expert parallelism's). */
static int64_t capacity_of(const Value *cnt, int64_t E) {
  if (cnt->kind != VAL_RESULT || !cnt->def || cnt->def->kind != OP_MOE_COUNT) return 0;
  if (op_int(cnt->def, "experts") != E || type_numel(&cnt->type) != E) return 0;
  return op_int(cnt->def, "capacity");
}

/* rows [E*cap, D] of v's storage at byte `at` of the scratch region, as st's next output */
static int add_padded(Lower *L, RtStep *st, const Value *like, int64_t at, int64_t n) {
  RtBuf b;
  if (cl_buf_of(L, like, &b)) return IR_EINPUT;
  int size = cl_st_size(b.storage);
  if (cl_add_scratch(L, st, at, (n * size + 3) / 4)) return IR_EINPUT;
  RtBuf *p = &st->bufs[st->n_in + st->n_out - 1];
  p->storage = b.storage;
  p->round = b.round;
  p->n = n;
  return 0;
}

/* Is the padded copy of x (under counts cnt) at the start of scratch still there: the one the
   last pad made in this function, no step since writing any byte of it? */
static bool pad_kept(Lower *L, Steps *s, const Value *x, const Value *cnt) {
  if (L->moe_pad_of != x || L->moe_pad_cnt != cnt || L->moe_pad_f != L->f || L->moe_pad_steps > s->n) return false;
  for (int k = L->moe_pad_steps; k < s->n; k++) {
    const RtStep *st = &s->items[k];
    for (int b = st->n_in; b < st->n_in + st->n_out; b++)
      if (cl_overlap(&st->bufs[b], &L->moe_pad_buf)) return false;
  }
  return true;
}

/* x [R,D] -> [E,cap,D] at scratch byte `at` (its buffer in *out); at 0, reused when kept */
static int pad_step(Lower *L, Steps *s, const Value *x, const Value *cnt, int64_t E, int64_t cap, int64_t at,
                    RtBuf *out) {
  int64_t R = x->type.dims[0], D = x->type.dims[1];
  if (at == 0 && pad_kept(L, s, x, cnt)) {
    *out = L->moe_pad_buf;
    return 0;
  }
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (pad to the capacity)");
  const Value *in[2] = {x, cnt};
  if (!st || cl_set_bufs(L, st, in, 2, false) || add_padded(L, st, x, at, E * cap * D)) return IR_EINPUT;
  const int64_t v[4] = {E, cap, D, R};
  memcpy(st->i, v, sizeof v);
  cl_launch_ew(st, E * cap * D);
  *out = st->bufs[2];
  if (cl_instantiate(L, st, "moe_pad", "loom_moe_pad", (const int[]){0, -1}, NULL, "", 1024)) return IR_EINPUT;
  if (at == 0) {
    L->moe_pad_of = x, L->moe_pad_cnt = cnt, L->moe_pad_f = L->f;
    L->moe_pad_buf = *out;
    L->moe_pad_steps = s->n;
  } else if (L->moe_pad_f == L->f && cl_overlap(out, &L->moe_pad_buf)) {
    L->moe_pad_of = NULL;
  }
  return 0;
}

/* C[e] = op(A[e]) op(B[e]) for e < E: runtime/program.h's RT_STEP_GEMM, beta 0 */
static RtStep *gemm_step(Lower *L, Steps *s, const int64_t v[9], const char *what) {
  RtStep *st = cl_new_step(L, s, RT_STEP_GEMM, 0, what);
  if (!st) return NULL;
  memset(st->i, 0, sizeof st->i);
  memcpy(st->i, v, 9 * sizeof *v);
  st->grid[0] = st->block[0] = 0;   /* a library call */
  st->n_in = 2;
  st->n_out = 1;
  return st;
}

int cl_lower_moe_batched(Lower *L, Steps *s, const char **why_not) {
  const Op *op = L->op;
  bool batched;
  *why_not = NULL;
  if (cl_moe_gemm_mode(L, &batched)) return IR_EINPUT;
  if (!batched) return 1;
  bool wg = op->kind == OP_GROUPED_MATMUL_WGRAD;
  const Value *a = op->operands[0], *b = op->operands[1], *cnt = op->operands[2];
  int64_t E = wg ? op_int(op, "experts") : b->type.dims[0];
  int64_t cap = capacity_of(cnt, E);
  if (cap <= 0) {
    bool routed = cnt->kind == VAL_RESULT && cnt->def && cnt->def->kind == OP_MOE_COUNT;
    *why_not = routed ? " (grouped: LOOM_CUDA_MOE_GEMM=batched needs a capacity_factor)"
                      : " (grouped: LOOM_CUDA_MOE_GEMM=batched takes one routing's counts, not expert parallelism's)";
    return 1;
  }
  if (E > MOE_PAD_E) {
    *why_not = " (grouped: LOOM_CUDA_MOE_GEMM=batched takes at most 1024 experts)";
    return 1;
  }
  if (a->type.rank != 2 || b->type.rank != (wg ? 2 : 3) || E * cap > INT32_MAX)
    return cl_fail(L, "internal error: a batched grouped matmul of unexpected shapes");
  char what[256];
  snprintf(what, sizeof what, " (batched: %lld experts x capacity %lld)", (long long)E, (long long)cap);
  RtBuf pa, pb;
  if (wg) {   /* dw[e] [N,K] = dy_e^T x_e: dy [R,N] and x [R,K] padded, one GEMM with ta */
    int64_t N = a->type.dims[1], K = b->type.dims[1];
    int64_t at_x = cg_align64(E * cap * N * cl_st_size(cl_storage_of(a->type.dtype)));
    if (pad_step(L, s, a, cnt, E, cap, 0, &pa) || pad_step(L, s, b, cnt, E, cap, at_x, &pb)) return IR_EINPUT;
    const int64_t v[9] = {E, N, K, cap, 1, 0, cap * N, cap * K, N * K};
    /* the product added into the f32 gradient when an accumulation of it follows (as
       lower_gemm.c's matmuls: beta 1, no bf16 rounding of the product, one launch less) */
    const Value *acc = cl_fuse_grad_accum(L, L->f, L->op_index);
    if (acc) {
      size_t n = strlen(what);
      snprintf(what + n, sizeof what - n, " (+= $%s)", acc->global->name);
    }
    RtStep *st = gemm_step(L, s, v, what);
    if (!st) return IR_EINPUT;
    st->bufs[0] = pa;
    st->bufs[1] = pb;
    if (acc) st->i[CUDA_GEMM_BETA_INT] = 1;
    return cl_buf_of(L, acc ? acc : op->results[0], &st->bufs[2]);
  }
  /* y [R,N]: x [R,K] padded, yp[e] = xp[e] w[e] (w [E,N,K] with tb, else [E,K,N]), back to rows */
  bool tb = op_bool(op, "tb");
  const Value *y = op->results[0];
  int64_t R = a->type.dims[0], K = a->type.dims[1], N = y->type.dims[1];
  int64_t at_y = cg_align64(E * cap * K * cl_st_size(cl_storage_of(a->type.dtype)));
  if (pad_step(L, s, a, cnt, E, cap, 0, &pa)) return IR_EINPUT;
  const int64_t v[9] = {E, cap, N, K, 0, tb, cap * K, N * K, cap * N};
  RtStep *st = gemm_step(L, s, v, what);
  if (!st || cl_buf_of(L, b, &st->bufs[1])) return IR_EINPUT;
  st->bufs[0] = pa;
  st->n_out = 0;
  if (add_padded(L, st, y, at_y, E * cap * N)) return IR_EINPUT;
  RtBuf yp = st->bufs[2];
  st = cl_new_step(L, s, RT_STEP_KERNEL, 0, " (back to the groups' rows)");
  if (!st) return IR_EINPUT;
  st->n_in = 2;
  st->n_out = 1;
  st->bufs[0] = yp;
  if (cl_buf_of(L, cnt, &st->bufs[1]) || cl_buf_of(L, y, &st->bufs[2])) return IR_EINPUT;
  const int64_t u[4] = {E, cap, N, R};
  memcpy(st->i, u, sizeof u);
  cl_launch_ew(st, R * N);
  return cl_instantiate(L, st, "moe_unpad", "loom_moe_unpad", (const int[]){0, -1}, NULL, "", 1024);
}
