/* passes/shard.c — pass "shard": turns the global training program into the program of
 * one rank of the device mesh (SPMD: every rank runs it, on its own piece of the data).
 *
 * Placements.  On each mesh axis a value is replicated (R), split along a dim (S(d)), or
 * partial (P: each rank holds a summand).  The plan fixes the placements of the inputs and
 * globals (see plan_globals): tokens S(0) over dp; parameters R over dp; gradient
 * accumulators P over dp (reduced once per optimizer step); with ZeRO-1 the optimizer
 * moments are S(d) over dp, with ZeRO-2 the gradients too, with ZeRO-3 the parameters.
 *
 * Rules.  Walking each function in order, every op's sharding rule (rule(), one case per
 * op, next to its derivative rule in spirit: both say how the op treats its operands)
 * gives the placements it needs for its operands and the placements of its results.
 * Where an operand sits differently, reshard() inserts the collective:
 *     P -> R all_reduce      P -> S(d) reduce_scatter     S(d) -> R all_gather
 *     S(d) -> S(e) all_to_all      R -> S(d) shard_slice (no communication)
 * Then the op is emitted with per-rank shapes.  Results of a function are made R.
 *
 * This version plans the dp axis (data parallel, ZeRO 0-3); a mesh with other axes larger
 * than 1 is refused with a clear message.  docs/sharding.md lists every op's rule.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
  int8_t kind;   /* SH_R, SH_S, SH_P */
  int8_t dim;
} Place;

typedef struct {
  Module *m;
  Func *f;             /* the function being built (per-rank) */
  Value **map;         /* source value id -> per-rank value */
  int zero;
  bool sp;             /* sequence parallel over tp */
  bool in_step;        /* building @grad_step or @forward (activations flow there) */
  int *zero_dim;       /* per global index: the dim ZeRO splits over dp, or -1 */
  bool *undecided;     /* per global index: a gradient whose placement off dp the first accumulate decides */
  int64_t heads, kv_heads;   /* of the model's attention (0: none) */
  /* reshard cache: (value, placement on an axis) -> converted value; cleared when the
     global it reads is written, never kept for ZeRO-3 parameters (re-gathered at each use) */
  struct { Value *from, *to; Sharding want; } *cache;
  int n_cache, cap_cache;
  char *err;
  size_t errlen;
  int failed;
} Sharder;

static Place place_of(const Value *v, int axis) {
  Place p = {v->type.sh.kind[axis], v->type.sh.dim[axis]};
  return p;
}

static void set_place(Sharding *s, int axis, Place p) {
  s->kind[axis] = p.kind;
  s->dim[axis] = p.kind == SH_S ? p.dim : 0;
}

static bool place_eq(Place a, Place b) { return a.kind == b.kind && (a.kind != SH_S || a.dim == b.dim); }

static const Place R = {SH_R, 0}, P = {SH_P, 0};   /* replicated; partial sums */
static Place S(int d) { return (Place){SH_S, (int8_t)d}; }

/* Per-rank dims of a global type under a sharding. */
static Type local_type(const Module *m, Type global, const Sharding *sh) {
  Type t = global;
  t.sh = *sh;
  for (int a = 0; a < AX_COUNT; a++)
    if (sh->kind[a] == SH_S) t.dims[sh->dim[a]] /= m->mesh.size[a];
  return t;
}

/* The global dims of a per-rank value. */
static Type global_type(const Module *m, const Value *v) {
  Type t = v->type;
  for (int a = 0; a < AX_COUNT; a++)
    if (t.sh.kind[a] == SH_S) t.dims[t.sh.dim[a]] *= m->mesh.size[a];
  memset(&t.sh, 0, sizeof t.sh);
  return t;
}

static int fail(Sharder *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Sharder *s, const char *fmt, ...) {
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

static Value *collective_parts(Sharder *s, OpKind k, Value *x, int axis, int64_t dim, int64_t dim2, Place result,
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
    fail(s, "shard: cannot build %s: %s", op_info(k)->name, msg);
    return x;
  }
  t.sh = x->type.sh;
  set_place(&t.sh, axis, result);
  op->results[0]->type = t;
  op->results[0]->name = x->name;
  ptrvec_push(s->m->arena, &s->f->ops, op);
  return op->results[0];
}

static Value *collective(Sharder *s, OpKind k, Value *x, int axis, int64_t dim, int64_t dim2, Place result,
                         const char *reduce) {
  return collective_parts(s, k, x, axis, dim, dim2, result, reduce, s->m->mesh.size[axis]);
}

/* Moves v to placement `want` on one axis. */
static Value *reshard_axis(Sharder *s, Value *v, int axis, Place want) {
  Place have = place_of(v, axis);
  if (place_eq(have, want)) return v;
  if (have.kind == SH_P) {
    if (want.kind == SH_R) return collective(s, OP_ALL_REDUCE, v, axis, 0, 0, R, "sum");
    if (want.kind == SH_S) return collective(s, OP_REDUCE_SCATTER, v, axis, want.dim, 0, want, NULL);
  }
  if (have.kind == SH_S) {
    if (want.kind == SH_R) return collective(s, OP_ALL_GATHER, v, axis, have.dim, 0, R, NULL);
    if (want.kind == SH_S) return collective(s, OP_ALL_TO_ALL, v, axis, want.dim, have.dim, want, NULL);
  }
  if (have.kind == SH_R && want.kind == SH_S) return collective(s, OP_SHARD_SLICE, v, axis, want.dim, 0, want, NULL);
  fail(s, "shard: no way to move a value from %s to partial over %s", have.kind == SH_R ? "replicated" : "split",
       mesh_axis_names[axis]);
  return v;
}

static bool is_zero3_param(Sharder *s, const Value *v) {
  return s->zero >= 3 && v->kind == VAL_GLOBAL && v->global->kind == GLOBAL_PARAM && s->zero_dim[v->global->index] >= 0;
}

static Value *reshard(Sharder *s, Value *v, const Sharding *want) {
  if (sharding_eq(&v->type.sh, want)) return v;
  bool cacheable = !is_zero3_param(s, v);
  for (int i = 0; cacheable && i < s->n_cache; i++)
    if (s->cache[i].from == v && sharding_eq(&s->cache[i].want, want)) return s->cache[i].to;
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
  if (cacheable) {
    if (s->n_cache == s->cap_cache) {
      s->cap_cache = s->cap_cache ? s->cap_cache * 2 : 256;
      s->cache = realloc(s->cache, sizeof *s->cache * (size_t)s->cap_cache);
    }
    s->cache[s->n_cache].from = v;
    s->cache[s->n_cache].to = x;
    s->cache[s->n_cache++].want = *want;
  }
  return x;
}

static void cache_forget_global(Sharder *s, const Value *g) {
  int out = 0;
  for (int i = 0; i < s->n_cache; i++)
    if (s->cache[i].from != g) s->cache[out++] = s->cache[i];
  s->n_cache = out;
}

/* ---- the rules: per axis, what each op needs and gives ---- */

typedef struct {
  Place need[256];   /* per operand */
  Place give[IR_MAX_RESULTS];
  int hint[256];     /* per operand: the dim a partial operand would rather be scattered to, or -1 */
} Decision;

/* Is the op linear in its operands, so partial sums pass through (with the others R)?
   add/sub: all operands partial; mul: one partial; div: the numerator; others: one operand. */
static bool partial_passes(const Op *op, const Place *in) {
  int n_p = 0;
  for (int i = 0; i < op->n_operands; i++) n_p += in[i].kind == SH_P;
  switch (op->kind) {
  case OP_ADD: case OP_SUB: return n_p == op->n_operands;
  case OP_MUL: return n_p == 1;
  case OP_DIV: return in[0].kind == SH_P && in[1].kind == SH_R;
  case OP_NEG: case OP_SCALE: case OP_CAST: return true;
  case OP_WHERE: return in[0].kind != SH_P && in[1].kind == SH_P && in[2].kind == SH_P;
  default: return false;
  }
}

/* For a reshape, the result dim that keeps the split of operand dim d, or -1. */
static int reshape_dim(const Type *x, const Type *y, int d, int64_t n) {
  int64_t before = 1;
  for (int i = 0; i < d; i++) before *= x->dims[i];
  int64_t acc = 1;
  for (int e = 0; e < y->rank; e++) {
    if (acc == before && y->dims[e] == 1 && x->dims[d] != 1) continue;   /* an inserted size-1 dim */
    if (acc == before) {
      if (x->dims[d] % n) return -1;
      if (y->dims[e] >= x->dims[d]) return y->dims[e] % x->dims[d] == 0 ? e : -1;  /* merged: d outermost */
      return y->dims[e] % n == 0 && x->dims[d] % y->dims[e] == 0 ? e : -1;          /* split: outer factor */
    }
    acc *= y->dims[e];
    if (acc > before) return -1;
  }
  return -1;
}

/* Elementwise ops: operands meet at the most split placement. */
static void rule_elementwise(Sharder *s, const Op *op, const Place *in, int axis, Decision *d) {
  Place target = R;
  bool any_p = false;
  for (int i = 0; i < op->n_operands; i++) {
    if (in[i].kind == SH_S && target.kind == SH_R && op->results[0]->type.rank > 0) target = in[i];
    any_p |= in[i].kind == SH_P;
  }
  /* Sequence parallel: a partial activation [B,T,...] is reduce-scattered along the
     sequence (Megatron-SP), not all-reduced. */
  if (target.kind == SH_R && s->sp && axis == AX_TP && s->in_step && op->results[0]->type.rank >= 3 &&
      !partial_passes(op, in) && any_p)
    target = S(1);
  /* ZeRO: a partial gradient is reduce-scattered to the rank's shard, not all-reduced. */
  if (target.kind == SH_R && !partial_passes(op, in))
    for (int i = 0; i < op->n_operands; i++)
      if (in[i].kind == SH_P && d->hint[i] >= 0) target = S(d->hint[i]);
  if (any_p && target.kind == SH_R && partial_passes(op, in)) {
    for (int i = 0; i < op->n_operands; i++) d->need[i] = in[i].kind == SH_P ? P : R;
    d->give[0] = P;
    return;
  }
  for (int i = 0; i < op->n_operands; i++) d->need[i] = target;
  d->give[0] = target;
}

static void rule(Sharder *s, const Op *op, const Place *in, const Type *gin, int axis, Decision *d) {
  const OpInfo *info = op_info(op->kind);
  int64_t n = s->m->mesh.size[axis];
  for (int i = 0; i < op->n_operands; i++) d->need[i] = in[i];
  for (int r = 0; r < op->n_results; r++) d->give[r] = R;
  if (info->cls == CLASS_ELEMENTWISE || op->kind == OP_CAST) {
    rule_elementwise(s, op, in, axis, d);
    return;
  }
  Place x = op->n_operands ? in[0] : R;
  switch (op->kind) {
  case OP_REDUCE_SUM:
  case OP_REDUCE_MEAN:
  case OP_REDUCE_MAX: {
    const Attr *dims = &op->attrs[0];
    bool max = op->kind == OP_REDUCE_MAX;
    if (x.kind == SH_P) {
      d->need[0] = max ? R : P;
      d->give[0] = max ? R : P;
    } else if (x.kind == SH_S) {
      int removed = 0;
      bool reduced = false;
      for (int i = 0; i < dims->n; i++) {
        if (dims->ints[i] == x.dim) reduced = true;
        if (dims->ints[i] < x.dim) removed++;
      }
      /* Summing over a split dim leaves partial sums (reduce_max: an all_reduce max). */
      d->give[0] = reduced ? (max ? R : P) : S(x.dim - removed);
    }
    return;
  }
  case OP_BROADCAST: {
    const Type *y = &op->results[0]->type;
    int off = y->rank - gin[0].rank;
    if (x.kind == SH_S) d->give[0] = S(x.dim + off);
    else d->give[0] = x;
    return;
  }
  case OP_RESHAPE: {
    if (x.kind == SH_S) {
      int e = reshape_dim(&gin[0], &op->results[0]->type, x.dim, n);
      if (e >= 0) d->give[0] = S(e);
      else d->need[0] = d->give[0] = R;
    } else {
      d->give[0] = x;
    }
    return;
  }
  case OP_TRANSPOSE: {
    const Attr *perm = &op->attrs[0];
    d->give[0] = x;
    if (x.kind == SH_S)
      for (int i = 0; i < perm->n; i++)
        if (perm->ints[i] == x.dim) d->give[0] = S(i);
    return;
  }
  case OP_SLICE:
  case OP_PAD: {
    /* Along the split dim only a full-range slice (or no padding) stays local. */
    const Attr *a = &op->attrs[0], *b = &op->attrs[1];
    if (x.kind == SH_S) {
      bool full = op->kind == OP_SLICE ? a->ints[x.dim] == 0 && b->ints[x.dim] == gin[0].dims[x.dim]
                                       : a->ints[x.dim] == 0 && b->ints[x.dim] == 0;
      if (!full) x = R;
    }
    d->need[0] = d->give[0] = x;
    return;
  }
  case OP_CONCAT: {
    int64_t dim = op_int(op, "dim");
    Place t = R;
    bool all_p = true;
    for (int i = 0; i < op->n_operands; i++) {
      if (in[i].kind == SH_S && in[i].dim != dim && t.kind == SH_R) t = in[i];
      all_p &= in[i].kind == SH_P;
    }
    if (all_p) t = P;
    for (int i = 0; i < op->n_operands; i++) d->need[i] = t;
    d->give[0] = t;
    return;
  }
  case OP_CONSTANT:
  case OP_IOTA:
    return;
  case OP_MATMUL: {
    /* Roles of each operand's dims: batch, M (a) / N (b), K (contracted). */
    const Type *ta = &gin[0], *tb = &gin[1];
    bool tA = op_bool(op, "ta"), tB = op_bool(op, "tb");
    int ra = ta->rank, rb = tb->rank;
    int aK = tA ? ra - 2 : ra - 1, bK = tB ? rb - 1 : rb - 2, bN = tB ? rb - 2 : rb - 1;
    int yr = op->results[0]->type.rank;
    Place a = in[0], b = in[1];
    bool b_batched = rb > 2;
    if (a.kind == SH_P && b.kind == SH_P) b = R;              /* bilinear: one side reduced */
    /* A partial activation (gradient) meeting a split weight is reduced, not the weight
       gathered: Megatron's all-reduce before a column-parallel layer's backward. */
    if (a.kind == SH_P && b.kind == SH_S) a = R;
    if (b.kind == SH_P && a.kind == SH_S) b = R;
    if (a.kind == SH_P || b.kind == SH_P) {
      Place other = a.kind == SH_P ? b : a;
      if (other.kind != SH_R) {
        if (a.kind == SH_P) b = R;
        else a = R;
      }
      d->need[0] = a.kind == SH_P ? P : R;
      d->need[1] = b.kind == SH_P ? P : R;
      d->give[0] = P;
      return;
    }
    /* An activation split along its rows (sequence parallel) meeting a weight split along
       N: gather the activation (Megatron-SP's all-gather before a column-parallel layer). */
    if (a.kind == SH_S && a.dim != aK && b.kind == SH_S && b.dim == bN) {
      d->need[0] = R;
      d->need[1] = b;
      d->give[0] = S(yr - 1);
      return;
    }
    /* Contraction split on both sides -> partial sums. */
    if ((a.kind == SH_S && a.dim == aK) || (b.kind == SH_S && b.dim == bK)) {
      d->need[0] = S(aK);
      d->need[1] = S(bK);
      d->give[0] = P;
      return;
    }
    if (a.kind == SH_S) {   /* batch or M of a */
      d->need[0] = a;
      d->need[1] = R;
      if (a.dim < ra - 2) {
        if (b_batched) d->need[1] = S(a.dim);
        d->give[0] = S(a.dim);
      } else {
        d->give[0] = S(yr - 2);   /* M */
      }
      return;
    }
    if (b.kind == SH_S) {
      d->need[0] = R;
      d->need[1] = b;
      if (b.dim == bN) d->give[0] = S(yr - 1);
      else {   /* batch of b */
        d->need[0] = S(b.dim);
        d->give[0] = S(b.dim);
      }
      return;
    }
    return;
  }
  case OP_EMBEDDING: {
    Place t = in[0], ids = in[1];
    if (t.kind == SH_S && t.dim == 0) {   /* vocabulary-parallel: local rows, partial sums */
      d->need[1] = R;
      d->give[0] = P;
      return;
    }
    if (t.kind == SH_P) {
      d->need[1] = R;
      d->give[0] = P;
    } else if (ids.kind == SH_S) {
      d->need[0] = R;
      d->give[0] = S(ids.dim);
    } else if (t.kind == SH_S && t.dim == 1) {
      d->give[0] = S(gin[1].rank);
    } else {
      d->need[0] = R;
    }
    return;
  }
  case OP_EMBEDDING_GRAD: {   /* dy ids -> dtable: rows split means partial tables */
    Place dy = in[0], ids = in[1];
    int last = gin[0].rank - 1;
    if (axis == AX_TP && op->results[0]->type.dims[0] % n == 0 && !(dy.kind == SH_S && dy.dim == last)) {
      /* tensor parallel: the table is vocabulary-parallel; each rank scatters into its rows */
      d->need[0] = d->need[1] = R;
      d->give[0] = S(0);
      return;
    }
    if (dy.kind == SH_P) {
      d->need[1] = R;
      d->give[0] = P;
    } else if (dy.kind == SH_S && dy.dim < last) {
      d->need[1] = dy;
      d->give[0] = P;
    } else if (ids.kind == SH_S) {
      d->need[0] = ids;
      d->give[0] = P;
    } else if (dy.kind == SH_S) {
      d->give[0] = S(1);
    }
    return;
  }
  case OP_LAYERNORM:
  case OP_RMSNORM:
  case OP_SOFTMAX:
  case OP_CROSS_ENTROPY: {
    /* Row-wise: rows may be split; the normalized/vocabulary dim must be whole. */
    int last = gin[0].rank - 1;
    Place t = (x.kind == SH_S && x.dim < last) ? x : R;
    d->need[0] = t;
    for (int i = 1; i < op->n_operands; i++) d->need[i] = op->kind == OP_CROSS_ENTROPY ? t : R;
    d->give[0] = t;
    return;
  }
  case OP_LAYERNORM_GRAD:
  case OP_RMSNORM_GRAD:
  case OP_SOFTMAX_GRAD:
  case OP_CROSS_ENTROPY_GRAD: {
    /* (dy, x, ...): rows split together; the weight gradients become partial. Linear in
       dy: a partial dy with whole x gives partial results. */
    int last = gin[1].rank - 1;
    Place dy = in[0], xx = in[1];
    Place t = (xx.kind == SH_S && xx.dim < last) ? xx : (dy.kind == SH_S && dy.dim < last) ? dy : R;
    if (op->kind == OP_CROSS_ENTROPY_GRAD) {   /* (dloss, logits, targets): rows of dloss are logits' rows */
      t = (xx.kind == SH_S && xx.dim < last) ? xx : (dy.kind == SH_S) ? dy : R;
      if (dy.kind == SH_P && t.kind == SH_R) {
        d->need[0] = P;
        d->need[1] = d->need[2] = R;
        d->give[0] = P;
        return;
      }
      for (int i = 0; i < 3; i++) d->need[i] = t;
      d->give[0] = t;
      return;
    }
    if (dy.kind == SH_P && t.kind == SH_R) {
      d->need[0] = P;
      for (int i = 1; i < op->n_operands; i++) d->need[i] = R;
      for (int r = 0; r < op->n_results; r++) d->give[r] = P;
      return;
    }
    d->need[0] = d->need[1] = t;
    for (int i = 2; i < op->n_operands; i++) d->need[i] = R;
    d->give[0] = t;
    for (int r = 1; r < op->n_results; r++) d->give[r] = t.kind == SH_S ? P : R;
    return;
  }
  case OP_ATTENTION:
  case OP_ATTENTION_GRAD: {
    /* Batch (dim 0) or heads (dim 2) split alike on q, k and v. */
    int q = op->kind == OP_ATTENTION ? 0 : 1;
    Place t = R;
    for (int i = 0; i < op->n_operands; i++)
      if (in[i].kind == SH_S && (in[i].dim == 0 || in[i].dim == 2) && t.kind == SH_R) t = in[i];
    if (t.kind == SH_S && t.dim == 2 && (gin[q + 1].dims[2] % n || gin[q].dims[2] % n)) t = R;
    if (op->kind == OP_ATTENTION_GRAD && in[0].kind == SH_P && t.kind == SH_R) {
      d->need[0] = P;
      for (int i = 1; i < 4; i++) d->need[i] = R;
      for (int r = 0; r < 3; r++) d->give[r] = P;
      return;
    }
    for (int i = 0; i < op->n_operands; i++) d->need[i] = t;
    for (int r = 0; r < op->n_results; r++) d->give[r] = t;
    return;
  }
  case OP_ROPE: {
    Place t = (x.kind == SH_S && x.dim != 1) || x.kind == SH_P ? x : R;   /* positions need whole sequences */
    d->need[0] = d->give[0] = t;
    return;
  }
  case OP_ADAMW: {
    /* Elementwise over p, m, v, g; the scalars are replicated. */
    Place t = R;
    for (int i = 0; i < 4; i++)
      if (in[i].kind == SH_S && t.kind == SH_R) t = in[i];
    for (int i = 0; i < 4; i++) d->need[i] = t;
    for (int i = 4; i < 7; i++) d->need[i] = R;
    for (int r = 0; r < 3; r++) d->give[r] = t;
    return;
  }
  default:   /* no rule of its own: whole operands, whole results (effects are fixed by emit) */
    for (int i = 0; i < op->n_operands; i++) d->need[i] = R;
    return;
  }
}

/* ---- the plan ---- */

/* The dim ZeRO splits over dp: the first dim the dp size divides (after other axes). */
static int zero_dim_of(const Module *m, const Type *t) {
  int64_t dp = m->mesh.size[AX_DP];
  for (int d = 0; d < t->rank; d++) {
    int64_t local = t->dims[d];
    for (int a = 0; a < AX_COUNT; a++)
      if (t->sh.kind[a] == SH_S && t->sh.dim[a] == d) local /= m->mesh.size[a];
    if (local % dp == 0) return d;
  }
  return -1;
}

/* Head counts from the first attention op (tp keeps whole heads per rank). */
static void find_heads(Sharder *s) {
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

static const Global *param_of_state(const Module *m, const Global *g) {
  const char *prefixes[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  for (int i = 0; i < 3; i++) {
    size_t l = strlen(prefixes[i]);
    if (!strncmp(g->name, prefixes[i], l)) return module_find_global(m, g->name + l);
  }
  return NULL;
}

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

/* Placements of the globals over tp and dp, then their per-rank types. */
static int plan_globals(Sharder *s) {
  Module *m = s->m;
  bool dp = m->mesh.size[AX_DP] > 1, tp = m->mesh.size[AX_TP] > 1;
  /* Plan on the whole types; every global becomes per-rank at the end. */
  Sharding *plan = calloc((size_t)m->globals.n + 1, sizeof *plan);
  for (int i = 0; i < m->globals.n; i++) plan[i] = ((Global *)m->globals.items[i])->value->type.sh;
  for (int i = 0; i < m->globals.n; i++) {
    Global *g = m->globals.items[i];
    s->zero_dim[i] = -1;
    if (!dtype_is_float(g->value->type.dtype)) continue;
    const Global *p = g->kind == GLOBAL_PARAM ? g : param_of_state(m, g);
    if (!p) continue;
    bool grad = g != p && !strncmp(g->name, GRAD_PREFIX, strlen(GRAD_PREFIX));
    Sharding sh = plan[i];
    if (tp) {
      int d = tp_dim_of(s, p);
      if (d >= 0 && p->value->type.dims[d] % m->mesh.size[AX_TP]) {
        snprintf(s->err, s->errlen, "shard: tp=%lld does not divide dim %d (%lld) of $%s; choose a tp that divides it",
                 (long long)m->mesh.size[AX_TP], d, (long long)p->value->type.dims[d], p->name);
        free(plan);
        return IR_EINPUT;
      }
      if (grad) s->undecided[i] = true;   /* placed where its gradient arrives */
      else if (d >= 0) set_place(&sh, AX_TP, S(d));
    }
    if (dp) {
      Type planned = p->value->type;
      if (tp && tp_dim_of(s, p) >= 0) set_place(&planned.sh, AX_TP, S(tp_dim_of(s, p)));
      int zd = zero_dim_of(m, &planned);
      Place want = R;
      if (g->kind == GLOBAL_PARAM) {
        if (s->zero >= 3 && zd >= 0) want = S(zd);
      } else if (grad) {
        want = (s->zero >= 2 && zd >= 0) ? S(zd) : P;   /* partial sums until the optimizer step */
      } else if (s->zero >= 1 && zd >= 0) {
        want = S(zd);
      }
      s->zero_dim[i] = zd;
      set_place(&sh, AX_DP, want);
    }
    plan[i] = sh;
  }
  for (int i = 0; i < m->globals.n; i++) {
    Global *g = m->globals.items[i];
    g->value->type = local_type(m, g->value->type, &plan[i]);
  }
  free(plan);
  return 0;
}

/* The first accumulate into an undecided gradient fixes its placement off dp: the one its
   value arrives with (a split gradient stays split; one summed over ranks stays partial). */
static void decide_gradient(Sharder *s, Value *dst, const Value *v) {
  int gi = dst->global->index;
  if (!s->undecided[gi]) return;
  s->undecided[gi] = false;
  Type whole = global_type(s->m, dst);
  Sharding sh = dst->type.sh;
  for (int a = 0; a < AX_COUNT; a++)
    if (a != AX_DP) {
      sh.kind[a] = v->type.sh.kind[a];
      sh.dim[a] = v->type.sh.dim[a];
    }
  dst->type = local_type(s->m, whole, &sh);
}

/* ---- one function ---- */

static Value *map_operand(Sharder *s, Value *v) { return v->kind == VAL_GLOBAL ? v : s->map[v->id]; }

/* ---- ops the partitioner rewrites (the per-rank form is not the same op) ---- */

/* An op on per-rank values with result placements `sh`; attributes copied from `like`. */
static Value *local_op(Sharder *s, OpKind k, Value **ops, int n, const Type *declared, Sharding sh, const Op *like) {
  Type t = declared ? *declared : ops[0]->type;
  Op *op = op_new(s->m, k, ops, n, &t);
  if (like) memcpy(op->attrs, like->attrs, sizeof op->attrs);
  if (!(op_info(k)->flags & OPF_TYPED)) {
    char msg[512];
    if (infer_types(op, &t, msg, sizeof msg)) {
      fail(s, "shard: %s: %s", op_info(k)->name, msg);
      return ops[0];
    }
  }
  t.sh = sh;
  op->results[0]->type = t;
  ptrvec_push(s->m->arena, &s->f->ops, op);
  return op->results[0];
}

static Value *reduce_last(Sharder *s, OpKind k, Value *x, Sharding sh) {
  int64_t last = x->type.rank - 1;
  Value *v = local_op(s, k, &x, 1, NULL, sh, NULL);
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
  x = local_op(s, OP_RESHAPE, &x, 1, &k, x->type.sh, NULL);
  Type t = like->type;
  t.dtype = x->type.dtype;
  return local_op(s, OP_BROADCAST, &x, 1, &t, like->type.sh, NULL);
}

static Value *set_vocab_axis(Sharder *s, Value *v, int axis) {
  Attr *a = &v->def->attrs[op_attr_index(v->def->kind, "vocab_axis")];
  a->s = mesh_axis_names[axis];
  a->set = true;
  (void)s;
  return v;
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
    L = local_op(s, OP_CAST, &L, 1, &t, L->type.sh, NULL);
  }
  Sharding rows = L->type.sh, partial;
  set_place(&rows, axis, R);
  partial = rows;
  set_place(&partial, axis, P);
  tg = reshard(s, tg, &rows);
  Value *m = collective(s, OP_ALL_REDUCE, reduce_last(s, OP_REDUCE_MAX, L, partial), axis, 0, 0, R, "max");
  Value *zz[2] = {L, bcast_to(s, m, L)};
  Value *z = local_op(s, OP_SUB, zz, 2, NULL, L->type.sh, NULL);
  Value *e = local_op(s, OP_EXP, &z, 1, NULL, L->type.sh, NULL);
  Value *sum = collective(s, OP_ALL_REDUCE, reduce_last(s, OP_REDUCE_SUM, e, partial), axis, 0, 0, R, "sum");
  if (!grad) {
    Value *pick[2] = {z, tg};
    Value *t = set_vocab_axis(s, local_op(s, OP_TARGET_PICK, pick, 2, NULL, partial, NULL), axis);
    Value *tz = collective(s, OP_ALL_REDUCE, t, axis, 0, 0, R, "sum");
    Value *lt[2] = {local_op(s, OP_LOG, &sum, 1, NULL, rows, NULL), tz};
    s->map[op->results[0]->id] = local_op(s, OP_SUB, lt, 2, NULL, rows, NULL);
    return;
  }
  Value *dloss = reshard(s, ops[0], &rows);
  Value *ps[2] = {e, bcast_to(s, sum, L)};
  Value *p = local_op(s, OP_DIV, ps, 2, NULL, L->type.sh, NULL);
  Type oh_t = L->type;
  Value *oh = set_vocab_axis(s, local_op(s, OP_ONEHOT, &tg, 1, &oh_t, L->type.sh, NULL), axis);
  Value *po[2] = {p, oh};
  Value *diff = local_op(s, OP_SUB, po, 2, NULL, L->type.sh, NULL);
  Value *dg[2] = {diff, bcast_to(s, dloss, L)};
  Value *g = local_op(s, OP_MUL, dg, 2, NULL, L->type.sh, NULL);
  if (dt != DT_F32) {
    Type t = g->type;
    t.dtype = dt;
    g = local_op(s, OP_CAST, &g, 1, &t, g->type.sh, NULL);
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
    Value *x = reshard(s, ops[i], &whole_kv);
    args[i] = collective_parts(s, OP_SHARD_SLICE, x, axis, 2, 0, S(2), NULL, kv);
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
      s->map[op->results[r]->id] = collective_parts(s, OP_SHARD_PAD, c->results[r], axis, 2, 0, P, NULL, kv);
}

static void emit(Sharder *s, Op *op) {
  const OpInfo *info = op_info(op->kind);
  Module *m = s->m;
  int nops = op->n_operands;
  Value *ops[256];
  Type gin[256];
  for (int i = 0; i < nops; i++) {
    ops[i] = map_operand(s, op->operands[i]);
    gin[i] = global_type(m, ops[i]);
  }
  /* A partial operand that was already reduced for an earlier op is read reduced: the
     collective is not repeated (e.g. a gradient reduced for the input-gradient matmul is
     reused by the weight-gradient one). */
  for (int i = op_n_writes(op->kind); i < nops; i++) {   /* never a global the op writes */
    Sharding reduced = ops[i]->type.sh;
    bool partial = false;
    for (int a = 0; a < AX_COUNT; a++)
      if (reduced.kind[a] == SH_P) {
        reduced.kind[a] = SH_R;
        partial = true;
      }
    for (int k = 0; partial && k < s->n_cache; k++)
      if (s->cache[k].from == ops[i] && sharding_eq(&s->cache[k].want, &reduced)) {
        ops[i] = s->cache[k].to;
        gin[i] = global_type(m, ops[i]);
        break;
      }
  }
  /* Ops whose per-rank form is a different computation. */
  for (int a = 0; a < AX_COUNT; a++) {
    int64_t n = m->mesh.size[a];
    if (n == 1) continue;
    if (op->kind == OP_CROSS_ENTROPY || op->kind == OP_CROSS_ENTROPY_GRAD) {
      const Value *L = ops[op->kind == OP_CROSS_ENTROPY ? 0 : 1];
      Place p = place_of(L, a);
      if (p.kind == SH_S && p.dim == L->type.rank - 1) {
        emit_vocab_ce(s, op, ops, a);
        return;
      }
    }
    if (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD) {
      int q = op->kind == OP_ATTENTION ? 0 : 1;
      Place pq = place_of(ops[q], a);
      int64_t kv = gin[q + 1].dims[2];
      if (pq.kind == SH_S && pq.dim == 2 && kv % n && n % kv == 0) {
        emit_kv_replicated(s, op, ops, a, kv);
        return;
      }
    }
  }
  /* Decide per axis, then move the operands where the rule needs them. */
  Decision dec;
  Sharding need[256], give[IR_MAX_RESULTS];
  memset(need, 0, sizeof(Sharding) * (size_t)(nops ? nops : 1));
  memset(give, 0, sizeof give);
  for (int a = 0; a < AX_COUNT; a++) {
    if (m->mesh.size[a] == 1) continue;
    Place in[256];
    for (int i = 0; i < nops; i++) {
      in[i] = place_of(ops[i], a);
      /* ZeRO-3 splits a parameter's storage, not the computation: rules see it whole, so
         it is gathered before each use (and the optimizer, elementwise on shards, does not). */
      if (a == AX_DP && is_zero3_param(s, ops[i])) in[i] = R;
      const Value *v = ops[i];
      dec.hint[i] = a == AX_DP && s->zero >= 1 && v->kind == VAL_GLOBAL ? s->zero_dim[v->global->index] : -1;
    }
    rule(s, op, in, gin, a, &dec);
    for (int i = 0; i < nops; i++) set_place(&need[i], a, dec.need[i]);
    for (int r = 0; r < op->n_results; r++) set_place(&give[r], a, dec.give[r]);
  }
  /* Effects: the destination global's placement is fixed; the value must match it. */
  int writes = op_n_writes(op->kind);
  if (op->kind == OP_ACCUMULATE && ops[0]->kind == VAL_GLOBAL) decide_gradient(s, ops[0], ops[1]);
  for (int i = 0; i < writes; i++) need[i] = ops[i]->type.sh;
  if (op->kind == OP_ACCUMULATE || op->kind == OP_ASSIGN) need[1] = ops[0]->type.sh;
  for (int i = writes; i < nops; i++) ops[i] = reshard(s, ops[i], &need[i]);
  for (int i = 0; i < writes; i++) cache_forget_global(s, ops[i]);

  /* Partition rewrites: a mean over a split dim is a sum over the whole count; a max over
     one is a local max and an all_reduce. */
  OpKind kind = op->kind;
  double mean_scale = 0;
  int max_axis = -1;
  if (op->kind == OP_REDUCE_MEAN || op->kind == OP_REDUCE_MAX)
    for (int a = 0; a < AX_COUNT; a++) {
      Place p = place_of(ops[0], a);
      if (p.kind != SH_S) continue;
      const Attr *dims = &op->attrs[0];
      for (int i = 0; i < dims->n; i++)
        if (dims->ints[i] == p.dim) {
          if (op->kind == OP_REDUCE_MEAN) {
            kind = OP_REDUCE_SUM;
            mean_scale = (double)type_numel(&op->results[0]->type) / (double)type_numel(&gin[0]);
          } else {
            max_axis = a;
          }
        }
    }
  Type types[IR_MAX_RESULTS];
  for (int r = 0; r < op->n_results; r++) types[r] = local_type(m, op->results[r]->type, &give[r]);
  Op *c = op_new_n(m, kind, ops, nops, types, op->n_results);
  memcpy(c->attrs, op->attrs, sizeof c->attrs);
  c->line = op->line;
  /* Slices and pads of split dims cover them whole: their bounds become per-rank. */
  if (op->kind == OP_SLICE || op->kind == OP_PAD) {
    Attr *a0 = &c->attrs[0], *a1 = &c->attrs[1];
    int64_t lo[IR_MAX_RANK], hi[IR_MAX_RANK];
    memcpy(lo, a0->ints, sizeof(int64_t) * (size_t)a0->n);
    memcpy(hi, a1->ints, sizeof(int64_t) * (size_t)a1->n);
    for (int a = 0; a < AX_COUNT; a++)
      if (ops[0]->type.sh.kind[a] == SH_S) {
        int d = ops[0]->type.sh.dim[a];
        if (op->kind == OP_SLICE) hi[d] = ops[0]->type.dims[d];
      }
    op_set_ints(m, c, op->kind == OP_SLICE ? "start" : "low", lo, a0->n);
    op_set_ints(m, c, op->kind == OP_SLICE ? "end" : "high", hi, a1->n);
  }
  if (!(info->flags & OPF_TYPED)) {
    Type t[IR_MAX_RESULTS];
    char msg[512];
    if (infer_types(c, t, msg, sizeof msg)) {
      char text[256];
      fail(s, "shard: the per-rank form of an op does not check: %s\n  %s", msg, op_to_string(op, text, sizeof text));
      return;
    }
    for (int r = 0; r < c->n_results; r++) {
      Sharding sh = give[r];
      c->results[r]->type = t[r];
      c->results[r]->type.sh = sh;
    }
  }
  for (int r = 0; r < c->n_results; r++) {
    c->results[r]->name = op->results[r]->name;
    s->map[op->results[r]->id] = c->results[r];
  }
  /* A vocabulary split over an axis: the per-rank embedding places its rows by coordinate. */
  if (op->kind == OP_EMBEDDING || op->kind == OP_EMBEDDING_GRAD)
    for (int a = 0; a < AX_COUNT; a++) {
      Place p = op->kind == OP_EMBEDDING ? place_of(ops[0], a) : (Place){give[0].kind[a], give[0].dim[a]};
      if (p.kind == SH_S && p.dim == 0) set_vocab_axis(s, c->results[0], a);
    }
  ptrvec_push(m->arena, &s->f->ops, c);
  if (mean_scale) {
    Value *v = c->results[0];
    Op *sc = op_new(m, OP_SCALE, &v, 1, &v->type);
    op_set_float(sc, "by", mean_scale);
    sc->results[0]->name = v->name;
    v->name = NULL;
    ptrvec_push(m->arena, &s->f->ops, sc);
    s->map[op->results[0]->id] = sc->results[0];
  }
  if (max_axis >= 0) {
    Value *v = c->results[0];
    s->map[op->results[0]->id] = collective(s, OP_ALL_REDUCE, v, max_axis, 0, 0, R, "max");
  }
}

static int shard_func(Sharder *s, Func *src) {
  Module *m = s->m;
  Func *f = arena_alloc(m->arena, sizeof *f);
  f->name = src->name;
  f->module = m;
  f->arena_bytes = -1;
  s->f = f;
  s->in_step = !strcmp(src->name, "grad_step") || !strcmp(src->name, "forward");
  int n = func_number(src);
  s->map = calloc((size_t)n + 1, sizeof *s->map);
  s->n_cache = 0;
  /* Token inputs are split over dp along the batch; other arguments are replicated. */
  for (int i = 0; i < src->args.n; i++) {
    Value *a = src->args.items[i];
    Sharding sh = a->type.sh;
    if (m->mesh.size[AX_DP] > 1 && a->type.rank >= 1 && !dtype_is_float(a->type.dtype)) {
      if (a->type.dims[0] % m->mesh.size[AX_DP]) {
        fail(s, "shard: the batch of @%s's argument %%%s (%lld) does not split over dp=%lld; make the batch a "
                    "multiple of dp", src->name, a->name ? a->name : "?", (long long)a->type.dims[0],
                    (long long)m->mesh.size[AX_DP]);
        break;
      }
      set_place(&sh, AX_DP, S(0));
    }
    s->map[a->id] = func_add_arg(f, a->name, local_type(m, a->type, &sh));
  }
  for (int i = 0; i < src->ops.n && !s->failed; i++) emit(s, src->ops.items[i]);
  /* What a function returns is whole on every rank. */
  for (int i = 0; i < src->rets.n && !s->failed; i++) {
    Value *v = map_operand(s, src->rets.items[i]);
    Sharding whole;
    memset(&whole, 0, sizeof whole);
    func_add_ret(f, reshard(s, v, &whole));
  }
  free(s->map);
  s->map = NULL;
  if (s->failed) return IR_EINPUT;
  for (int i = 0; i < m->funcs.n; i++)
    if (m->funcs.items[i] == src) m->funcs.items[i] = f;
  return 0;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  if (m->local) {
    snprintf(err, errlen, "the module is already partitioned (mesh ... local)");
    return IR_EINPUT;
  }
  for (int a = 0; a < AX_COUNT; a++)
    if (a != AX_DP && a != AX_TP && a != AX_PP && m->mesh.size[a] > 1) {   /* pp: the pipeline pass cuts the step */
      snprintf(err, errlen, "shard: %s=%lld is not supported yet (this version partitions over dp, with ZeRO 0-3, "
               "and tp); run with %s=1", mesh_axis_names[a], (long long)m->mesh.size[a], mesh_axis_names[a]);
      return IR_EINPUT;
    }
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  if (mesh_world(&m->mesh) == 1) return 0;   /* one rank: nothing to partition */
  Sharder s;
  memset(&s, 0, sizeof s);
  s.m = m;
  s.zero = ts->zero;
  s.sp = ts->sp;
  s.err = err;
  s.errlen = errlen;
  s.zero_dim = calloc((size_t)m->globals.n + 1, sizeof(int));
  s.undecided = calloc((size_t)m->globals.n + 1, sizeof(bool));
  find_heads(&s);
  int n_funcs = m->funcs.n, rc = plan_globals(&s);
  for (int i = 0; i < n_funcs && !rc; i++) {
    Func *f = m->funcs.items[i];
    if (f->is_kernel) {
      snprintf(err, errlen, "shard runs before fuse: @%s is a kernel", f->name);
      rc = IR_EINPUT;
    } else {
      rc = shard_func(&s, f);
    }
  }
  m->local = true;
  free(s.zero_dim);
  free(s.undecided);
  free(s.cache);
  return rc;
}

const Pass pass_shard = {"shard", "partition the program over the mesh (dp, ZeRO 0-3): per-rank shapes and collectives", run};

/* ---- `loom ir --collectives`: what each rank sends per call of each function ---- */

/* Bytes one rank sends in the ring algorithm, for a collective over n ranks whose per-rank
   buffer (the larger of input and output) holds `size` bytes:
     all_reduce 2(n-1)/n size; all_gather, reduce_scatter, all_to_all (n-1)/n size. */
static double ring_bytes(const Op *op, int64_t n) {
  int64_t in = type_numel(&op->operands[0]->type) * dtype_size(op->operands[0]->type.dtype);
  int64_t out = type_numel(&op->results[0]->type) * dtype_size(op->results[0]->type.dtype);
  double size = (double)(in > out ? in : out);
  switch (op->kind) {
  case OP_ALL_REDUCE: return 2.0 * (double)(n - 1) / (double)n * size;
  case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL: return (double)(n - 1) / (double)n * size;
  default: return 0;   /* shard_slice / shard_pad: local */
  }
}

int collective_summary(const Module *m, const char *func, CollectiveCount *out, int max) {
  int n_out = 0;
  for (int i = 0; i < m->funcs.n; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel || (func && strcmp(f->name, func))) continue;
    for (int k = 0; k < f->ops.n; k++) {
      const Op *op = f->ops.items[k];
      if (op_info(op->kind)->cls != CLASS_COLLECTIVE || op->kind == OP_SHARD_SLICE || op->kind == OP_SHARD_PAD) continue;
      int axis = mesh_axis_parse(op_attr(op, "axis")->s), j = 0;
      while (j < n_out && !(out[j].kind == op->kind && out[j].axis == axis && out[j].func == f)) j++;
      if (j == n_out) {
        if (n_out == max) continue;
        out[n_out++] = (CollectiveCount){f, op->kind, axis, 0, 0, 0};
      }
      out[j].count++;
      out[j].payload += type_numel(&op->operands[0]->type) * dtype_size(op->operands[0]->type.dtype);
      out[j].sent += ring_bytes(op, op_int(op, "n"));
    }
  }
  return n_out;
}

void collective_report(FILE *out, const Module *m) {
  CollectiveCount c[256];
  int n = collective_summary(m, NULL, c, 256);
  fprintf(out, "collectives per rank (each function, per call; bytes sent by one rank in ring algorithms):\n");
  if (!n) fprintf(out, "  none\n");
  for (int i = 0; i < n; i++)
    fprintf(out, "  @%-15s %-15s %-3s x%-5lld payload %12lld B   sent %14.0f B\n", c[i].func->name,
            op_info(c[i].kind)->name, mesh_axis_names[c[i].axis], (long long)c[i].count, (long long)c[i].payload,
            c[i].sent);
}
