/* codegen/cuda/lower_gemm_match.c — the patterns around a matmul that the GEMM lowering fuses
 * into its cuBLASLt call, and why each is worth it: a gradient's accumulation into the f32
 * gradient (beta = 1), the epilogues (bias, GELU, residual), GELU's backward (DGELU_BGRAD).
 * Matchers only: they look at the function and its memory plan and change nothing, so that the
 * plans (lower_gemm_plan.c, lower_gemm_views.c) and the lowering (lower_gemm.c) ask the same
 * questions the same way. */
#include "codegen/cuda/lower_gemm_internal.h"

#include <stdlib.h>
#include <string.h>

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
bool cl_gemm_is_cast_call(const Op *op) {
  if (op->kind != OP_CALL || op->n_operands != 1 || op->n_results != 1) return false;
  const Func *k = op->callee;
  if (!k || !k->is_kernel || k->args.n != 1 || k->rets.n != 1 || k->ops.n != 1) return false;
  const Op *c = k->ops.items[0];
  return c->kind == OP_CAST && c->operands[0] == k->args.items[0] && k->rets.items[0] == c->results[0] &&
         dtype_is_float(c->operands[0]->type.dtype) && dtype_is_float(c->results[0]->type.dtype);
}

/* Op `at` of f is `accumulate $g, v` into an f32 global of v's element count. */
const Value *cl_gemm_accumulates(const Func *f, int at, const Value *v) {
  if (at >= f->ops.n) return NULL;
  const Op *op = f->ops.items[at];
  if (op->kind != OP_ACCUMULATE || op->operands[1] != v) return NULL;
  const Value *g = op->operands[0];
  if (g->kind != VAL_GLOBAL || g->type.dtype != DT_F32 || type_numel(&g->type) != type_numel(&v->type)) return NULL;
  return g;
}

/* What cl_fuse_grad_accum would take for op i, without marking anything: the global, and in
   *last the last op taken (the accumulate). */
const Value *cl_gemm_grad_accum(const Func *f, int i, int *last) {
  if (getenv("LOOM_CUDA_NO_ACC_FUSION")) return NULL;   /* the unfused program, for the tests */
  const Op *op = f->ops.items[i];
  const Value *r = op->n_results == 1 ? op->results[0] : NULL;
  *last = i + 1;
  if (!r || cl_uses(f, r) != 1) return NULL;
  if (op->kind == OP_CALL) return cl_gemm_is_cast_call(op) && r->type.dtype == DT_F32 ? cl_gemm_accumulates(f, i + 1, r) : NULL;
  /* (a weight gradient of the experts: lower_moe.c's batched GEMM alone calls for it) */
  if ((op->kind != OP_MATMUL && op->kind != OP_GROUPED_MATMUL_WGRAD) || i + 1 >= f->ops.n) return NULL;
  if (r->type.dtype == DT_F32) return cl_gemm_accumulates(f, i + 1, r);
  if (!cl_fuse_narrow()) return NULL;
  const Op *c = f->ops.items[i + 1];
  if (cl_gemm_is_cast_call(c) && c->operands[0] == r && c->results[0]->type.dtype == DT_F32 && cl_uses(f, c->results[0]) == 1)
    return cl_gemm_accumulates(f, *last = i + 2, c->results[0]);
  return NULL;
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

/* Does op j of f read value v? */
bool cl_gemm_reads(const Func *f, int j, const Value *v) {
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

bool cl_gemm_same_type(const Type *a, const Type *b) {
  if (a->dtype != b->dtype || type_numel(a) != type_numel(b)) return false;
  return true;
}

/* The matmul at op i and the kernel call at op j (> i) that uses its product. */
bool cl_gemm_match_epilogue(const Func *f, int i, int j, GemmEpilogue *e) {
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
      other_side(add, bc->results[0]) == m && cl_gemm_same_type(&add->results[0]->type, rt)) {
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
    } else if (x && x->kind == VAL_ARG && x != m && cl_gemm_same_type(&x->type, rt) && cl_gemm_same_type(&op->results[0]->type, rt)) {
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

/* Would lower_matmul make L->op one GEMM of batch 1 (after folding a shared weight's batch)? */
bool cl_gemm_is_single(const Lower *L) {
  const Op *op = L->op;
  const Type *b = &op->operands[1]->type, *c = &op->results[0]->type;
  int64_t MN = c->dims[c->rank - 2] * c->dims[c->rank - 1];
  return MN > 0 && (type_numel(c) == MN || (b->rank == 2 && !op_bool(op, "ta")));
}


/* May op j of f (a call or builtin) run before the matmul mm: none of its results shares memory
   with mm's operands (the memory plan may have given their place away after mm), and it is no
   matmul, accumulate or update of a global (the cases this reordering does not need)? */
bool cl_gemm_may_precede(Lower *L, const Func *f, int j, const Op *mm) {
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
bool cl_gemm_match_dgelu(Lower *L, const Func *f, int i, int j, const Value **pre, const Value **dx, const Value **db) {
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
    if (op->kind == OP_MATMUL && cl_gemm_grad_accum(f, q, &last)) unmade_to = last - 1;
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
