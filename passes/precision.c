/* passes/precision.c — pass "mixed-precision": when the run's precision is bf16,
 * rewrites @forward to compute in bf16 on f32 master weights: every use of a float
 * parameter reads `cast $p : bf16[...]`, and every float value the forward computes
 * becomes bf16 — except what an op defines as f32 (cross-entropy's loss), so the loss
 * and its mean stay f32.  Composite ops accumulate in f32 inside and round their result.
 *
 * It runs before autodiff: the gradient of `cast` is a cast back, so parameter
 * gradients arrive in f32 while the backward computes in bf16, exactly what bf16
 * autocast training does.  With fp32 it changes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  if (!ts->bf16) return 0;
  Func *f = module_find_func(m, "forward");
  if (!f) {
    snprintf(err, errlen, "mixed-precision needs a function @forward");
    return IR_EINPUT;
  }
  /* Rebuild the op list: casts of parameters go right before their first use. */
  PtrVec old = f->ops;
  memset(&f->ops, 0, sizeof f->ops);
  Value **cast_of = calloc((size_t)m->globals.n + 1, sizeof *cast_of);
  Builder b = {f, {0}};
  for (int i = 0; i < old.n; i++) {
    Op *op = old.items[i];
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind != VAL_GLOBAL || v->global->kind != GLOBAL_PARAM || v->type.dtype != DT_F32) continue;
      Value **c = &cast_of[v->global->index];
      if (!*c) {
        Type t = v->type;
        t.dtype = DT_BF16;
        *c = build_typed(&b, OP_CAST, v, t, NULL);
      }
      op->operands[k] = *c;
    }
    ptrvec_push(m->arena, &f->ops, op);
    /* New result types: inferred from the bf16 operands; declared ones (reshape,
       broadcast, constant...) follow their operand's dtype. */
    Type types[8];
    char msg[1024];
    const OpInfo *info = op_info(op->kind);
    if (info->flags & OPF_TYPED) {
      for (int r = 0; r < op->n_results; r++) {
        Type *t = &op->results[r]->type;
        if (op->kind == OP_CAST) continue;   /* an explicit cast keeps its target */
        if (dtype_is_float(t->dtype)) t->dtype = op->n_operands && dtype_is_float(op->operands[0]->type.dtype)
                                                     ? op->operands[0]->type.dtype : DT_BF16;
      }
      continue;
    }
    if (infer_types(op, types, msg, sizeof msg)) {
      snprintf(err, errlen, "mixed-precision: %s", msg);
      free(cast_of);
      return IR_ERUN;
    }
    for (int r = 0; r < op->n_results; r++) {
      Sharding sh = op->results[r]->type.sh;
      op->results[r]->type = types[r];
      op->results[r]->type.sh = sh;
    }
  }
  free(cast_of);
  if (b.err[0]) {
    snprintf(err, errlen, "mixed-precision: %s", b.err);
    return IR_ERUN;
  }
  /* The returned types changed with the values (logits are bf16 now). */
  return 0;
}

const Pass pass_mixed_precision = {"mixed-precision", "bf16 compute on f32 master weights (when precision is bf16)", run};
