/* codegen/cuda/lower_gemm.c — matmuls as cuBLASLt calls, and the fusions around them: the
 * gradient accumulation into the f32 gradient (beta = 1), the cast + accumulate pair, the GEMM
 * epilogues (bias, GELU, residual), the bias gradients (BGRADA), GELU's backward
 * (DGELU_BGRAD), sums of three products, gradient trees (pieces added into their part of a
 * gradient) and slices read in place (views).  lower.c's lower_func calls cl_plan_bgrad once
 * per function (the plans that reorder or skip ops), then in here for every matmul
 * (cl_lower_matmul_op), the accumulation a call or matmul starts (cl_fuse_grad_accum), a call
 * whose place a GEMM takes (cl_lower_gemm_at) and a gradient tree's leaf (cl_lower_tree_leaf).
 * A little over 1,000 lines: each fusion is a matcher beside its lowering; the next split is
 * the planning (bias gradients, GELU, sums, trees, views) from the lowering.
 */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

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


/* ---------------------------------------------------------------- gradient accumulation

   The training passes leave each gradient as `%g = matmul ...` (or a fused reduction), in
   bf16 `%f = call @cast(%g)` to f32, then `accumulate $grad.X, %f`: two or three launches and
   the gradient written and read twice.  Here:
     - matmul [+ cast] + accumulate, consecutive, each result used once, into an f32 global of
       as many elements: one GEMM with C = the global and beta = 1 (f32 accumulation of the
       product, no bf16 rounding of it: fp32 programs give the same bits, bf16 ones a more
       exact sum);
     - cast + accumulate, consecutive, the cast's result used once: one loom_update that reads
       the narrow value and adds it in f32 (the same arithmetic, the same bits).
   Done in the lowering rather than in fuse: the GEMM is a library call the IR has no op for
   (matmul with an accumulator), and the pairs are adjacent in every program the passes make. */

/* The fusions that move a bf16 (f16) program's rounding points (a product no longer rounded to
   its dtype before the bias, the residual or the f32 gradient is added) are on unless
   LOOM_CUDA_FUSE_BF16=0.  Their gradients are as close to the fp32 program's as the CPU
   backend's bf16 gradients are (tests/gpu/test_train.sh measures both against the fp32
   golden), but no longer within 2e-2 of the CPU's own bf16 program, which rounds at every op
   as LOOM_CUDA_FUSE_BF16=0 does: the suite compares that program with the CPU's, tensor by
   tensor, and the fused one by loom check's bf16 rule.  fp32 programs fuse always (the same
   bits, or within 1e-5). */
bool cl_fuse_narrow(void) {
  const char *e = getenv("LOOM_CUDA_FUSE_BF16");
  return !e || !*e || strcmp(e, "0");
}

/* A kernel func that only converts its one float argument to another float dtype. */
static bool is_cast_call(const Op *op) {
  if (op->kind != OP_CALL || op->n_operands != 1 || op->n_results != 1) return false;
  const Func *k = op->callee;
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 1) return false;
  const Op *c = k->ops.items[0];
  return c->kind == OP_CAST && c->operands[0] == k->args.items[0] && k->rets.items[0] == c->results[0] &&
         dtype_is_float(c->operands[0]->type.dtype) && dtype_is_float(c->results[0]->type.dtype);
}

/* Op `at` of f is `accumulate $g, v` into an f32 global of v's element count. */
static const Value *accumulates(const Func *f, int at, const Value *v) {
  if (at >= f->ops.n) return NULL;
  const Op *op = f->ops.items[at];
  if (op->kind != OP_ACCUMULATE || op->operands[1] != v) return NULL;
  const Value *g = op->operands[0];
  if (g->kind != VAL_GLOBAL || g->type.dtype != DT_F32 || type_numel(&g->type) != type_numel(&v->type)) return NULL;
  return g;
}

/* Op i (a matmul or a cast call) followed by its accumulation: the global (and marks the ops
   it takes over as skipped), or NULL. */
/* What cl_fuse_grad_accum would take for op i, without marking anything: the global, and in
   *last the last op taken (the accumulate). */
static const Value *grad_accum(const Func *f, int i, int *last) {
  if (getenv("LOOM_CUDA_NO_ACC_FUSION")) return NULL;   /* the unfused program, for the tests */
  const Op *op = f->ops.items[i];
  const Value *r = op->n_results == 1 ? op->results[0] : NULL;
  *last = i + 1;
  if (!r || cl_uses(f, r) != 1) return NULL;
  if (op->kind == OP_CALL) return is_cast_call(op) && r->type.dtype == DT_F32 ? accumulates(f, i + 1, r) : NULL;
  /* (a weight gradient of the experts: lower_moe.c's batched GEMM alone calls for it) */
  if ((op->kind != OP_MATMUL && op->kind != OP_GROUPED_MATMUL_WGRAD) || i + 1 >= f->ops.n) return NULL;
  if (r->type.dtype == DT_F32) return accumulates(f, i + 1, r);
  if (!cl_fuse_narrow()) return NULL;
  const Op *c = f->ops.items[i + 1];
  if (is_cast_call(c) && c->operands[0] == r && c->results[0]->type.dtype == DT_F32 && cl_uses(f, c->results[0]) == 1)
    return accumulates(f, *last = i + 2, c->results[0]);
  return NULL;
}

const Value *cl_fuse_grad_accum(Lower *L, const Func *f, int i) {
  int last;
  const Value *g = grad_accum(f, i, &last);
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

/* ---------------------------------------------------------------- GEMM epilogues

   A matmul whose result only feeds the next op (or the one after, when the op between may run
   first), a fused kernel that adds a bias [N] to it (broadcast over the rows), then maybe GELU
   (tanh form, keeping the pre-activation as a result too: gelu_new's forward) or a residual of
   the result's shape (or only adds that residual), then maybe a reshape, becomes one cuBLASLt
   call with the epilogue BIAS or GELU_AUX_BIAS and, for the residual, beta = 1 with C = the
   residual (program.h, RT_GEMM_EPI_INT).  The kernel's launch and its
   read and write of the product are gone.  The product is no longer rounded to the result's
   dtype before the bias (and the residual) are added: bf16 results differ from the unfused
   program's in their last bits (fp32 ones by the order of the additions).  In the lowering
   rather than in fuse: the pattern is a matmul next to a fused kernel, which fuse makes.
   LOOM_CUDA_NO_EPILOGUE=1 keeps them apart (the tests' unfused program). */
typedef struct {
  const Value *bias, *residual;   /* the call's operands */
  const Value *out, *pre;         /* the call's results: the GEMM's C, and GELU's pre-activation */
} Epilogue;

/* Does op j of f read value v? */
static bool reads(const Func *f, int j, const Value *v) {
  const Op *op = f->ops.items[j];
  for (int k = 0; k < op->n_operands; k++)
    if (op->operands[k] == v) return true;
  return false;
}

/* The call operand bound to kernel argument v (an arg of callee), or NULL. */
static const Value *operand_of(const Op *call, const Value *v) {
  const Func *k = call->callee;
  for (int a = 0; a < k->args.n; a++)
    if (k->args.items[a] == v) return call->operands[a];
  return NULL;
}

/* add(x, y) with one side `known`: the other side, or NULL. */
static const Value *other_side(const Op *op, const Value *known) {
  if (op->kind != OP_ADD) return NULL;
  return op->operands[0] == known ? op->operands[1] : op->operands[1] == known ? op->operands[0] : NULL;
}

static bool same_type(const Type *a, const Type *b) {
  if (a->dtype != b->dtype || type_numel(a) != type_numel(b)) return false;
  return true;
}

/* The matmul at op i and the kernel call at op j (> i) that uses its product. */
static bool match_epilogue(const Func *f, int i, int j, Epilogue *e) {
  memset(e, 0, sizeof *e);
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || j >= f->ops.n) return false;
  const Op *mm = f->ops.items[i], *call = f->ops.items[j];
  const Value *r = mm->results[0];
  const Type *rt = &r->type;
  if ((rt->dtype != DT_BF16 && rt->dtype != DT_F32 && rt->dtype != DT_F16) || cl_uses(f, r) != 1 || call->kind != OP_CALL)
    return false;
  if (rt->dtype != DT_F32 && !cl_fuse_narrow()) return false;
  const Func *k = call->callee;
  if (!k || !k->is_kernel || k->ops.n < 1 || k->ops.n > 4) return false;
  const Value *m = NULL;   /* the kernel's argument that is the product */
  for (int a = 0; a < k->args.n; a++)
    if (call->operands[a] == r) {
      if (m) return false;
      m = k->args.items[a];
    }
  if (!m) return false;
  int64_t N = rt->dims[rt->rank - 1];
  /* broadcast bias; add product, bias (or no bias: a residual alone follows) */
  const Op *bc = k->ops.items[0], *add = k->ops.n > 1 ? k->ops.items[1] : NULL;
  const Value *last = m;
  int at = 0;
  /* a bias (and GELU's pre-activation, whose leading dimension cuBLASLt wants a multiple of
     8) only on a width of a multiple of 8: no algorithm is promised for the others, and the
     unfused kernel would be gone */
  if (add && N % 8 == 0 && bc->kind == OP_BROADCAST && bc->operands[0]->kind == VAL_ARG && bc->operands[0]->type.rank == 1 &&
      bc->operands[0]->type.dims[0] == N && bc->operands[0]->type.dtype == rt->dtype &&
      other_side(add, bc->results[0]) == m && same_type(&add->results[0]->type, rt)) {
    e->bias = operand_of(call, bc->operands[0]);
    last = add->results[0];
    at = 2;
  }
  if (at < k->ops.n) {
    const Op *op = k->ops.items[at];
    const Value *x = other_side(op, last);
    if (op->kind == OP_GELU_TANH && op->operands[0] == last && e->bias) {
      e->pre = last;
      last = op->results[0];
      at++;
    } else if (x && x->kind == VAL_ARG && x != m && same_type(&x->type, rt) && same_type(&op->results[0]->type, rt)) {
      e->residual = operand_of(call, x);
      last = op->results[0];
      at++;
    }
  }
  if (at < k->ops.n && ((const Op *)k->ops.items[at])->kind == OP_RESHAPE &&
      ((const Op *)k->ops.items[at])->operands[0] == last) {
    last = ((const Op *)k->ops.items[at])->results[0];
    at++;
  }
  if (at != k->ops.n) return false;
  /* results: the last value alone, or the pre-activation and GELU's value */
  if (e->pre ? !(k->rets.n == 2 && k->rets.items[0] == e->pre && k->rets.items[1] == last)
             : !(k->rets.n == 1 && k->rets.items[0] == last))
    return false;
  if (e->pre && cl_uses(k, e->pre) != 2) return false;   /* GELU and the return only */
  e->out = call->results[e->pre ? 1 : 0];
  if (e->pre) e->pre = call->results[0];
  return (e->bias || e->residual) && (!e->residual || e->residual != r);
}

/* The matmul L->op with the epilogue e: A B bias [residual] -> out [pre-activation]. */
/* Would lower_matmul make L->op one GEMM of batch 1 (after folding a shared weight's batch)? */
static bool lower_matmul_step_is_single(const Lower *L) {
  const Op *op = L->op;
  const Type *b = &op->operands[1]->type, *c = &op->results[0]->type;
  int64_t MN = c->dims[c->rank - 2] * c->dims[c->rank - 1];
  return MN > 0 && (type_numel(c) == MN || (b->rank == 2 && !op_bool(op, "ta")));
}

static int lower_matmul_epilogue(Lower *L, Steps *s, const Epilogue *e) {
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

/* May op j of f (a call or builtin) run before the matmul mm: none of its results shares memory
   with mm's operands (the memory plan may have given their place away after mm), and it is no
   matmul, accumulate or update of a global (the cases this reordering does not need)? */
static bool may_precede(Lower *L, const Func *f, int j, const Op *mm) {
  const Op *op = f->ops.items[j];
  if (op->kind != OP_CALL || !op->callee || !op->callee->is_kernel) return false;
  for (int k = 0; k < op->n_results; k++) {
    RtBuf rb;
    if (op->results[k]->kind == VAL_GLOBAL || cl_buf_of(L, op->results[k], &rb)) {
      L->err[0] = 0;
      return false;
    }
    for (int a = 0; a < 2; a++) {
      RtBuf ab;
      if (cl_buf_of(L, mm->operands[a], &ab)) {
        L->err[0] = 0;
        return false;
      }
      if (cl_overlap(&rb, &ab)) return false;
    }
  }
  return true;
}

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
        !(op->kind == OP_ACCUMULATE || op->kind == OP_RESHAPE || is_cast_call(op) ||
          (op->kind == OP_PAD && op->n_operands == 1)))
      return false;
    /* a cast whose accumulate follows runs as one kernel (cl_fuse_grad_accum): its result is
       never written */
    if (is_cast_call(op) && op->results[0]->type.dtype == DT_F32 && cl_uses(f, op->results[0]) == 1 &&
        accumulates(f, k + 1, op->results[0]) && !getenv("LOOM_CUDA_NO_ACC_FUSION"))
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
    if (ord[x] < 0 || !same_type(&v[x]->type, &b->results[0]->type)) return false;
  }
  return ord[0] != ord[1] && ord[1] != ord[2] && ord[0] != ord[2];
}

/* May the matmul at op i take an epilogue of its own (a plain GEMM of batch 1)? */
static bool plain_single(Lower *L, const Func *f, int i) {
  const Op *mm = f->ops.items[i];
  int last;
  if (mm->kind != OP_MATMUL || L->skip[i] || L->defer[i] >= 0 || L->bgrad[i] || L->resid[i] || L->sum_into[i] >= 0 ||
      grad_accum(f, i, &last))
    return false;
  const Op *save = L->op;
  L->op = mm;
  bool single = lower_matmul_step_is_single(L);
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

/* ---------------------------------------------------------------- gradient trees

   c_attn's gradients are sums of pieces padded into place: per q, k, v the weight's
   dW_j = x^T d_j and the bias's db_j, each reshaped and padded to [D, 3, D] ([3, D]), the
   three added (kernels), cast to f32 and accumulated into $grad (GPT-2 124M: 8 launches a
   layer and the padded matrices written and read).  A tree of such sums (kernels that only
   add their arguments, then maybe cast to f32) under an accumulate has leaves pad(reshape(y))
   padded on one axis: y lands on a view of the gradient (rows, a row stride, an offset).  A
   product y of a GEMM accumulates there itself (beta = 1, C's row stride: program.h
   RT_GEMM_LDC_INT); any other y is accumulated there by the pad's step.  The pads, the sums
   and the accumulate are gone.  Adding zeros is exact, so a leaf's own accumulation is the
   same arithmetic (on always); a GEMM's adds its product unrounded, which moves a bf16
   program's rounding point: bf16 GEMM leaves only with LOOM_CUDA_FUSE_BF16=1.
   LOOM_CUDA_NO_EPILOGUE=1 or LOOM_CUDA_NO_TREES=1: off (whole leaves, below: LOOM_CUDA_NO_TIED_GRAD=1). */

/* A kernel func that adds its arguments, each once, maybe casting the sum to f32 last. */
static bool is_sum_kernel(const Func *k) {
  if (!k || !k->is_kernel || k->args.n < 2 || k->rets.n != 1 || k->ops.n < 1) return false;
  int adds = 0;
  for (int o = 0; o < k->ops.n; o++) {
    const Op *op = k->ops.items[o];
    bool last = o == k->ops.n - 1;
    if (op->kind == OP_CAST && last && o > 0 && op->results[0]->type.dtype == DT_F32 &&
        op->operands[0] == ((const Op *)k->ops.items[o - 1])->results[0])
      continue;
    if (op->kind != OP_ADD || op->operands[0] == op->operands[1] || cl_uses(k, op->results[0]) != 1) return false;
    adds++;
  }
  for (int a = 0; a < k->args.n; a++)
    if (cl_uses(k, k->args.items[a]) != 1) return false;
  const Op *fin = k->ops.items[k->ops.n - 1];
  return adds == k->args.n - 1 && k->rets.items[0] == fin->results[0];
}

/* The view of the gradient g a pad leaf's operand lands on. */
static bool pad_view(Lower *L, const Op *pad, const Value *g, RtBuf *view, int64_t *rows, int64_t *cols, int64_t *ld) {
  const Attr *lo = op_attr(pad, "low"), *hi = op_attr(pad, "high");
  const Type *t = &pad->results[0]->type;
  if (pad->kind != OP_PAD || !lo || !hi || lo->n != t->rank || hi->n != t->rank || t->rank != g->type.rank ||
      type_numel(t) != type_numel(&g->type))
    return false;
  int a = -1;
  for (int d = 0; d < t->rank; d++) {
    if (t->dims[d] != g->type.dims[d] || lo->ints[d] < 0 || hi->ints[d] < 0) return false;
    if (lo->ints[d] || hi->ints[d]) {
      if (a >= 0) return false;
      a = d;
    }
  }
  if (a < 0) return false;
  int64_t inner = cl_prod_dims(t, a + 1, t->rank);
  *rows = cl_prod_dims(t, 0, a);
  *ld = cl_prod_dims(t, a, t->rank);
  *cols = (t->dims[a] - lo->ints[a] - hi->ints[a]) * inner;
  if (cl_buf_of(L, g, view)) {
    L->err[0] = 0;
    return false;
  }
  view->offset += lo->ints[a] * inner * cl_st_size(view->storage);
  view->n = (*rows - 1) * *ld + *cols;
  return view->offset % 64 == 0;   /* as every buffer of the program (kernels may load vectors) */
}

static int op_index(const Func *f, const Op *op, int below) {
  for (int q = below - 1; q >= 0; q--)
    if (f->ops.items[q] == op) return q;
  return -1;
}

/* Op q of f, a whole leaf of a tree into the f32 gradient g: a matmul or an embedding's gradient
   of g's element count, used once, whose sum with the other pieces g was (a tied embedding's
   table: the lm_head's dW and the embedding's rows).  It adds into g itself: the GEMM with
   beta = 1, the embedding's gradient its rows (no fill of the table, no sum, no cast, no
   accumulate).  The pieces overlap, so their sum's order changes (fp32: g + a + b for
   g + (a + b), the same bits while g is zero) and a narrow sum is no longer rounded: narrow
   leaves only with LOOM_CUDA_FUSE_BF16=1.  LOOM_CUDA_NO_TIED_GRAD=1: off. */
static bool whole_leaf(Lower *L, const Func *f, int q, const Value *g) {
  const Op *op = f->ops.items[q];
  const Value *y = op->results[0];
  if ((op->kind != OP_MATMUL && op->kind != OP_EMBEDDING_GRAD) || op->n_results != 1 || cl_uses(f, y) != 1 ||
      type_numel(&y->type) != type_numel(&g->type) || y->type.rank != g->type.rank || L->defer[q] >= 0 || L->skip[q] ||
      L->gemm_at[q] >= 0 || (y->type.dtype != DT_F32 && !cl_fuse_narrow()))
    return false;
  for (int d = 0; d < y->type.rank; d++)
    if (y->type.dims[d] != g->type.dims[d]) return false;
  return true;
}

static void plan_trees(Lower *L, const Func *f) {
  /* LOOM_CUDA_NO_TREES: no pad leaves; LOOM_CUDA_NO_TIED_GRAD: no whole ones */
  bool pads_ok = !getenv("LOOM_CUDA_NO_TREES"), whole_ok = !cl_env_on("LOOM_CUDA_NO_TIED_GRAD");
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || (!pads_ok && !whole_ok)) return;
  int n = f->ops.n;
  int *stack = malloc(sizeof(int) * (size_t)(n + 1)), *calls = malloc(sizeof(int) * (size_t)(n + 1));
  int *pads = malloc(sizeof(int) * (size_t)(n + 1));
  if (!stack || !calls || !pads) goto done;
  for (int a = 0; a < n; a++) {
    const Op *acc = f->ops.items[a];
    if (acc->kind != OP_ACCUMULATE || L->skip[a] || L->defer[a] >= 0) continue;
    const Value *g = acc->operands[0], *t = acc->operands[1];
    if (g->kind != VAL_GLOBAL || g->type.dtype != DT_F32 || t->kind != VAL_RESULT || t->def->kind != OP_CALL ||
        cl_uses(f, t) != 1)
      continue;
    /* the tree: sum calls down to pads */
    int ns = 0, nc = 0, np = 0, first = a;
    bool ok = true;
    int c0 = op_index(f, t->def, a);
    if (c0 < 0) continue;
    stack[ns++] = c0;
    while (ns && ok) {
      int c = stack[--ns];
      const Op *call = f->ops.items[c];
      if (L->skip[c] || L->defer[c] >= 0 || L->gemm_at[c] >= 0 || !is_sum_kernel(call->callee)) {
        ok = false;
        break;
      }
      calls[nc++] = c;
      if (c < first) first = c;
      for (int o = 0; o < call->n_operands && ok; o++) {
        const Value *v = call->operands[o];
        int q = v->kind == VAL_RESULT ? op_index(f, v->def, c) : -1;
        if (q < 0 || cl_uses(f, v) != 1 || L->skip[q] || L->defer[q] >= 0) {
          ok = false;
          break;
        }
        if (v->def->kind == OP_CALL) stack[ns++] = q;
        else if ((pads_ok && v->def->kind == OP_PAD) || (whole_ok && whole_leaf(L, f, q, g))) pads[np++] = q;
        else ok = false;
      }
    }
    if (!ok || !np) continue;
    /* each leaf: pad(reshape(y)) or pad(y) */
    RtBuf views[64];
    int64_t lds[64];
    const Value *ys[64];
    int gemm[64];
    if (np > 64) continue;
    for (int l = 0; l < np && ok; l++) {
      const Op *pad = f->ops.items[pads[l]];
      int64_t rows, cols, ld;
      const Value *y = pad->operands[0];
      if (pad->kind != OP_PAD) {   /* a whole leaf: the gradient itself */
        y = pad->results[0];
        cols = g->type.rank ? g->type.dims[g->type.rank - 1] : 1;
        rows = cols ? type_numel(&g->type) / cols : 0;
        ld = cols;
        if (cl_buf_of(L, g, &views[l])) {
          L->err[0] = 0;
          ok = false;
          break;
        }
        ys[l] = y;
        lds[l] = ld;
        gemm[l] = pad->kind == OP_MATMUL ? pads[l] : -1;
        if (pad->kind == OP_MATMUL) {   /* a single GEMM of the gradient's shape, as a pad leaf's below */
          const Op *save = L->op;
          L->op = pad;
          bool single = lower_matmul_step_is_single(L);
          L->op = save;
          int last;
          if (!single || y->type.rank != 2 || y->type.dims[0] != rows || y->type.dims[1] != cols || L->resid[pads[l]] ||
              L->sum_into[pads[l]] >= 0 || grad_accum(f, pads[l], &last))
            ok = false;
        }
        if (pads[l] < first) first = pads[l];
        continue;
      }
      if (y->kind == VAL_RESULT && y->def->kind == OP_RESHAPE && cl_uses(f, y) == 1) y = y->def->operands[0];
      if (!pad_view(L, pad, g, &views[l], &rows, &cols, &ld) || type_numel(&y->type) != rows * cols) {
        ok = false;
        break;
      }
      ys[l] = y;
      lds[l] = ld;
      gemm[l] = -1;
      int q = y->kind == VAL_RESULT ? op_index(f, y->def, pads[l]) : -1;
      if (q >= 0 && y->def->kind == OP_MATMUL && cl_uses(f, y) == 1 && y->type.rank == 2 && y->type.dims[0] == rows &&
          y->type.dims[1] == cols && (y->type.dtype == DT_F32 || cl_fuse_narrow()) && !L->resid[q] && L->sum_into[q] < 0 &&
          L->defer[q] < 0 && !L->skip[q]) {
        int last;
        const Op *save = L->op;
        L->op = y->def;
        bool single = lower_matmul_step_is_single(L);
        L->op = save;
        if (single && !grad_accum(f, q, &last)) {
          gemm[l] = q;
          if (q < first) first = q;
          continue;
        }
      }
      /* accumulated by the pad's step: contiguous, a float */
      if (!(rows == 1 || cols == ld) || !dtype_is_float(y->type.dtype)) ok = false;
    }
    if (!ok) continue;
    /* nothing else touches the gradient from the first piece on */
    for (int q = first; q < a && ok; q++) {
      const Op *op = f->ops.items[q];
      for (int o = 0; o < op->n_operands && ok; o++) ok = op->operands[o] != g;
    }
    if (!ok) continue;
    for (int l = 0; l < np; l++) {
      const Op *leaf = f->ops.items[pads[l]];
      if (leaf->kind != OP_PAD) {   /* a whole leaf lowers in place: the GEMM or the embedding's rows add */
        if (gemm[l] >= 0) {
          L->acc_into[ys[l]->id] = views[l];
          L->acc_ld[ys[l]->id] = 0;   /* whole: C is the gradient (lower_matmul) */
        } else {
          L->leaf_into[pads[l]] = views[l];
          L->leaf_of[pads[l]] = ys[l];
        }
        continue;
      }
      L->skip[pads[l]] = true;
      if (gemm[l] >= 0) {
        L->acc_into[ys[l]->id] = views[l];
        L->acc_ld[ys[l]->id] = lds[l];
      } else {
        L->skip[pads[l]] = false;
        L->leaf_into[pads[l]] = views[l];
        L->leaf_of[pads[l]] = ys[l];
      }
    }
    for (int c = 0; c < nc; c++) L->skip[calls[c]] = true;
    L->skip[a] = true;
  }
done:
  free(stack);
  free(calls);
  free(pads);
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

/* ---------------------------------------------------------------- views

   The q, k and v projections take slices of one [D, 3, D] c_attn weight and of its [3, D]
   bias: a copy kernel each (GPT-2 124M: 72 a step).  A slice restricted on one axis, every
   other axis whole, is a matrix of rows (the axes before) with a row stride (the axes from
   it on), at an offset: a GEMM reads it in place through its leading dimension (program.h
   RT_GEMM_LDA_INT / RT_GEMM_LDB_INT), and any op reads it in place when it is contiguous
   (one row: the bias's slice).  So the slice becomes no step when every use of it (through
   reshapes) is a rank-2 GEMM operand, or it is contiguous, and nothing writes its operand's
   bytes before the last use (the memory plan may have given them away after the slice). */

/* Op k's writes: its results (but in-place reshapes, and the view's values), and the
   global an accumulate, assign or fill writes; false if one has no buffer or op k is a
   parameter update (which writes its operands). */
static bool op_writes(Lower *L, const Op *op, const bool *in_view, RtBuf *w, int *nw, int cap) {
  if (op->kind == OP_ADAMW) return false;
  for (int t = 0; t < op->n_results; t++) {
    const Value *v = op->results[t];
    if (v->kind != VAL_GLOBAL && v->id >= 0 && v->id < L->n_view && in_view[v->id]) continue;
    if (op->kind == OP_RESHAPE && v->kind != VAL_GLOBAL && op->operands[0]->kind != VAL_GLOBAL &&
        v->offset == op->operands[0]->offset)
      continue;
    if (*nw >= cap || cl_buf_of(L, v, &w[(*nw)++])) return false;
  }
  if ((op->kind == OP_ACCUMULATE || op->kind == OP_ASSIGN || op->kind == OP_FILL) &&
      (*nw >= cap || cl_buf_of(L, op->operands[0], &w[(*nw)++])))
    return false;
  return true;
}

static void plan_views(Lower *L, const Func *f) {
  if (getenv("LOOM_CUDA_NO_VIEWS")) return;
  bool *in_view = calloc((size_t)L->n_view + 1, sizeof(bool));
  if (!in_view) return;   /* copies: correct, only slower */
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    if (op->kind != OP_SLICE || L->skip[i]) continue;
    const Value *x = op->operands[0], *y = op->results[0];
    const Attr *st = op_attr(op, "start"), *en = op_attr(op, "end");
    const Type *xt = &x->type;
    if (!st || !en || st->n != xt->rank || en->n != xt->rank || y->id < 0 || y->id >= L->n_view) continue;
    int a = -1;   /* the one restricted axis */
    bool ok = true;
    for (int d = 0; d < xt->rank && ok; d++)
      if (st->ints[d] != 0 || en->ints[d] != xt->dims[d]) ok = a < 0 ? (a = d, true) : false;
    if (!ok || a < 0) continue;
    int64_t rows = cl_prod_dims(xt, 0, a), ld = cl_prod_dims(xt, a, xt->rank), inner = cl_prod_dims(xt, a + 1, xt->rank);
    int64_t cols = (en->ints[a] - st->ints[a]) * inner, off = st->ints[a] * inner;
    bool contiguous = rows == 1 || cols == ld;
    RtBuf xb;
    if (cl_buf_of(L, x, &xb)) {
      L->err[0] = 0;
      continue;
    }
    /* the view's values (the slice, its reshapes) and their uses, up to the last */
    memset(in_view, 0, (size_t)L->n_view + 1);
    in_view[y->id] = true;
    int last = i;
    for (int k = i + 1; k < f->ops.n && ok; k++) {
      const Op *u = f->ops.items[k];
      for (int o = 0; o < u->n_operands && ok; o++) {
        const Value *v = u->operands[o];
        if (v->kind == VAL_GLOBAL || v->id < 0 || v->id >= L->n_view || !in_view[v->id]) continue;
        last = k;
        if (u->kind == OP_RESHAPE && u->results[0]->offset == v->offset && u->results[0]->id >= 0 &&
            u->results[0]->id < L->n_view)
          in_view[u->results[0]->id] = true;
        else if (!contiguous && !(u->kind == OP_MATMUL && o < 2 && v->type.rank == 2 && rows == v->type.dims[0] &&
                                  cols == v->type.dims[1] && u->operands[1 - o] != v))
          ok = false;
      }
    }
    for (int r = 0; r < f->rets.n && ok; r++) {
      const Value *v = f->rets.items[r];
      ok = v->kind == VAL_GLOBAL || v->id < 0 || v->id >= L->n_view || !in_view[v->id];
    }
    /* nothing between writes x's bytes */
    for (int k = i + 1; k <= last && ok; k++) {
      enum { CAP = 16 };
      RtBuf w[CAP];
      int nw = 0;
      if (!op_writes(L, f->ops.items[k], in_view, w, &nw, CAP)) {
        L->err[0] = 0;
        ok = false;
      }
      for (int t = 0; t < nw && ok; t++) ok = !cl_overlap(&w[t], &xb);
    }
    /* at 64 bytes, as every buffer of the program (kernels may load vectors) */
    if (!ok || (xb.offset + off * cl_st_size(xb.storage)) % 64) continue;
    RtBuf vb = xb;
    vb.offset += off * cl_st_size(xb.storage);
    vb.n = contiguous ? cols * rows : (rows - 1) * ld + cols;
    for (int id = 0; id < L->n_view; id++)
      if (in_view[id]) {
        L->view[id] = vb;
        L->view_ld[id] = contiguous ? 0 : ld;
      }
    L->skip[i] = true;
  }
  free(in_view);
}

/* ---------------------------------------------------------------- GELU backward (DGELU)

   gelu_new's backward leaves dh = matmul (dy W^T), then a fused kernel of gelu_tanh_grad(pre,
   dh) and (with a bias) its reduce_sum over every dim but the last: the bias gradient.  The
   GEMM with cuBLASLt's DGELU_BGRAD epilogue (DGELU without the reduction) computes both: the
   product times GELU's derivative at the saved pre-activation, and the column sums of that.
   dh is gone (its write and two reads).  The GEMM runs at the kernel's place: the ops between
   may not write its operands.  dh is no longer rounded to its dtype before GELU's derivative
   multiplies it, and the sums are of the unrounded products (as cuBLASLt's): a bf16 program's
   rounding points move, so bf16 and f16 programs fuse only with LOOM_CUDA_FUSE_BF16=1.
   LOOM_CUDA_NO_EPILOGUE=1 or LOOM_CUDA_NO_DGELU=1: off. */

/* Op j (a call) is the GELU backward of the product of the matmul at op i: its pre-activation
   and results (db NULL without the reduction) in *pre, *dx, *db. */
static bool match_dgelu(Lower *L, const Func *f, int i, int j, const Value **pre, const Value **dx, const Value **db) {
  const Op *mm = f->ops.items[i], *call = f->ops.items[j];
  const Value *r = mm->results[0];
  const Type *rt = &r->type;
  if (call->kind != OP_CALL || !call->callee || !call->callee->is_kernel || cl_uses(f, r) != 1 || rt->rank < 2 ||
      rt->dims[rt->rank - 1] % 8 || (rt->dtype != DT_F32 && rt->dtype != DT_BF16 && rt->dtype != DT_F16) ||
      (rt->dtype != DT_F32 && !cl_fuse_narrow()))
    return false;
  const Func *k = call->callee;
  if (k->args.n != 2 || k->ops.n < 1 || k->ops.n > 2 || k->rets.n != k->ops.n) return false;
  const Op *gg = k->ops.items[0];
  if (gg->kind != OP_GELU_TANH_GRAD || gg->operands[1] != k->args.items[1] || gg->operands[0] != k->args.items[0] ||
      call->operands[1] != r || call->operands[0] == r || k->rets.items[0] != gg->results[0])
    return false;
  const Value *x = call->operands[0];
  if (x->type.dtype != rt->dtype || type_numel(&x->type) != type_numel(rt) || gg->results[0]->type.dtype != rt->dtype)
    return false;
  *db = NULL;
  if (k->ops.n == 2) {   /* the bias gradient: the reduction of the derivative over all but the last dim */
    const Op *rs = k->ops.items[1];
    const Attr *dims = op_attr(rs, "dims");
    int rank = gg->results[0]->type.rank;
    if (rs->kind != OP_REDUCE_SUM || rs->operands[0] != gg->results[0] || k->rets.items[1] != rs->results[0] ||
        rs->results[0]->type.rank != 1 || rs->results[0]->type.dims[0] != rt->dims[rt->rank - 1] ||
        rs->results[0]->type.dtype != rt->dtype || !dims || dims->kind != ATTR_INTS || dims->n != rank - 1)
      return false;
    for (int d = 0; d < dims->n; d++)
      if (dims->ints[d] != d) return false;
    *db = call->results[1];
  }
  *pre = x;
  *dx = call->results[0];
  /* the ops between may run before the GEMM: none writes its operands */
  RtBuf ab[3], out;
  for (int a = 0; a < 3; a++)
    if (cl_buf_of(L, a < 2 ? mm->operands[a] : x, &ab[a])) {
      L->err[0] = 0;
      return false;
    }
  /* and the GEMM's outputs (placed where the kernel's were, maybe over bytes its operands
     left) overlap none of its inputs, but the derivative exactly over the pre-activation (the
     kernel's in-place write: the epilogue reads each element's aux before it writes it) */
  for (int o = 0; o < call->n_results; o++) {
    if (cl_buf_of(L, call->results[o], &out)) {
      L->err[0] = 0;
      return false;
    }
    for (int a = 0; a < 3; a++)
      if (cl_overlap(&out, &ab[a]) && !(o == 0 && a == 2 && out.region == ab[2].region && out.offset == ab[2].offset &&
                                         out.n == ab[2].n && out.storage == ab[2].storage))
        return false;
  }
  int unmade_to = -1;   /* ops up to this one write no result: a GEMM accumulating into its global */
  for (int q = i + 1; q < j; q++) {
    const Op *op = f->ops.items[q];
    enum { CAP = 16 };
    RtBuf w[CAP];
    int nw = 0;
    int last;
    if (op->kind == OP_MATMUL && grad_accum(f, q, &last)) unmade_to = last - 1;
    for (int t = 0; t < op->n_results && nw < CAP && q > unmade_to; t++)
      if (cl_buf_of(L, op->results[t], &w[nw++])) {
        L->err[0] = 0;
        return false;
      }
    if ((op->kind == OP_ACCUMULATE || op->kind == OP_ASSIGN || op->kind == OP_FILL) && nw < CAP && cl_buf_of(L, op->operands[0], &w[nw++])) {
      L->err[0] = 0;
      return false;
    }
    if (op->n_results > CAP || (op->kind != OP_CALL && op->kind != OP_MATMUL && op->kind != OP_ACCUMULATE &&
                                op->kind != OP_RESHAPE && op->kind != OP_FILL))
      return false;   /* only the ops the passes put there */
    RtBuf in;   /* a reshape in place writes nothing (no step) */
    if (op->kind == OP_RESHAPE && nw == 1 && !cl_buf_of(L, op->operands[0], &in) && in.region == w[0].region &&
        in.offset == w[0].offset)
      continue;
    L->err[0] = 0;
    for (int t = 0; t < nw; t++)
      if (cl_overlap(&w[t], &ab[0]) || cl_overlap(&w[t], &ab[1])) return false;
  }
  return true;
}

static void plan_dgelu(Lower *L, const Func *f) {
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || getenv("LOOM_CUDA_NO_DGELU")) return;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *mm = f->ops.items[i];
    if (mm->kind != OP_MATMUL || L->skip[i] || L->defer[i] >= 0 || L->bgrad[i]) continue;
    const Op *save = L->op;
    L->op = mm;
    bool single = lower_matmul_step_is_single(L);
    L->op = save;
    if (!single) continue;
    for (int j = i + 1; j < f->ops.n && j <= i + 16; j++) {
      if (!reads(f, j, mm->results[0])) continue;
      const Value *pre, *dx, *db;
      if (!L->skip[j] && L->defer[j] < 0 && L->gemm_at[j] < 0 && match_dgelu(L, f, i, j, &pre, &dx, &db)) {
        L->defer[i] = j;   /* not lowered in order: at op j's place */
        L->gemm_at[j] = i;
      }
      break;
    }
  }
}

/* Op j (a call), the GELU backward of the matmul gemm_at[j]: that GEMM with DGELU[_BGRAD]. */
int cl_lower_gemm_at(Lower *L, Steps *s, int j) {
  const Func *f = L->f;
  const Op *call = f->ops.items[j];
  int i = L->gemm_at[j];
  const Value *pre, *dx, *db;
  L->op = f->ops.items[i];
  if (!match_dgelu(L, f, i, j, &pre, &dx, &db)) return cl_fail(L, "internal error: the GELU backward epilogue no longer matches");
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
  plan_views(L, f);
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || getenv("LOOM_CUDA_NO_BGRAD")) {
    free(trial);
    plan_dgelu(L, f);
    plan_sum3(L, f);
    plan_trees(L, f);
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
  plan_trees(L, f);
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
  if (j < f->ops.n && !L->skip[j] && L->defer[j] < 0 && !reads(f, j, L->op->results[0]) && j + 1 < f->ops.n &&
      may_precede(L, f, j, L->op))
    j++;
  Epilogue e;
  if (!acc && lower_matmul_step_is_single(L) && (j >= f->ops.n || (!L->skip[j] && L->defer[j] < 0)) &&
      match_epilogue(f, i, j, &e)) {
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
