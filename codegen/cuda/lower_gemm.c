/* codegen/cuda/lower_gemm.c — matmuls as cuBLASLt calls: lower.c's lower_func calls in here
 * for every matmul (cl_lower_matmul_op: one GEMM step, with the epilogue, bias gradient or sum
 * the plans chose), the accumulation a call or matmul starts (cl_fuse_grad_accum), a call whose
 * place a GEMM takes (cl_lower_gemm_at) and a gradient tree's leaf (cl_lower_tree_leaf).  Which
 * fusion each matmul gets is decided before, apart from the steps made here:
 * lower_gemm_match.c (what a matmul's neighbours are: the fusions' patterns, with why each
 * fusion is worth it and which bits it moves), lower_gemm_plan.c (cl_plan_bgrad, once per
 * function: the plans that reorder or skip ops) and lower_gemm_views.c (GEMMs reading slices
 * and adding into parts of a gradient in place).  This file only builds the steps. */
#include "codegen/cuda/lower_gemm_internal.h"

#include <stdlib.h>
#include <string.h>

/* A matmul; into_global (NULL: none) is the f32 gradient the GEMM accumulates its result into
   (C = that global, beta = 1: fuse_grad_accum), instead of writing its own result. */
static int lower_matmul(Lower *L, Steps *s, const Value *into_global) {
  const Op *op = L->op;
  const Type *a = &op->operands[0]->type, *b = &op->operands[1]->type, *c = &op->results[0]->type;
  bool ta = op_bool(op, "ta"), tb = op_bool(op, "tb");
  int64_t M = c->dims[c->rank - 2], N = c->dims[c->rank - 1], K = a->dims[a->rank - (ta ? 2 : 1)];
  RtStep *st = cl_new_step(L, s, RT_STEP_GEMM, 0, "");
  if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;
  int64_t batch = M * N != 0 ? type_numel(c) / (M * N) : 0;
  /* activations times a shared weight: the batch folded into M (one GEMM of batch x M rows;
     A's and C's batches follow one another) */
  if (batch > 1 && b->rank == 2 && !ta) {
    M *= batch;
    batch = 1;
  }
  int64_t v[9] = {batch, M, N, K, ta, tb, M * K, b->rank > 2 ? K * N : 0, M * N};
  memcpy(st->i, v, sizeof v);
  for (int k = 0; k < 2; k++) {   /* an operand that is a strided view (plan_views) */
    const Value *x = op->operands[k];
    if (!L->view || x->kind == VAL_GLOBAL || x->id < 0 || x->id >= L->n_view || !L->view_ld[x->id]) continue;
    if (batch != 1) return cl_fail(L, "internal error: a strided GEMM operand on a batch of %lld", (long long)batch);
    st->bufs[k] = L->view[x->id];
    st->i[RT_GEMM_LDA_INT + k] = L->view_ld[x->id];
  }
  st->grid[0] = st->block[0] = 0;   /* a library call: no launch of ours */
  const Value *r = op->results[0];
  if (!into_global && L->acc_into && r->id >= 0 && r->id < L->n_view && L->acc_into[r->id].n) {
    /* a piece of a gradient tree: added into its view of the gradient (plan_trees) */
    st->bufs[2] = L->acc_into[r->id];
    st->i[CUDA_GEMM_BETA_INT] = 1;
    /* acc_ld 0: a whole leaf, the gradient itself */
    st->i[RT_GEMM_LDC_INT] = L->acc_ld[r->id] == N ? 0 : L->acc_ld[r->id];
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, L->acc_ld[r->id] ? " (+= a part of a gradient)" : " (+= a gradient)");
  }
  if (into_global) {
    if (cl_buf_of(L, into_global, &st->bufs[2])) return IR_EINPUT;
    st->i[CUDA_GEMM_BETA_INT] = 1;
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, " (+= $%s)", into_global->global->name);
  }
  return 0;
}

/* Op i (a matmul or a cast call) followed by its accumulation: the global (and marks the ops
   it takes over as skipped), or NULL. */
const Value *cl_fuse_grad_accum(Lower *L, const Func *f, int i) {
  int last;
  const Value *g = cl_gemm_grad_accum(f, i, &last);
  for (int k = i + 1; g && k <= last; k++) L->skip[k] = true;
  return g;
}

/* cast + accumulate as one step: loom_update<f32 global, narrow value, acc>. */
int cl_lower_cast_accumulate(Lower *L, Steps *s, const Value *g) {
  const Value *x = L->op->operands[0];
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
  if (!st || cl_set_bufs(L, st, (const Value *const[]){g, x}, 2, false)) return IR_EINPUT;
  snprintf(st->label, sizeof st->label, "accumulate $%s (cast)", g->global->name);
  st->i[0] = type_numel(&x->type);
  cl_launch_ew(st, st->i[0]);
  return cl_instantiate(L, st, "accumulate", "loom_update", (const int[]){0, 1, -1}, "true", "", 1024);
}
/* The matmul L->op with the epilogue e: A B bias [residual] -> out [pre-activation]. */
static int lower_matmul_epilogue(Lower *L, Steps *s, const GemmEpilogue *e) {
  if (lower_matmul(L, s, NULL)) return IR_EINPUT;
  RtStep *st = &s->items[s->n - 1];
  if (st->i[0] != 1) return cl_fail(L, "internal error: a GEMM epilogue on a batch of %lld", (long long)st->i[0]);
  int n = 2;
  if (e->bias && cl_buf_of(L, e->bias, &st->bufs[n++])) return IR_EINPUT;
  if (e->residual && cl_buf_of(L, e->residual, &st->bufs[n++])) return IR_EINPUT;
  st->n_in = n;
  st->n_out = 1;
  if (cl_buf_of(L, e->out, &st->bufs[n])) return IR_EINPUT;
  if (e->pre) {
    st->n_out = 2;
    if (cl_buf_of(L, e->pre, &st->bufs[n + 1])) return IR_EINPUT;
  }
  st->i[CUDA_GEMM_EPI_INT] = (e->bias ? RT_GEMM_EPI_BIAS : 0) | (e->pre ? RT_GEMM_EPI_GELU : 0) |
                             (e->residual ? RT_GEMM_EPI_C : 0);
  const Value *o = e->pre ? e->pre : e->out;
  snprintf(st->label, sizeof st->label, "matmul %%%s%s%s%s", o->name ? o->name : "?", e->bias ? " + bias" : "",
           e->pre ? ", gelu" : "", e->residual ? " + residual" : "");
  return 0;
}
int cl_lower_tree_leaf(Lower *L, Steps *s, int k) {
  const Value *y = L->leaf_of[k];
  L->op = L->f->ops.items[k];
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
  if (!st || cl_set_bufs(L, st, (const Value *const[]){y, y}, 2, false)) return IR_EINPUT;
  st->bufs[0] = L->leaf_into[k];
  st->bufs[0].n = type_numel(&y->type);
  snprintf(st->label, sizeof st->label, "accumulate into a part of a gradient%s",
           y->type.dtype != DT_F32 ? " (cast)" : "");
  st->i[0] = type_numel(&y->type);
  cl_launch_ew(st, st->i[0]);
  return cl_instantiate(L, st, "accumulate", "loom_update", (const int[]){0, 1, -1}, "true", "", 1024);
}

/* Op j (a call), the GELU backward of the matmul gemm_at[j]: that GEMM with DGELU[_BGRAD]. */
int cl_lower_gemm_at(Lower *L, Steps *s, int j) {
  const Func *f = L->f;
  const Op *call = f->ops.items[j];
  int i = L->gemm_at[j];
  const Value *pre, *dx, *db;
  L->op = f->ops.items[i];
  if (!cl_gemm_match_dgelu(L, f, i, j, &pre, &dx, &db)) return cl_fail(L, "internal error: the GELU backward epilogue no longer matches");
  if (lower_matmul(L, s, NULL)) return IR_EINPUT;
  RtStep *st = &s->items[s->n - 1];
  if (st->i[0] != 1) return cl_fail(L, "internal error: a GEMM epilogue on a batch of %lld", (long long)st->i[0]);
  if (cl_buf_of(L, pre, &st->bufs[2]) || cl_buf_of(L, dx, &st->bufs[3])) return IR_EINPUT;
  st->n_in = 3;
  st->n_out = 1;
  if (db) {
    if (cl_buf_of(L, db, &st->bufs[4])) return IR_EINPUT;
    st->n_out = 2;
  }
  st->i[CUDA_GEMM_EPI_INT] = RT_GEMM_EPI_DGELU | (db ? RT_GEMM_EPI_BGRAD : 0);
  snprintf(st->label, sizeof st->label, "matmul %%%s, gelu backward%s", dx->name ? dx->name : "?",
           db ? ", bias gradient" : "");
  L->op = call;
  return 0;
}
/* Op i of the current function, a matmul (L->op), as one GEMM step: with its epilogue when the
   product's user matches one, into the f32 gradient acc when that is not NULL (cl_fuse_grad_accum). */
int cl_lower_matmul_op(Lower *L, Steps *s, int i, const Value *acc) {
  const Func *f = L->f;
  int rc = 0;
  if (L->bgrad[i]) {   /* the bias gradient too, then the ops that use it */
    const Value *r = L->bgrad[i];
    if (lower_matmul(L, s, acc)) return IR_EINPUT;
    RtStep *st = &s->items[s->n - 1];
    if (st->i[0] != 1 || st->n_out != 1)
      return cl_fail(L, "internal error: a bias-gradient epilogue on a batch of %lld", (long long)st->i[0]);
    RtBuf *g = &st->bufs[st->n_in + 1];
    if (cl_buf_of(L, r, g)) return IR_EINPUT;
    if (L->bgrad_scratch[i]) {   /* at the start of scratch until its deferred users have run */
      g->offset = cg_align64(f->arena_bytes);
      int64_t bytes = cg_align64(g->n * cl_st_size(g->storage));
      if (bytes > L->scratch) L->scratch = bytes;
      L->moved_value = r;
      L->moved_offset = g->offset;
    }
    st->n_out = 2;
    st->i[CUDA_GEMM_EPI_INT] = RT_GEMM_EPI_BGRAD;
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, ", bias gradient");
    const Op *mm = L->op;
    for (int k = 0; k < i && !rc; k++)
      if (L->defer[k] == i && !L->skip[k]) {
        int at = k;
        rc = L->lower_op(L, s, &at);
      }
    L->op = mm;
    L->moved_value = NULL;
    return rc;
  }
  if (L->resid[i]) {   /* a sum of products: C = resid, beta = 1 (plan_sum3) */
    if (lower_matmul(L, s, NULL)) return IR_EINPUT;
    RtStep *st = &s->items[s->n - 1];
    if (st->i[0] != 1) return cl_fail(L, "internal error: a GEMM epilogue on a batch of %lld", (long long)st->i[0]);
    st->bufs[3] = st->bufs[2];
    if (cl_buf_of(L, L->resid[i], &st->bufs[2])) return IR_EINPUT;
    const Op *call = L->sum_into[i] >= 0 ? f->ops.items[L->sum_into[i]] : NULL;
    if (call && cl_buf_of(L, call->results[0], &st->bufs[3])) return IR_EINPUT;
    st->n_in = 3;
    st->i[CUDA_GEMM_EPI_INT] = RT_GEMM_EPI_C;
    size_t n = strlen(st->label);
    snprintf(st->label + n, sizeof st->label - n, " + %%%s%s", L->resid[i]->name ? L->resid[i]->name : "sum",
             call ? " (the sum of three)" : "");
    return 0;
  }
  /* the product's user: the next op, or the one after when the op between (the bias's
     cast) neither reads the product nor writes the matmul's operands: the GEMM then runs
     at the user's place, after it */
  int j = i + 1;
  if (j < f->ops.n && !L->skip[j] && L->defer[j] < 0 && !cl_gemm_reads(f, j, L->op->results[0]) && j + 1 < f->ops.n &&
      cl_gemm_may_precede(L, f, j, L->op))
    j++;
  GemmEpilogue e;
  if (!acc && cl_gemm_is_single(L) && (j >= f->ops.n || (!L->skip[j] && L->defer[j] < 0)) &&
      cl_gemm_match_epilogue(f, i, j, &e)) {
    const Op *mm = L->op;
    if (j > i + 1) {   /* the op between first */
      L->op = f->ops.items[i + 1];
      L->skip[i + 1] = true;
      rc = cl_lower_call(L, s);
      L->op = mm;
    }
    L->skip[j] = true;
    if (!rc) rc = lower_matmul_epilogue(L, s, &e);
  } else {
    rc = lower_matmul(L, s, acc);
  }
  return rc;
}
