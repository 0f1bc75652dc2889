/* passes/shard_internal.h — what the files of the shard pass share (not for other passes).
 *
 *   shard.c     the pass: the plan's driver, the rules that hold on every mesh axis,
 *               the partitioner (per-rank ops, collective insertion), `--collectives`
 *   shard_dp.c  the dp axis: tokens split along the batch, ZeRO-1/2/3 placements
 *   shard_tp.c  the tp axis: Megatron's parameter layouts, sequence parallel, the
 *               vocabulary-parallel and head-parallel per-rank forms
 *   shard_cp.c  the cp axis: the sequence split (contiguous or zigzag), ring attention
 *
 * An axis's file answers the driver's questions about that axis only (where a global
 * sits, how an operand is seen, where a partial value is reduced to, which ops it rules or
 * rewrites itself); the driver asks them by axis.  cp, pp and ep will get their own
 * shard_<axis>.c with the same kind of hooks.
 */
#ifndef LOOM_SHARD_INTERNAL_H
#define LOOM_SHARD_INTERNAL_H

#include "passes.h"

/* A placement on one mesh axis. */
typedef struct {
  int8_t kind;   /* SH_R, SH_S, SH_P */
  int8_t dim;
} Place;

/* A forward attention over cp: its source q, k, v and the per-rank merged output and lse,
   kept for the backward of the same attention. */
typedef struct {
  const Value *q, *k, *v;
  Value *o, *lse;
} CpForward;

/* ep: a value in expert space (rows of this rank's experts, from every rank), the local
   counts of the rows it came from, and its local-row form once made (shard_ep.c). */
typedef struct {
  Value *v, *cnt, *local;
  int64_t rows;   /* the rank's local rows it came from */
} EpSpace;
typedef struct {
  Value *cnt, *rcnt;
} EpCounts;

typedef struct Merged Merged;   /* shard_rows.c */

typedef struct Sharder {
  Module *m;
  Func *f;             /* the function being built (per-rank) */
  Value **map;         /* source value id -> per-rank value */
  int zero;            /* dp: the ZeRO stage */
  bool dp_in_step;     /* dp, ZeRO-0, one micro-batch a step, overlap on: gradients all-reduced
                          in @grad_step as the backward makes them (shard_dp_plan_global) */
  bool sp;             /* tp: sequence parallel */
  bool in_step;        /* building @grad_step or @forward (activations flow there) */
  int *zero_dim;       /* dp: per global index, the dim ZeRO splits over dp, or -1 */
  bool *undecided;     /* per global index: a gradient whose placement off dp the first accumulate decides */
  int64_t heads, kv_heads;   /* tp: of the model's attention (0: none) */
  bool cp_zigzag;            /* cp: the zigzag layout (else contiguous chunks) */
  /* cp's own resharding (shard_cp_reshard), reached through this pointer so that shard_emit.c's
     shard_reshard calls no axis file (the axis files call shard_emit.c) */
  Value *(*cp_reshard)(struct Sharder *s, Value *v, Place have, Place want);
  bool cp_allgather;         /* cp: attention all-gathers K/V (else the ring) */
  int64_t cp_tag;            /* cp: the next point-to-point tag */
  Merged *rows;              /* flattened [B*T,...] values whose T is split (shard_rows.c) */
  int n_rows, cap_rows;
  int rows_bucket[1024];
  CpForward cp_fwd[512];
  int n_cp_fwd;
  EpSpace *ep_space;         /* ep: expert-space values of the function being built */
  int n_ep_space, cap_ep_space;
  EpCounts ep_counts[1024];  /* ep: each moe_count's all_to_all'd counts */
  int n_ep_counts;
  /* reshard cache: (value, placement on an axis) -> converted value; cleared when the
     global it reads is written, never kept for ZeRO-3 parameters (re-gathered at each use) */
  struct { Value *from, *to; Sharding want; int next; } *cache;
  int n_cache, cap_cache;
  int cache_bucket[1024];    /* by `from`: the latest entry, chained by next (-1 ends; shard_cache_*) */
  char *err;
  size_t errlen;
  int failed;
} Sharder;

/* The reshard cache's entry for (from, want), or NULL (shard_emit.c); an entry added; the
   cache emptied (a function starts); every entry from g dropped (g written).  Bucketed by
   `from`, so that a function of many layers does not scan every earlier conversion. */
Value *shard_cache_find(const Sharder *s, const Value *from, const Sharding *want);
void shard_cache_add(Sharder *s, Value *from, Value *to, const Sharding *want);
void shard_cache_clear(Sharder *s);
void shard_cache_forget(Sharder *s, const Value *g);

/* What an op's sharding rule decides on one axis. */
typedef struct {
  Place need[256];   /* per operand */
  Place give[IR_MAX_RESULTS];
  int hint[256];     /* per operand: the dim a partial operand would rather be scattered to, or -1 */
} Decision;

/* Placements read as the rules write them: R replicated, P partial sums, S(d) split along d.
   Inline and file-local in every file that includes this header, so they need no prefix. */
static const Place R = {SH_R, 0}, P = {SH_P, 0};
static inline Place S(int d) { return (Place){SH_S, (int8_t)d}; }

static inline Place place_of(const Value *v, int axis) {
  Place p = {v->type.sh.kind[axis], v->type.sh.dim[axis]};
  return p;
}

static inline void set_place(Sharding *s, int axis, Place p) {
  s->kind[axis] = p.kind;
  s->dim[axis] = p.kind == SH_S ? p.dim : 0;
}

static inline bool place_eq(Place a, Place b) { return a.kind == b.kind && (a.kind != SH_S || a.dim == b.dim); }

/* ---- shard.c: types, errors, building the per-rank program ---- */

Type shard_local_type(const Module *m, Type global, const Sharding *sh);   /* per-rank dims under sh */
Type shard_global_type(const Module *m, const Value *v);                  /* whole dims of a per-rank value */
int shard_fail(Sharder *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A collective (or shard_slice/shard_pad into `parts` pieces) on one axis; the result is
   `result` there and placed like x elsewhere. */
Value *shard_collective_parts(Sharder *s, OpKind k, Value *x, int axis, int64_t dim, int64_t dim2, Place result,
                              const char *reduce, int64_t parts);
Value *shard_collective(Sharder *s, OpKind k, Value *x, int axis, int64_t dim, int64_t dim2, Place result,
                        const char *reduce);
/* Moves v to the placements `want` on every axis, inserting the collectives (cached). */
Value *shard_reshard(Sharder *s, Value *v, const Sharding *want);
/* An op on per-rank values with result placements `sh`; attributes copied from `like`. */
Value *shard_local_op(Sharder *s, OpKind k, Value **ops, int n, const Type *declared, Sharding sh, const Op *like);
/* Marks an embedding, target_pick or onehot as reading the vocabulary split over `axis`. */
Value *shard_set_vocab_axis(Value *v, int axis);

/* ---- shard_dp.c: the dp axis (data parallel, ZeRO 0-3) ---- */

/* A ZeRO-3 parameter: stored split over dp, gathered before each use. */
bool shard_dp_zero3_param(const Sharder *s, const Value *v);
/* Global gi's placement over dp (`param`: its parameter as the other axes place it). */
void shard_dp_plan_global(Sharder *s, int gi, const Global *g, bool grad, const Type *param, Sharding *sh);
/* A function argument's placement over dp; fails (IR_EINPUT) when the batch does not split. */
int shard_dp_plan_arg(Sharder *s, const Func *src, const Value *a, Sharding *sh);
/* How the dp rules see operand v (in: its placement, hint: where its partial sums go). */
void shard_dp_operand(const Sharder *s, const Value *v, Place *in, int *hint);
/* Where a partial operand of an elementwise op that is not linear in it is reduced to. */
Place shard_dp_partial_target(const Op *op, const Place *in, const Decision *d);

/* ---- shard_tp.c: the tp axis (tensor and sequence parallel) ---- */

void shard_tp_init(Sharder *s);   /* reads the attention's head counts */
/* Global gi's placement over tp (p: its parameter); sets the parameter's in `param`.
   Fails (IR_EINPUT, message in s->err) when tp does not divide the split dim. */
int shard_tp_plan_global(Sharder *s, int gi, const Global *p, bool grad, Sharding *sh, Type *param);
Place shard_tp_partial_target(const Sharder *s, const Op *op);
/* tp's own rule for an op, before the rules of every axis; false when it has none. */
bool shard_tp_rule(const Sharder *s, const Op *op, const Place *in, const Type *gin, Decision *d);
/* The per-rank forms that are a different computation (vocabulary-parallel cross-entropy,
   KV heads sliced per rank); true when op was emitted that way over `axis`. */
bool shard_tp_rewrite(Sharder *s, const Op *op, Value **ops, const Type *gin, int axis);

/* ---- shard_cp.c: the cp axis (context parallelism) ---- */

/* cp's own rule for an op (the split's start, rope, attention); false when it has none. */
bool shard_cp_rule(Sharder *s, const Op *op, const Place *in, const Type *gin, Decision *d);
/* A move on cp of a zigzag split (through the storage-order permutation); NULL: the plain one. */
Value *shard_cp_reshard(Sharder *s, Value *v, Place have, Place want);
/* The per-rank attention (ring or all-gather) of an attention or attention_grad. */
void shard_cp_emit_attention(Sharder *s, const Op *op, Value **ops);
/* Sets rope's seq_axis/seq_n/zigzag when its operand is split over cp. */
void shard_cp_mark_positions(Sharder *s, Op *c);

/* ---- shard_ep.c: the mixture-of-experts ops on every axis, and the ep axis ---- */

/* The MoE ops' rule on any axis (rows split alike; local counts); false for other ops. */
bool shard_moe_rule(Sharder *s, const Op *op, const Place *in, const Type *gin, int axis, Decision *d);
/* Global g's placement over ep (p: its parameter): a stack of experts S(0), others R (gradients P). */
void shard_ep_plan_global(const Global *p, bool grad, Sharding *sh);
/* Token inputs split over ep (with dp) along the batch. */
int shard_ep_plan_arg(Sharder *s, const Func *src, const Value *a, Sharding *sh);
/* The expert-parallel per-rank forms (all_to_allv into and out of expert space); true when
   op was emitted so. */
bool shard_ep_emit(Sharder *s, const Op *op, Value **ops, const Sharding *give);
/* Marks elementwise results of expert-space values; fails when another op reads one. */
void shard_ep_check(Sharder *s, const Op *op, Value **ops, Value *const *results);

/* ---- shard_rows.c: flattened [B*T,...] values whose T is split over tp (sp) or cp ---- */

void shard_rows_clear(Sharder *s);   /* a function starts */
void shard_rows_free(Sharder *s);
bool shard_rows_merged(const Sharder *s, const Value *v, int axis);
/* Merged operands of an op that cannot take them, gathered on their axes (gin updated). */
void shard_rows_prepare(Sharder *s, const Op *op, Value **ops, Type *gin);
/* The rule for a reshape into or out of merged rows; false for other ops. */
bool shard_rows_rule(Sharder *s, const Op *op, const Place *in, const Type *gin, int axis, Decision *d);
/* Before the operands move: the ones split beside merged rows, split in their order. */
void shard_rows_convert(Sharder *s, const Op *op, Value **ops, const Sharding *need);
/* After the op: marks the results that are merged rows. */
void shard_rows_mark(Sharder *s, const Op *op, Value **ops, Value *const *results);
/* After shard_reshard moved a value: its result keeps the rows' order where it stays split. */
void shard_rows_follow(Sharder *s, const Value *from, Value *to);
/* After a function: drops the flattenings that no op read. */
void shard_rows_sweep(Sharder *s, Func *f);

#endif
