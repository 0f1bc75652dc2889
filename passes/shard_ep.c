/* passes/shard_ep.c — the shard pass's rules for the mixture-of-experts ops on every mesh
 * axis, and the ep axis (expert parallelism).
 *
 * The MoE ops on a batch-like axis (dp, ep; tp's sequence-parallel rows alike): a rank routes
 * its own token rows.  topk, gather_last and the router's softmax keep the rows' split;
 * moe_sort gives this rank's positions among its own rows (a "local row" value: S(0), but
 * rows in the rank's sorted order, not a slice of the whole program's), moe_count this
 * rank's counts (P: the whole count is their sum; grouped matmuls read the rank's own
 * summand, which is what its rows need), moe_dispatch the rank's sorted rows.  Grouped
 * matmuls over local rows with local counts give local rows; their weight gradients are
 * partial sums (summed over the rows of every rank).  moe_combine and moe_weight_grad bring
 * local rows back to the rank's tokens (S(0) again).
 *
 * ep: the batch is split over dp x ep (token inputs S(0) on both; ep the outer split), dense
 * parameters are replicated and their gradients partial over ep (reduced with dp's), and a
 * stack of experts (a global `as experts`, [E,...]) is split along the experts, S(0): rank c
 * holds experts c*El .. (c+1)*El-1, El = E/ep, with their gradients and optimizer state.
 * A grouped matmul whose weights are split so meets the rows in "expert space": the rank's
 * sorted rows go to the ranks holding their experts (all_to_allv; the counts first, by an
 * all_to_all of moe_count's [E] vector, so every rank knows what it receives:
 * recv[i*El + e] rows of its expert e from rank i), the grouped matmul runs over the
 * received rows in (source rank, expert) groups (G = ep*El groups, expert g mod El), and
 * elementwise ops between grouped matmuls stay in expert space.  Before moe_combine or
 * moe_weight_grad the rows go back by the reverse all_to_allv.  Every conversion is made
 * once per value and reused (the backward's weight gradient finds the forward's).  An
 * expert-space value holds ep x the rank's local rows (the worst case: every rank sends it
 * all its rows); its shape is the whole program's on ep (placement R there) but its rows are
 * this rank's experts' — only the ops above may read it (checked).
 */
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

static bool rows(Place p) { return p.kind == SH_S && p.dim == 0; }

/* ---- the MoE ops on every axis ---- */

static EpSpace *space_of(Sharder *s, const Value *v);

bool shard_moe_rule(Sharder *s, const Op *op, const Place *in, const Type *gin, int axis, Decision *d) {
  (void)gin;
  int n = op->n_operands;
  if (axis == AX_EP && (op->kind == OP_MOE_COMBINE || op->kind == OP_MOE_WEIGHT_GRAD) && op->operands[0]->kind != VAL_GLOBAL &&
      space_of(s, s->map[op->operands[0]->id])) {   /* expert-space rows: shard_ep_emit brings them back */
    d->need[0] = in[0];
    for (int i = 1; i < n; i++) d->need[i] = S(0);
    d->give[0] = S(0);
    return true;
  }
  switch (op->kind) {
  case OP_TOPK:
  case OP_MOE_SORT: {
    Place t = rows(in[0]) ? S(0) : R;
    d->need[0] = d->give[0] = t;
    return true;
  }
  case OP_MOE_COUNT:
    d->need[0] = rows(in[0]) ? S(0) : R;
    d->give[0] = rows(in[0]) ? P : R;
    return true;
  case OP_GATHER_LAST:
  case OP_SCATTER_LAST:
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE:
  case OP_MOE_WEIGHT_GRAD: {
    /* row-wise: every operand's rows split alike; else linear in the float operands */
    bool any = false;
    for (int i = 0; i < n; i++) any |= rows(in[i]);
    if (any) {
      for (int i = 0; i < n; i++) d->need[i] = S(0);
      d->give[0] = S(0);
      return true;
    }
    int n_p = 0;
    for (int i = 0; i < n; i++) n_p += in[i].kind == SH_P;
    for (int i = 0; i < n; i++) d->need[i] = n_p == 1 && in[i].kind == SH_P ? P : R;
    d->give[0] = n_p == 1 ? P : R;
    return true;
  }
  case OP_GROUPED_MATMUL:
  case OP_GROUPED_MATMUL_WGRAD: {
    bool wg = op->kind == OP_GROUPED_MATMUL_WGRAD;
    Place x = in[0], b = in[1];
    if (axis == AX_EP && s->m->mesh.size[AX_EP] > 1) {   /* shard_ep_emit exchanges the rows */
      for (int i = 0; i < n; i++) d->need[i] = in[i];
      if (!wg) d->need[1] = S(0);
      d->give[0] = wg ? S(0) : R;
      return true;
    }
    if (rows(x) || (wg && rows(b))) {   /* local rows with the rank's own counts */
      d->need[0] = S(0);
      d->need[1] = wg ? S(0) : R;
      d->need[2] = P;
      d->give[0] = wg ? P : S(0);
      return true;
    }
    /* whole rows: linear in x (and in w) */
    bool px = x.kind == SH_P, pb = b.kind == SH_P && !px;
    d->need[0] = px ? P : R;
    d->need[1] = pb ? P : R;
    d->need[2] = R;
    d->give[0] = px || pb ? P : R;
    return true;
  }
  default: return false;
  }
}

/* ---- ep: placements ---- */

void shard_ep_plan_global(const Global *p, bool grad, Sharding *sh) {
  if (p->hf_experts) set_place(sh, AX_EP, S(0));
  else set_place(sh, AX_EP, grad ? P : R);
}

int shard_ep_plan_arg(Sharder *s, const Func *src, const Value *a, Sharding *sh) {
  const Module *m = s->m;
  if (a->type.rank >= 1 && !dtype_is_float(a->type.dtype)) {
    int64_t split = m->mesh.size[AX_EP] * m->mesh.size[AX_DP];
    if (a->type.dims[0] % split)
      return shard_fail(s, "shard: the batch of @%s's argument %%%s (%lld) does not split over dp x ep = %lld; make the "
                           "batch a multiple of %lld", src->name, a->name ? a->name : "?", (long long)a->type.dims[0],
                        (long long)split, (long long)split);
    set_place(sh, AX_EP, S(0));
  }
  return 0;
}

/* ---- ep: expert space ---- */

/* The attributes of an exchange over ep (all_to_all of the counts, all_to_allv of rows),
   for shard_local_op to copy. */
static Op ep_exchange(Sharder *s, OpKind k, int64_t rows) {
  Op like = {.kind = k};
  Attr *a = &like.attrs[op_attr_index(k, "axis")];
  a->kind = ATTR_STR, a->s = mesh_axis_names[AX_EP], a->set = true;
  op_set_int(&like, "n", s->m->mesh.size[AX_EP]);
  if (k == OP_ALL_TO_ALL) op_set_int(&like, "split", 0), op_set_int(&like, "concat", 0);
  if (k == OP_ALL_TO_ALLV) op_set_int(&like, "rows", rows);
  return like;
}

static EpSpace *space_of(Sharder *s, const Value *v) {
  for (int i = 0; i < s->n_ep_space; i++)
    if (s->ep_space[i].v == v) return &s->ep_space[i];
  return NULL;
}

static void mark(Sharder *s, Value *v, Value *cnt, Value *local, int64_t rows) {
  if (s->n_ep_space == s->cap_ep_space) {
    s->cap_ep_space = s->cap_ep_space ? 2 * s->cap_ep_space : 256;
    s->ep_space = realloc(s->ep_space, sizeof *s->ep_space * (size_t)s->cap_ep_space);
  }
  s->ep_space[s->n_ep_space++] = (EpSpace){v, cnt, local, rows};
}

/* What this rank receives per (source rank, own expert): the all_to_all of the counts. */
static Value *recv_counts(Sharder *s, Value *cnt) {
  for (int i = 0; i < s->n_ep_counts; i++)
    if (s->ep_counts[i].cnt == cnt) return s->ep_counts[i].rcnt;
  Type f = cnt->type;
  f.dtype = DT_F32;
  Op a2a = ep_exchange(s, OP_ALL_TO_ALL, 0);
  Value *x = shard_local_op(s, OP_CAST, &cnt, 1, &f, cnt->type.sh, NULL);
  x = shard_local_op(s, OP_ALL_TO_ALL, &x, 1, NULL, cnt->type.sh, &a2a);
  Value *r = shard_local_op(s, OP_CAST, &x, 1, &cnt->type, cnt->type.sh, NULL);
  if (s->n_ep_counts < (int)(sizeof s->ep_counts / sizeof s->ep_counts[0])) s->ep_counts[s->n_ep_counts++] = (EpCounts){cnt, r};
  return r;
}

/* The local rows x (sorted by expert, counted by cnt) in expert space. */
static Value *to_experts(Sharder *s, Value *x, Value *cnt) {
  EpSpace *e = space_of(s, x);
  if (e) return x;
  for (int i = 0; i < s->n_ep_space; i++)
    if (s->ep_space[i].local == x) return s->ep_space[i].v;
  Value *rc = recv_counts(s, cnt);
  /* the most rows that can arrive: every rank's rows (dropless), or with a capacity C per
     (rank, expert) at most C from each rank for each of this rank's experts: E x C */
  int64_t rows_out = x->type.dims[0] * s->m->mesh.size[AX_EP];
  int64_t cap = cnt->kind == VAL_RESULT && cnt->def->kind == OP_MOE_COUNT ? op_int(cnt->def, "capacity") : 0;
  if (cap > 0 && cap * cnt->type.dims[0] < rows_out) rows_out = cap * cnt->type.dims[0];
  Sharding sh = x->type.sh;
  set_place(&sh, AX_EP, R);
  Value *ops[3] = {x, cnt, rc};
  Op a2av = ep_exchange(s, OP_ALL_TO_ALLV, rows_out);
  Value *y = shard_local_op(s, OP_ALL_TO_ALLV, ops, 3, NULL, sh, &a2av);
  mark(s, y, cnt, x, x->type.dims[0]);
  return y;
}

/* An expert-space value back in the rank's local rows. */
static Value *to_local(Sharder *s, Value *y) {
  EpSpace *e = space_of(s, y);
  if (!e) return y;
  if (e->local) return e->local;
  Value *rc = recv_counts(s, e->cnt);
  int64_t rows_out = e->rows;
  Sharding sh = y->type.sh;
  set_place(&sh, AX_EP, S(0));
  Value *ops[3] = {y, rc, e->cnt};
  Op a2av = ep_exchange(s, OP_ALL_TO_ALLV, rows_out);
  Value *x = shard_local_op(s, OP_ALL_TO_ALLV, ops, 3, NULL, sh, &a2av);
  e->local = x;
  return x;
}

bool shard_ep_emit(Sharder *s, const Op *op, Value **ops, const Sharding *give) {
  Module *m = s->m;
  if (m->mesh.size[AX_EP] == 1) return false;
  Value *out = NULL;
  switch (op->kind) {
  case OP_GROUPED_MATMUL: {
    if (place_of(ops[1], AX_EP).kind != SH_S) return false;
    Value *cnt = space_of(s, ops[0]) ? space_of(s, ops[0])->cnt : ops[2];
    Value *x = to_experts(s, ops[0], cnt), *a[3] = {x, ops[1], recv_counts(s, cnt)};
    int64_t rows = space_of(s, x)->rows;
    Sharding sh = give[0];
    set_place(&sh, AX_EP, R);
    Op like = *op;   /* balanced routing brings the rank as many rows as it sends */
    op_set_int(&like, "routed", rows);
    out = shard_local_op(s, OP_GROUPED_MATMUL, a, 3, NULL, sh, &like);
    mark(s, out, cnt, NULL, rows);
    break;
  }
  case OP_GROUPED_MATMUL_WGRAD: {
    EpSpace *e0 = space_of(s, ops[0]), *e1 = space_of(s, ops[1]);
    if (!e0 && !e1) return false;
    Value *cnt = e0 ? e0->cnt : e1->cnt;
    Value *a[3] = {to_experts(s, ops[0], cnt), to_experts(s, ops[1], cnt), recv_counts(s, cnt)};
    int64_t el = op_int(op, "experts") / m->mesh.size[AX_EP];
    Sharding sh = give[0];
    set_place(&sh, AX_EP, S(0));
    Op like = *op;   /* the rank's experts; its own routed rows */
    op_set_int(&like, "experts", el);
    op_set_int(&like, "routed", (e0 ? e0 : e1)->rows);
    out = shard_local_op(s, OP_GROUPED_MATMUL_WGRAD, a, 3, NULL, sh, &like);
    break;
  }
  case OP_MOE_COMBINE:
  case OP_MOE_WEIGHT_GRAD: {
    if (!space_of(s, ops[0])) return false;
    Value *a[3] = {to_local(s, ops[0]), ops[1], ops[2]};
    out = shard_local_op(s, op->kind, a, 3, NULL, give[0], op);
    break;
  }
  default: return false;
  }
  out->name = op->results[0]->name;
  s->map[op->results[0]->id] = out;
  return true;
}

/* After an op is emitted: an elementwise op (or cast) of expert-space values is in expert
   space too; any other op may not read one (its rows are not what the op would think). */
void shard_ep_check(Sharder *s, const Op *op, Value **ops, Value *const *results) {
  EpSpace *e = NULL;
  for (int i = 0; i < op->n_operands && !e; i++) e = space_of(s, ops[i]);
  if (!e) return;
  if (op_info(op->kind)->cls == CLASS_ELEMENTWISE || op->kind == OP_CAST) {
    Value *cnt = e->cnt;
    int64_t rows = e->rows;
    for (int r = 0; r < op->n_results; r++) mark(s, results[r], cnt, NULL, rows);
    return;
  }
  char text[256];
  shard_fail(s, "shard (ep): %s reads rows of the experts this rank holds (an expert-parallel grouped matmul's), which "
                "only elementwise ops, grouped matmuls, moe_combine and moe_weight_grad may read\n  %s",
             op_info(op->kind)->name, op_to_string(op, text, sizeof text));
}
