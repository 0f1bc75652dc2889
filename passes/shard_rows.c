/* passes/shard_rows.c — merged rows: a flattened [B*T,...] whose T is split over tp (sequence
 * parallel) or cp.
 *
 * Flattening [B,T,...] -> [B*T,...] while T is split leaves each rank the rows (b, t) of its own
 * positions t of every sequence b: a split of the merged dim that is not contiguous (unless
 * B = 1).  Gathering first (what a split that is not a slice would need) costs an all_gather
 * and, worse, makes every rank compute on every row: a mixture of experts under sequence
 * parallelism ran each expert on the whole micro-batch on each tp rank (2x the FLOPs at tp=2).
 *
 * Instead the value stays split, placed S(0), and is marked here as "merged" on that axis, with
 * the B and T of its flattening.  Ops that treat rows independently keep the mark
 * (elementwise, matmul rows, softmax, the mixture of experts' routing and dispatch); a
 * contraction over the rows (a weight gradient, a sum over dim 0) gives partial sums, which is
 * right whatever order the rows are in, as long as both operands are in the same order; and
 * the reshape back to [B,T,...] is S(1) again.  Any other op first gets the merged value whole,
 * through the reshape back, the axis's own gather (cp's zigzag permutation included) and the
 * flattening; an operand such an op needs split alongside a merged one (a replicated value
 * meeting merged rows) is split the same way, through [B,T,...].  So every conversion in or out
 * of merged order goes through the [B,T,...] form, where the placements mean what they always
 * mean.
 *
 * Row values of the mixture of experts in a rank's own order (moe_sort's positions,
 * moe_dispatch's sorted rows: S(0) "local rows", shard_ep.c) are never converted: their
 * row count is not B*T.
 */
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

struct Merged {
  const Value *v;     /* per-rank value */
  uint8_t mask;       /* axes on which its rows are merged */
  int64_t outer, len; /* the flattening's B and T (global) */
  Value *origin;      /* the [B,T,...] per-rank value it was flattened from, or NULL */
  Value *whole[AX_COUNT];   /* its form gathered on an axis, once made */
  bool order;         /* moe_sort's positions of merged rows: not merged rows themselves, but
                         what moe_combine and moe_weight_grad give back is (in their order) */
  int next;
};

static bool axis_merges(const Sharder *s, int a) {
  return s->m->mesh.size[a] > 1 && ((a == AX_TP && s->sp) || a == AX_CP);
}

static unsigned bucket(const Value *v) { return (unsigned)(((uintptr_t)v >> 4) * 2654435761u) % 1024u; }

static Merged *find(const Sharder *s, const Value *v) {
  if (!s->rows) return NULL;
  for (int i = s->rows_bucket[bucket(v)]; i >= 0; i = s->rows[i].next)
    if (s->rows[i].v == v) return &s->rows[i];
  return NULL;
}

static Merged *add(Sharder *s, const Value *v, uint8_t mask, int64_t outer, int64_t len, Value *origin) {
  Merged *e = find(s, v);
  if (e) {
    e->mask |= mask;
    e->order = false;
    return e;
  }
  if (s->n_rows == s->cap_rows) {
    s->cap_rows = s->cap_rows ? 2 * s->cap_rows : 256;
    s->rows = realloc(s->rows, sizeof *s->rows * (size_t)s->cap_rows);
  }
  unsigned b = bucket(v);
  e = &s->rows[s->n_rows];
  *e = (Merged){.v = v, .mask = mask, .outer = outer, .len = len, .origin = origin, .next = s->rows_bucket[b]};
  s->rows_bucket[b] = s->n_rows++;
  return e;
}

void shard_rows_clear(Sharder *s) {
  s->n_rows = 0;
  for (int i = 0; i < 1024; i++) s->rows_bucket[i] = -1;
}

void shard_rows_free(Sharder *s) {
  free(s->rows);
  s->rows = NULL;
  s->n_rows = s->cap_rows = 0;
}

/* v's entry when it is merged rows (or, with order, positions of merged rows) on axis. */
static Merged *on(const Sharder *s, const Value *v, int axis, bool order) {
  Merged *e = v->kind == VAL_GLOBAL ? NULL : find(s, v);
  return e && (e->mask >> axis & 1) && (order || !e->order) ? e : NULL;
}

bool shard_rows_merged(const Sharder *s, const Value *v, int axis) { return on(s, v, axis, false) != NULL; }

/* [B,T,rest...] -> [B*T,rest...]: the reshape that merges dims 0 and 1. */
static bool merges_01(const Type *x, const Type *y) {
  if (x->rank < 2 || y->rank != x->rank - 1 || y->dims[0] != x->dims[0] * x->dims[1]) return false;
  for (int i = 1; i < y->rank; i++)
    if (y->dims[i] != x->dims[i + 1]) return false;
  return true;
}

/* [B*T,rest...] -> [B,T,rest...] for the merged value e. */
static bool splits_01(const Merged *e, const Type *x, const Type *y) {
  if (y->rank != x->rank + 1 || y->dims[0] != e->outer || y->dims[1] != e->len) return false;
  for (int i = 2; i < y->rank; i++)
    if (y->dims[i] != x->dims[i - 1]) return false;
  return true;
}

/* The ops that may read merged rows at operand i (their rows independent, or contracted). */
static bool takes_rows(const Op *op, int i, const Type *gin, const Type *y, const Merged *e) {
  const OpInfo *info = op_info(op->kind);
  if (info->cls == CLASS_ELEMENTWISE) return true;
  switch (op->kind) {
  case OP_CAST:
  case OP_SOFTMAX:   /* over the last dim */
  case OP_SOFTMAX_GRAD:
  case OP_TOPK:
  case OP_GATHER_LAST:
  case OP_SCATTER_LAST:
  case OP_MOE_SORT:
  case OP_MOE_COUNT:
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE:
  case OP_MOE_WEIGHT_GRAD:
  case OP_GROUPED_MATMUL:
  case OP_GROUPED_MATMUL_WGRAD:
  case OP_REDUCE_SUM:   /* over dim 0: partial sums (or a max, a mean), in any row order */
  case OP_REDUCE_MEAN:
  case OP_REDUCE_MAX: return true;
  case OP_MATMUL: {
    bool ta = op_bool(op, "ta"), tb = op_bool(op, "tb");
    if (gin[0].rank != 2 || gin[1].rank != 2) return false;
    if (i == 0) return !ta || !tb;   /* its rows (ta: the contracted dim, met by the other's rows) */
    return ta && !tb;                /* the other side of a contraction over rows */
  }
  case OP_RESHAPE: return y->dims[0] == gin[i].dims[0] || splits_01(e, &gin[i], y);   /* rows kept, or [B,T,...] */
  case OP_BROADCAST: return y->rank == gin[i].rank && y->dims[0] == gin[i].dims[0];    /* [N,1] -> [N,k] */
  default: return false;
  }
}

/* ---- conversions, through [B,T,...] ---- */

/* The per-rank reshape of v to the whole shape `whole` placed `sh`. */
static Value *reshape_to(Sharder *s, Value *v, const Type *whole, Sharding sh) {
  Type t = shard_local_type(s->m, *whole, &sh);
  return shard_local_op(s, OP_RESHAPE, &v, 1, &t, sh, NULL);
}

/* The [B,T,rest] type and placements of a [B*T,rest] value placed sh, merged on mask. */
static Sharding unflat(const Merged *e, const Type *g, Sharding sh, uint8_t mask, Type *out) {
  Type u = *g;
  u.rank = g->rank + 1;
  u.dims[0] = e->outer;
  u.dims[1] = e->len;
  for (int i = 1; i < g->rank; i++) u.dims[i + 1] = g->dims[i];
  Sharding r = sh;
  for (int a = 0; a < AX_COUNT; a++) {
    Place p = {sh.kind[a], sh.dim[a]};
    if (mask >> a & 1) set_place(&r, a, S(1));
    else if (p.kind == SH_S && p.dim > 0) set_place(&r, a, S(p.dim + 1));
  }
  *out = u;
  return r;
}

/* Flattens a [B,T,rest] value back; axes split on T stay merged. */
static Value *flat(Sharder *s, Value *u, const Merged *like, Value *origin) {
  Type g = shard_global_type(s->m, u), f = g;
  f.rank = g.rank - 1;
  f.dims[0] = g.dims[0] * g.dims[1];
  for (int i = 1; i < f.rank; i++) f.dims[i] = g.dims[i + 1];
  Sharding sh = u->type.sh;
  uint8_t mask = 0;
  for (int a = 0; a < AX_COUNT; a++) {
    Place p = place_of(u, a);
    if (p.kind == SH_S && p.dim == 1) set_place(&sh, a, S(0)), mask |= (uint8_t)(1 << a);
    else if (p.kind == SH_S && p.dim > 1) set_place(&sh, a, S(p.dim - 1));
  }
  Value *x = reshape_to(s, u, &f, sh);
  if (mask) add(s, x, mask, like->outer, like->len, origin);
  return x;
}

/* Merged value v whole on axis a (the other axes as they were). */
static Value *to_whole(Sharder *s, Value *v, int a) {
  Merged *e = find(s, v);
  if (e->whole[a]) return e->whole[a];
  Value *u = e->origin;
  if (!u) {
    Type g = shard_global_type(s->m, v), ut;
    Sharding sh = unflat(e, &g, v->type.sh, e->mask, &ut);
    u = reshape_to(s, v, &ut, sh);
  }
  Sharding want = u->type.sh;
  set_place(&want, a, R);
  Value *w = shard_reshard(s, u, &want);
  Value *x = flat(s, w, e, w);
  e = find(s, v);   /* flat may have grown the table */
  e->whole[a] = x;
  return x;
}

/* A [B*T,...] value not merged on a, in the merged order of `like` there. */
static Value *to_merged(Sharder *s, Value *v, int a, const Merged *like) {
  const Merged *m = find(s, v);
  uint8_t other = m && !m->order ? (uint8_t)(m->mask & ~(1 << a)) : 0;   /* merged on other axes already */
  Sharding want = v->type.sh;
  set_place(&want, a, R);
  v = shard_reshard(s, v, &want);
  Type g = shard_global_type(s->m, v), ut;
  Sharding sh = unflat(like, &g, v->type.sh, other, &ut);
  Value *u = reshape_to(s, v, &ut, sh);
  set_place(&sh, a, S(1));
  u = shard_reshard(s, u, &sh);
  return flat(s, u, like, u);
}

/* ---- the pass's hooks ---- */

/* Operand j of an op reading merged rows is split on axis a across them: along a dim that is
   not its rows (a column-parallel weight, features split), so the op cannot keep the rows split
   too.  Such an op reads the merged rows whole, as it did before they could stay split (a
   weight gradient stays split beside its split weight, not a partial sum of it). */
static bool crosses(const Sharder *s, const Op *op, Value *const *ops, int j, int a) {
  Place p = place_of(ops[j], a);
  if (p.kind != SH_S || shard_rows_merged(s, ops[j], a)) return false;
  if (op->kind == OP_MATMUL && j == 1) return !(op_bool(op, "ta") && !op_bool(op, "tb")) || p.dim != 0;
  return p.dim != 0;
}

void shard_rows_prepare(Sharder *s, const Op *op, Value **ops, Type *gin) {
  if (!s->n_rows) return;
  for (int i = op_n_writes(op->kind); i < op->n_operands; i++) {
    if (ops[i]->kind == VAL_GLOBAL) continue;
    Merged *e = find(s, ops[i]);
    if (!e || e->order) continue;
    bool takes = takes_rows(op, i, gin, &op->results[0]->type, e);
    for (int a = 0; a < AX_COUNT; a++) {
      if (!on(s, ops[i], a, false)) continue;
      bool keep = takes;
      for (int j = 0; j < op->n_operands && keep; j++)
        if (j != i && crosses(s, op, ops, j, a)) keep = false;
      if (!keep) ops[i] = to_whole(s, ops[i], a);
    }
    gin[i] = shard_global_type(s->m, ops[i]);
  }
}

bool shard_rows_rule(Sharder *s, const Op *op, const Place *in, const Type *gin, int axis, Decision *d) {
  if (op->kind != OP_RESHAPE || !axis_merges(s, axis)) return false;
  if (op->operands[0]->kind == VAL_GLOBAL) return false;
  const Type *y = &op->results[0]->type;
  Value *x = s->map[op->operands[0]->id];
  if (!x) return false;
  Merged *e = on(s, x, axis, false);
  if (e && in[0].kind == SH_S && in[0].dim == 0) {   /* (not gathered by shard_rows_prepare) */
    d->need[0] = in[0];
    d->give[0] = splits_01(e, &gin[0], y) ? S(1) : S(0);   /* back to [B,T,...], or the rows kept */
    return true;
  }
  if (in[0].kind == SH_S && in[0].dim == 1 && gin[0].dims[0] > 1 && merges_01(&gin[0], y)) {
    d->need[0] = in[0];
    d->give[0] = S(0);
    return true;
  }
  return false;
}

/* Before the operands move: an op reading merged rows gets the others in the same order. */
void shard_rows_convert(Sharder *s, const Op *op, Value **ops, const Sharding *need) {
  if (!s->n_rows) return;
  for (int a = 0; a < AX_COUNT; a++) {
    if (!axis_merges(s, a)) continue;
    const Merged *like = NULL;
    for (int i = op_n_writes(op->kind); i < op->n_operands && !like; i++)
      if (need[i].kind[a] == SH_S && need[i].dim[a] == 0) like = on(s, ops[i], a, true);
    Merged copy;
    if (like) copy = *like, like = &copy;
    for (int i = op_n_writes(op->kind); i < op->n_operands; i++) {
      if (ops[i]->kind == VAL_GLOBAL) continue;
      Place have = place_of(ops[i], a), want = {need[i].kind[a], need[i].dim[a]};
      if (shard_rows_merged(s, ops[i], a)) {
        if (want.kind == SH_R) ops[i] = to_whole(s, ops[i], a);
        else if (!(want.kind == SH_S && want.dim == 0)) {
          char text[256];
          shard_fail(s, "shard: %s: rows merged from [B,T,...] with T split over %s cannot be placed so here\n  %s",
                     op_info(op->kind)->name, mesh_axis_names[a], op_to_string(op, text, sizeof text));
          return;
        }
      } else if (like && want.kind == SH_S && want.dim == 0 && have.kind != SH_S && ops[i]->type.rank >= 1 &&
                 shard_global_type(s->m, ops[i]).dims[0] == like->outer * like->len) {
        ops[i] = to_merged(s, ops[i], a, like);
      }
    }
  }
}

/* After the op (results: its per-rank results as mapped): results placed S(0) beside merged
   operands with as many rows are merged; so is a flattening's result kept split. */
void shard_rows_mark(Sharder *s, const Op *op, Value **ops, Value *const *results) {
  if (!op->n_results) return;
  for (int a = 0; a < AX_COUNT; a++) {
    if (!axis_merges(s, a)) continue;
    if (op->kind == OP_RESHAPE && place_of(ops[0], a).kind == SH_S && place_of(ops[0], a).dim == 1 &&
        place_of(results[0], a).kind == SH_S && place_of(results[0], a).dim == 0) {
      Type g = shard_global_type(s->m, ops[0]), y = shard_global_type(s->m, results[0]);
      if (g.dims[0] > 1 && merges_01(&g, &y)) add(s, results[0], (uint8_t)(1 << a), g.dims[0], g.dims[1], ops[0]);
      continue;
    }
    const Merged *like = NULL;
    for (int i = 0; i < op->n_operands && !like; i++) like = on(s, ops[i], a, true);
    if (!like) continue;
    Merged copy = *like;
    if (op->kind == OP_MOE_SORT && !copy.order) {   /* positions of the merged rows it sorts */
      if (place_of(results[0], a).kind == SH_S) add(s, results[0], (uint8_t)(1 << a), copy.outer, copy.len, NULL)->order = true;
      continue;
    }
    for (int r = 0; r < op->n_results; r++) {
      Place p = place_of(results[r], a);
      if (p.kind != SH_S || p.dim != 0 || results[r]->type.rank < 1) continue;
      if (shard_global_type(s->m, results[r]).dims[0] != copy.outer * copy.len) continue;
      add(s, results[r], (uint8_t)(1 << a), copy.outer, copy.len, NULL);
    }
  }
}

/* After a function: the flattenings nobody read (every reader took the value whole) go. */
void shard_rows_sweep(Sharder *s, Func *f) {
  if (!s->n_rows) return;
  int nv = func_number(f);
  int *uses = calloc((size_t)nv + 1, sizeof *uses);
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int j = 0; j < op->n_operands; j++)
      if (op->operands[j]->kind != VAL_GLOBAL) uses[op->operands[j]->id]++;
  }
  for (int k = 0; k < f->rets.n; k++) uses[((Value *)f->rets.items[k])->id]++;
  int n = 0;
  for (int i = f->ops.n - 1; i >= 0; i--) {   /* from the end: a dead flattening may free its operand's */
    Op *op = f->ops.items[i];
    if (op->kind == OP_RESHAPE && !uses[op->results[0]->id] && find(s, op->results[0])) {
      if (op->operands[0]->kind != VAL_GLOBAL) uses[op->operands[0]->id]--;
      f->ops.items[i] = NULL;
      n++;
    }
  }
  if (n) {
    int w = 0;
    for (int i = 0; i < f->ops.n; i++)
      if (f->ops.items[i]) f->ops.items[w++] = f->ops.items[i];
    f->ops.n = w;
  }
  free(uses);
}

/* A merged value moved on other axes (a partial sum reduced over tp, say) keeps its rows'
   order where it stays split. */
void shard_rows_follow(Sharder *s, const Value *from, Value *to) {
  if (from == to || from->kind == VAL_GLOBAL) return;
  Merged *e = find(s, from);
  if (!e || e->order) return;
  Merged copy = *e;
  uint8_t mask = 0;
  for (int a = 0; a < AX_COUNT; a++)
    if ((copy.mask >> a & 1) && place_of(to, a).kind == SH_S && place_of(to, a).dim == 0) mask |= (uint8_t)(1 << a);
  if (mask) add(s, to, mask, copy.outer, copy.len, NULL);
}
