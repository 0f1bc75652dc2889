/* codegen/lower_common.h — what the CPU and CUDA lowerings (codegen/cpu/lower.c,
   codegen/cuda/lower.c) share: error messages with their place, alignment, rounding
   formats, the region of a global and the description of a global in the lowered program. */
#ifndef LOOM_CODEGEN_LOWER_COMMON_H
#define LOOM_CODEGEN_LOWER_COMMON_H

#include <stdarg.h>
#include <stdint.h>

#include "ir/ir.h"
#include "runtime/program.h"

/* "@func: op 'kind' (the op as text): message", or "@func: message", or the message: into
   err; returns IR_EINPUT. */
int cg_vfail(char *err, size_t errlen, const Func *f, const Op *op, const char *fmt, va_list ap);

/* f[0..3] of a rope or rope_at step (rt_rope_inv_freq): theta, and with Llama 3.1 scaling
   (factor > 0) factor, original_max_pos / low_freq_factor, original_max_pos / high_freq_factor. */
void cg_rope_f(const Op *op, double f[4]);

static inline int64_t cg_align64(int64_t x) { return (x + 63) & ~(int64_t)63; }

/* The rounding that emulates a narrow float dtype (RT_ROUND_NONE for the others). */
uint8_t cg_round_of(DType dt);

/* Parameters, gradient accumulators, or other state (optimizer moments). */
RtRegion cg_region_of(const Global *g);

/* rg = global g at `offset` of its region: name, element count, the shape checkpoints see
   (the whole tensor's, for a piece of a partitioned module on `mesh`), initializer, rounding
   and placement.  Returns -1 (rg untouched) when the name does not fit. */
int cg_describe_global(const Global *g, const Mesh *mesh, RtGlobal *rg, int64_t offset);

/* The placement of a per-rank value of type t (an RtFunc argument's), as RtGlobal's; and the
   program's mesh. */
void cg_describe_place(const Type *t, RtPlace *pl);
void cg_describe_mesh(const Mesh *mesh, RtProgram *out);
/* A pipelined module's schedule parameters (RtProgram.pipe) and every global's stage
   (RtGlobal.owner, -1 when not pipelined): what the executors read instead of the module.
   After the globals are described (out->n_globals of them, in module order). */
void cg_describe_pipe(const Module *m, RtProgram *out);

/* A module described as a program without steps, for the reference interpreter's device
   (runtime/exec/ref_device.c), which runs the IR: every function in module order (its name,
   its arguments' and results' element counts and kinds: f32, or int32 for integers and
   bools; the arguments' placements) and every global in module order (cg_describe_global),
   the mesh and a pipeline's schedule (cg_describe_pipe).  0, or 2 with a message (a name too
   long, too many arguments; 1: out of memory); out is then freed. */
int cg_describe_module(const Module *m, RtProgram *out, char *err, size_t errlen);

/* The order globals are placed in their regions: parameters grouped by the weight decay of
   their AdamW, each gradient and moment in its parameter's order, so that a group's AdamW
   updates are one span in every region.  A malloc'd permutation of the global indices, or
   NULL when out of memory. */
int *cg_placement_order(const Module *m);

/* A step that merged `tensors` updates says so in profiles and traces: "adamw %57 [10
   tensors]" (the label's end gives way when it is full).  Nothing for 1. */
void cg_label_merged(RtStep *st, int tensors);

/* A collective start (the overlap pass): the collective's just-lowered step becomes
   RT_B_COLL_START with the collective and the start's handle h in front of its ints
   (program.h).  0, or -1 when st is not a collective or its ints leave no room. */
int cg_wrap_start(RtStep *st, int h);

/* The ir/ops.def op a runtime builtin lowers from one to one (an OpKind), or -1 (a runtime-only
   step; also past the table).  runtime/builtins.def is the table. */
int cg_builtin_op(int builtin);

/* The step list both lowerings grow: a zeroed step of kind and which at the end of *items
   (n used, cap allocated), labelled after op ("call @f", or "<op> %result" / "<op> $global",
   then suffix); NULL: out of memory. */
RtStep *cg_new_step(RtStep **items, int *n, int *cap, const Op *op, RtStepKind kind, int which, const char *suffix);
/* The head of a lowered function: its name, arena, argument and result counts (buffers and
   placements are the caller's).  0, or IR_EINPUT with the reason in msg. */
int cg_func_head(const Func *f, RtFunc *rf, char *msg, size_t n);

#endif
