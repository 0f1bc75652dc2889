/* passes/timing.h — the time model of one training step of a partitioned program: what
 * `loom ir --time --hw H100` prints and what the planner (issue 16) ranks layouts by.
 *
 * Inputs: the per-rank module (after `shard`, best after `lower`, whose fused kernels are
 * the memory traffic the run really has) and a Hardware description (driver/hardware.c reads
 * it from models/hardware/NAME.json).  Every op gets a time from its FLOPs and bytes
 * (roofline: the larger of FLOPs / (peak · efficiency) and bytes / (bandwidth · efficiency),
 * plus a per-op overhead), every collective from an alpha-beta model of its ring algorithm
 * over the link its axis group spans (timing.c has the formulas).  A step is grad_accum
 * calls of @grad_step and one @optimizer_step; a pipeline's step is its schedule simulated
 * with each chunk function's time (ir/schedule.c), which gives the bubble, plus the slowest
 * stage's optimizer step.  Within a function, compute runs on one clock and collectives
 * one after another on the rank's communication queue: a blocking collective waits for
 * itself, an async one (X_start ... wait, the overlap pass's) runs while the ops between
 * its start and its wait compute, and only the wait's idle time is exposed.
 */
#ifndef LOOM_PASSES_TIMING_H
#define LOOM_PASSES_TIMING_H

#include <stdio.h>

#include "ir/ir.h"
#include "passes/passes.h"

enum { LINK_INTRA, LINK_INTER };

/* The memory-bound ops by category (the names and split of codegen/cuda/cost.c's table, so a
   measured LOOM_PROFILE table maps onto them): each may have an efficiency of its own in the
   hardware file ("efficiency": {"norm": 0.6, ...}); one it lacks uses "memory".  timing_category
   says which an op is. */
typedef enum { TC_NORM, TC_ELEMENTWISE, TC_LOSS, TC_OPTIMIZER, TC_CAST, TC_REDUCE, TC_COPY, TC_COUNT } TimingCat;
extern const char *const timing_cat_names[TC_COUNT];
int timing_category(const Op *op);
#define TIMING_TOP 8

typedef struct {
  char name[128];
  double peak_flops[DT_COUNT];   /* dense FLOP/s per device by compute dtype; 0: unknown (f32's is used) */
  double mem_bytes;              /* device memory */
  double mem_bw;                 /* bytes/s */
  int64_t devices_per_node;
  double link_bw[2];             /* bytes/s one device sends in one direction: intra-node, inter-node */
  double link_lat[2];            /* seconds per message step (alpha) */
  double eff_matmul, eff_attention, eff_memory, eff_link;   /* fractions of the peaks above */
  double eff_cat[TC_COUNT];      /* per category of memory-bound op; 0: eff_memory */
  double op_overhead;            /* seconds added per op (a kernel launch, a dispatch) */
  int axis_order[AX_COUNT];      /* placement on the machine, innermost first (tp cp ep dp pp) */
} Hardware;

/* The default placement: tp innermost (within a node), then cp, ep, dp, pp outermost. */
void hardware_default_order(int order[AX_COUNT]);

/* The link an axis's groups run over: intra-node when a group's ranks (those differing only
   in that axis, `stride` apart where stride is the product of the inner axes' sizes) lie
   within one node, else inter-node. */
int timing_axis_link(const Hardware *hw, const Mesh *mesh, int axis);

/* Alpha-beta time of one collective over n ranks whose per-rank buffer (the larger of input
   and output) holds `bytes`, ring algorithms:
     all_reduce         2(n-1) alpha + 2(n-1)/n bytes / beta
     all_gather,
     reduce_scatter,
     all_to_all          (n-1) alpha +  (n-1)/n bytes / beta
     send / recv               alpha +          bytes / beta        (n ignored) */
double timing_collective(OpKind kind, int64_t n, double bytes, double beta, double alpha);

typedef struct {
  double compute_s;           /* ops whose FLOPs bound them (matmul, attention) */
  double memory_s;            /* ops bound by memory traffic (fused kernels, data movement, optimizer) */
  double memory_cat_s[TC_COUNT];   /* memory_s by category */
  double overhead_s;          /* per-op overhead */
  double comm_s[AX_COUNT];    /* collective and transfer time per axis */
  double exposed_comm_s;      /* the time ranks wait for collectives (comm_s less what compute hides) */
  double bubble_s;            /* pipeline: the slowest rank's idle time in the schedule */
  double optimizer_s;         /* @optimizer_step (the slowest stage's with pp) */
  double step_s;              /* one optimizer step, per rank (ranks run in lockstep) */
  double model_flops;         /* matmul + attention FLOPs of one step, per rank */
  double peak_flops;          /* the peak the MFU is against (the matmuls' dtype) */
  double mfu;                 /* model_flops / (step_s · peak_flops) */
  int link[AX_COUNT];         /* LINK_INTRA / LINK_INTER for every axis of size > 1 */
  struct {                    /* the ops that take the most time per step (calls x time) */
    const Func *func;
    const Op *op;
    double s;
  } top[TIMING_TOP];
} StepTime;

/* Predicts one step.  grad_accum: micro-batches per step (a pipeline's comes from the
   module).  Returns 0, or 2 with a message when the module is not a training program. */
int timing_predict(const Module *m, const Hardware *hw, int64_t grad_accum, StepTime *out, char *err, size_t errlen);
/* The same with some functions' call times given (given[i] for m->funcs.items[i], i <
   n_given; FuncFigures: passes.h): those are not walked, so out's step_s, optimizer_s and
   bubble_s are timing_predict's but its per-class totals leave them out. */
int timing_predict_given(const Module *m, const Hardware *hw, int64_t grad_accum, const FuncFigures *given, int n_given,
                         StepTime *out, char *err, size_t errlen);
/* One call's time of f (a function of m), as timing_predict counts it. */
double timing_call_s(const Func *f, const Module *m, const Hardware *hw);

/* The breakdown `loom ir --time` prints; tokens: tokens of one step over all ranks. */
void timing_report(FILE *out, const Module *m, const Hardware *hw, const StepTime *t, double tokens);

#endif
