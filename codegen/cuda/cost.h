/* codegen/cuda/cost.h — what a lowered CUDA program costs, counted off the GPU: every launch
 * and library call of a step in order with its category, the FLOPs it must do, the bytes it
 * must move and its roofline bound on a given hardware (`loom ir --cost`); and the same
 * per-step figures for the measured profile (LOOM_PROFILE=1 on the CUDA backend).
 *
 * Counted from the RtProgram alone (cuda_lower's steps and kernel names), so a compiled
 * executable's program is counted the same way:
 *   - bytes: every buffer of the step read (inputs) or written (outputs) once, at its storage's
 *     size; a GEMM reads A and B and writes C (and reads C too when it accumulates, beta = 1),
 *     a shared operand (batch stride 0) once.  A lower bound: what the step cannot avoid.
 *   - FLOPs: GEMMs 2·batch·M·N·K (and an epilogue's work is not counted); attention per
 *     kernel 4 (forward), 6 (dq: scores, dP, dQ) or 8 (dk dv: scores, dP, dV, dK) x
 *     B·H·T·S·D, halved when causal; the grouped matmuls 2·R·K·N; everything else 0 (memory
 *     bound: its FLOPs are a few per byte).
 *   - bound: max(FLOPs / (peak of the operands' dtype x efficiency), bytes / (bandwidth x
 *     memory efficiency)), the efficiencies of the hardware file (1 as shipped).
 * A step is grad_accum calls of @grad_step and one @optimizer_step (a module without them:
 * every function once).
 */
#ifndef LOOM_CODEGEN_CUDA_COST_H
#define LOOM_CODEGEN_CUDA_COST_H

#include <stdbool.h>
#include <stdio.h>

#include "passes/timing.h"
#include "runtime/program.h"

typedef enum {
  CC_GEMM,
  CC_ATTENTION,
  CC_NORM,
  CC_ELEMENTWISE,
  CC_LOSS,
  CC_OPTIMIZER,
  CC_CAST,
  CC_REDUCE,
  CC_COPY,
  CC_COMM,
  CC_COUNT
} CudaCostCat;

const char *cuda_cost_cat_name(int cat);   /* "gemm", "attention", ... */

/* One step's category, FLOPs and bytes (see the top of this file). */
typedef struct {
  int cat;
  double flops, bytes;
  int peak_dtype;   /* the DType whose peak bounds its FLOPs (DT_F32 when it has none) */
} CudaStepCost;
void cuda_step_cost(const RtProgram *p, const RtStep *st, CudaStepCost *out);

/* The roofline bound of a step on hw, seconds. */
double cuda_step_bound(const CudaStepCost *c, const Hardware *hw);

/* Calls of function f of p in one training step: grad_accum for @grad_step, 1 for
   @optimizer_step, 0 for the others; every function once when p has neither. */
int64_t cuda_cost_calls(const RtProgram *p, int f, int64_t grad_accum);

typedef struct {
  int64_t grad_accum;
  double flops[CC_COUNT], bytes[CC_COUNT], bound_s[CC_COUNT];
  int64_t launches[CC_COUNT];  /* steps a training step runs, per category */
  double total_flops, total_bytes, total_bound_s;
  int64_t total_launches;
} CudaCost;

/* The totals of one training step of p (grad_accum micro-batches). */
void cuda_cost(const RtProgram *p, const Hardware *hw, int64_t grad_accum, CudaCost *out);

/* The report of `loom ir --cost`: every step of the counted functions in order, then the
   totals per category; or the same as one JSON object. */
void cuda_cost_report(FILE *out, const RtProgram *p, const Hardware *hw, const CudaCost *c, bool json);

/* The measured profile (LOOM_PROFILE on the CUDA backend): ms[f] the time of each step of one
   call of function f (NULL: not profiled), the calls of a step as cuda_cost_calls counts them.
   Prints per category and per kernel (the top `top` by time; a GEMM is "cublasLtMatmul" with
   its shape): calls, ms a step, achieved TFLOP/s and GB/s, and the % of the roofline bound
   on hw (bound / measured). */
void cuda_profile_report(FILE *out, const RtProgram *p, const Hardware *hw, const float *const *ms, int64_t grad_accum,
                         int top);

#endif
