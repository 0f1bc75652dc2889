/* passes/canonicalize.c — pass "canonicalize": local rewrites to a simpler equal form.
 *   reshape/broadcast/cast to the operand's own type      -> the operand (not a cast to f32:
 *       the frontend writes one where a computation stays f32 under mixed precision, e.g.
 *       a mixture of experts' routing; the mixed-precision pass runs after this one)
 *   reshape(reshape(x))                                   -> reshape(x)
 *   transpose with the identity permutation               -> the operand
 *   transpose(transpose(x))                               -> one transpose
 *   slice of the whole operand, concat of one operand     -> the operand
 *   scale by 1, add_scalar of 0                           -> the operand
 *   scale, add_scalar, neg, reshape, broadcast of a constant -> a constant (computed in f32)
 *   shard_slice of a constant                             -> the constant, the slice's type
 *   shard_slice(broadcast(x)) along a dim the broadcast made -> broadcast(x) to the slice's
 *       (local) type: every rank's part of a broadcast dim is the same, so each rank
 *       broadcasts straight to its part instead of writing the whole mesh's tensor and
 *       slicing it (at dp=N, N times the bytes and the arena: GPT-2's biases and position
 *       embedding broadcast to the global batch)
 * Rewrites either reuse an existing value or change an op in place; ops left unused are
 * removed at the end.  An operand that is a global is read when its op runs, so a fold
 * never makes a later op read a global that this function writes: that would move the
 * read past the write. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* May a fold make another op read v?  Not a global this function writes. */
static bool movable(const Value *v, const bool *written) {
  return v->kind != VAL_GLOBAL || !written[v->global->index];
}

/* An op on a constant becomes a constant: rewritten in place, so no new values. */
static bool fold_constant(Op *op) {
  const Value *x = op->n_operands == 1 ? op->operands[0] : NULL;
  if (!x || x->kind != VAL_RESULT || x->def->kind != OP_CONSTANT || !dtype_is_float(x->type.dtype)) return false;
  float c = (float)op_float(x->def, "value"), v;
  switch (op->kind) {
  case OP_SCALE: v = c * (float)op_float(op, "by"); break;
  case OP_ADD_SCALAR: v = c + (float)op_float(op, "value"); break;
  case OP_NEG: v = -c; break;
  case OP_RESHAPE: case OP_BROADCAST: v = c; break;
  default: return false;
  }
  v = dtype_round(op->results[0]->type.dtype, v);
  Attr value = {.kind = ATTR_FLOAT, .f = v, .set = true};
  op->kind = OP_CONSTANT;
  op->n_operands = 0;
  memset(op->attrs, 0, sizeof op->attrs);
  op->attrs[0] = value;
  return true;
}

/* shard_slice(broadcast(x)) along a dim that is new in the broadcast or 1 in x: rewritten in
   place into broadcast(x) with the slice's type. */
static bool slice_of_broadcast(Op *op, const bool *written) {
  if (op->kind != OP_SHARD_SLICE || op->n_operands != 1) return false;
  const Value *bv = op->operands[0];
  if (bv->kind == VAL_RESULT && bv->def->kind == OP_CONSTANT && dtype_is_float(bv->type.dtype)) {
    Attr value = bv->def->attrs[0];   /* a constant: every part is the same constant */
    op->kind = OP_CONSTANT;
    op->n_operands = 0;
    memset(op->attrs, 0, sizeof op->attrs);
    op->attrs[0] = value;
    return true;
  }
  if (bv->kind != VAL_RESULT || bv->def->kind != OP_BROADCAST) return false;
  Value *x = bv->def->operands[0];
  if (!movable(x, written)) return false;
  int d = (int)op_int(op, "dim"), off = bv->type.rank - x->type.rank;
  if (d < 0 || d >= bv->type.rank || off < 0) return false;
  if (d >= off && x->type.dims[d - off] != 1) return false;
  op->kind = OP_BROADCAST;
  op->operands[0] = x;
  memset(op->attrs, 0, sizeof op->attrs);
  return true;
}

/* The value that `op`'s result can be replaced by, or NULL. */
static Value *fold(Module *m, Op *op, const bool *written) {
  Value *x = op->n_operands ? op->operands[0] : NULL;
  const Type *rt = &op->results[0]->type;
  switch (op->kind) {
  case OP_RESHAPE:
    if (x->kind == VAL_RESULT && x->def->kind == OP_RESHAPE && movable(x->def->operands[0], written))
      op->operands[0] = x = x->def->operands[0];
    /* fall through */
  case OP_BROADCAST:
  case OP_CAST:
    if (op->kind == OP_CAST && rt->dtype == DT_F32) return NULL;
    return type_eq(&x->type, rt) ? x : NULL;
  case OP_TRANSPOSE: {
    const Attr *perm = &op->attrs[0];
    if (x->kind == VAL_RESULT && x->def->kind == OP_TRANSPOSE && movable(x->def->operands[0], written)) {
      /* result dim i = inner dim perm[i] = x0 dim inner_perm[perm[i]] */
      const Attr *inner = &x->def->attrs[0];
      int64_t composed[IR_MAX_RANK];
      for (int i = 0; i < perm->n; i++) composed[i] = inner->ints[perm->ints[i]];
      op->operands[0] = x = x->def->operands[0];
      op_set_ints(m, op, "perm", composed, perm->n);
    }
    for (int i = 0; i < perm->n; i++)
      if (perm->ints[i] != i) return NULL;
    return x;
  }
  case OP_SLICE:
    return type_shape_eq(&x->type, rt) && sharding_eq(&x->type.sh, &rt->sh) ? x : NULL;
  case OP_CONCAT:
    return op->n_operands == 1 ? x : NULL;
  case OP_SCALE:
    return op_float(op, "by") == 1.0 ? x : NULL;
  case OP_ADD_SCALAR:
    return op_float(op, "value") == 0.0 ? x : NULL;
  default:
    return NULL;
  }
}

static int canonicalize_func(Module *m, Func *f) {
  int n = func_number(f);
  Value **repl = calloc((size_t)(n ? n : 1), sizeof *repl);
  int changed = 0;
  bool *written = calloc((size_t)m->globals.n + 1, 1);
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int k = 0; k < op_n_writes(op->kind); k++)
      if (op->operands[k]->kind == VAL_GLOBAL) written[op->operands[k]->global->index] = true;
  }
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && repl[v->id]) op->operands[k] = repl[v->id];
    }
    if (op->n_results != 1) continue;
    if (fold_constant(op) || slice_of_broadcast(op, written)) {
      changed++;
      continue;
    }
    Value *to = fold(m, op, written);
    if (to && movable(to, written)) {
      repl[op->results[0]->id] = to;
      changed++;
    }
  }
  replace_uses(f, repl);
  free(repl);
  free(written);
  remove_dead_ops(f);   /* in-place rewrites can leave inner ops unused too */
  return changed;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (int i = 0; i < m->funcs.n; i++) ctx->changed += canonicalize_func(m, m->funcs.items[i]);
  return 0;
}

const Pass pass_canonicalize = {"canonicalize", "fold identities and chains of reshapes and transposes", run};
