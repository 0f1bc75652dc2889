/* passes/shard_emit.c — what the shard pass and each axis's rules (shard_*.c) share to build
 * per-rank code: per-rank and whole types, failing with a message, the collectives that move a
 * value between placements (shard_reshard), a per-rank op.  Split from shard.c so that the axis
 * files call down into this one and never back into the pass that calls them. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

/* Per-rank dims of a global type under a sharding. */
Type shard_local_type(const Module *m, Type global, const Sharding *sh) {
  Type t = global;
  t.sh = *sh;
  for (int a = 0; a < AX_COUNT; a++)
    if (sh->kind[a] == SH_S) t.dims[sh->dim[a]] /= m->mesh.size[a];
  return t;
}

/* The global dims of a per-rank value. */
Type shard_global_type(const Module *m, const Value *v) {
  Type t = v->type;
  for (int a = 0; a < AX_COUNT; a++)
    if (t.sh.kind[a] == SH_S) t.dims[t.sh.dim[a]] *= m->mesh.size[a];
  memset(&t.sh, 0, sizeof t.sh);
  return t;
}

int shard_fail(Sharder *s, const char *fmt, ...) {
  if (!s->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, s->errlen, fmt, ap);
    va_end(ap);
  }
  s->failed = 1;
  return IR_EINPUT;
}

/* ---- collectives ---- */

Value *shard_collective_parts(Sharder *s, OpKind k, Value *x, int axis, int64_t dim, int64_t dim2, Place result,
                              const char *reduce, int64_t parts) {
  Op *op = op_new(s->m, k, &x, 1, &x->type);
  op->attrs[0] = (Attr){.kind = ATTR_STR, .s = mesh_axis_names[axis], .set = true};
  op_set_int(op, "n", s->m->mesh.size[axis]);
  if (k == OP_ALL_REDUCE) {
    Attr *a = &op->attrs[op_attr_index(k, "reduce")];
    a->s = reduce ? reduce : "sum";
    a->set = true;
  } else if (k == OP_ALL_TO_ALL) {
    op_set_int(op, "split", dim);
    op_set_int(op, "concat", dim2);
  } else {
    op_set_int(op, "dim", dim);
    if (k == OP_SHARD_SLICE || k == OP_SHARD_PAD) op_set_int(op, "parts", parts);
  }
  Type t;
  char msg[512];
  if (infer_types(op, &t, msg, sizeof msg)) {
    shard_fail(s, "shard: cannot build %s: %s", op_info(k)->name, msg);
    return x;
  }
  t.sh = x->type.sh;
  set_place(&t.sh, axis, result);
  op->results[0]->type = t;
  op->results[0]->name = x->name;
  ptrvec_push(s->m->arena, &s->f->ops, op);
  return op->results[0];
}

Value *shard_collective(Sharder *s, OpKind k, Value *x, int axis, int64_t dim, int64_t dim2, Place result,
                        const char *reduce) {
  return shard_collective_parts(s, k, x, axis, dim, dim2, result, reduce, s->m->mesh.size[axis]);
}

/* Moves v to placement `want` on one axis. */
static Value *reshard_axis(Sharder *s, Value *v, int axis, Place want) {
  Place have = place_of(v, axis);
  if (place_eq(have, want)) return v;
  if (axis == AX_CP) {   /* a zigzag split moves through its permutation */
    Value *z = s->cp_reshard ? s->cp_reshard(s, v, have, want) : NULL;
    if (z) return z;
  }
  if (have.kind == SH_P) {
    if (want.kind == SH_R) return shard_collective(s, OP_ALL_REDUCE, v, axis, 0, 0, R, "sum");
    if (want.kind == SH_S) return shard_collective(s, OP_REDUCE_SCATTER, v, axis, want.dim, 0, want, NULL);
  }
  if (have.kind == SH_S) {
    if (want.kind == SH_R) return shard_collective(s, OP_ALL_GATHER, v, axis, have.dim, 0, R, NULL);
    if (want.kind == SH_S) return shard_collective(s, OP_ALL_TO_ALL, v, axis, want.dim, have.dim, want, NULL);
  }
  if (have.kind == SH_R && want.kind == SH_S)
    return shard_collective(s, OP_SHARD_SLICE, v, axis, want.dim, 0, want, NULL);
  shard_fail(s, "shard: no way to move a value from %s to partial over %s", have.kind == SH_R ? "replicated" : "split",
             mesh_axis_names[axis]);
  return v;
}

/* Whether v is a parameter ZeRO-3 splits over dp (shard_dp.c's placements): shard_reshard
   does not cache its gathers. */
bool shard_dp_zero3_param(const Sharder *s, const Value *v) {
  return s->zero >= 3 && v->kind == VAL_GLOBAL && v->global->kind == GLOBAL_PARAM && s->zero_dim[v->global->index] >= 0;
}

static int cache_bucket_of(const Value *v) { return (int)(((uintptr_t)v >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 54) & 1023; }

Value *shard_cache_find(const Sharder *s, const Value *from, const Sharding *want) {
  for (int i = s->cache_bucket[cache_bucket_of(from)]; i >= 0; i = s->cache[i].next)
    if (s->cache[i].from == from && sharding_eq(&s->cache[i].want, want)) return s->cache[i].to;
  return NULL;
}

void shard_cache_add(Sharder *s, Value *from, Value *to, const Sharding *want) {
  if (s->n_cache == s->cap_cache) {
    s->cap_cache = s->cap_cache ? s->cap_cache * 2 : 256;
    s->cache = realloc(s->cache, sizeof *s->cache * (size_t)s->cap_cache);
  }
  int b = cache_bucket_of(from);
  s->cache[s->n_cache].from = from;
  s->cache[s->n_cache].to = to;
  s->cache[s->n_cache].want = *want;
  s->cache[s->n_cache].next = s->cache_bucket[b];
  s->cache_bucket[b] = s->n_cache++;
}

void shard_cache_clear(Sharder *s) {
  s->n_cache = 0;
  memset(s->cache_bucket, 0xff, sizeof s->cache_bucket);   /* -1: empty */
}

void shard_cache_forget(Sharder *s, const Value *g) {
  for (int *at = &s->cache_bucket[cache_bucket_of(g)]; *at >= 0;)
    if (s->cache[*at].from == g) *at = s->cache[*at].next;   /* unlinked (its slot is not reused) */
    else at = &s->cache[*at].next;
}

Value *shard_reshard(Sharder *s, Value *v, const Sharding *want) {
  if (sharding_eq(&v->type.sh, want)) return v;
  bool cacheable = !shard_dp_zero3_param(s, v);
  Value *hit = cacheable ? shard_cache_find(s, v, want) : NULL;
  if (hit) return hit;
  Value *x = v;
  /* Reduce partial sums first, then gather, then split: the fewest bytes in flight.  When
     several axes split one dim, a larger axis index is the outer split (tp outside dp:
     ZeRO splits the tp-local piece), so gathers go by rising index and splits by falling. */
  for (int pass = 0; pass < 3; pass++)
    for (int i = 0; i < AX_COUNT; i++) {
      int a = pass == 2 ? AX_COUNT - 1 - i : i;
      Place have = place_of(x, a), w = {want->kind[a], want->dim[a]};
      if (place_eq(have, w)) continue;
      if ((pass == 0 && have.kind == SH_P) || (pass == 1 && have.kind == SH_S) || (pass == 2 && have.kind == SH_R))
        x = reshard_axis(s, x, a, w);
    }
  if (cacheable) shard_cache_add(s, v, x, want);
  return x;
}

/* ---- building per-rank ops (the axes' rewrites use these too) ---- */

/* An op on per-rank values with result placements `sh`; attributes copied from `like`. */
Value *shard_local_op(Sharder *s, OpKind k, Value **ops, int n, const Type *declared, Sharding sh, const Op *like) {
  Type t = declared ? *declared : ops[0]->type;
  Op *op = op_new(s->m, k, ops, n, &t);
  if (like) memcpy(op->attrs, like->attrs, sizeof op->attrs);
  if (!(op_info(k)->flags & OPF_TYPED)) {
    char msg[512];
    if (infer_types(op, &t, msg, sizeof msg)) {
      shard_fail(s, "shard: %s: %s", op_info(k)->name, msg);
      return ops[0];
    }
  }
  t.sh = sh;
  op->results[0]->type = t;
  ptrvec_push(s->m->arena, &s->f->ops, op);
  return op->results[0];
}

Value *shard_set_vocab_axis(Value *v, int axis) {
  Attr *a = &v->def->attrs[op_attr_index(v->def->kind, "vocab_axis")];
  a->s = mesh_axis_names[axis];
  a->set = true;
  return v;
}
