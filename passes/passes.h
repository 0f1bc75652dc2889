/* passes/passes.h — the pass manager and the passes, one file each.
 *
 *   pass_manager.c  pipelines ("a,b,c"), hooks around every pass: print, dump, verify, time
 *   util.c          helpers shared by passes: replace uses, remove dead ops; train_defaults
 *   verify.c        pass "verify": runs the IR verifier
 *   dce.c           pass "dce": removes ops whose results are never used
 *   cse.c           pass "cse": merges identical ops
 *   canonicalize.c  pass "canonicalize": folds identities and chains of data movement
 *   precision.c     pass "mixed-precision": bf16 compute on f32 master weights
 *   autodiff.c      pass "autodiff": @forward -> @grad_step (forward, loss, backward)
 *   optimizer.c     pass "optimizer": @optimizer_step (norm, clipping, AdamW, zeroing)
 *   fuse.c          pass "fuse": elementwise/broadcast/reduction chains -> kernel funcs + call
 *   memory_plan.c   pass "memory-plan": arena offsets (liveness, aliasing, in place); memory_report()
 *   memory_cuda.c   the CUDA lowering's bytes past the arena (stats area, scratch) the memory figures count
 *   memory_rank.c   memory per rank of a partitioned (and pipelined) program: loom plan, recompute auto
 *   shard.c         pass "shard": per-rank program over the mesh, collectives inserted; the
 *                   axes' own rules in shard_dp.c (dp, ZeRO), shard_tp.c (tp, sp), shard_cp.c
 *                   (cp, ring attention), shard_ep.c (experts); shard_emit.c builds the
 *                   per-rank ops and collectives they all use (shard_internal.h)
 *   bucket.c        pass "bucket": dp gradient all-reduces packed into buckets
 *   pipeline.c      pass "pipeline": the step cut into per-chunk functions with send/recv (pp);
 *                   each op's chunk in pipeline_units.c, the chunk functions in
 *                   pipeline_chunks.c, the per-rank optimizer steps in pipeline_optimizer.c
 *                   (pipeline_internal.h)
 *   recompute.c     pass "recompute": forward ops cloned into the backward instead of kept
 *                   (--recompute selective|full|auto; auto fits --memory-budget)
 *   overlap.c       pass "overlap": collectives as start/wait, starts hoisted and waits sunk
 *                   (ZeRO-3 gathers one layer ahead); --overlap false leaves them
 *   verify_collectives.c  pass "verify-collectives": every rank's collectives and transfers
 *                   match and cannot deadlock under the schedule
 *   flops.c, timing.c  analyses, not passes: model FLOPs (`--flops`) and the predicted step
 *                   time on a hardware description (`--time`, passes/timing.h)
 *   lower_memo.c    lowering each distinct function once (loom plan; passes/lower_memo.h)
 *   (ir/schedule.c: the pipeline schedules as data, which the pass and the runtime share)
 */
#ifndef LOOM_PASSES_H
#define LOOM_PASSES_H

#include "ir/ir.h"
#include "ir/schedule.h"

typedef struct PassContext PassContext;

typedef struct {
  const char *name;      /* kebab-case, as written in pipelines */
  const char *summary;   /* one line, shown by `loom ir --list-passes` */
  int (*run)(Module *m, PassContext *ctx, char *err, size_t errlen);
} Pass;

/* Training settings the training passes read (autodiff, optimizer, mixed-precision). */
typedef struct {
  int64_t grad_accum;        /* micro-batches per optimizer step: the loss seed is 1/grad_accum */
  double beta1, beta2, eps, weight_decay, grad_clip;
  bool bf16;                 /* mixed precision: bf16 compute, f32 master weights */
  int zero;                  /* ZeRO stage over dp: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters */
  bool sp;                   /* sequence parallel: activations between tp regions split along the sequence */
  double bucket_mb;          /* data-parallel gradient all-reduce buckets, MB (10^6 bytes); 0: one per gradient */
  bool overlap;              /* the overlap pass: collectives as start/wait, moved apart (default true) */
  /* context parallelism (shard_cp.c, when the mesh has cp > 1) */
  bool cp_contiguous;        /* the sequence in cp contiguous chunks (default: zigzag's 2cp half-chunks) */
  bool cp_allgather;         /* attention gathers K/V over cp (default: a ring of point-to-point transfers) */
  /* pipeline parallelism (the pipeline pass, when the mesh has pp > 1) */
  int pp_schedule;           /* PipeKind; 0: 1f1b */
  int pp_virtual;            /* chunks per pp rank; 0: the schedule's default */
  int n_pp_split;            /* pp_split: the first layer of every chunk (n = pp x virtual), or 0: balanced */
  int64_t pp_split[256];
  /* recomputation (the recompute pass) */
  int recompute;             /* RecomputeMode (ir.h); 0: none */
  unsigned recompute_classes;/* selective: RC_* op classes */
  int64_t memory_budget;     /* auto: bytes per rank the planned peak must fit */
} TrainSettings;
extern const TrainSettings train_defaults;

enum { TARGET_CPU, TARGET_CUDA };

/* Options of one pipeline run. */
typedef struct {
  const TrainSettings *train;   /* NULL: train_defaults */
  int target;                   /* TARGET_CPU (default) or TARGET_CUDA: storage sizes for memory-plan */
  const char *print_after[64];  /* pass names: print the IR after each of them */
  int n_print_after;
  bool print_after_all;
  const char *dump_dir;         /* write NN-<pass>.ir files here */
  bool verify_each;             /* run the verifier after every pass */
  bool time_passes;             /* report the time of every pass */
  bool no_self_checks;          /* memory-plan skips its own overlap check (loom plan's screening) */
  FILE *print_to;               /* where printed IR and timings go (default stderr) */
  /* A reproducer when a pass fails (pass_manager.c): the IR before the pass
     (before-<pass>.ir) and rerun.sh (repro_cmd followed by --passes=<the pipeline up to that
     pass>) in dump_dir, or else, when the failure is not a refusal of the input (IR_EINPUT),
     in a new folder under $TMPDIR.  repro_cmd: the command (a `loom ir` line) that rebuilds the
     pipeline's input; NULL: no reproducer. */
  const char *repro_cmd;
  /* verify-collectives: other programs for some ranks (`loom ir --rank-ir R=FILE`) */
  const Module *rank_ir[16];
  int rank_ir_rank[16];
  int n_rank_ir;
} PassOptions;

struct PassContext {
  const PassOptions *opt;
  /* counters a pass may report, e.g. "dce: removed 12 ops" in --time-passes output */
  int changed;
  /* pipeline_run itself, for a pass that runs a sub-pipeline (recompute measures a
     candidate's memory by planning it) */
  int (*run_pipeline)(Module *m, const char *pipeline, const PassOptions *opt, char *err, size_t errlen);
};

const Pass *pass_lookup(const char *name);
void pass_list(FILE *out);
/* Checks that every name in the comma-separated list is a known pass. */
int pipeline_check(const char *pipeline, char *err, size_t errlen);
/* Runs the passes in order with the hooks of `opt` (may be NULL). */
int pipeline_run(Module *m, const char *pipeline, const PassOptions *opt, char *err, size_t errlen);

/* The pipeline `loom ir` runs when none is given, the one training adds, and lowering.
   In --passes, the words "train" and "lower" stand for these lists. */
#define DEFAULT_PIPELINE "verify,canonicalize,cse,dce,verify"
#define TRAIN_PIPELINE \
  "verify,canonicalize,mixed-precision,autodiff,optimizer,shard,recompute,pipeline,bucket,canonicalize,cse,dce,overlap," \
  "verify,verify-collectives"
#define LOWER_PIPELINE "fuse,memory-plan,verify"
/* The decode graph (loom sample, frontend_build_decode): no training passes. */
#define DECODE_PIPELINE "verify,canonicalize,cse,dce,fuse,memory-plan,verify"
/* loom eval: with --grads (autodiff adds @grad_step; no optimizer), and the forward of a
   mesh (partitioned, no training passes). */
#define EVAL_GRADS_PIPELINE "verify,canonicalize,mixed-precision,autodiff,cse,dce,verify"
#define EVAL_MESH_PIPELINE "verify,canonicalize,mixed-precision,shard,canonicalize,cse,dce,verify"

/* The most buffers (inputs + outputs) one fused kernel passes: runtime/program.h's
   RT_MAX_BUFS (passes may not include the runtime). */
#define FUSE_MAX_BUFS 16

/* pipeline_units.c: the split of L layers into C chunks (1 <= C <= L) the pipeline pass makes
   when --pp-split gives none: a chunk of layers k..l-1 costs layer[k] + ... + layer[l-1], plus
   `first` on the first chunk (the embedding) and `last` on the last (the head); the largest
   chunk's cost is made least, ties going to the later start.  start[0..C): each chunk's first
   layer (start[0] = 0).  The planner (driver/plan_fast.c) mirrors the pass's split with it.
   -1 (start unset) when out of memory or C is out of range. */
int pipeline_chunk_starts(int C, int L, const double *layer, double first, double last, int *start);

/* autodiff.c: the op whose result is the backward's seed (d loss = 1 / grad_accum, named
   %loss_seed): the ops after it are the backward's (pipeline, recompute). */
bool op_is_loss_seed(const Op *op);

/* flops.c: the model FLOPs of a function (matmuls, attention; see the file) and the report
   of `loom ir --flops`. */
void flops_of(const Func *f, double *matmul, double *attention);
double flops_op(const Op *op);   /* one op's (matmul + attention) */
void flops_report(FILE *out, const Module *m);
/* memory_plan.c: parameters, gradients, optimizer state and each function's arena peak. */
void memory_report(FILE *out, Module *m, int target);
/* The planned peak per rank: state (every global) + the largest function arena (after
   memory-plan); the two parts into *state and *arena when not NULL. */
int64_t memory_planned_peak(const Module *m, int target, int64_t *state, int64_t *arena);
/* memory_cuda.c: the bytes the CUDA lowering adds past f's arena (0 on the cpu target): its
   stats area (the norms' mean and rstd, attention's log-sum-exp and f32 O, the fused
   classifier's loss rows) and its scratch; the two apart into *stats and *scratch; and f's
   arena with them (memory-plan's arena_bytes + memory_cuda_extra), what every memory figure
   counts for a function. */
int64_t memory_cuda_extra(const Func *f, int target);
void memory_cuda_extra_parts(const Func *f, int target, int64_t *stats, int64_t *scratch);
int64_t memory_func_arena(const Func *f, int target);
/* The bytes of the CUDA backend's 2-byte weight copies (0 on the cpu target). */
int64_t memory_weight_copies(const Module *m, int target);
/* memory_rank.c: the largest memory of any rank, pipelined or not (see the file); -1 when a
   pipelined module's schedule cannot be built. */
int64_t memory_rank_peak(const Module *m, int target);
/* What lowering gives one function, for a function left unlowered whose figures are known
   (`loom plan` lowers equal functions once, ir/hash.c): a call's predicted time
   (timing_call_s), its arena (memory-plan's), and the globals its ops read or write once
   lowered (indices in m->globals). */
typedef struct {
  bool given;
  double call_s;
  int64_t arena_bytes;
  int n_globals;
  const int *globals;
} FuncFigures;
/* memory_weight_copies where given[i].given marks a function figured by the planner's memo,
   not lowered yet (its bare casts count as the kernel calls fuse will make). */
int64_t memory_weight_copies_given(const Module *m, int target, const FuncFigures *given, int n_given);
/* memory_rank_peak with given[i] standing for m->funcs.items[i] where i < n_given and
   given[i].given. */
int64_t memory_rank_peak_given(const Module *m, int target, const FuncFigures *given, int n_given);
/* What the forward leaves alive for the backward: live bytes right after the op that
   computes f's returned loss (0 when f returns no computed value). */
int64_t memory_activations(Func *f, int target);
/* The most bytes alive at once in f under its plan (a value from its op to its last reader;
   outputs written in place over a dying input count once): what a plan without
   fragmentation would need.  Needs memory-plan's offsets. */
int64_t memory_live_peak(Func *f, int target);
/* shard.c: the collectives of a partitioned module, by function, kind and axis. */
typedef struct {
  const Func *func;
  OpKind kind;
  int axis;
  int64_t count, payload;   /* payload: bytes of the operands */
  double sent;              /* bytes one rank sends (ring algorithms) */
} CollectiveCount;
int collective_summary(const Module *m, const char *func, CollectiveCount *out, int max);
void collective_report(FILE *out, const Module *m);

/* verify_collectives.c: rank k runs mods[k] (world of them, one mesh); 0 when their
   collectives and transfers match and cannot deadlock, else the first violation. */
int verify_collectives_ranks(const Module *const *mods, int world, char *err, size_t errlen);

/* Checks that no two buffers alive at the same time share bytes (except aliases). */
int memory_plan_check(Func *f, int target, char *err, size_t errlen);

/* GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX: ir/ir.h (the runtime's executors read them too). */

/* util.c */
/* Rewrites every use of values by their replacement: repl[v->id] (NULL = keep).  Ids
   must come from func_number() on f before the rewrite. */
void replace_uses(Func *f, Value **repl);
/* Removes ops without effects whose results are never used; returns how many. */
int remove_dead_ops(Func *f);
/* The index of the send whose message f's op i (a recv with a relative peer: a cp ring's
   K/V or dK/dV) receives: the nearest send before it on the same axis with the same tag;
   -1 when op i is not such a recv. */
int ring_send_of(const Func *f, int i);

#endif
