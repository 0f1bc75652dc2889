/* codegen/cuda/cuda_internal.h — what kernel.c and the lower*.c files share (private to codegen/cuda). */
#ifndef LOOM_CODEGEN_CUDA_INTERNAL_H
#define LOOM_CODEGEN_CUDA_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda.h"
#include "codegen/text.h"


/* How a fused kernel walks its iteration space. */
typedef enum {
  CK_ELEMENTWISE,   /* no reductions: grid-stride loop over N, 256 threads */
  CK_SERIAL,        /* reductions of <= 32 elements: one thread per output, sequential */
  CK_ROW,           /* innermost dims reduced: one block per output, block reduction */
  CK_COLUMN,        /* innermost dims kept: blocks of 32 x BY threads, 32 outputs each */
} CudaKernelMode;

typedef struct {
  CudaKernelMode mode;
  int64_t N;          /* elements of the space */
  int64_t out_n;      /* reduction outputs (modes with reductions) */
  int64_t count;      /* elements per output */
  uint32_t block[3];
  int64_t work;       /* grid-stride units: elements, outputs or groups of 32 outputs */
  int64_t per_block;  /* units one block covers in one pass */
  /* Split reductions (ROW and COLUMN with few outputs and long reductions): each output's
     reduced range is cut into `split` parts, one block each; the kernel writes the parts'
     results to scratch (after its results: buffer n_args + n_rets), and a second kernel
     (the "finish" body, one thread per output) combines them in order and stores the
     reduction results (its buffers: the scratch, then the reduction results in order). */
  int64_t split;          /* 1: not split */
  int64_t scratch_bytes;  /* of the parts */
  int n_red;              /* reduction results */
  uint32_t fin_block;
  int64_t fin_work;       /* outputs */
} CudaKernelInfo;

/* The body of a fused kernel: the text after "extern \"C\" __global__ void NAME(LoomArgs a)"
   (starting with "{"), and how to launch it; with info->split > 1 also the body of its finish
   kernel in *fin.  Fails naming the op on what is unsupported. */
int cuda_kernel_body(const Func *k, Str *out, Str *fin, CudaKernelInfo *info, char *err, size_t errlen);

/* A float constant as CUDA C text that reads back as the same float. */
void cuda_float_literal(float f, char *buf, size_t n);

/* ---------------------------------------------------------------- lowering (lower.c, lower_mesh.c, lower_gemm.c)
   The state of cuda_lower while it lowers one function, and the step builders lower.c
   defines for the files that lower an op family of their own (lower_mesh.c: a partitioned
   program's collectives and per-rank ops). */
#define KNAME 32   /* RtProgram.kernel_names entries, NUL included */

struct Steps;
typedef struct Lower {
  const Module *m;
  RtProgram *p;
  const Func *f;
  const Op *op;
  int64_t *global_offset;
  RtRegion *global_region;
  /* kernel symbols of the translation unit, in order of first use */
  char (*names)[KNAME];
  int n_names, cap_names;
  Str text;                 /* the kernels and wrappers */
  /* fused kernels, per func index of the module */
  int *fused_symbol;
  int *fused_fin;            /* the finish kernel of a split reduction, or -1 */
  CudaKernelInfo *fused_info;
  /* unique fused bodies (dedup): text and symbols */
  char **bodies;
  uint64_t *body_hash;
  int *body_symbol, *body_fin;
  int n_bodies;
  int64_t scratch;           /* scratch bytes the current function's steps need */
  bool *skip;                /* per op of the current function: lowered with an earlier op */
  int *defer;                /* per op: the matmul after which it is lowered (cl_plan_bgrad), or -1 */
  const Value **bgrad;       /* per op: the bias gradient a matmul writes in its epilogue, or NULL */
  bool *bgrad_scratch;       /* per op: ... to scratch, where its deferred users read it */
  int *gemm_at;              /* per op (a call): the matmul lowered in its place (DGELU), or -1 */
  const Value **resid;       /* per op (a matmul): a value its GEMM adds (C, beta = 1), or NULL */
  int *sum_into;             /* per op (a matmul): the 3-way sum call its GEMM finishes, or -1 */
  /* per value id: a slice (or its reshape) that is a view of its operand's buffer, no copy
     (view[id].n > 0): at view[id] with row stride view_ld[id] (0: contiguous, cl_buf_of
     gives it; else only a GEMM operand reads it, with that stride) */
  RtBuf *view;
  int64_t *view_ld;
  int n_view;
  /* gradient trees (lower_gemm.c): per value id, a product its GEMM adds into a view of an f32
     gradient (acc_into[id].n > 0, row stride acc_ld[id]); per op, a pad lowered as the
     accumulation of its operand into a view of one (leaf_into[k].n > 0, leaf_of[k] the value) */
  RtBuf *acc_into;
  int64_t *acc_ld;
  RtBuf *leaf_into;
  const Value **leaf_of;
  const Value *moved_value;  /* a value cl_buf_of places at moved_offset of the arena, or NULL */
  int64_t moved_offset;
  bool adamw_in_place;       /* the current adamw writes its parameter and moments directly */
  int *handle;               /* per value id of the current function: its collective start's handle */
  int n_handles;
  int n_values;              /* value ids of the current function (func_number) */
  /* lower_fuse.c, the bf16 weight copies: per global, its copy's offset in the parameter
     region (-1: none) and dtype; per value id of the current function, the buffer that holds
     the value instead of its arena place (a parameter's copy, the stats area), where value_has */
  int64_t *copy_offset;
  DType *copy_dtype;
  RtBuf *value_buf;
  bool *value_has;
  /* lower_fuse.c, the norms (and lower_attn.c, attention): the op index being lowered; per op
     of the current function, the offset in its stats area of the statistics a gradient op
     reads (-1: none); the stats area's bytes (past the arena and its scratch, placed at the
     function's end) */
  int op_index;
  int64_t *norm_stats;
  int64_t stats_bytes;
  /* the dispatcher (lower.c's op lowering), for a family that lowers an op it had deferred
     (lower_gemm.c): a hook, so that no split-off file calls back into lower.c */
  int (*lower_op)(struct Lower *L, struct Steps *s, int *i);
  /* lower_moe.c: the last operand padded to [E, cap, ...] at the start of scratch (its value,
     counts, function, buffer, and the step count after it): the next batched matmul of the
     same operand reuses it while no step since has written that part of scratch */
  const Value *moe_pad_of, *moe_pad_cnt;
  const Func *moe_pad_f;
  RtBuf moe_pad_buf;
  int moe_pad_steps;
  char *err;
  size_t errlen;
} Lower;

typedef struct Steps {
  RtStep *items;
  int n, cap;
} Steps;

/* steps.c: the step builders (see its opening comment). */
int cl_fail(Lower *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cl_storage_of(DType dt);                 /* a dtype's RtStorage on CUDA, or -1 */
int cl_st_size(int storage);                 /* bytes per element of an RtStorage */
bool cl_env_on(const char *name);            /* the variable is set, not empty and not "0" */
bool cl_fuse_narrow(void);                   /* LOOM_CUDA_FUSE_BF16 (lower_gemm_match.c says what it allows) */
int cl_buf_of(Lower *L, const Value *v, RtBuf *b);   /* a value's buffer: its region and place */
/* A new step of the current op (zeroed, launch 1x1x1, labelled "<op> %<result><suffix>"). */
RtStep *cl_new_step(Lower *L, Steps *s, RtStepKind kind, int which, const char *suffix);
/* Buffers: in[] as inputs, then the op's results (if results) as outputs. */
int cl_set_bufs(Lower *L, RtStep *st, const Value *const *in, int n_in, bool results);
int cl_set_operand_bufs(Lower *L, RtStep *st);   /* the op's operands, then its results */
int cl_push_int(Lower *L, RtStep *st, int *n, int64_t v);   /* st->i[(*n)++] = v, checked */
void cl_launch_ew(RtStep *st, int64_t n);        /* a grid-stride launch over n items */
/* Kernel "loom_<base>_<storage letters of bufs idx[]><suffix>" = template tmpl on those
   storages (+ extra template arguments); sets st->which.  A step with tensor maps
   (st->tmaps > 0) gets a wrapper that takes them and calls tmpl(a, t). */
int cl_instantiate(Lower *L, RtStep *st, const char *base, const char *tmpl, const int *idx, const char *extra,
                   const char *suffix, int max_threads);
/* An extern "C" wrapper `name` calling the prelude's `call`; its symbol index or -1. */
int cl_builtin_symbol(Lower *L, const char *name, int max_threads, const char *call);
int64_t cl_prod_dims(const Type *t, int from, int to);   /* dims [from, to) multiplied */
bool cl_overlap(const RtBuf *a, const RtBuf *b);   /* do two buffers share bytes? */
/* lower.c: the multi-tensor AdamW and the fills of neighbouring globals, merged into one launch
   each (after a function is lowered). */
void cl_merge_updates(const Lower *L, RtFunc *rf);
/* lower_grads.c: drops the optimizer's zero fills of the gradients and adds the first
   micro-batch's @grad_step, which writes them (RT_FUNC_FIRST_GRAD_STEP), where it can. */
int cl_first_grads_func(Lower *L, RtProgram *p);
int cl_uses(const Func *f, const Value *v);        /* uses of v as an operand or result of f */
int cl_lower_call(Lower *L, Steps *s);             /* the call L->op: its fused kernel's step(s) */
int cl_fused_kernel(Lower *L, int fi);             /* kernel func fi's symbol (once per distinct body) */
/* Appends an output buffer of n f32 (i32) in the scratch past the arena, at byte `at` of it. */
int cl_add_scratch(Lower *L, RtStep *st, int64_t at, int64_t n);
int cl_add_scratch_i32(Lower *L, RtStep *st, int64_t at, int64_t n);
int64_t cl_last_dim(const Type *t);                /* the innermost dim (1 for a scalar) */
uint32_t cl_clamp_grid(int64_t blocks, int64_t max);   /* blocks clamped to [1, max] */
uint32_t cl_row_threads(int64_t D);                /* threads of a block per row of D */
void cl_launch_rows(RtStep *st, int64_t rows, int64_t D);   /* one block per row */
/* Raw data movement "loom_<base>_<size>" = template tmpl on elements of size bytes. */
int cl_instantiate_raw(Lower *L, RtStep *st, const char *base, const char *tmpl, int size);
bool cl_all_float(const RtStep *st);               /* no i32 buffer */
/* seq_axis of L->op (rope, the attention blocks) as program.h has it: the axis + 1, 0 whole */
int cl_seq_axis1(Lower *L, int64_t *axis1);
/* lower.c: op *i as lower_func does (*i: the last op taken); reached from the other files
   through L->lower_op */
int cl_lower_op(Lower *L, Steps *s, int *i);

/* lower_gemm*.c: matmuls as cuBLASLt steps and the fusions around them (lower_gemm_internal.h
   names the files).  cl_fuse_grad_accum:
   op i (a matmul or cast call) followed by the accumulation of its result into an f32
   gradient: that global (the ops it takes over marked in L->skip), or NULL.
   cl_lower_cast_accumulate: the cast call L->op and its accumulation into g as one step.
   cl_lower_matmul_op: the matmul L->op (op i), with an epilogue where its user matches one,
   accumulating into acc where acc is not NULL. */
const Value *cl_fuse_grad_accum(Lower *L, const Func *f, int i);
int cl_lower_cast_accumulate(Lower *L, Steps *s, const Value *g);
int cl_lower_matmul_op(Lower *L, Steps *s, int i, const Value *acc);
/* lower_gemm_plan.c: before the current function's ops are lowered: allocates L->defer and L->bgrad and finds the
   bias-gradient reductions a weight-gradient GEMM computes in its epilogue (the reduction
   skipped, its users deferred to after the GEMM), and the GELU backward kernels a GEMM
   computes in its epilogue (L->gemm_at). */
int cl_plan_bgrad(Lower *L, const Func *f);
/* Op j, a call whose place a matmul takes (L->gemm_at[j]): that GEMM with the call's GELU
   backward as its epilogue. */
int cl_lower_gemm_at(Lower *L, Steps *s, int j);
/* Op k, a pad of a gradient tree (L->leaf_into[k]): its operand accumulated into the view. */
int cl_lower_tree_leaf(Lower *L, Steps *s, int k);

/* lower_fuse.c: the bf16 weight copies (see its opening comment).  cl_weight_copies_plan:
   which parameters get one, after the globals are placed (grows the parameter region).
   cl_weight_copy_call: L->op is the cast of such a parameter (true: no step; its result reads
   the copy).  cl_weight_copy_follow: a reshape at the same place reads the same copy.
   cl_weight_copy_buf: v's buffer is a copy (cl_buf_of's first question).  cl_weight_copy_adamw:
   the in-place adamw step st of such a parameter also writes its copy (an output appended;
   1) or not (0).  cl_weight_copies_func: the function RT_FUNC_WEIGHT_COPIES (no steps: none). */
int cl_weight_copies_plan(Lower *L);
int cl_weight_copies_begin(Lower *L, const Func *f);   /* per function, before its ops: the aliases */
bool cl_weight_copy_call(Lower *L);
void cl_weight_copy_follow(Lower *L, const Value *from, const Value *to);
bool cl_weight_copy_buf(const Lower *L, const Value *v, RtBuf *b);
int cl_weight_copy_adamw(Lower *L, RtStep *st);
int cl_weight_copies_func(Lower *L, RtFunc *rf);
/* lower_fuse.c, the norms (see its comment): cl_fuse_norm_fwd adds the statistics output to the
   forward step st of op i when a gradient op reads them; cl_fuse_norm_bwd lowers the gradient op
   j from them (1: it has none, lower it as before); cl_fuse_func_end places the stats area. */
int cl_fuse_norm_fwd(Lower *L, Steps *s, RtStep *st, int i);
int cl_fuse_norm_bwd(Lower *L, Steps *s, int j);
void cl_fuse_func_end(Lower *L, Steps *s);
/* The stats area for other families: n elements at byte `at` of it as a buffer; `bytes` of it
   for the gradient op j (its offset, -1: none); the offset reserved for op j (-1: none). */
RtBuf cl_stats_buf(int64_t at, int64_t n, int storage);
int64_t cl_stats_reserve(Lower *L, int j, int64_t bytes);
int64_t cl_stats_of(const Lower *L, int j);
/* lower_fuse.c, the classifier: the cross_entropy op i and its gradient in one step (1: no
   such gradient, or its buffer is not free early enough: lower it as before). */
int cl_fuse_xent(Lower *L, Steps *s, int i);
/* lower_fuse.c: the embedding op i and the add of positions after it in one step (1: no such
   add, lower it as before). */
int cl_fuse_embed_pos(Lower *L, Steps *s, int i);

/* lower_attn.c: attention, attention_grad, attention_block and attention_block_grad (L->op)
   as the flash-attention kernels of kernels/attention*.cuh and kernels/attn_block.cuh. */
int cl_lower_attention(Lower *L, Steps *s);

/* lower_moe.c: grouped_matmul or grouped_matmul_wgrad (L->op) as one strided-batched cuBLASLt
   GEMM over the groups padded to the capacity, when LOOM_CUDA_MOE_GEMM=batched and the counts
   have one (1: not lowered, lower it as the grouped kernels; *why_not the label's note, or
   NULL when batched was not asked for).  cl_moe_gemm_mode reads the variable (an error when it
   is neither grouped nor batched). */
int cl_lower_moe_batched(Lower *L, Steps *s, const char **why_not);
int cl_moe_gemm_mode(Lower *L, bool *batched);

/* lower_mesh.c: the ops of a partitioned program.  Collectives (and their async start/wait
   halves) become RT_STEP_BUILTIN steps with program.h's i[] layout, which the runtime runs as
   NCCL calls; shard_slice, shard_pad, target_pick and onehot become kernels of
   kernels/mesh.cuh with the rank's coordinate written by the runtime (RtStep.coord_at).
   cl_lower_mesh_op lowers L->op, for which cl_mesh_op is true. */
bool cl_mesh_op(const Op *op);
int cl_lower_mesh_op(Lower *L, Steps *s);

#endif
