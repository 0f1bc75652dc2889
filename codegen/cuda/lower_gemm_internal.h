/* codegen/cuda/lower_gemm_internal.h — what the files of the GEMM lowering share (not for the
 * other lowering files: cuda_internal.h names their entry points).  From the bottom up, each
 * calling only those above it (tests/lint/file_cycles.sh):
 *
 *   lower_gemm_match.c  the fusions' patterns (matchers: they change nothing)
 *   lower_gemm_views.c  views and gradient trees: GEMMs reading and adding in place
 *   lower_gemm_plan.c   cl_plan_bgrad: bias gradients, sums of three, GELU's backward, and the above
 *   lower_gemm.c        the GEMM steps, with what the plans chose
 */
#ifndef LOOM_CODEGEN_CUDA_LOWER_GEMM_INTERNAL_H
#define LOOM_CODEGEN_CUDA_LOWER_GEMM_INTERNAL_H

#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

/* lower_gemm_match.c */
/* A kernel func that only converts its one float argument to another float dtype. */
bool cl_gemm_is_cast_call(const Op *op);
/* Op `at` of f is `accumulate $g, v` into an f32 global of v's element count: $g, else NULL. */
const Value *cl_gemm_accumulates(const Func *f, int at, const Value *v);
/* What cl_fuse_grad_accum would take for op i, without marking anything: the global, and in
   *last the last op taken (the accumulate). */
const Value *cl_gemm_grad_accum(const Func *f, int i, int *last);
/* Same dtype and element count. */
bool cl_gemm_same_type(const Type *a, const Type *b);
/* Does op j of f read value v? */
bool cl_gemm_reads(const Func *f, int j, const Value *v);
/* A GEMM epilogue (lower_gemm_match.c's "GEMM epilogues"). */
typedef struct {
  const Value *bias, *residual;   /* the call's operands */
  const Value *out, *pre;         /* the call's results: the GEMM's C, and GELU's pre-activation */
} GemmEpilogue;
/* The matmul at op i and the kernel call at op j (> i) that uses its product, as e. */
bool cl_gemm_match_epilogue(const Func *f, int i, int j, GemmEpilogue *e);
/* Would the lowering make L->op one GEMM of batch 1 (after folding a shared weight's batch)? */
bool cl_gemm_is_single(const Lower *L);
/* May op j of f run before the matmul mm (lower_gemm.c runs the GEMM after it)? */
bool cl_gemm_may_precede(Lower *L, const Func *f, int j, const Op *mm);
/* Op j (a call) is the GELU backward of the product of the matmul at op i: its pre-activation
   and results (db NULL without the reduction) in *pre, *dx, *db. */
bool cl_gemm_match_dgelu(Lower *L, const Func *f, int i, int j, const Value **pre, const Value **dx, const Value **db);

/* lower_gemm_views.c: slices as views (L->view, view_ld), gradient trees (L->acc_into, acc_ld,
   leaf_into, leaf_of, skip). */
void cl_gemm_plan_views(Lower *L, const Func *f);
void cl_gemm_plan_trees(Lower *L, const Func *f);

#endif
