/* passes/autodiff.c — pass "autodiff": from @forward (whose last result is the scalar
 * loss) build @grad_step: the forward ops, then the backward in reverse order, and for
 * every parameter `accumulate $grad.<name>, %d<name>` as soon as its gradient is complete.  The loss is seeded with
 * 1/grad_accum, so after grad_accum micro-batches the accumulators hold the mean
 * gradient, as PyTorch's loss/grad_accum convention gives.
 *
 * One switch holds the derivative rule of every op; composites (attention, norms,
 * softmax, cross-entropy, embedding, rope) differentiate as whole units into their
 * *_grad ops.  Gradients flow only into values that depend on parameters.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  Module *m;
  Builder b;
  Value **adj;      /* adjoint of each cloned forward value, by id */
  bool *needs;      /* does the value depend on a parameter? by id */
  Value **gadj;     /* adjoint of each global, by index */
} AD;

/* ---- small builders ---- */

static Value *B1(AD *ad, OpKind k, Value *x) { return build1(&ad->b, k, x, NULL); }
static Value *B2(AD *ad, OpKind k, Value *x, Value *y) { return build2(&ad->b, k, x, y, NULL); }
static Value *typed(AD *ad, OpKind k, Value *x, Type t) { return build_typed(&ad->b, k, x, t, NULL); }

static Value *scale(AD *ad, Value *x, double by) {
  op_set_float(build_begin(&ad->b, OP_SCALE, &x, 1), "by", by);
  return build_end(&ad->b, NULL);
}

static Value *add_scalar(AD *ad, Value *x, double v) {
  op_set_float(build_begin(&ad->b, OP_ADD_SCALAR, &x, 1), "value", v);
  return build_end(&ad->b, NULL);
}

static Value *constant(AD *ad, Type t, double v) {
  Op *op = func_add_op(ad->b.f, OP_CONSTANT, NULL, 0, &t);
  op_set_float(op, "value", v);
  return op->results[0];
}

static Value *zeros_like(AD *ad, Value *x) {
  Type t = x->type;
  return constant(ad, t, 0);
}

static Value *matmul(AD *ad, Value *a, Value *b, bool ta, bool tb) {
  Value *ops[2] = {a, b};
  Op *op = build_begin(&ad->b, OP_MATMUL, ops, 2);
  op_set_bool(op, "ta", ta);
  op_set_bool(op, "tb", tb);
  return build_end(&ad->b, NULL);
}

static Value *with_ints(AD *ad, OpKind k, Value *x, const char *a1, const int64_t *v1, const char *a2,
                        const int64_t *v2, int n) {
  Op *op = build_begin(&ad->b, k, &x, 1);
  op_set_ints(ad->m, op, a1, v1, n);
  if (a2) op_set_ints(ad->m, op, a2, v2, n);
  return build_end(&ad->b, NULL);
}

/* Swaps the last two dims. */
static Value *transpose_last2(AD *ad, Value *x) {
  int64_t perm[IR_MAX_RANK];
  int r = x->type.rank;
  for (int i = 0; i < r; i++) perm[i] = i;
  perm[r - 2] = r - 1;
  perm[r - 1] = r - 2;
  return with_ints(ad, OP_TRANSPOSE, x, "perm", perm, NULL, NULL, r);
}

static Value *reduce_sum(AD *ad, Value *x, const int64_t *dims, int n) {
  return with_ints(ad, OP_REDUCE_SUM, x, "dims", dims, NULL, NULL, n);
}

/* Broadcasts g (x's shape with `dims` removed) back to x's shape. */
static Value *unreduce(AD *ad, Value *g, const Type *x, const Attr *dims) {
  Type keep = *x;
  for (int i = 0; i < dims->n; i++) keep.dims[dims->ints[i]] = 1;
  keep.dtype = g->type.dtype;
  Type full = *x;
  full.dtype = g->type.dtype;
  return typed(ad, OP_BROADCAST, typed(ad, OP_RESHAPE, g, keep), full);
}

/* The adjoint of broadcast: sums g over the dims x was broadcast along, back to x's shape. */
static Value *sum_to(AD *ad, Value *g, const Type *x) {
  const Type *y = &g->type;
  int off = y->rank - x->rank, n = 0;
  int64_t dims[IR_MAX_RANK];
  for (int d = 0; d < y->rank; d++)
    if (d < off || (x->dims[d - off] == 1 && y->dims[d] != 1)) dims[n++] = d;
  Value *r = n ? reduce_sum(ad, g, dims, n) : g;
  Type want = *x;
  want.dtype = g->type.dtype;
  return type_shape_eq(&r->type, &want) ? r : typed(ad, OP_RESHAPE, r, want);
}

/* ---- adjoint bookkeeping ---- */

static bool needs(AD *ad, const Value *v) {
  if (v->kind == VAL_GLOBAL) return v->global->kind == GLOBAL_PARAM && dtype_is_float(v->type.dtype);
  if (v->kind == VAL_ARG) return false;
  return ad->needs[v->id];
}

static void contribute(AD *ad, Value *v, Value *g) {
  if (!g || !needs(ad, v)) return;
  Value **slot = v->kind == VAL_GLOBAL ? &ad->gadj[v->global->index] : &ad->adj[v->id];
  *slot = *slot ? B2(ad, OP_ADD, *slot, g) : g;
}

static int no_rule(const Op *op, char *err, size_t errlen) {
  snprintf(err, errlen, "no derivative rule for op '%s' (it appears on the path from a parameter to the loss)",
           op_info(op->kind)->name);
  return IR_EINPUT;
}

/* The derivative rule of every op: given the adjoints dy[] of op's results, add the
   adjoints of its operands. */
static int rule(AD *ad, Op *op, Value **dy, char *err, size_t errlen) {
  Value *x = op->n_operands > 0 ? op->operands[0] : NULL;
  Value *y = op->results[0], *g = dy[0];
  Value *a = x, *b = op->n_operands > 1 ? op->operands[1] : NULL;
  switch (op->kind) {
  /* elementwise, unary */
  case OP_NEG: contribute(ad, x, B1(ad, OP_NEG, g)); return 0;
  case OP_EXP: contribute(ad, x, B2(ad, OP_MUL, g, y)); return 0;
  case OP_LOG: contribute(ad, x, B2(ad, OP_DIV, g, x)); return 0;
  case OP_SQRT: contribute(ad, x, scale(ad, B2(ad, OP_DIV, g, y), 0.5)); return 0;
  case OP_RSQRT: contribute(ad, x, scale(ad, B2(ad, OP_MUL, g, B2(ad, OP_MUL, y, B1(ad, OP_SQUARE, y))), -0.5)); return 0;
  case OP_RECIP: contribute(ad, x, B1(ad, OP_NEG, B2(ad, OP_MUL, g, B1(ad, OP_SQUARE, y)))); return 0;
  case OP_TANH: contribute(ad, x, B2(ad, OP_MUL, g, add_scalar(ad, B1(ad, OP_NEG, B1(ad, OP_SQUARE, y)), 1))); return 0;
  case OP_SIGMOID: contribute(ad, x, B2(ad, OP_MUL, g, B2(ad, OP_MUL, y, add_scalar(ad, B1(ad, OP_NEG, y), 1)))); return 0;
  case OP_GELU_TANH: contribute(ad, x, B2(ad, OP_GELU_TANH_GRAD, x, g)); return 0;
  case OP_SILU: contribute(ad, x, B2(ad, OP_SILU_GRAD, x, g)); return 0;
  case OP_RELU: contribute(ad, x, B2(ad, OP_RELU_GRAD, x, g)); return 0;
  case OP_ABS: contribute(ad, x, B2(ad, OP_MUL, g, B1(ad, OP_SIGN, x))); return 0;
  case OP_SQUARE: contribute(ad, x, B2(ad, OP_MUL, g, scale(ad, x, 2))); return 0;
  case OP_SCALE: contribute(ad, x, scale(ad, g, op_float(op, "by"))); return 0;
  case OP_ADD_SCALAR: contribute(ad, x, g); return 0;
  case OP_SIGN: case OP_EQ: case OP_GE: case OP_IOTA: case OP_CONSTANT: return 0;   /* piecewise constant */
  /* elementwise, binary */
  case OP_ADD: contribute(ad, a, g); contribute(ad, b, g); return 0;
  case OP_SUB: contribute(ad, a, g); if (needs(ad, b)) contribute(ad, b, B1(ad, OP_NEG, g)); return 0;
  case OP_MUL:
    if (needs(ad, a)) contribute(ad, a, B2(ad, OP_MUL, g, b));
    if (needs(ad, b)) contribute(ad, b, B2(ad, OP_MUL, g, a));
    return 0;
  case OP_DIV:
    if (needs(ad, a)) contribute(ad, a, B2(ad, OP_DIV, g, b));
    if (needs(ad, b)) contribute(ad, b, B1(ad, OP_NEG, B2(ad, OP_DIV, B2(ad, OP_MUL, g, y), b)));
    return 0;
  case OP_POW:
    if (needs(ad, a)) contribute(ad, a, B2(ad, OP_MUL, g, B2(ad, OP_MUL, b, B2(ad, OP_POW, a, add_scalar(ad, b, -1)))));
    if (needs(ad, b)) contribute(ad, b, B2(ad, OP_MUL, g, B2(ad, OP_MUL, y, B1(ad, OP_LOG, a))));
    return 0;
  case OP_MAX:
  case OP_MIN: {   /* the gradient goes to the operand that was picked (a on ties) */
    Value *pick_a = op->kind == OP_MAX ? B2(ad, OP_GE, a, b) : B2(ad, OP_GE, b, a), *z = zeros_like(ad, g);
    Value *wa[3] = {pick_a, g, z}, *wb[3] = {pick_a, z, g};
    if (needs(ad, a)) contribute(ad, a, build(&ad->b, OP_WHERE, wa, 3, NULL));
    if (needs(ad, b)) contribute(ad, b, build(&ad->b, OP_WHERE, wb, 3, NULL));
    return 0;
  }
  case OP_WHERE: {
    Value *c = op->operands[0], *z = zeros_like(ad, g);
    Value *wa[3] = {c, g, z}, *wb[3] = {c, z, g};
    if (needs(ad, op->operands[1])) contribute(ad, op->operands[1], build(&ad->b, OP_WHERE, wa, 3, NULL));
    if (needs(ad, op->operands[2])) contribute(ad, op->operands[2], build(&ad->b, OP_WHERE, wb, 3, NULL));
    return 0;
  }
  /* reductions */
  case OP_REDUCE_SUM: contribute(ad, x, unreduce(ad, g, &x->type, &op->attrs[0])); return 0;
  case OP_REDUCE_MEAN: {
    int64_t count = type_numel(&x->type) / (type_numel(&y->type) ? type_numel(&y->type) : 1);
    contribute(ad, x, unreduce(ad, scale(ad, g, 1.0 / (double)count), &x->type, &op->attrs[0]));
    return 0;
  }
  case OP_REDUCE_MAX: {
    Value *mask = B2(ad, OP_EQ, x, unreduce(ad, y, &x->type, &op->attrs[0]));
    Value *w[3] = {mask, unreduce(ad, g, &x->type, &op->attrs[0]), NULL};
    w[2] = zeros_like(ad, w[1]);
    contribute(ad, x, build(&ad->b, OP_WHERE, w, 3, NULL));
    return 0;
  }
  /* contractions: C = op(A) op(B) */
  case OP_MATMUL: {
    bool ta = op_bool(op, "ta"), tb = op_bool(op, "tb");
    bool b_broadcast = b->type.rank < a->type.rank;
    if (needs(ad, a)) {
      if (ta && b_broadcast)   /* dA' = (dC op(B)^T)^T: b cannot be the batched left operand */
        contribute(ad, a, transpose_last2(ad, matmul(ad, g, b, false, !tb)));
      else
        contribute(ad, a, ta ? matmul(ad, b, g, tb, true) : matmul(ad, g, b, false, !tb));
    }
    if (needs(ad, b)) {
      Value *aa = a, *gg = g;
      if (b_broadcast) {   /* sum over the batch: flatten [..., M, K] to [(...*M), K] */
        if (ta) {   /* op(A) = A'^T: transpose first, then flatten like ta=false */
          aa = transpose_last2(ad, a);
          ta = false;
        }
        int64_t K = aa->type.dims[aa->type.rank - 1], N = g->type.dims[g->type.rank - 1];
        int64_t rows = type_numel(&aa->type) / (K ? K : 1);
        int64_t da[2] = {rows, K}, dg[2] = {rows, N};
        aa = typed(ad, OP_RESHAPE, aa, type_make(aa->type.dtype, 2, da));
        gg = typed(ad, OP_RESHAPE, g, type_make(g->type.dtype, 2, dg));
      }
      contribute(ad, b, tb ? matmul(ad, gg, aa, true, ta) : matmul(ad, aa, gg, !ta, false));
    }
    return 0;
  }
  case OP_EMBEDDING: {   /* rows of the table scatter-add the gradients of their uses */
    Value *ops[2] = {g, b};
    Type t = x->type;
    t.dtype = g->type.dtype;
    contribute(ad, x, func_add_op(ad->b.f, OP_EMBEDDING_GRAD, ops, 2, &t)->results[0]);
    return 0;
  }
  /* data movement */
  case OP_RESHAPE: {
    Type t = x->type;
    t.dtype = g->type.dtype;
    contribute(ad, x, typed(ad, OP_RESHAPE, g, t));
    return 0;
  }
  case OP_BROADCAST: contribute(ad, x, sum_to(ad, g, &x->type)); return 0;
  case OP_CAST: if (dtype_is_float(x->type.dtype)) contribute(ad, x, typed(ad, OP_CAST, g, x->type)); return 0;
  case OP_TRANSPOSE: {
    const Attr *perm = &op->attrs[0];
    int64_t inv[IR_MAX_RANK];
    for (int i = 0; i < perm->n; i++) inv[perm->ints[i]] = i;
    contribute(ad, x, with_ints(ad, OP_TRANSPOSE, g, "perm", inv, NULL, NULL, perm->n));
    return 0;
  }
  case OP_SLICE: {
    const Attr *st = &op->attrs[0], *en = &op->attrs[1];
    int64_t high[IR_MAX_RANK];
    for (int d = 0; d < x->type.rank; d++) high[d] = x->type.dims[d] - en->ints[d];
    contribute(ad, x, with_ints(ad, OP_PAD, g, "low", st->ints, "high", high, x->type.rank));
    return 0;
  }
  case OP_PAD: {
    const Attr *lo = &op->attrs[0];
    int64_t end[IR_MAX_RANK];
    for (int d = 0; d < x->type.rank; d++) end[d] = lo->ints[d] + x->type.dims[d];
    contribute(ad, x, with_ints(ad, OP_SLICE, g, "start", lo->ints, "end", end, x->type.rank));
    return 0;
  }
  case OP_CONCAT: {
    int dim = (int)op_int(op, "dim");
    int64_t off = 0;
    for (int i = 0; i < op->n_operands; i++) {
      Value *v = op->operands[i];
      int64_t start[IR_MAX_RANK] = {0}, end[IR_MAX_RANK];
      for (int d = 0; d < v->type.rank; d++) end[d] = g->type.dims[d];
      start[dim] = off;
      end[dim] = off + v->type.dims[dim];
      off = end[dim];
      if (needs(ad, v)) contribute(ad, v, with_ints(ad, OP_SLICE, g, "start", start, "end", end, v->type.rank));
    }
    return 0;
  }
  /* composites, as whole units */
  case OP_LAYERNORM:
  case OP_RMSNORM: {
    bool ln = op->kind == OP_LAYERNORM;
    Value *ops[3] = {g, x, op->operands[1]};
    Op *o = build_begin(&ad->b, ln ? OP_LAYERNORM_GRAD : OP_RMSNORM_GRAD, ops, 3);
    op_set_float(o, "eps", op_float(op, "eps"));
    build_end(&ad->b, NULL);
    contribute(ad, x, o->results[0]);
    contribute(ad, op->operands[1], o->results[1]);
    if (ln) contribute(ad, op->operands[2], o->results[2]);
    return 0;
  }
  case OP_SOFTMAX: contribute(ad, x, B2(ad, OP_SOFTMAX_GRAD, g, y)); return 0;
  case OP_ATTENTION: {
    Value *ops[4] = {g, op->operands[0], op->operands[1], op->operands[2]};
    Op *o = build_begin(&ad->b, OP_ATTENTION_GRAD, ops, 4);
    op_set_float(o, "scale", op_float(op, "scale"));
    op_set_bool(o, "causal", op_bool(op, "causal"));
    op_set_int(o, "window", op_int(op, "window"));
    build_end(&ad->b, NULL);
    for (int i = 0; i < 3; i++) contribute(ad, op->operands[i], o->results[i]);
    return 0;
  }
  case OP_ROPE: {
    Op *o = build_begin(&ad->b, OP_ROPE, &g, 1);
    op_set_float(o, "theta", op_float(op, "theta"));
    op_set_float(o, "factor", op_float(op, "factor"));
    op_set_float(o, "low_freq_factor", op_float(op, "low_freq_factor"));
    op_set_float(o, "high_freq_factor", op_float(op, "high_freq_factor"));
    op_set_int(o, "original_max_pos", op_int(op, "original_max_pos"));
    op_set_int(o, "offset", op_int(op, "offset"));
    op_set_bool(o, "inverse", !op_bool(op, "inverse"));
    contribute(ad, x, build_end(&ad->b, NULL));
    return 0;
  }
  case OP_CROSS_ENTROPY: {
    Value *ops[3] = {g, x, b};
    contribute(ad, x, build(&ad->b, OP_CROSS_ENTROPY_GRAD, ops, 3, NULL));
    return 0;
  }
  /* mixture of experts: the routing (topk, sort, count) is piecewise constant; the weights
     and rows flow through gathers, the dispatch/combine adjoint pair and grouped matmuls */
  case OP_TOPK: case OP_MOE_SORT: case OP_MOE_COUNT: return 0;
  case OP_GATHER_LAST: {
    Value *ops[2] = {g, b};
    Op *o = func_add_op(ad->b.f, OP_SCATTER_LAST, ops, 2, &x->type);
    contribute(ad, x, o->results[0]);
    return 0;
  }
  case OP_SCATTER_LAST: contribute(ad, x, B2(ad, OP_GATHER_LAST, g, b)); return 0;
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE: {
    Value *w = op->operands[2];
    bool disp = op->kind == OP_MOE_DISPATCH;
    Value *ops[3] = {g, b, w};
    Op *o = build_begin(&ad->b, disp ? OP_MOE_COMBINE : OP_MOE_DISPATCH, ops, 3);
    if (!disp) op_set_int(o, "rows", x->type.dims[0]);
    contribute(ad, x, build_end(&ad->b, NULL));
    if (needs(ad, w)) {   /* the rows (sorted side) first, then the tokens */
      Value *wg[3] = {disp ? g : x, disp ? x : g, b};
      contribute(ad, w, build(&ad->b, OP_MOE_WEIGHT_GRAD, wg, 3, NULL));
    }
    return 0;
  }
  case OP_GROUPED_MATMUL: {
    Value *w = b, *cnt = op->operands[2];
    bool tb = op_bool(op, "tb");
    Value *ops[3] = {g, w, cnt};
    op_set_bool(build_begin(&ad->b, OP_GROUPED_MATMUL, ops, 3), "tb", !tb);
    contribute(ad, x, build_end(&ad->b, NULL));
    if (needs(ad, w)) {   /* tb: dw[e] = dy^T x ([N,K]); else dw[e] = x^T dy ([K,N]) */
      Value *wg[3] = {tb ? g : x, tb ? x : g, cnt};
      op_set_int(build_begin(&ad->b, OP_GROUPED_MATMUL_WGRAD, wg, 3), "experts", w->type.dims[0]);
      contribute(ad, w, build_end(&ad->b, NULL));
    }
    return 0;
  }
  default:
    return no_rule(op, err, errlen);
  }
}

/* The accumulates (and their casts to f32), appended after the backward's ops[0..n_body),
   move up to just after the op that completes their gradient: a gradient is then dead as
   soon as it is accumulated (the memory plan does not hold every weight gradient of the step
   until its end).  Each accumulate writes its own global, which nothing else in the step
   reads: the values are the same whatever the order.  (A ZeRO-2/3 gradient's reduce-scatter
   then sits before its accumulate: the overlap pass sinks the two together.) */
static void place_accumulates(Module *m, Func *f, int n_body) {
  int n = f->ops.n, n_tail = n - n_body, n_vals = func_number(f);
  /* after[id]: the body op index a value's accumulate follows (-1: the end); next: each body
     op's tail ops in their order, as linked lists (first/last by body index) */
  int *after = malloc(sizeof(int) * (size_t)(n_vals + 1)), *where = malloc(sizeof(int) * (size_t)(n_tail + 1));
  int *first = malloc(sizeof(int) * (size_t)(n_body + 1)), *last = malloc(sizeof(int) * (size_t)(n_body + 1));
  int *next = malloc(sizeof(int) * (size_t)(n_tail + 1));
  if (!after || !where || !first || !last || !next) {   /* out of memory: leave them at the end */
    free(after), free(where), free(first), free(last), free(next);
    return;
  }
  for (int i = 0; i < f->args.n; i++) after[((Value *)f->args.items[i])->id] = -1;
  for (int i = 0; i < n_body; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) after[op->results[r]->id] = i;
    first[i] = last[i] = -1;
  }
  PtrVec out = {0};
  for (int k = 0; k < n_tail; k++) {
    const Op *op = f->ops.items[n_body + k];
    const Value *v = op->kind == OP_ACCUMULATE ? op->operands[1] : op->operands[0];
    where[k] = v->kind == VAL_RESULT ? after[v->id] : -1;   /* an accumulate of a tail cast: the cast's place */
    for (int r = 0; r < op->n_results; r++) after[op->results[r]->id] = where[k];
    next[k] = -1;
    if (where[k] < 0) continue;
    if (last[where[k]] < 0) first[where[k]] = k;
    else next[last[where[k]]] = k;
    last[where[k]] = k;
  }
  for (int i = 0; i < n_body; i++) {
    ptrvec_push(m->arena, &out, f->ops.items[i]);
    for (int k = first[i]; k >= 0; k = next[k]) ptrvec_push(m->arena, &out, f->ops.items[n_body + k]);
  }
  for (int k = 0; k < n_tail; k++)
    if (where[k] < 0) ptrvec_push(m->arena, &out, f->ops.items[n_body + k]);
  f->ops = out;
  free(after), free(where), free(first), free(last), free(next);
}

/* Clones @forward's ops into f, mapping values; returns the clone of the loss. */
static Value *clone_forward(Module *m, const Func *fwd, Func *f) {
  int n = func_number((Func *)fwd);
  Value **map = calloc((size_t)(n ? n : 1), sizeof *map);
  for (int i = 0; i < fwd->args.n; i++) {
    const Value *v = fwd->args.items[i];
    map[v->id] = func_add_arg(f, v->name, v->type);
  }
  for (int i = 0; i < fwd->ops.n; i++) {
    const Op *op = fwd->ops.items[i];
    Value *operands[256];
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      operands[k] = v->kind == VAL_GLOBAL ? (Value *)v : map[v->id];
    }
    Type types[8];
    for (int r = 0; r < op->n_results; r++) types[r] = op->results[r]->type;
    Op *c = func_add_op(f, op->kind, operands, op->n_operands, types);
    memcpy(c->attrs, op->attrs, sizeof c->attrs);
    for (int r = 0; r < op->n_results; r++) {
      c->results[r]->name = op->results[r]->name;
      map[op->results[r]->id] = c->results[r];
    }
  }
  const Value *loss = fwd->rets.items[fwd->rets.n - 1];
  Value *out = loss->kind == VAL_GLOBAL ? (Value *)loss : map[loss->id];
  free(map);
  return out;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  Func *fwd = module_find_func(m, "forward");
  if (!fwd || fwd->rets.n < 1) {
    snprintf(err, errlen, "autodiff needs a function @forward whose last result is the loss");
    return IR_EINPUT;
  }
  const Value *loss0 = fwd->rets.items[fwd->rets.n - 1];
  if (loss0->type.rank != 0 || !dtype_is_float(loss0->type.dtype)) {
    char buf[128];
    snprintf(err, errlen, "@forward's last result must be a float scalar loss, but it is %s",
             type_str(&loss0->type, buf, sizeof buf));
    return IR_EINPUT;
  }
  if (module_find_func(m, "grad_step")) {
    snprintf(err, errlen, "the module already has @grad_step (autodiff ran before)");
    return IR_EINPUT;
  }
  Func *f = module_add_func(m, "grad_step");
  Value *loss = clone_forward(m, fwd, f);
  int n_fwd = f->ops.n, n = func_number(f);
  AD ad = {m, {f, {0}}, calloc((size_t)n + 1, sizeof(Value *)), calloc((size_t)n + 1, 1),
           calloc((size_t)m->globals.n + 1, sizeof(Value *))};
  /* Which values depend on a parameter (only those get adjoints). */
  for (int i = 0; i < n_fwd; i++) {
    Op *op = f->ops.items[i];
    bool dep = false;
    for (int k = 0; k < op->n_operands; k++) dep |= needs(&ad, op->operands[k]);
    for (int r = 0; r < op->n_results; r++) ad.needs[op->results[r]->id] = dep && dtype_is_float(op->results[r]->type.dtype);
  }
  int rc = 0;
  if (loss->kind == VAL_RESULT && ad.needs[loss->id]) {
    ad.adj[loss->id] = constant(&ad, loss->type, 1.0 / (double)(ts->grad_accum > 0 ? ts->grad_accum : 1));
    /* The backward starts here: the pipeline pass finds the seed by this name. */
    value_set_name(m, ad.adj[loss->id], "loss_seed");
    for (int i = n_fwd - 1; i >= 0 && !rc; i--) {
      Op *op = f->ops.items[i];
      Value *dy[8];
      bool any = false;
      for (int r = 0; r < op->n_results; r++) any |= (dy[r] = ad.adj[op->results[r]->id]) != NULL;
      if (!any) continue;
      rc = rule(&ad, op, dy, err, errlen);
      if (ad.b.err[0] && !rc) {
        snprintf(err, errlen, "autodiff built an invalid op (a bug in a derivative rule): %s", ad.b.err);
        rc = IR_ERUN;
      }
    }
  }
  /* Accumulate every parameter's gradient into its f32 $grad.<name>. */
  int n_globals = m->globals.n, n_body = f->ops.n;
  for (int i = 0; i < n_globals && !rc; i++) {
    Global *p = m->globals.items[i];
    if (p->kind != GLOBAL_PARAM || !dtype_is_float(p->value->type.dtype)) continue;
    char name[512];
    snprintf(name, sizeof name, GRAD_PREFIX "%s", p->name);
    Type gt = p->value->type;
    gt.dtype = DT_F32;
    Global *acc = module_find_global(m, name);
    if (!acc) {
      acc = module_add_global(m, GLOBAL_STATE, name, gt, (Init){INIT_ZEROS, 0});
      acc->hf_rank = p->hf_rank;
      acc->hf_experts = p->hf_experts;
      memcpy(acc->hf_dims, p->hf_dims, sizeof acc->hf_dims);
    }
    Value *g = ad.gadj[i];
    if (!g) continue;   /* the loss does not depend on it: its gradient stays zero */
    if (g->type.dtype != DT_F32) g = typed(&ad, OP_CAST, g, gt);
    Value *ops[2] = {acc->value, g};
    func_add_op(f, OP_ACCUMULATE, ops, 2, NULL);
  }
  if (!rc) place_accumulates(m, f, n_body);
  func_add_ret(f, loss);
  free(ad.adj);
  free(ad.needs);
  free(ad.gadj);
  return rc;
}

const Pass pass_autodiff = {"autodiff", "@forward -> @grad_step: forward, loss, backward, accumulate $grad.*", run};

bool op_is_loss_seed(const Op *op) {
  return op->n_results == 1 && op->results[0]->name && !strcmp(op->results[0]->name, "loss_seed");
}
