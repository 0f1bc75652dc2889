/* passes/util.c — helpers shared by passes (uses, dead ops, a ring recv's send) and the
   training settings' defaults (here, not in pass_manager.c: the passes read them, and the
   pass manager calls the passes). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

const TrainSettings train_defaults = {.grad_accum = 1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                                      .grad_clip = 1.0, .bucket_mb = 25.0, .overlap = true};

static Value *resolve(Value **repl, Value *v) {
  while (v->kind == VAL_RESULT && repl[v->id]) v = repl[v->id];
  return v;
}

void replace_uses(Func *f, Value **repl) {
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) op->operands[k] = resolve(repl, op->operands[k]);
  }
  for (int i = 0; i < f->rets.n; i++) f->rets.items[i] = resolve(repl, f->rets.items[i]);
}

int remove_dead_ops(Func *f) {
  int n = func_number(f);
  bool *live = calloc((size_t)(n ? n : 1), 1);
  for (int i = 0; i < f->rets.n; i++) {
    Value *v = f->rets.items[i];
    if (v->kind != VAL_GLOBAL) live[v->id] = true;
  }
  /* Walk backwards: an op is kept if it has effects or any result is live. */
  bool *keep = calloc((size_t)(f->ops.n ? f->ops.n : 1), 1);
  for (int i = f->ops.n - 1; i >= 0; i--) {
    Op *op = f->ops.items[i];
    bool k = (op_info(op->kind)->flags & OPF_EFFECT) != 0;
    for (int r = 0; r < op->n_results && !k; r++) k = live[op->results[r]->id];
    keep[i] = k;
    if (k)
      for (int j = 0; j < op->n_operands; j++)
        if (op->operands[j]->kind != VAL_GLOBAL) live[op->operands[j]->id] = true;
  }
  int out = 0, removed = 0;
  for (int i = 0; i < f->ops.n; i++) {
    if (keep[i]) f->ops.items[out++] = f->ops.items[i];
    else removed++;
  }
  f->ops.n = out;
  free(live);
  free(keep);
  return removed;
}

int ring_send_of(const Func *f, int i) {
  const Op *r = f->ops.items[i];
  if (r->kind != OP_RECV || !op_bool(r, "rel")) return -1;
  /* the attributes by index, looked up once (the walk back may pass many sends) */
  int rel = op_attr_index(OP_SEND, "rel"), tag = op_attr_index(OP_SEND, "tag"), axis = op_attr_index(OP_SEND, "axis");
  int64_t want = op_int(r, "tag");
  const char *want_axis = op_attr(r, "axis")->s;
  for (int k = i - 1; k >= 0; k--) {
    const Op *o = f->ops.items[k];
    if (o->kind == OP_SEND && o->attrs[rel].i && o->attrs[tag].i == want && !strcmp(o->attrs[axis].s, want_axis)) return k;
  }
  return -1;
}
