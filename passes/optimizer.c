/* passes/optimizer.c — pass "optimizer": builds
 *   @optimizer_step(%lr: f32[], %step: f32[]) -> (f32[] grad_norm)
 * which reads the accumulated gradients $grad.<name>, computes their global L2 norm,
 * the clipping coefficient coef = min(1, clip / (norm + 1e-6)) (1 when clip is 0), runs
 * AdamW on every parameter with the gradient scaled by coef (weight decay only on
 * parameters of 2 or more dimensions, as the usual GPT recipe), assigns the new
 * parameter and moments back, and zeroes the accumulators.  adamw itself is pure, so the
 * shard and zero passes can run it on shards; lowering turns adamw + its three assigns
 * into one in-place update.  Moments live in f32 state $adam_m.<name> and $adam_v.<name>.
 * %step is t, the 1-based count of optimizer steps, for AdamW's bias correction.
 */
#include <string.h>

#include "passes.h"

static Value *constant(Func *f, double v) {
  Type t = type_scalar(DT_F32);
  Op *op = func_add_op(f, OP_CONSTANT, NULL, 0, &t);
  op_set_float(op, "value", v);
  return op->results[0];
}

static Global *state(Module *m, const char *prefix, const Global *p) {
  char name[512];
  snprintf(name, sizeof name, "%s%s", prefix, p->name);
  Global *g = module_find_global(m, name);
  if (g) return g;
  Type t = p->value->type;
  t.dtype = DT_F32;
  g = module_add_global(m, GLOBAL_STATE, name, t, (Init){INIT_ZEROS, 0});
  g->hf_rank = p->hf_rank;   /* checkpoints hold moments in the parameter's checkpoint shape */
  g->hf_experts = p->hf_experts;
  memcpy(g->hf_dims, p->hf_dims, sizeof g->hf_dims);
  return g;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  if (module_find_func(m, "optimizer_step")) {
    snprintf(err, errlen, "the module already has @optimizer_step (the optimizer pass ran before)");
    return IR_EINPUT;
  }
  Func *f = module_add_func(m, "optimizer_step");
  Builder b = {f, {0}};
  Value *lr = func_add_arg(f, "lr", type_scalar(DT_F32));
  Value *step = func_add_arg(f, "step", type_scalar(DT_F32));

  /* The parameters and their gradient accumulators, in module order. */
  int n_globals = m->globals.n, n = 0;
  Global *params[m->globals.n + 1], *grads[m->globals.n + 1];
  for (int i = 0; i < n_globals; i++) {
    Global *p = m->globals.items[i];
    if (p->kind != GLOBAL_PARAM || !dtype_is_float(p->value->type.dtype)) continue;
    char name[512];
    snprintf(name, sizeof name, GRAD_PREFIX "%s", p->name);
    Global *g = module_find_global(m, name);
    if (!g) {
      snprintf(err, errlen, "parameter $%s has no gradient accumulator $%s: run the autodiff pass first", p->name, name);
      return IR_EINPUT;
    }
    params[n] = p;
    grads[n++] = g;
  }

  /* Global gradient norm: sqrt of the sum of squares of every gradient element. */
  Value *total = NULL;
  for (int i = 0; i < n; i++) {
    Value *sq = build1(&b, OP_SQUARE, grads[i]->value, NULL);
    int64_t dims[IR_MAX_RANK];
    for (int d = 0; d < sq->type.rank; d++) dims[d] = d;
    Value *s = sq;
    if (sq->type.rank) {
      op_set_ints(m, build_begin(&b, OP_REDUCE_SUM, &sq, 1), "dims", dims, sq->type.rank);
      s = build_end(&b, NULL);
    }
    total = total ? build2(&b, OP_ADD, total, s, NULL) : s;
  }
  Value *norm = total ? build1(&b, OP_SQRT, total, "grad_norm") : constant(f, 0);
  Value *coef;
  if (ts->grad_clip > 0) {
    Value *den = norm;
    op_set_float(build_begin(&b, OP_ADD_SCALAR, &den, 1), "value", 1e-6);
    den = build_end(&b, NULL);
    coef = build2(&b, OP_MIN, build2(&b, OP_DIV, constant(f, ts->grad_clip), den, NULL), constant(f, 1.0), "clip_coef");
  } else {
    coef = constant(f, 1.0);
  }
  for (int i = 0; i < n; i++) {
    Global *p = params[i];
    Value *mom = state(m, ADAM_M_PREFIX, p)->value, *var = state(m, ADAM_V_PREFIX, p)->value;
    Value *ops[7] = {p->value, mom, var, grads[i]->value, coef, lr, step};
    Op *op = build_begin(&b, OP_ADAMW, ops, 7);
    op_set_float(op, "beta1", ts->beta1);
    op_set_float(op, "beta2", ts->beta2);
    op_set_float(op, "eps", ts->eps);
    /* Decay matrices, not vectors: by the rank PyTorch sees (the checkpoint shape). */
    int rank = p->hf_rank ? p->hf_rank : p->value->type.rank;
    op_set_float(op, "weight_decay", rank >= 2 ? ts->weight_decay : 0.0);
    build_end(&b, NULL);
    /* The new values go back to the parameter and its moments; the gradient is zeroed. */
    Value *dst[3] = {p->value, mom, var};
    for (int r = 0; r < 3; r++) {
      Value *pair[2] = {dst[r], op->results[r]};
      func_add_op(f, OP_ASSIGN, pair, 2, NULL);
    }
    Value *g = grads[i]->value;
    op_set_float(func_add_op(f, OP_FILL, &g, 1, NULL), "value", 0.0);
  }
  func_add_ret(f, norm);
  if (b.err[0]) {
    snprintf(err, errlen, "%s", b.err);
    return IR_ERUN;
  }
  return 0;
}

const Pass pass_optimizer = {"optimizer", "@optimizer_step: global grad norm, clipping, AdamW, zero $grad.*", run};
