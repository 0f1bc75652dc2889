/* ir/infer.c — the shape rule of every op: result dtype and shape from operands and
   attributes.  Shardings are not inferred here (verify.c checks them; the shard pass
   sets them).  Messages have no location: the caller adds the op and line. */
#include <stdarg.h>
#include <string.h>

#include "ir.h"

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return IR_EINPUT;
}

/* Type text for messages; each call takes the next of four buffers (function calls are
   sequenced, so several TS() in one call are fine). */
static const char *ts_rot(const Type *t, char (*bufs)[256], unsigned *i) {
  char *b = bufs[(*i)++ & 3];
  return type_str(t, b, 256);
}
#define TS(t) ts_rot((t), tsbuf, &tsi)

static bool is_int_dtype(DType d) { return d == DT_I32 || d == DT_I64 || d == DT_U16; }

int infer_types(const Op *op, Type *out, char *err, size_t errlen) {
  char tsbuf[4][256];
  unsigned tsi = 0;
  const OpInfo *info = op_info(op->kind);
  const Type *x = op->n_operands > 0 ? &op->operands[0]->type : NULL;
  Type r;
  memset(&r, 0, sizeof r);

  if (info->flags & OPF_FLOAT_ONLY)
    for (int i = 0; i < op->n_operands; i++) {
      const Type *t = &op->operands[i]->type;
      if (!dtype_is_float(t->dtype) && !(op->kind == OP_CROSS_ENTROPY && i == 1))
        return fail(err, errlen, "operand %d is %s, but %s needs a floating-point type", i, TS(t), info->name);
    }

  switch (info->cls) {
  case CLASS_ELEMENTWISE: {
    /* where(c, a, b): c is bool, a and b agree; the others: all operands agree. */
    int first = op->kind == OP_WHERE ? 1 : 0;
    if (op->kind == OP_WHERE) {
      const Type *a = &op->operands[1]->type;
      if (x->dtype != DT_BOOL || x->rank != a->rank || memcmp(x->dims, a->dims, sizeof(int64_t) * (size_t)x->rank))
        return fail(err, errlen, "where needs a bool condition shaped like its values: %s vs %s", TS(x), TS(a));
    }
    const Type *t0 = &op->operands[first]->type;
    for (int i = first + 1; i < op->n_operands; i++)
      if (!type_shape_eq(t0, &op->operands[i]->type))
        return fail(err, errlen, "operands %d and %d differ: %s vs %s (elementwise ops need equal types; broadcast or cast first)",
                    first, i, TS(t0), TS(&op->operands[i]->type));
    r = type_make(op->kind == OP_EQ || op->kind == OP_GE ? DT_BOOL : t0->dtype, t0->rank, t0->dims);
    out[0] = r;
    return 0;
  }
  case CLASS_REDUCTION: {
    const Attr *dims = &op->attrs[0];
    bool removed[IR_MAX_RANK] = {0};
    for (int i = 0; i < dims->n; i++) {
      int64_t d = dims->ints[i];
      if (d < 0 || d >= x->rank)
        return fail(err, errlen, "dims: %lld is out of range for %s", (long long)d, TS(x));
      if (i > 0 && d <= dims->ints[i - 1])
        return fail(err, errlen, "dims must be strictly increasing");
      removed[d] = true;
    }
    r.dtype = x->dtype;
    for (int d = 0; d < x->rank; d++)
      if (!removed[d]) r.dims[r.rank++] = x->dims[d];
    out[0] = r;
    return 0;
  }
  default: break;
  }

  switch (op->kind) {
  case OP_MATMUL: {
    const Type *a = x, *b = &op->operands[1]->type;
    bool ta = op_bool(op, "ta"), tb = op_bool(op, "tb");
    if (a->rank < 2 || b->rank < 2)
      return fail(err, errlen, "matmul needs rank >= 2 operands, got %s and %s", TS(a), TS(b));
    if (a->dtype != b->dtype)
      return fail(err, errlen, "matmul operands have different dtypes: %s and %s", TS(a), TS(b));
    int64_t m = a->dims[a->rank - (ta ? 1 : 2)], k = a->dims[a->rank - (ta ? 2 : 1)];
    int64_t kb = b->dims[b->rank - (tb ? 1 : 2)], n = b->dims[b->rank - (tb ? 2 : 1)];
    if (k != kb)
      return fail(err, errlen, "matmul contraction sizes differ: %lld (from %s%s) vs %lld (from %s%s)",
                  (long long)k, TS(a), ta ? ", transposed" : "", (long long)kb, TS(b), tb ? ", transposed" : "");
    if (b->rank > 2) {
      if (b->rank != a->rank)
        return fail(err, errlen, "matmul batch dims differ: %s vs %s", TS(a), TS(b));
      for (int d = 0; d < a->rank - 2; d++)
        if (a->dims[d] != b->dims[d]) return fail(err, errlen, "matmul batch dims differ: %s vs %s", TS(a), TS(b));
    }
    r = type_make(a->dtype, a->rank, a->dims);
    r.dims[r.rank - 2] = m;
    r.dims[r.rank - 1] = n;
    break;
  }
  case OP_EMBEDDING: {
    const Type *ids = &op->operands[1]->type;
    if (x->rank != 2 || !dtype_is_float(x->dtype))
      return fail(err, errlen, "embedding table must be a float [V,D] matrix, got %s", TS(x));
    if (!is_int_dtype(ids->dtype))
      return fail(err, errlen, "embedding ids must be integers, got %s", TS(ids));
    if (ids->rank + 1 > IR_MAX_RANK) return fail(err, errlen, "embedding ids have too many dims");
    r = type_make(x->dtype, ids->rank, ids->dims);
    r.dims[r.rank++] = x->dims[1];
    break;
  }
  case OP_RESHAPE:
    r = op->results[0]->type;
    if (r.dtype != x->dtype || type_numel(&r) != type_numel(x))
      return fail(err, errlen, "cannot reshape %s to %s: element counts or dtypes differ", TS(x), TS(&r));
    break;
  case OP_BROADCAST:
    r = op->results[0]->type;
    if (r.dtype != x->dtype || r.rank < x->rank)
      return fail(err, errlen, "cannot broadcast %s to %s", TS(x), TS(&r));
    for (int i = 0; i < x->rank; i++) {
      int64_t from = x->dims[x->rank - 1 - i], to = r.dims[r.rank - 1 - i];
      if (from != 1 && from != to)
        return fail(err, errlen, "cannot broadcast %s to %s: dim %d is %lld, not 1 or %lld", TS(x), TS(&r),
                    x->rank - 1 - i, (long long)from, (long long)to);
    }
    break;
  case OP_CAST:
    r = op->results[0]->type;
    if (r.rank != x->rank || memcmp(r.dims, x->dims, sizeof(int64_t) * (size_t)x->rank))
      return fail(err, errlen, "cast cannot change the shape: %s to %s", TS(x), TS(&r));
    break;
  case OP_TRANSPOSE: {
    const Attr *perm = &op->attrs[0];
    bool seen[IR_MAX_RANK] = {0};
    if (perm->n != x->rank) return fail(err, errlen, "perm has %d entries for %s", perm->n, TS(x));
    r.dtype = x->dtype;
    r.rank = x->rank;
    for (int i = 0; i < perm->n; i++) {
      int64_t p = perm->ints[i];
      if (p < 0 || p >= x->rank || seen[p]) return fail(err, errlen, "perm is not a permutation of 0..%d", x->rank - 1);
      seen[p] = true;
      r.dims[i] = x->dims[p];
    }
    break;
  }
  case OP_SLICE: {
    const Attr *st = &op->attrs[0], *en = &op->attrs[1];
    if (st->n != x->rank || en->n != x->rank)
      return fail(err, errlen, "start and end need %d entries each for %s", x->rank, TS(x));
    r.dtype = x->dtype;
    r.rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
      if (st->ints[d] < 0 || st->ints[d] > en->ints[d] || en->ints[d] > x->dims[d])
        return fail(err, errlen, "slice [%lld:%lld] is out of range for dim %d of %s", (long long)st->ints[d],
                    (long long)en->ints[d], d, TS(x));
      r.dims[d] = en->ints[d] - st->ints[d];
    }
    break;
  }
  case OP_PAD: {
    const Attr *lo = &op->attrs[0], *hi = &op->attrs[1];
    if (lo->n != x->rank || hi->n != x->rank)
      return fail(err, errlen, "low and high need %d entries each for %s", x->rank, TS(x));
    r = type_make(x->dtype, x->rank, x->dims);
    for (int d = 0; d < x->rank; d++) {
      if (lo->ints[d] < 0 || hi->ints[d] < 0) return fail(err, errlen, "pad amounts cannot be negative");
      r.dims[d] += lo->ints[d] + hi->ints[d];
    }
    break;
  }
  case OP_CONCAT: {
    int64_t dim = op_int(op, "dim");
    if (dim < 0 || dim >= x->rank) return fail(err, errlen, "dim %lld is out of range for %s", (long long)dim, TS(x));
    r = type_make(x->dtype, x->rank, x->dims);
    for (int i = 1; i < op->n_operands; i++) {
      const Type *t = &op->operands[i]->type;
      bool ok = t->dtype == x->dtype && t->rank == x->rank;
      for (int d = 0; ok && d < x->rank; d++)
        if (d != dim && t->dims[d] != x->dims[d]) ok = false;
      if (!ok) return fail(err, errlen, "operand %d (%s) does not match operand 0 (%s) outside dim %lld", i, TS(t), TS(x), (long long)dim);
      r.dims[dim] += t->dims[dim];
    }
    break;
  }
  case OP_CONSTANT:
    r = op->results[0]->type;
    break;
  case OP_IOTA:
    r = op->results[0]->type;
    if (op_int(op, "dim") < 0 || op_int(op, "dim") >= r.rank)
      return fail(err, errlen, "iota dim %lld is out of range for %s", (long long)op_int(op, "dim"), TS(&r));
    break;
  case OP_LAYERNORM:
  case OP_RMSNORM:
    if (x->rank < 1) return fail(err, errlen, "%s needs rank >= 1, got %s", info->name, TS(x));
    for (int i = 1; i < op->n_operands; i++) {
      const Type *w = &op->operands[i]->type;
      if (w->rank != 1 || w->dims[0] != x->dims[x->rank - 1])
        return fail(err, errlen, "%s operand %d must be [%lld] to match %s, got %s", info->name, i,
                    (long long)x->dims[x->rank - 1], TS(x), TS(w));
    }
    if (op_float(op, "eps") <= 0) return fail(err, errlen, "eps must be positive");
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  case OP_SOFTMAX:
    if (x->rank < 1) return fail(err, errlen, "softmax needs rank >= 1");
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  case OP_ATTENTION: {
    const Type *k = &op->operands[1]->type, *v = &op->operands[2]->type;
    if (x->rank != 4 || k->rank != 4 || v->rank != 4)
      return fail(err, errlen, "attention needs q[B,T,H,Dh], k and v [B,S,KV,Dh]; got %s, %s, %s", TS(x), TS(k), TS(v));
    if (!type_shape_eq(k, v)) return fail(err, errlen, "attention k and v differ: %s vs %s", TS(k), TS(v));
    if (k->dtype != x->dtype || k->dims[0] != x->dims[0] || k->dims[3] != x->dims[3])
      return fail(err, errlen, "attention q %s and k %s disagree in batch, head size or dtype", TS(x), TS(k));
    if (k->dims[2] < 1 || x->dims[2] % k->dims[2])
      return fail(err, errlen, "attention: %lld query heads is not a multiple of %lld kv heads", (long long)x->dims[2],
                  (long long)k->dims[2]);
    if (op_bool(op, "causal") && k->dims[1] != x->dims[1])
      return fail(err, errlen, "causal attention needs as many keys as queries: %s vs %s", TS(x), TS(k));
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  }
  case OP_ATTENTION_BLOCK:
  case OP_ATTENTION_BLOCK_GRAD: {
    bool grad = op->kind == OP_ATTENTION_BLOCK_GRAD;
    const Type *q = &op->operands[grad]->type, *k = &op->operands[grad + 1]->type, *v = &op->operands[grad + 2]->type;
    if (q->rank != 4 || k->rank != 4 || !type_shape_eq(k, v) || k->dims[0] != q->dims[0] || k->dims[3] != q->dims[3] ||
        k->dims[2] < 1 || q->dims[2] % k->dims[2])
      return fail(err, errlen, "%s needs q[B,Tq,H,Dh], k and v [B,Tk,KV,Dh] with H a multiple of KV; got %s, %s, %s",
                  op_info(op->kind)->name, TS(q), TS(k), TS(v));
    const char *ax = op_attr(op, "seq_axis")->s;
    int64_t n = op_int(op, "seq_n"), shift = op_int(op, "kv_shift");
    if (ax && ax[0] && mesh_axis_parse(ax) < 0)
      return fail(err, errlen, "seq_axis '%s' is not a mesh axis (dp, tp, cp, pp, ep)", ax);
    if (n < 1 || shift < -1 || shift >= n)
      return fail(err, errlen, "seq_n %lld and kv_shift %lld: need seq_n >= 1 and -1 <= kv_shift < seq_n", (long long)n,
                  (long long)shift);
    if (op_bool(op, "zigzag") && q->dims[1] % 2)
      return fail(err, errlen, "zigzag positions need an even number of rows per rank, got %s", TS(q));
    int64_t want = shift < 0 ? n * q->dims[1] : q->dims[1];
    if (k->dims[1] != want)
      return fail(err, errlen, "%s with kv_shift %lld needs %lld keys (the queries' %lld%s), got %s", op_info(op->kind)->name,
                  (long long)shift, (long long)want, (long long)q->dims[1], shift < 0 ? " times seq_n" : "", TS(k));
    int64_t lse_dims[3] = {q->dims[0], q->dims[1], q->dims[2]};
    if (!grad) {
      out[0] = type_make(DT_F32, 4, q->dims);
      out[1] = type_make(DT_F32, 3, lse_dims);
      return 0;
    }
    for (int i = 4; i < 6; i++) {
      const Type *t = &op->operands[i]->type;
      if (t->dtype != DT_F32 || t->rank != 3 || memcmp(t->dims, lse_dims, sizeof lse_dims))
        return fail(err, errlen, "attention_block_grad's lse and delta must be f32 [B,Tq,H] like q %s, got %s", TS(q), TS(t));
    }
    if (!type_shape_eq(x, q)) return fail(err, errlen, "dout %s is not shaped like q %s", TS(x), TS(q));
    out[0] = type_make(DT_F32, 4, q->dims);
    out[1] = type_make(DT_F32, 4, k->dims);
    out[2] = type_make(DT_F32, 4, k->dims);
    return 0;
  }
  case OP_ROPE_AT:
  case OP_ATTENTION_CACHED: {
    const Type *pos = &op->operands[op->n_operands - 1]->type;
    if (x->rank != 4 || !dtype_is_float(x->dtype) || (op->kind == OP_ROPE_AT && x->dims[3] % 2))
      return fail(err, errlen, "%s needs x[B,C,H,Dh] (float%s), got %s", op_info(op->kind)->name,
                  op->kind == OP_ROPE_AT ? ", an even Dh" : "", TS(x));
    if (!is_int_dtype(pos->dtype) || pos->rank != 2 || pos->dims[0] != x->dims[0] || pos->dims[1] != x->dims[1])
      return fail(err, errlen, "%s's positions must be integers [B,C] like x's first dims, got %s for %s",
                  op_info(op->kind)->name, TS(pos), TS(x));
    if (op->kind == OP_ATTENTION_CACHED) {
      const Type *k = &op->operands[1]->type, *v = &op->operands[2]->type;
      if (k->rank != 4 || !type_shape_eq(k, v) || k->dims[0] != x->dims[0] || k->dims[3] != x->dims[3] || k->dims[2] < 1 ||
          x->dims[2] % k->dims[2] || !dtype_is_float(k->dtype))
        return fail(err, errlen, "attention_cached needs q[B,C,H,Dh] and caches [B,Tmax,KV,Dh] with H a multiple of KV; "
                    "got %s, %s, %s", TS(x), TS(k), TS(v));
    }
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  }
  case OP_ROPE:
    if (x->rank != 4 || x->dims[3] % 2)
      return fail(err, errlen, "rope needs x[B,T,H,Dh] with an even Dh, got %s", TS(x));
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  case OP_CROSS_ENTROPY: {
    const Type *t = &op->operands[1]->type;
    if (!dtype_is_float(x->dtype) || x->rank < 1)
      return fail(err, errlen, "cross_entropy logits must be float [...,V], got %s", TS(x));
    if (!is_int_dtype(t->dtype) || t->rank != x->rank - 1 || memcmp(t->dims, x->dims, sizeof(int64_t) * (size_t)t->rank))
      return fail(err, errlen, "cross_entropy targets must be integers shaped like the logits without V: %s for %s", TS(t), TS(x));
    r = type_make(DT_F32, t->rank, t->dims);
    break;
  }
  case OP_TARGET_PICK: {
    const Type *t = &op->operands[1]->type;
    if (!dtype_is_float(x->dtype) || x->rank < 1 || !is_int_dtype(t->dtype) || t->rank != x->rank - 1 ||
        memcmp(t->dims, x->dims, sizeof(int64_t) * (size_t)t->rank))
      return fail(err, errlen, "target_pick needs x[...,V] and integer targets[...]: %s and %s", TS(x), TS(t));
    r = type_make(x->dtype, t->rank, t->dims);
    break;
  }
  case OP_ONEHOT:
    r = op->results[0]->type;
    if (!is_int_dtype(x->dtype) || r.rank != x->rank + 1 || memcmp(r.dims, x->dims, sizeof(int64_t) * (size_t)x->rank) ||
        !dtype_is_float(r.dtype))
      return fail(err, errlen, "onehot of %s must be declared float [...,V] with the same leading dims, got %s", TS(x), TS(&r));
    break;
  case OP_LAYERNORM_GRAD:
  case OP_RMSNORM_GRAD: {
    const Type *xx = &op->operands[1]->type, *w = &op->operands[2]->type;
    if (!type_shape_eq(x, xx)) return fail(err, errlen, "dy %s and x %s differ", TS(x), TS(xx));
    if (xx->rank < 1 || w->rank != 1 || w->dims[0] != xx->dims[xx->rank - 1])
      return fail(err, errlen, "w must be [%lld] to match %s, got %s", (long long)xx->dims[xx->rank - 1], TS(xx), TS(w));
    out[0] = type_make(xx->dtype, xx->rank, xx->dims);
    out[1] = type_make(w->dtype, 1, w->dims);
    if (op->kind == OP_LAYERNORM_GRAD) out[2] = out[1];
    return 0;
  }
  case OP_SOFTMAX_GRAD:
    if (!type_shape_eq(x, &op->operands[1]->type)) return fail(err, errlen, "dy and y differ: %s vs %s", TS(x), TS(&op->operands[1]->type));
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  case OP_ATTENTION_GRAD: {
    /* Same checks as the forward, on (q, k, v); dout is shaped like q. */
    Op fwd = *op;
    fwd.kind = OP_ATTENTION;
    fwd.n_operands = 3;
    fwd.operands = op->operands + 1;
    fwd.n_results = 1;
    Type o;
    if (infer_types(&fwd, &o, err, errlen)) return IR_EINPUT;
    if (!type_shape_eq(x, &o)) return fail(err, errlen, "dout %s is not shaped like the output %s", TS(x), TS(&o));
    for (int i = 0; i < 3; i++) {
      const Type *t = &op->operands[i + 1]->type;
      out[i] = type_make(t->dtype, t->rank, t->dims);
    }
    return 0;
  }
  case OP_CROSS_ENTROPY_GRAD: {
    Op fwd = *op;
    fwd.kind = OP_CROSS_ENTROPY;
    fwd.n_operands = 2;
    fwd.operands = op->operands + 1;
    fwd.n_results = 1;
    Type l;
    if (infer_types(&fwd, &l, err, errlen)) return IR_EINPUT;
    if (!type_shape_eq(x, &l)) return fail(err, errlen, "dloss %s is not shaped like the loss %s", TS(x), TS(&l));
    const Type *logits = &op->operands[1]->type;
    r = type_make(logits->dtype, logits->rank, logits->dims);
    break;
  }
  case OP_EMBEDDING_GRAD: {
    const Type *ids = &op->operands[1]->type;
    r = op->results[0]->type;
    if (!is_int_dtype(ids->dtype) || x->rank != ids->rank + 1 || memcmp(x->dims, ids->dims, sizeof(int64_t) * (size_t)ids->rank))
      return fail(err, errlen, "embedding_grad needs dy[...,D] and integer ids[...]: got %s and %s", TS(x), TS(ids));
    if (r.rank != 2 || r.dims[1] != x->dims[x->rank - 1] || r.dtype != x->dtype)
      return fail(err, errlen, "embedding_grad result must be [V,%lld] %s, declared %s", (long long)x->dims[x->rank - 1],
                  dtype_name(x->dtype), TS(&r));
    break;
  }
  case OP_ACCUMULATE:
  case OP_ASSIGN:
    if (!type_shape_eq(x, &op->operands[1]->type))
      return fail(err, errlen, "the value %s does not match the destination %s", TS(&op->operands[1]->type), TS(x));
    return 0;
  case OP_FILL:
    return 0;
  case OP_KV_WRITE: {
    const Type *v = &op->operands[1]->type, *pos = &op->operands[2]->type;
    if (x->rank != 4 || v->rank != 4 || v->dims[0] != x->dims[0] || v->dims[2] != x->dims[2] || v->dims[3] != x->dims[3] ||
        v->dims[1] > x->dims[1] || v->dtype != x->dtype)
      return fail(err, errlen, "kv_write needs a cache [B,Tmax,KV,Dh] and new rows [B,C,KV,Dh] of its dtype, got %s and %s",
                  TS(x), TS(v));
    if (!is_int_dtype(pos->dtype) || pos->rank != 2 || pos->dims[0] != v->dims[0] || pos->dims[1] != v->dims[1])
      return fail(err, errlen, "kv_write's positions must be integers [B,C], got %s for %s", TS(pos), TS(v));
    return 0;
  }
  case OP_ADAMW: {
    for (int i = 1; i < 4; i++) {
      const Type *t = &op->operands[i]->type;
      if (t->rank != x->rank || memcmp(t->dims, x->dims, sizeof(int64_t) * (size_t)x->rank))
        return fail(err, errlen, "operand %d %s is not shaped like the parameter %s", i, TS(t), TS(x));
    }
    if (op->operands[1]->type.dtype != DT_F32 || op->operands[2]->type.dtype != DT_F32)
      return fail(err, errlen, "optimizer moments must be f32");
    for (int i = 4; i < 7; i++) {
      const Type *t = &op->operands[i]->type;
      if (t->rank != 0 || t->dtype != DT_F32) return fail(err, errlen, "operand %d must be an f32 scalar, got %s", i, TS(t));
    }
    for (int r = 0; r < 3; r++) out[r] = type_make(op->operands[r]->type.dtype, x->rank, x->dims);
    return 0;
  }
  case OP_SEND:
  case OP_RECV: {
    int axis = mesh_axis_parse(op_attr(op, "axis")->s);
    if (axis < 0) return fail(err, errlen, "axis '%s' is not a mesh axis (dp, tp, cp, pp, ep)", op_attr(op, "axis")->s);
    int64_t n = op_int(op, "n"), peer = op_int(op, "peer");
    if (n < 2) return fail(err, errlen, "point-to-point needs an axis of 2 or more ranks (n=%lld)", (long long)n);
    if (op_bool(op, "rel") ? (peer < 1 || peer >= n) : (peer < 0 || peer >= n))
      return fail(err, errlen, "peer %lld is not a %s of %s=%lld", (long long)peer,
                  op_bool(op, "rel") ? "relative coordinate (1 .. n-1)" : "coordinate", mesh_axis_names[axis], (long long)n);
    if (op_int(op, "tag") < 0) return fail(err, errlen, "tag must be 0 or more");
    if (op->kind == OP_SEND) {
      if (!dtype_is_float(x->dtype)) return fail(err, errlen, "send moves float values, not %s", TS(x));
      return 0;
    }
    r = op->results[0]->type;
    if (!dtype_is_float(r.dtype)) return fail(err, errlen, "recv moves float values, not %s", TS(&r));
    break;
  }
  case OP_ALL_TO_ALLV: {
    const Type *sc = &op->operands[1]->type, *rc = &op->operands[2]->type;
    int64_t n = op_int(op, "n"), rows = op_int(op, "rows");
    if (mesh_axis_parse(op_attr(op, "axis")->s) < 0)
      return fail(err, errlen, "axis '%s' is not a mesh axis (dp, tp, cp, pp, ep)", op_attr(op, "axis")->s);
    if (x->rank != 2 || !dtype_is_float(x->dtype) || n < 1 || rows < 0 || sc->dtype != DT_I32 || sc->rank != 1 ||
        !type_shape_eq(sc, rc) || sc->dims[0] % n)
      return fail(err, errlen, "all_to_allv needs float rows x[S,D], i32 send and recv counts [n*El] and rows >= 0; got "
                  "%s, %s, %s", TS(x), TS(sc), TS(rc));
    int64_t d[2] = {rows, x->dims[1]};
    r = type_make(x->dtype, 2, d);
    break;
  }
  case OP_WAIT:   /* the started collective's result, once it is done */
    r = type_make(x->dtype, x->rank, x->dims);
    break;
  case OP_ALL_REDUCE_START:
  case OP_ALL_GATHER_START:
  case OP_REDUCE_SCATTER_START:
  case OP_ALL_TO_ALL_START:
  case OP_ALL_REDUCE:
  case OP_ALL_GATHER:
  case OP_REDUCE_SCATTER:
  case OP_ALL_TO_ALL:
  case OP_SHARD_SLICE:
  case OP_SHARD_PAD: {
    const OpKind ck = op_sync_of(op->kind);   /* a start has the shape rule of its collective */
    int64_t n = op_int(op, "n");
    if (mesh_axis_parse(op_attr(op, "axis")->s) < 0)
      return fail(err, errlen, "axis '%s' is not a mesh axis (dp, tp, cp, pp, ep)", op_attr(op, "axis")->s);
    if (n < 1) return fail(err, errlen, "n must be at least 1");
    r = type_make(x->dtype, x->rank, x->dims);
    if (ck == OP_ALL_REDUCE) {
      const char *red = op_attr(op, "reduce")->s;
      if (strcmp(red, "sum") && strcmp(red, "max")) return fail(err, errlen, "reduce must be sum or max, not '%s'", red);
      if (!dtype_is_float(x->dtype)) return fail(err, errlen, "all_reduce needs a float value, got %s", TS(x));
      break;
    }
    if (ck == OP_ALL_TO_ALL) {
      int64_t sd = op_int(op, "split"), cd = op_int(op, "concat");
      if (sd < 0 || sd >= x->rank || cd < 0 || cd >= x->rank) return fail(err, errlen, "split/concat dims out of range for %s", TS(x));
      if (x->dims[sd] % n) return fail(err, errlen, "dim %lld of %s does not split %lld ways", (long long)sd, TS(x), (long long)n);
      r.dims[sd] /= n;
      r.dims[cd] *= n;
      break;
    }
    int64_t d = op_int(op, "dim");
    if (d < 0 || d >= x->rank) return fail(err, errlen, "dim %lld is out of range for %s", (long long)d, TS(x));
    if (ck == OP_ALL_GATHER) r.dims[d] *= n;
    else if (ck == OP_REDUCE_SCATTER) {
      if (x->dims[d] % n) return fail(err, errlen, "dim %lld of %s does not split %lld ways", (long long)d, TS(x), (long long)n);
      r.dims[d] /= n;
    } else {
      int64_t parts = op_int(op, "parts");
      if (parts < 1 || n % parts) return fail(err, errlen, "parts (%lld) must divide n (%lld)", (long long)parts, (long long)n);
      if (op->kind == OP_SHARD_SLICE) {
        if (x->dims[d] % parts) return fail(err, errlen, "dim %lld of %s does not split in %lld parts", (long long)d, TS(x), (long long)parts);
        r.dims[d] /= parts;
      } else {
        r.dims[d] *= parts;
      }
    }
    break;
  }
  case OP_CALL: {
    const Func *c = op->callee;
    if (!c) return fail(err, errlen, "call has no callee");
    if (op->n_operands != c->args.n || op->n_results != c->rets.n)
      return fail(err, errlen, "@%s takes %d arguments and returns %d results; the call has %d and %d", c->name,
                  c->args.n, c->rets.n, op->n_operands, op->n_results);
    for (int i = 0; i < op->n_operands; i++) {
      const Type *want = &((const Value *)c->args.items[i])->type;
      if (!type_shape_eq(&op->operands[i]->type, want))
        return fail(err, errlen, "argument %d is %s, but @%s takes %s", i, TS(&op->operands[i]->type), c->name, TS(want));
    }
    for (int r = 0; r < op->n_results; r++) {
      const Type *t = &((const Value *)c->rets.items[r])->type;
      out[r] = type_make(t->dtype, t->rank, t->dims);
    }
    return 0;
  }
  /* ---- mixture of experts (ops.def) ---- */
  case OP_TOPK: {
    int64_t k = op_int(op, "k");
    if (x->rank < 1 || !dtype_is_float(x->dtype) || k < 1 || k > x->dims[x->rank - 1])
      return fail(err, errlen, "topk needs float x[...,E] and 1 <= k <= E, got k=%lld for %s", (long long)k, TS(x));
    r = type_make(DT_I32, x->rank, x->dims);
    r.dims[r.rank - 1] = k;
    break;
  }
  case OP_GATHER_LAST:
  case OP_SCATTER_LAST: {
    const Type *idx = &op->operands[1]->type;
    bool fwd = op->kind == OP_GATHER_LAST;
    const Type *big = fwd ? x : &op->results[0]->type, *small = fwd ? NULL : x;
    if (!is_int_dtype(idx->dtype) || idx->rank != big->rank || idx->rank < 1 ||
        memcmp(idx->dims, big->dims, sizeof(int64_t) * (size_t)(idx->rank - 1)) || !dtype_is_float(big->dtype))
      return fail(err, errlen, "%s needs x[...,E] (float) and integer idx[...,k] with the same leading dims: %s and %s",
                  info->name, TS(big), TS(idx));
    if (small && (small->rank != idx->rank || memcmp(small->dims, idx->dims, sizeof(int64_t) * (size_t)idx->rank)))
      return fail(err, errlen, "scatter_last's dy must be shaped like idx %s, got %s", TS(idx), TS(small));
    if (small && small->dtype != big->dtype)
      return fail(err, errlen, "scatter_last's dy %s and result %s differ in dtype", TS(small), TS(big));
    r = fwd ? type_make(x->dtype, idx->rank, idx->dims) : *big;
    break;
  }
  case OP_MOE_SORT:
  case OP_MOE_COUNT: {
    int64_t e = op_int(op, "experts"), cap = op_int(op, "capacity");
    if (!is_int_dtype(x->dtype) || x->rank != 2 || e < 1 || cap < 0)
      return fail(err, errlen, "%s needs integer idx[N,k], experts >= 1 and capacity >= 0; got %s, experts=%lld", info->name,
                  TS(x), (long long)e);
    int64_t n = op->kind == OP_MOE_SORT ? x->dims[0] * x->dims[1] : e;
    r = type_make(DT_I32, 1, &n);
    break;
  }
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE:
  case OP_MOE_WEIGHT_GRAD: {
    /* dispatch x[N,D] pos w; combine y[R,D] pos w; weight_grad y[R,D] x[N,D] pos */
    bool wg = op->kind == OP_MOE_WEIGHT_GRAD;
    const Type *pos = &op->operands[wg ? 2 : 1]->type, *w = wg ? NULL : &op->operands[2]->type;
    const Type *rows = op->kind == OP_MOE_DISPATCH ? NULL : x, *tok = op->kind == OP_MOE_DISPATCH ? x : wg ? &op->operands[1]->type : NULL;
    if (pos->dtype != DT_I32 || pos->rank != 1 || x->rank != 2)
      return fail(err, errlen, "%s needs 2-D rows and i32 positions pos[N*k]; got %s and %s", info->name, TS(x), TS(pos));
    int64_t N = tok ? tok->dims[0] : w->dims[0], k = w ? w->dims[1] : (N ? pos->dims[0] / N : 0);
    if ((w && (w->rank != 2 || w->dims[0] != N || !dtype_is_float(w->dtype))) || N < 1 || k < 1 || N * k != pos->dims[0] ||
        (tok && (tok->rank != 2 || tok->dtype != x->dtype)) || (rows && tok && rows->dims[1] != tok->dims[1]))
      return fail(err, errlen, "%s: the tokens [N,D], weights [N,k] and positions [N*k] disagree: %s, %s, %s", info->name,
                  TS(x), TS(pos), w ? TS(w) : TS(tok));
    if (op->kind == OP_MOE_DISPATCH) {
      int64_t R = op_int(op, "rows");
      if (R < N * k) return fail(err, errlen, "moe_dispatch needs rows >= N*k = %lld, got %lld", (long long)(N * k), (long long)R);
      int64_t d[2] = {R, x->dims[1]};
      r = type_make(x->dtype, 2, d);
    } else if (op->kind == OP_MOE_COMBINE) {
      if (x->dims[0] < N * k) return fail(err, errlen, "moe_combine needs at least N*k = %lld rows, got %s", (long long)(N * k), TS(x));
      int64_t d[2] = {N, x->dims[1]};
      r = type_make(x->dtype, 2, d);
    } else {
      if (x->dims[0] < N * k) return fail(err, errlen, "moe_weight_grad needs at least N*k = %lld rows, got %s", (long long)(N * k), TS(x));
      int64_t d[2] = {N, k};
      r = type_make(DT_F32, 2, d);   /* the routing weights' gradient: f32 like them */
    }
    break;
  }
  case OP_GROUPED_MATMUL:
  case OP_GROUPED_MATMUL_WGRAD: {
    const Type *b = &op->operands[1]->type, *cnt = &op->operands[2]->type;
    bool wgrad = op->kind == OP_GROUPED_MATMUL_WGRAD;
    if (x->rank != 2 || b->rank != (wgrad ? 2 : 3) || cnt->dtype != DT_I32 || cnt->rank != 1 || !dtype_is_float(x->dtype) ||
        b->dtype != x->dtype)
      return fail(err, errlen, "%s needs %s and i32 counts[G]; got %s, %s, %s", info->name,
                  wgrad ? "dy[R,N], x[R,K]" : "x[R,K], w[E,N,K] (same float dtype)", TS(x), TS(b), TS(cnt));
    if (wgrad) {
      int64_t e = op_int(op, "experts");
      if (b->dims[0] != x->dims[0] || e < 1 || cnt->dims[0] % e)
        return fail(err, errlen, "grouped_matmul_wgrad: dy %s and x %s need the same rows, and the %lld groups a multiple of "
                    "experts=%lld", TS(x), TS(b), (long long)cnt->dims[0], (long long)e);
      int64_t d[3] = {e, x->dims[1], b->dims[1]};
      r = type_make(x->dtype, 3, d);
    } else {
      bool tb = op_bool(op, "tb");
      int64_t K = tb ? b->dims[2] : b->dims[1], N = tb ? b->dims[1] : b->dims[2];
      if (K != x->dims[1] || cnt->dims[0] % b->dims[0])
        return fail(err, errlen, "grouped_matmul: x %s and w %s (tb=%d) disagree in K, or the %lld groups are not a multiple "
                    "of the %lld experts", TS(x), TS(b), tb, (long long)cnt->dims[0], (long long)b->dims[0]);
      int64_t d[2] = {x->dims[0], N};
      r = type_make(x->dtype, 2, d);
    }
    break;
  }
  default:
    return fail(err, errlen, "no shape rule for op %s", info->name);
  }
  memset(&r.sh, 0, sizeof r.sh);
  out[0] = r;
  return 0;
}

/* ---- builder ---- */

static Value *finish(Builder *b, Op *op, const char *name) {
  Type t[4];
  char msg[1024];
  if (infer_types(op, t, msg, sizeof msg)) {
    if (!b->err[0]) snprintf(b->err, sizeof b->err, "building %s: %s", op_info(op->kind)->name, msg);
    return op->results[0];
  }
  for (int i = 0; i < op->n_results; i++) {
    Sharding keep = op->results[i]->type.sh;
    op->results[i]->type = t[i];
    if (op_info(op->kind)->flags & OPF_TYPED) op->results[i]->type.sh = keep;
  }
  if (name) value_set_name(b->f->module, op->results[0], name);
  return op->results[0];
}

Value *build(Builder *b, OpKind k, Value **operands, int n, const char *name) {
  Type t[4];
  memset(t, 0, sizeof t);
  if (n > 0) t[0] = operands[0]->type;
  Op *op = func_add_op(b->f, k, operands, n, t);
  return finish(b, op, name);
}

Value *build1(Builder *b, OpKind k, Value *x, const char *name) { return build(b, k, &x, 1, name); }

Value *build2(Builder *b, OpKind k, Value *x, Value *y, const char *name) {
  Value *v[2] = {x, y};
  return build(b, k, v, 2, name);
}

Value *build_typed(Builder *b, OpKind k, Value *x, Type t, const char *name) {
  Op *op = func_add_op(b->f, k, &x, x ? 1 : 0, &t);
  return finish(b, op, name);
}

Op *build_begin(Builder *b, OpKind k, Value **operands, int n) {
  Type t[4];
  memset(t, 0, sizeof t);
  if (n > 0) t[0] = operands[0]->type;
  return func_add_op(b->f, k, operands, n, t);
}

Value *build_end(Builder *b, const char *name) {
  return finish(b, b->f->ops.items[b->f->ops.n - 1], name);
}
