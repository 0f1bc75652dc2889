/* codegen/cuda/lower_gemm_plan.c — the GEMM fusions that reorder or skip ops, planned once
 * per function before it is lowered (cl_plan_bgrad, from lower.c's lower_func): the bias
 * gradients as BGRADA epilogues, the sums of three products, GELU's backward at its kernel's
 * place; the views and gradient trees by lower_gemm_views.c.  What it decides is in Lower
 * (skip, defer, bgrad, resid, sum_into, gemm_at, ...), which lower_gemm.c reads as it makes
 * the steps.  Its own file: planning walks the whole function and the memory plan; the
 * lowering only reads the answers. */
#include "codegen/cuda/lower_gemm_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- bias gradients (BGRAD)

   A layer y = x W + b has db = the column sums of dy, which the training passes leave as a
   fused kernel of one reduce_sum (every dim but the last) beside the weight gradient's
   matmul dW = x^T dy (ta, B = dy).  That GEMM already reads dy: cuBLASLt's BGRADA epilogue
   (our B is Lt's A) writes db as well, and the reduction's launch and its read of dy go.
   The reduction comes first in the program, its users (the cast + accumulate into the f32
   gradient, or the pads of q, k and v) maybe before the matmul: they are deferred to just
   after it.  The sums run in f32 and are rounded once to db's dtype, as the kernel's: no
   rounding point moves (bf16 programs too; the order of the additions differs), so this is on
   without LOOM_CUDA_FUSE_BF16.  LOOM_CUDA_NO_EPILOGUE=1 or LOOM_CUDA_NO_BGRAD=1: off. */

/* A kernel func that is one reduce_sum of its argument [.., N] over every dim but the last. */
static bool is_bias_reduce(const Func *k) {
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 1) return false;
  const Op *rs = k->ops.items[0];
  const Value *x = k->args.items[0], *r = rs->results[0];
  if (rs->kind != OP_REDUCE_SUM || rs->operands[0] != x || k->rets.items[0] != r || x->type.rank < 2 || r->type.rank != 1 ||
      r->type.dims[0] != x->type.dims[x->type.rank - 1] || !dtype_is_float(x->type.dtype) || r->type.dtype != x->type.dtype)
    return false;
  const Attr *dims = op_attr(rs, "dims");
  if (!dims || dims->kind != ATTR_INTS || dims->n != x->type.rank - 1) return false;
  for (int d = 0; d < dims->n; d++)
    if (dims->ints[d] != d) return false;
  return true;
}

static bool same_buf(const RtBuf *a, const RtBuf *b) {
  return a->region == b->region && a->offset == b->offset && a->n == b->n && a->storage == b->storage;
}

/* Buffers of op k's operands and results but x and y (NULL: none) appended to bufs (*n of
   cap); false if one has none. */
static bool op_bufs(Lower *L, const Op *op, const Value *x, const Value *y, RtBuf *bufs, int *n, int cap) {
  for (int a = 0; a < op->n_operands + op->n_results; a++) {
    const Value *v = a < op->n_operands ? op->operands[a] : op->results[a - op->n_operands];
    if (v && (v == x || v == y)) continue;
    if (*n >= cap || cl_buf_of(L, v, &bufs[*n])) {
      L->err[0] = 0;
      return false;
    }
    (*n)++;
  }
  return true;
}

/* The reduction at op i and the weight-gradient matmul at op j: may the reduction run as j's
   epilogue, with the ops between that use its result (marked in defer[]) after j? */
static bool plan_one(Lower *L, const Func *f, int i, int j, int *defer, bool *scratch) {
  enum { CAP = 64 };
  const Value *r = ((const Op *)f->ops.items[i])->results[0];
  const Value *vals[CAP];
  int n_vals = 0;
  vals[n_vals++] = r;
  RtBuf moved[CAP];   /* the buffers the reordered ops touch */
  int n_moved = 0;
  const Value *unmade = NULL;   /* a cast's result the fused cast + accumulate never writes */
  /* r is used only by the deferred ops: it goes to scratch, which no op between touches after
     the GEMM (its place may have been given to a value the ops between write) */
  int r_deferred = 0;
  for (int k = i + 1; k < j; k++) {
    const Op *op = f->ops.items[k];
    for (int a = 0; a < op->n_operands; a++) r_deferred += op->operands[a] == r;
  }
  *scratch = r_deferred == cl_uses(f, r);
  if (!*scratch && cl_buf_of(L, r, &moved[n_moved++])) {
    L->err[0] = 0;
    return false;
  }
  for (int k = i + 1; k <= j; k++) {
    const Op *op = f->ops.items[k];
    bool uses_r = false;
    for (int a = 0; a < op->n_operands && !uses_r; a++)
      for (int v = 0; v < n_vals; v++) uses_r |= op->operands[a] == vals[v];
    if (!uses_r) continue;
    /* only the users the passes put there, which touch nothing else the ops between read */
    if (k == j || L->skip[k] || L->defer[k] >= 0 ||
        !(op->kind == OP_ACCUMULATE || op->kind == OP_RESHAPE || cl_gemm_is_cast_call(op) ||
          (op->kind == OP_PAD && op->n_operands == 1)))
      return false;
    /* a cast whose accumulate follows runs as one kernel (cl_fuse_grad_accum): its result is
       never written */
    if (cl_gemm_is_cast_call(op) && op->results[0]->type.dtype == DT_F32 && cl_uses(f, op->results[0]) == 1 &&
        cl_gemm_accumulates(f, k + 1, op->results[0]) && !getenv("LOOM_CUDA_NO_ACC_FUSION"))
      unmade = op->results[0];
    if (!op_bufs(L, op, unmade, *scratch ? r : NULL, moved, &n_moved, CAP)) return false;
    for (int q = 0; q < op->n_results && n_vals < CAP; q++) vals[n_vals++] = op->results[q];
    defer[k] = j;
  }
  for (int k = i + 1; k <= j; k++) {
    if (defer[k] >= 0) continue;
    RtBuf b[CAP];
    int nb = 0;
    if (!op_bufs(L, f->ops.items[k], NULL, NULL, b, &nb, CAP)) return false;
    for (int x = 0; x < nb; x++)
      for (int y = 0; y < n_moved; y++)
        if (cl_overlap(&b[x], &moved[y])) return false;
  }
  return true;
}

/* ---------------------------------------------------------------- sums of three products

   The q, k and v projections' input gradient is dx = dq Wq^T + dk Wk^T + dv Wv^T: three GEMMs,
   then a kernel add(add(p1, p2), p3) that reads the three products and writes dx (GPT-2
   124M: 100 MB a layer).  Instead p2's GEMM adds p1 (C = p1, beta = 1; its result in p2's
   place) and p3's GEMM adds that and writes dx: the kernel is gone.  The same additions in
   the same order (fp32: the same bits); in bf16 the products are no longer rounded before
   they are added, so bf16 and f16 only with LOOM_CUDA_FUSE_BF16=1.  LOOM_CUDA_NO_EPILOGUE=1
   or LOOM_CUDA_NO_SUM3=1: off. */

/* A kernel func add(add(a0, a1), a2) of its three arguments of one type: the order of the
   arguments in ord[] (first added first). */
static bool is_sum3(const Func *k, int ord[3]) {
  if (!k || !k->is_kernel || k->args.n != 3 || k->rets.n != 1 || k->ops.n != 2) return false;
  const Op *a = k->ops.items[0], *b = k->ops.items[1];
  if (a->kind != OP_ADD || b->kind != OP_ADD || b->operands[0] != a->results[0] || k->rets.items[0] != b->results[0])
    return false;
  const Value *v[3] = {a->operands[0], a->operands[1], b->operands[1]};
  for (int x = 0; x < 3; x++) {
    ord[x] = -1;
    for (int y = 0; y < 3; y++)
      if (k->args.items[y] == v[x]) ord[x] = y;
    if (ord[x] < 0 || !cl_gemm_same_type(&v[x]->type, &b->results[0]->type)) return false;
  }
  return ord[0] != ord[1] && ord[1] != ord[2] && ord[0] != ord[2];
}

/* May the matmul at op i take an epilogue of its own (a plain GEMM of batch 1)? */
static bool plain_single(Lower *L, const Func *f, int i) {
  const Op *mm = f->ops.items[i];
  int last;
  if (mm->kind != OP_MATMUL || L->skip[i] || L->defer[i] >= 0 || L->bgrad[i] || L->resid[i] || L->sum_into[i] >= 0 ||
      cl_gemm_grad_accum(f, i, &last))
    return false;
  const Op *save = L->op;
  L->op = mm;
  bool single = cl_gemm_is_single(L);
  L->op = save;
  return single;
}

static void plan_sum3(Lower *L, const Func *f) {
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || getenv("LOOM_CUDA_NO_SUM3")) return;
  for (int j = 1; j < f->ops.n; j++) {
    const Op *call = f->ops.items[j];
    int ord[3];
    if (call->kind != OP_CALL || L->skip[j] || L->defer[j] >= 0 || L->gemm_at[j] >= 0 || !is_sum3(call->callee, ord))
      continue;
    const Value *p1 = call->operands[ord[0]], *p2 = call->operands[ord[1]], *p3 = call->operands[ord[2]];
    const Type *t = &p3->type;
    if ((t->dtype != DT_F32 && !cl_fuse_narrow()) || (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16))
      continue;
    /* p3 the product of the op just before; p2 of an earlier matmul; each used here only */
    int i = j - 1, k2 = -1;
    const Op *m3 = f->ops.items[i];
    if (m3->kind != OP_MATMUL || m3->results[0] != p3 || p2->kind != VAL_RESULT || p2->def->kind != OP_MATMUL)
      continue;
    for (int q = 0; q < i; q++)
      if (f->ops.items[q] == p2->def) k2 = q;
    if (k2 < 0 || cl_uses(f, p1) != 1 || cl_uses(f, p2) != 1 || cl_uses(f, p3) != 1 || p1 == p2 ||
        !plain_single(L, f, k2) || !plain_single(L, f, i))
      continue;
    /* p3's GEMM writes the sum where the kernel did: over none of its operands' bytes (which
       the memory plan may have given away after the GEMM), nor p2's (C; in place is fine) */
    RtBuf out, in[3];
    bool clash = cl_buf_of(L, call->results[0], &out) || cl_buf_of(L, m3->operands[0], &in[0]) ||
                 cl_buf_of(L, m3->operands[1], &in[1]) || cl_buf_of(L, p2, &in[2]);
    L->err[0] = 0;
    for (int a = 0; a < 3 && !clash; a++)
      clash = cl_overlap(&out, &in[a]) && !(a == 2 && out.offset == in[2].offset && out.region == in[2].region);
    if (clash) continue;
    /* p1 exists when p2's GEMM runs (an argument, a global, or made before it) */
    if (p1->kind == VAL_RESULT) {
      int k1 = -1;
      for (int q = 0; q < k2; q++)
        if (f->ops.items[q] == p1->def) k1 = q;
      if (k1 < 0) continue;
    }
    L->resid[k2] = p1;
    L->resid[i] = p2;
    L->sum_into[i] = j;
    L->skip[j] = true;
  }
}

static void plan_dgelu(Lower *L, const Func *f) {
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || getenv("LOOM_CUDA_NO_DGELU")) return;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *mm = f->ops.items[i];
    if (mm->kind != OP_MATMUL || L->skip[i] || L->defer[i] >= 0 || L->bgrad[i]) continue;
    const Op *save = L->op;
    L->op = mm;
    bool single = cl_gemm_is_single(L);
    L->op = save;
    if (!single) continue;
    for (int j = i + 1; j < f->ops.n && j <= i + 16; j++) {
      if (!cl_gemm_reads(f, j, mm->results[0])) continue;
      const Value *pre, *dx, *db;
      if (!L->skip[j] && L->defer[j] < 0 && L->gemm_at[j] < 0 && cl_gemm_match_dgelu(L, f, i, j, &pre, &dx, &db)) {
        L->defer[i] = j;   /* not lowered in order: at op j's place */
        L->gemm_at[j] = i;
      }
      break;
    }
  }
}

int cl_plan_bgrad(Lower *L, const Func *f) {
  int n = f->ops.n ? f->ops.n : 1;
  L->defer = malloc(sizeof(int) * (size_t)n);
  L->bgrad = calloc((size_t)n, sizeof *L->bgrad);
  L->bgrad_scratch = calloc((size_t)n, sizeof *L->bgrad_scratch);
  L->gemm_at = malloc(sizeof(int) * (size_t)n);
  int *trial = malloc(sizeof(int) * (size_t)n);
  if (!L->defer || !L->bgrad || !L->bgrad_scratch || !L->gemm_at || !trial) {
    free(trial);
    return cl_fail(L, "out of memory");
  }
  L->resid = calloc((size_t)n, sizeof *L->resid);
  L->sum_into = malloc(sizeof(int) * (size_t)n);
  if (!L->resid || !L->sum_into) {
    free(trial);
    return cl_fail(L, "out of memory");
  }
  for (int k = 0; k < n; k++) L->defer[k] = L->gemm_at[k] = L->sum_into[k] = -1;
  L->leaf_into = calloc((size_t)n, sizeof *L->leaf_into);
  L->leaf_of = calloc((size_t)n, sizeof *L->leaf_of);
  int nv = func_number((Func *)f) + 1;
  L->acc_into = calloc((size_t)nv, sizeof *L->acc_into);
  L->acc_ld = calloc((size_t)nv, sizeof *L->acc_ld);
  if (!L->leaf_into || !L->leaf_of || !L->acc_into || !L->acc_ld) {
    free(trial);
    return cl_fail(L, "out of memory");
  }
  L->n_view = func_number((Func *)f) + 1;
  L->view = calloc((size_t)L->n_view, sizeof *L->view);
  L->view_ld = calloc((size_t)L->n_view, sizeof *L->view_ld);
  if (!L->view || !L->view_ld) {
    free(trial);
    return cl_fail(L, "out of memory");
  }
  cl_gemm_plan_views(L, f);
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || getenv("LOOM_CUDA_NO_BGRAD")) {
    free(trial);
    plan_dgelu(L, f);
    plan_sum3(L, f);
    cl_gemm_plan_trees(L, f);
    return 0;
  }
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    if (op->kind != OP_CALL || L->skip[i] || !is_bias_reduce(op->callee)) continue;
    RtBuf y;
    if (cl_buf_of(L, op->operands[0], &y)) {
      L->err[0] = 0;
      continue;
    }
    /* the weight gradient: a matmul {ta} of rank 2 soon after whose B is the reduced value */
    for (int j = i + 1; j < f->ops.n && j <= i + 16; j++) {
      const Op *mm = f->ops.items[j];
      if (mm->kind != OP_MATMUL) continue;
      const Type *b = &mm->operands[1]->type, *c = &mm->results[0]->type;
      RtBuf yb;
      if (!op_bool(mm, "ta") || op_bool(mm, "tb") || b->rank != 2 || c->rank != 2 || mm->operands[0]->type.rank != 2 ||
          L->bgrad[j] || cl_buf_of(L, mm->operands[1], &yb)) {
        L->err[0] = 0;
        continue;
      }
      if (!same_buf(&y, &yb) || c->dims[1] != op->results[0]->type.dims[0]) continue;
      memcpy(trial, L->defer, sizeof(int) * (size_t)n);
      bool scratch = false;
      if (plan_one(L, f, i, j, trial, &scratch)) {
        memcpy(L->defer, trial, sizeof(int) * (size_t)n);
        L->bgrad[j] = op->results[0];
        L->bgrad_scratch[j] = scratch;
        L->skip[i] = true;
      }
      break;
    }
  }
  free(trial);
  plan_dgelu(L, f);
  plan_sum3(L, f);
  cl_gemm_plan_trees(L, f);
  return 0;
}
