/* passes/shard.c — pass "shard": turns the global training program into the program of
 * one rank of the device mesh (SPMD: every rank runs it, on its own piece of the data).
 * This file holds what every mesh axis shares: the plan's driver, the sharding rules that
 * hold on any axis, the partitioner, and the `--collectives` report; shard_emit.c builds
 * the per-rank ops and the collectives it inserts (the axis files use it too).  Each axis's own rules live in a file of their own, behind the
 * hooks of passes/shard_internal.h:
 *     shard_dp.c   dp: tokens split along the batch, ZeRO-1/2/3 placements
 *     shard_tp.c   tp: Megatron's parameter layouts, sequence parallel, the
 *                  vocabulary-parallel and head-parallel per-rank forms
 *     shard_cp.c   cp: the sequence split (contiguous or zigzag), ring attention
 *     shard_ep.c   the mixture-of-experts ops on every axis; ep: experts split, the rows
 *                  exchanged by all_to_allv
 * (pp is the pipeline pass's, after this one.)
 *
 * Placements.  On each mesh axis a value is replicated (R), split along a dim (S(d)), or
 * partial (P: each rank holds a summand).  The plan fixes the placements of the inputs and
 * globals (see plan_globals): tokens S(0) over dp; parameters R over dp; gradient
 * accumulators P over dp (reduced once per optimizer step); with ZeRO-1 the optimizer
 * moments are S(d) over dp, with ZeRO-2 the gradients too, with ZeRO-3 the parameters;
 * over tp, parameters by their Megatron layout.
 *
 * Rules.  Walking each function in order, every op's sharding rule (rule(), one case per
 * op, next to its derivative rule in spirit: both say how the op treats its operands)
 * gives the placements it needs for its operands and the placements of its results.  An
 * axis's own rule for an op, where it has one, comes first.  Where an operand sits
 * differently, shard_reshard() inserts the collective:
 *     P -> R all_reduce      P -> S(d) reduce_scatter     S(d) -> R all_gather
 *     S(d) -> S(e) all_to_all      R -> S(d) shard_slice (no communication)
 * Then the op is emitted with per-rank shapes.  Results of a function are made R.
 *
 * This version partitions over dp (ZeRO 0-3), tp (with sequence parallel), cp and ep (the
 * experts of a mixture of experts, shard_ep.c); pp passes through to the pipeline pass.
 * docs/sharding.md lists every op's rule.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"


/* ---- the rules: per axis, what each op needs and gives ---- */

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
  /* A partial operand the op is not linear in is reduced: to R, unless its axis reduces
     it to a split (sequence parallel on tp, the ZeRO shard of a gradient on dp). */
  if (target.kind == SH_R && any_p && !partial_passes(op, in)) {
    if (axis == AX_TP) target = shard_tp_partial_target(s, op);
    else if (axis == AX_DP) target = shard_dp_partial_target(op, in, d);
  }
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
  /* An axis's own rules first, then the rules that hold on every axis. */
  if (shard_rows_rule(s, op, in, gin, axis, d)) return;   /* flattened [B*T,...] with T split: shard_rows.c */
  if (axis == AX_TP && shard_tp_rule(s, op, in, gin, d)) return;
  if (axis == AX_CP && shard_cp_rule(s, op, in, gin, d)) return;
  if (shard_moe_rule(s, op, in, gin, axis, d)) return;   /* mixture of experts: shard_ep.c */
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
    int last = gin[0].rank - 1;   /* (tp's vocabulary-parallel table: shard_tp_rule) */
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

static const Global *param_of_state(const Module *m, const Global *g) {
  const char *prefixes[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  for (int i = 0; i < 3; i++) {
    size_t l = strlen(prefixes[i]);
    if (!strncmp(g->name, prefixes[i], l)) return module_find_global(m, g->name + l);
  }
  return NULL;
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
    /* The parameter as the axes before dp place it: ZeRO splits what they leave a rank. */
    Type param = p->value->type;
    if (tp && shard_tp_plan_global(s, i, p, grad, &sh, &param)) {
      free(plan);
      return IR_EINPUT;
    }
    if (m->mesh.size[AX_EP] > 1) {   /* a stack of experts split over ep (before ZeRO picks its dim) */
      shard_ep_plan_global(p, grad, &sh);
      if (p->hf_experts) set_place(&param.sh, AX_EP, S(0));
    }
    if (dp) shard_dp_plan_global(s, i, g, grad, &param, &sh);
    /* cp: a gradient arrives as partial sums over the rank's positions (or whole, when
       computed from gathered values); it is placed as it arrives */
    if (grad && m->mesh.size[AX_CP] > 1) s->undecided[i] = true;
    plan[i] = sh;
  }
  for (int i = 0; i < m->globals.n; i++) {
    Global *g = m->globals.items[i];
    g->value->type = shard_local_type(m, g->value->type, &plan[i]);
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
  Type whole = shard_global_type(s->m, dst);
  Sharding sh = dst->type.sh;
  for (int a = 0; a < AX_COUNT; a++)
    if (a != AX_DP) {
      sh.kind[a] = v->type.sh.kind[a];
      sh.dim[a] = v->type.sh.dim[a];
    }
  dst->type = shard_local_type(s->m, whole, &sh);
}


/* ---- one function ---- */

static Value *map_operand(Sharder *s, Value *v) { return v->kind == VAL_GLOBAL ? v : s->map[v->id]; }

/* op's per-rank results as mapped, to shard_rows_mark (merged rows). */
static void mark_rows(Sharder *s, const Op *op, Value **ops) {
  Value *mapped[IR_MAX_RESULTS];
  for (int r = 0; r < op->n_results; r++) mapped[r] = s->map[op->results[r]->id];
  shard_rows_mark(s, op, ops, mapped);
}

static void emit(Sharder *s, Op *op) {
  const OpInfo *info = op_info(op->kind);
  Module *m = s->m;
  int nops = op->n_operands;
  Value *ops[256];
  Type gin[256];
  for (int i = 0; i < nops; i++) {
    ops[i] = map_operand(s, op->operands[i]);
    gin[i] = shard_global_type(m, ops[i]);
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
    Value *hit = partial ? shard_cache_find(s, ops[i], &reduced) : NULL;
    if (hit) ops[i] = hit, gin[i] = shard_global_type(m, ops[i]);
  }
  shard_rows_prepare(s, op, ops, gin);   /* merged rows gathered for an op that needs them in order */
  /* Ops whose per-rank form is a different computation (vocabulary-parallel
     cross-entropy, KV heads sliced per rank: shard_tp.c). */
  bool cp_attention = m->mesh.size[AX_CP] > 1 && (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD);
  for (int a = 0; a < AX_COUNT && !cp_attention; a++)
    if (m->mesh.size[a] > 1 && shard_tp_rewrite(s, op, ops, gin, a)) return;
  /* Decide per axis, then move the operands where the rule needs them. */
  Decision dec;
  Sharding need[256], give[IR_MAX_RESULTS];
  memset(need, 0, sizeof(Sharding) * (size_t)(nops ? nops : 1));
  memset(give, 0, sizeof give[0] * (size_t)(op->n_results > 0 ? op->n_results : 1));   /* the results' (all that is read) */
  for (int a = 0; a < AX_COUNT; a++) {
    if (m->mesh.size[a] == 1) continue;
    Place in[256];
    for (int i = 0; i < nops; i++) {
      in[i] = place_of(ops[i], a);
      dec.hint[i] = -1;
      if (a == AX_DP) shard_dp_operand(s, ops[i], &in[i], &dec.hint[i]);   /* ZeRO-3 parameters seen whole */
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
  shard_rows_convert(s, op, ops, need);
  for (int i = writes; i < nops; i++) {
    Value *was = ops[i];
    ops[i] = shard_reshard(s, ops[i], &need[i]);
    shard_rows_follow(s, was, ops[i]);
  }
  for (int i = 0; i < writes; i++) shard_cache_forget(s, ops[i]);
  if (cp_attention) {   /* the ring (or all-gather) over cp: shard_cp.c */
    shard_cp_emit_attention(s, op, ops);
    return;
  }
  if (shard_ep_emit(s, op, ops, give)) {   /* rows into and out of expert space: shard_ep.c */
    mark_rows(s, op, ops);
    return;
  }

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
  for (int r = 0; r < op->n_results; r++) types[r] = shard_local_type(m, op->results[r]->type, &give[r]);
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
  if (op->kind == OP_MOE_DISPATCH) op_set_int(c, "rows", types[0].dims[0]);   /* the rank's rows */
  if ((op->kind == OP_MOE_SORT || op->kind == OP_MOE_COUNT) && op_int(op, "capacity") > 0) {
    /* a capacity holds for the tokens a rank routes: its share of the micro-batch's */
    int64_t whole = type_numel(&gin[0]), local = type_numel(&ops[0]->type), cap = op_int(op, "capacity");
    op_set_int(c, "capacity", (cap * local + whole - 1) / whole);
  }
  if (!(info->flags & OPF_TYPED)) {
    Type t[IR_MAX_RESULTS];
    char msg[512];
    if (infer_types(c, t, msg, sizeof msg)) {
      char text[256];
      shard_fail(s, "shard: the per-rank form of an op does not check: %s\n  %s", msg,
                 op_to_string(op, text, sizeof text));
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
  if (op->kind == OP_ROPE && m->mesh.size[AX_CP] > 1) shard_cp_mark_positions(s, c);
  /* A vocabulary split over an axis: the per-rank embedding places its rows by coordinate. */
  if (op->kind == OP_EMBEDDING || op->kind == OP_EMBEDDING_GRAD)
    for (int a = 0; a < AX_COUNT; a++) {
      Place p = op->kind == OP_EMBEDDING ? place_of(ops[0], a) : (Place){give[0].kind[a], give[0].dim[a]};
      if (p.kind == SH_S && p.dim == 0) shard_set_vocab_axis(c->results[0], a);
    }
  ptrvec_push(m->arena, &s->f->ops, c);
  if (s->n_ep_space) shard_ep_check(s, op, ops, c->results);
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
    s->map[op->results[0]->id] = shard_collective(s, OP_ALL_REDUCE, v, max_axis, 0, 0, R, "max");
  }
  mark_rows(s, op, ops);
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
  shard_rows_clear(s);
  shard_cache_clear(s);
  s->n_ep_space = s->n_ep_counts = 0;
  /* The arguments' placements: the tokens split over dp (shard_dp_plan_arg); others replicated. */
  for (int i = 0; i < src->args.n; i++) {
    Value *a = src->args.items[i];
    Sharding sh = a->type.sh;
    if (m->mesh.size[AX_DP] > 1 && shard_dp_plan_arg(s, src, a, &sh)) break;
    if (m->mesh.size[AX_EP] > 1 && shard_ep_plan_arg(s, src, a, &sh)) break;
    s->map[a->id] = func_add_arg(f, a->name, shard_local_type(m, a->type, &sh));
  }
  for (int i = 0; i < src->ops.n && !s->failed; i++) emit(s, src->ops.items[i]);
  /* What a function returns is whole on every rank, but for a training program's @forward:
     validation reads only its loss (its last result), so the logits stay each rank's piece.
     Gathering them would hold the whole mesh's logits on every rank (GPT-2 124M, dp=8, 8 x
     1024 a rank, bf16: 6.6 GB), the largest arena of the program.  loom eval's mesh pipeline
     has no @grad_step, and returns whole logits as before. */
  bool validation = !strcmp(src->name, "forward") && module_find_func(m, "grad_step");
  for (int i = 0; i < src->rets.n && !s->failed; i++) {
    Value *v = map_operand(s, src->rets.items[i]);
    if (validation && i < src->rets.n - 1) {
      func_add_ret(f, v);
      continue;
    }
    Sharding whole;
    memset(&whole, 0, sizeof whole);
    func_add_ret(f, shard_reshard(s, v, &whole));
  }
  shard_rows_sweep(s, f);
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
  if (m->mesh.size[AX_CP] > 128) {   /* the zigzag permutation is a concat of 2cp pieces; ops take at most 256 */
    snprintf(err, errlen, "shard: cp=%lld: context parallelism over more than 128 ranks is not supported; use cp <= 128 "
             "(and dp or pp for the rest)", (long long)m->mesh.size[AX_CP]);
    return IR_EINPUT;
  }
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  if (mesh_world(&m->mesh) == 1) return 0;   /* one rank: nothing to partition */
  Sharder s;
  memset(&s, 0, sizeof s);
  s.m = m;
  s.zero = ts->zero;
  s.dp_in_step = ts->zero == 0 && ts->grad_accum <= 1 && ts->overlap && m->mesh.size[AX_PP] == 1;
  s.sp = ts->sp;
  s.cp_zigzag = !ts->cp_contiguous;
  s.cp_reshard = shard_cp_reshard;
  s.cp_allgather = ts->cp_allgather;
  s.cp_tag = 1 << 24;   /* apart from the pipeline pass's tags (tied gradients: 1<<20 + global) */
  s.err = err;
  s.errlen = errlen;
  shard_cache_clear(&s);
  s.zero_dim = calloc((size_t)m->globals.n + 1, sizeof(int));
  s.undecided = calloc((size_t)m->globals.n + 1, sizeof(bool));
  shard_tp_init(&s);
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
  shard_rows_free(&s);
  free(s.ep_space);
  return rc;
}

const Pass pass_shard = {"shard",
                         "partition the program over the mesh (dp, ZeRO 0-3): per-rank shapes and collectives", run};

/* ---- `loom ir --collectives`: what each rank sends per call of each function ---- */

/* Bytes one rank sends in the ring algorithm, for a collective over n ranks whose per-rank
   buffer (the larger of input and output) holds `size` bytes:
     all_reduce 2(n-1)/n size; all_gather, reduce_scatter, all_to_all (n-1)/n size;
     send: size (a pipeline's activations, cp's ring). */
/* An all_to_allv's bytes under balanced routing: the rank's own rows, either way (the smaller
   side: the other is expert space, sized for the worst case). */
static int64_t routed_bytes(const Op *op) {
  int64_t in = type_numel(&op->operands[0]->type) * dtype_size(op->operands[0]->type.dtype);
  int64_t out = op->n_results ? type_numel(&op->results[0]->type) * dtype_size(op->results[0]->type.dtype) : in;
  return in < out ? in : out;
}

static double ring_bytes(const Op *op, int64_t n) {
  int64_t in = type_numel(&op->operands[0]->type) * dtype_size(op->operands[0]->type.dtype);
  int64_t out = op->n_results ? type_numel(&op->results[0]->type) * dtype_size(op->results[0]->type.dtype) : 0;
  double size = (double)(in > out ? in : out);
  switch (op_sync_of(op->kind)) {
  case OP_ALL_REDUCE: return 2.0 * (double)(n - 1) / (double)n * size;
  case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL: return (double)(n - 1) / (double)n * size;
  case OP_ALL_TO_ALLV: return (double)(n - 1) / (double)n * (double)routed_bytes(op);   /* less its own experts' rows */
  case OP_SEND: return size;   /* point-to-point: the whole value, once */
  default: return 0;   /* shard_slice / shard_pad: local; recv: its send counts */
  }
}

int collective_summary(const Module *m, const char *func, CollectiveCount *out, int max) {
  int n_out = 0;
  for (int i = 0; i < m->funcs.n; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel || (func && strcmp(f->name, func))) continue;
    for (int k = 0; k < f->ops.n; k++) {
      const Op *op = f->ops.items[k];
      if (op_info(op->kind)->cls != CLASS_COLLECTIVE || op->kind == OP_SHARD_SLICE || op->kind == OP_SHARD_PAD ||
          op->kind == OP_WAIT || op->kind == OP_RECV)
        continue;
      OpKind kind = op_sync_of(op->kind);   /* a start counts as its collective */
      int axis = mesh_axis_parse(op_attr(op, "axis")->s), j = 0;
      while (j < n_out && !(out[j].kind == kind && out[j].axis == axis && out[j].func == f)) j++;
      if (j == n_out) {
        if (n_out == max) continue;
        out[n_out++] = (CollectiveCount){f, kind, axis, 0, 0, 0};
      }
      out[j].count++;
      out[j].payload += op->kind == OP_ALL_TO_ALLV ? routed_bytes(op)
                                                  : type_numel(&op->operands[0]->type) * dtype_size(op->operands[0]->type.dtype);
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
