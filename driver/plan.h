/* driver/plan.h — the planner's search (`loom plan`): the layouts of a model on N devices,
 * their step predicted by the time model (passes/timing.h) and their memory by the memory
 * plan, those that fit ranked by step time.  tools/cmd_plan.c parses the flags, calls
 * plan_search and prints; docs/planning.md says what the figures mean.
 *
 * Two searches, meant to give the same table (LOOM_PLAN_CHECK=1 runs both and compares):
 *   - the fast one (the default; driver/plan_fast.c says where it stands: at scale its
 *     estimates are still too far under the screened steps to leave few candidates to
 *     screen): every candidate's step and memory are
 *     estimated from a few compiled programs, one per distinct layer program (tp, cp,
 *     sequence parallelism, recomputation, micro-batch, pipeline schedule family), with dp,
 *     ZeRO, pp, the schedule (simulated by ir/schedule.c) and grad_accum derived from them;
 *     the candidates whose estimate could beat the finalists are then screened by compiling
 *     them (as the exhaustive search does), and the best compiled whole;
 *   - the exhaustive one (LOOM_PLAN_EXHAUSTIVE=1; driver/plan_screen.c): every candidate screened by compiling it
 *     with 1 and 2 layers a pipeline chunk.
 * Every printed row is a whole compile's: memory exactly the memory plan's.
 *
 * Files: plan.c (candidates, the exact phase, the entry point), plan_compile.c (compiling a
 * candidate: the passes in parts shared between candidates), plan_screen.c (the exhaustive
 * screening and its pruning), plan_fast.c (the estimates), plan_internal.h (what they share).
 */
#ifndef LOOM_DRIVER_PLAN_H
#define LOOM_DRIVER_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "frontend/config.h"
#include "ir/ir.h"
#include "passes/timing.h"

typedef struct {
  int64_t dp, tp, cp, pp, v, ep;   /* ep: experts split (mixture of experts; the batch splits over dp x ep) */
  int zero, sched;    /* sched: PipeKind, PIPE_NONE without pp */
  int rc;             /* RecomputeMode: none, selective (the default classes), full */
  bool sp;
  int64_t batch, ga;  /* the spec's batch (mbs x dp x ep) and grad_accum */
  double step_s, mem; /* screened (or estimated) figures, then a whole compile's */
  StepTime t;         /* a whole compile's (exact) */
  bool exact, fits;
  bool pruned;        /* not screened in full: step_s is a lower bound (see plan_screen.c) */
  double est_s, est_mem;   /* the fast search's estimate */
  bool has_first;          /* pruned after its first screening compile, whose figures these are */
  double first_s, first_mem;
} PlanCand;

typedef struct {
  const RunSpec *base;     /* the spec with --seq, --precision, --capacity-factor applied */
  const Hardware *hw;
  int target;              /* TARGET_CUDA or TARGET_CPU: the memory plan's storage sizes */
  int64_t gpus, seqs;      /* devices; sequences a step (the global batch) */
  int64_t fix_mesh[AX_COUNT], fix_batch, fix_v;   /* 0: searched */
  int fix_zero, fix_sched, fix_rc;                /* -1: searched */
  int top;                 /* the table's rows */
  bool exhaustive;         /* screen every candidate by compiling it (the search before the fast one) */
  bool progress;           /* a progress line and the search's summary on standard error */
} PlanRequest;

typedef struct {
  PlanCand *best;          /* the table: compiled whole, fitting, by step */
  int n_best;
  int n_cand, n_pruned, n_refused, compiles;   /* candidates (not buildable ones included), ... */
  int layer_programs;      /* the fast search: distinct layer programs compiled */
  double elapsed_s;
  double flops_per_token;  /* the model's FLOPs of one token's forward and backward (loom ir --flops) */
  double peak_flops;       /* one device's peak for the plan's matmuls */
} PlanResult;

/* Searches; 0 with the table in *out (plan_result_free), or 2 with the reason (nothing
   fits: the closest miss and what would help; no layout reaches the batch), 1 on a failure. */
int plan_search(const PlanRequest *rq, PlanResult *out, char *err, size_t errlen);
void plan_result_free(PlanResult *r);

/* Compiles c whole: its module (lowered), predicted step and memory per device. */
int plan_compile(const PlanRequest *rq, const PlanCand *c, Module **m, StepTime *t, int64_t *mem, char *err,
                 size_t errlen);

/* "dp=8 tp=2+sp pp=4 1f1b zero=1 mbs=2 ga=8 rc=full" */
void plan_layout_text(const PlanCand *c, char *buf, size_t n);

/* Tokens/s/device x the model's FLOPs a token / peak: MFU, the same for every recomputation
   (HFU, what the device executes, is the time model's StepTime.mfu). */
double plan_mfu(const PlanResult *r, const PlanRequest *rq, const PlanCand *c);

#endif
