/* passes/shard_tp.c — the shard pass's rules for the tp axis (tensor and sequence parallel).
 *
 * Tensor parallelism is Megatron-LM's: parameters are split by their Hugging Face names
 * (tp_dim_of: column-parallel, row-parallel and vocabulary-parallel layers), and the rules
 * that hold on every axis (shard.c) then carry the splits through the program: a
 * column-parallel matmul gives activations split on their features, a row-parallel one
 * partial sums.  What is tp's own:
 *   - the parameter plan, and gradients placed where they arrive (decided by the first
 *     accumulate: split beside a split weight, partial beside a replicated one);
 *   - sequence parallel: a partial activation is reduce-scattered along the sequence where
 *     it is reduced (Megatron-SP), so norms and residuals run on a slice of the tokens;
 *   - embedding_grad into a vocabulary-parallel table: each rank scatters into its rows;
 *   - the per-rank forms that are a different computation: cross-entropy over logits split
 *     along the vocabulary (never gathered) and attention whose KV heads are fewer than tp.
 */
#include <string.h>

#include "shard_internal.h"

/* Head counts from the first attention op (tp keeps whole heads per rank). */
void shard_tp_init(Sharder *s) {
  for (int i = 0; i < s->m->funcs.n && !s->heads; i++) {
    const Func *f = s->m->funcs.items[i];
    for (int k = 0; k < f->ops.n; k++) {
      const Op *op = f->ops.items[k];
      if (op->kind != OP_ATTENTION) continue;
      s->heads = op->operands[0]->type.dims[2];
      s->kv_heads = op->operands[1]->type.dims[2];
      break;
    }
  }
}

/* ---- the plan ---- */

/* Tensor parallelism (Megatron-LM): the dim of a parameter split over tp, by its Hugging
   Face name; -1 for replicated.  Column-parallel (split outputs): GPT-2 c_attn (whole heads
   of q, k, v: [D,3,D]) and c_fc, Llama q/k/v and gate/up; row-parallel (split inputs):
   c_proj, o_proj, down; vocabulary-parallel: the token embedding and the LM head.  Key and
   value projections stay whole when tp does not divide the KV heads (their heads are then
   sliced per rank at the attention). */
static int tp_dim_of(const Sharder *s, const Global *p) {
  static const struct { const char *suffix; int dim; } plan[] = {
    {".attn.c_attn.weight", -2}, {".attn.c_attn.bias", -2}, {".attn.c_proj.weight", 0}, {".mlp.c_fc.weight", 1},
    {".mlp.c_fc.bias", 0}, {".mlp.c_proj.weight", 0}, {"wte.weight", 0}, {".q_proj.weight", 0}, {".k_proj.weight", -3},
    {".v_proj.weight", -3}, {".o_proj.weight", 1}, {".gate_proj.weight", 0}, {".up_proj.weight", 0},
    {".down_proj.weight", 1}, {"embed_tokens.weight", 0}, {"lm_head.weight", 0},
    /* Qwen2's q/k/v biases: split as their projections' outputs */
    {".q_proj.bias", 0}, {".k_proj.bias", -3}, {".v_proj.bias", -3},
  };
  int64_t tp = s->m->mesh.size[AX_TP];
  size_t len = strlen(p->name);
  for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
    size_t sl = strlen(plan[i].suffix);
    if (len < sl || strcmp(p->name + len - sl, plan[i].suffix)) continue;
    int d = plan[i].dim;
    if (d == -2) d = p->value->type.rank - 1;          /* the last dim */
    if (d == -3) d = s->kv_heads % tp == 0 ? 0 : -1;   /* whole KV heads per rank, or replicated */
    return d;
  }
  return -1;
}

/* A parameter and its optimizer moments are split alike; its gradient is left undecided:
   placed where its value arrives (see decide_gradient in shard.c). */
int shard_tp_plan_global(Sharder *s, int gi, const Global *p, bool grad, Sharding *sh, Type *param) {
  const Module *m = s->m;
  int d = tp_dim_of(s, p);
  if (d >= 0 && p->value->type.dims[d] % m->mesh.size[AX_TP]) {
    snprintf(s->err, s->errlen, "shard: tp=%lld does not divide dim %d (%lld) of $%s; choose a tp that divides it",
             (long long)m->mesh.size[AX_TP], d, (long long)p->value->type.dims[d], p->name);
    return IR_EINPUT;
  }
  if (grad) s->undecided[gi] = true;   /* placed where its gradient arrives */
  else if (d >= 0) set_place(sh, AX_TP, S(d));
  if (d >= 0) set_place(&param->sh, AX_TP, S(d));
  return 0;
}

/* ---- the rules ---- */

/* Sequence parallel: a partial activation [B,T,...] is reduce-scattered along the
   sequence (Megatron-SP), not all-reduced. */
Place shard_tp_partial_target(const Sharder *s, const Op *op) {
  return s->sp && s->in_step && op->results[0]->type.rank >= 3 ? S(1) : R;
}

bool shard_tp_rule(const Sharder *s, const Op *op, const Place *in, const Type *gin, Decision *d) {
  int64_t n = s->m->mesh.size[AX_TP];
  if (op->kind == OP_RESHAPE && s->sp && in[0].kind == SH_S && in[0].dim == 1 && gin[0].rank >= 3) {
    /* A sequence-split activation flattened to rows, [B,T,...] -> [B*T,...] (a weight
       gradient's operand, autodiff.c): gathered first, whatever B.  With B > 1 the split
       cannot survive the merge (shard.c's reshape_dim); with B = 1 it could, as a split of
       the rows, and the weight gradient was then contracted split over the tokens: a
       partial sum of the whole weight's gradient on every rank (all_to_alls in the
       backward, the gradient all-reduced at the optimizer step and held whole), another
       and dearer program than a larger batch's, which loom plan's dp = 1 references
       (a batch of one and of two sequences) measured as a negative cost a sequence. */
    const Type *y = &op->results[0]->type;
    bool flat = y->rank == gin[0].rank - 1 && y->dims[0] == gin[0].dims[0] * gin[0].dims[1];
    for (int i = 1; flat && i < y->rank; i++) flat = y->dims[i] == gin[0].dims[i + 1];
    if (flat) {
      d->need[0] = d->give[0] = R;
      return true;
    }
  }
  if (op->kind == OP_EMBEDDING_GRAD) {   /* dy ids -> dtable */
    Place dy = in[0];
    int last = gin[0].rank - 1;
    if (op->results[0]->type.dims[0] % n == 0 && !(dy.kind == SH_S && dy.dim == last)) {
      /* the table is vocabulary-parallel; each rank scatters into its rows */
      d->need[0] = d->need[1] = R;
      d->give[0] = S(0);
      return true;
    }
  }
  return false;
}

/* ---- per-rank forms that are a different computation ---- */

static Value *reduce_last(Sharder *s, OpKind k, Value *x, Sharding sh) {
  int64_t last = x->type.rank - 1;
  Value *v = shard_local_op(s, k, &x, 1, NULL, sh, NULL);
  op_set_ints(s->m, v->def, "dims", &last, 1);
  Type t;
  char msg[256];
  infer_types(v->def, &t, msg, sizeof msg);
  t.sh = sh;
  v->type = t;
  return v;
}

/* A per-row value [...] broadcast over the last dim of `like` [...,V]: reshape to [...,1] first. */
static Value *bcast_to(Sharder *s, Value *x, const Value *like) {
  Type k = x->type;
  k.dims[k.rank++] = 1;
  x = shard_local_op(s, OP_RESHAPE, &x, 1, &k, x->type.sh, NULL);
  Type t = like->type;
  t.dtype = x->type.dtype;
  return shard_local_op(s, OP_BROADCAST, &x, 1, &t, like->type.sh, NULL);
}

/* Cross-entropy over logits whose vocabulary is split over `axis` (the LM head is
   vocabulary-parallel): the row max, the sum of exponentials and the target's logit are
   each all-reduced over [B,T] -- the [B,T,V] logits are never gathered (Megatron's
   vocabulary-parallel cross-entropy).  The gradient recomputes the same statistics:
   dlogits = dloss * (exp(z) / sum - onehot(target)), each rank for its columns. */
static void emit_vocab_ce(Sharder *s, const Op *op, Value **ops, int axis) {
  bool grad = op->kind == OP_CROSS_ENTROPY_GRAD;
  Value *L = ops[grad ? 1 : 0], *tg = ops[grad ? 2 : 1];
  DType dt = L->type.dtype;
  if (dt != DT_F32) {   /* the statistics in f32, as the fused op computes them */
    Type t = L->type;
    t.dtype = DT_F32;
    L = shard_local_op(s, OP_CAST, &L, 1, &t, L->type.sh, NULL);
  }
  Sharding rows = L->type.sh, partial;
  set_place(&rows, axis, R);
  partial = rows;
  set_place(&partial, axis, P);
  tg = shard_reshard(s, tg, &rows);
  Value *m = shard_collective(s, OP_ALL_REDUCE, reduce_last(s, OP_REDUCE_MAX, L, partial), axis, 0, 0, R, "max");
  Value *zz[2] = {L, bcast_to(s, m, L)};
  Value *z = shard_local_op(s, OP_SUB, zz, 2, NULL, L->type.sh, NULL);
  Value *e = shard_local_op(s, OP_EXP, &z, 1, NULL, L->type.sh, NULL);
  Value *sum = shard_collective(s, OP_ALL_REDUCE, reduce_last(s, OP_REDUCE_SUM, e, partial), axis, 0, 0, R, "sum");
  if (!grad) {
    Value *pick[2] = {z, tg};
    Value *t = shard_set_vocab_axis(shard_local_op(s, OP_TARGET_PICK, pick, 2, NULL, partial, NULL), axis);
    Value *tz = shard_collective(s, OP_ALL_REDUCE, t, axis, 0, 0, R, "sum");
    Value *lt[2] = {shard_local_op(s, OP_LOG, &sum, 1, NULL, rows, NULL), tz};
    s->map[op->results[0]->id] = shard_local_op(s, OP_SUB, lt, 2, NULL, rows, NULL);
    return;
  }
  Value *dloss = shard_reshard(s, ops[0], &rows);
  Value *ps[2] = {e, bcast_to(s, sum, L)};
  Value *p = shard_local_op(s, OP_DIV, ps, 2, NULL, L->type.sh, NULL);
  Type oh_t = L->type;
  Value *oh = shard_set_vocab_axis(shard_local_op(s, OP_ONEHOT, &tg, 1, &oh_t, L->type.sh, NULL), axis);
  Value *po[2] = {p, oh};
  Value *diff = shard_local_op(s, OP_SUB, po, 2, NULL, L->type.sh, NULL);
  Value *dg[2] = {diff, bcast_to(s, dloss, L)};
  Value *g = shard_local_op(s, OP_MUL, dg, 2, NULL, L->type.sh, NULL);
  if (dt != DT_F32) {
    Type t = g->type;
    t.dtype = dt;
    g = shard_local_op(s, OP_CAST, &g, 1, &t, g->type.sh, NULL);
  }
  s->map[op->results[0]->id] = g;
}

/* Attention with query heads split over `axis` but too few KV heads to split (tp > KV,
   tp a multiple of KV): every rank holds all KV heads and slices the one its query heads
   read; in the backward the gradient of that head goes back into a whole-size partial
   sum. */
static void emit_kv_replicated(Sharder *s, const Op *op, Value **ops, int axis, int64_t kv) {
  bool grad = op->kind == OP_ATTENTION_GRAD;
  int q = grad ? 1 : 0;
  Sharding whole_kv = ops[q]->type.sh;
  set_place(&whole_kv, axis, R);
  Value *args[4];
  for (int i = 0; i < op->n_operands; i++) args[i] = ops[i];
  for (int i = q + 1; i < q + 3; i++) {
    Value *x = shard_reshard(s, ops[i], &whole_kv);
    args[i] = shard_collective_parts(s, OP_SHARD_SLICE, x, axis, 2, 0, S(2), NULL, kv);
  }
  Type types[3];
  for (int r = 0; r < op->n_results; r++) types[r] = (grad ? args[r + 1] : args[0])->type;
  Op *c = op_new_n(s->m, op->kind, args, op->n_operands, types, op->n_results);
  memcpy(c->attrs, op->attrs, sizeof c->attrs);
  ptrvec_push(s->m->arena, &s->f->ops, c);
  for (int r = 0; r < op->n_results; r++) {
    c->results[r]->name = op->results[r]->name;
    s->map[op->results[r]->id] = c->results[r];
  }
  if (grad)
    for (int r = 1; r < 3; r++)
      s->map[op->results[r]->id] = shard_collective_parts(s, OP_SHARD_PAD, c->results[r], axis, 2, 0, P, NULL, kv);
}

/* Only tp's plan splits a vocabulary or heads, but like every rule these forms go by the
   placements, so they are taken on whichever axis holds such a split. */
bool shard_tp_rewrite(Sharder *s, const Op *op, Value **ops, const Type *gin, int axis) {
  int64_t n = s->m->mesh.size[axis];
  if (op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD) {
    const Value *L = ops[op->kind == OP_CROSS_ENTROPY ? 0 : 1];
    Place p = place_of(L, axis);
    if (p.kind == SH_S && p.dim == L->type.rank - 1) {
      emit_vocab_ce(s, op, ops, axis);
      return true;
    }
  }
  if (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD) {
    int q = op->kind == OP_ATTENTION ? 0 : 1;
    Place pq = place_of(ops[q], axis);
    int64_t kv = gin[q + 1].dims[2];
    if (pq.kind == SH_S && pq.dim == 2 && kv % n && n % kv == 0) {
      emit_kv_replicated(s, op, ops, axis, kv);
      return true;
    }
  }
  return false;
}
