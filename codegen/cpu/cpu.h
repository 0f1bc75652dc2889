/* codegen/cpu/cpu.h — the CPU backend: fused kernels as LLVM IR, program functions as steps.
 *
 *   llvm_space.c   the iteration space of a kernel func: loop dims, parallel dims, extent
 *   llvm_kernel.c  one kernel func -> one LLVM function: loop nests the loop vectorizer
 *                  can widen, the arithmetic of ir/interp_ops.c, in-place variants
 *   llvm_module.c  all kernels of a module -> LLVM IR text (identical kernels shared,
 *                  checked with the LLVM C API)
 *   (llvm_internal.h: what those three share)
 *   lower.c        every program function (after `fuse` and `memory-plan`) -> an RtFunc of
 *                  RtSteps over (region, offset) buffers: see runtime/program.h
 *
 * Kernel calling convention (what the runtime calls; runtime/cpu/jit.h loads the code):
 *
 *     void <kernel name>(char **args, int64_t begin, int64_t end)
 *
 *   args[] are the buffer addresses: the kernel's arguments in order, then its results
 *   (float dtypes as f32, integer and bool dtypes as int32; exactly the bufs of the
 *   RT_STEP_KERNEL step).  The call computes the part [begin, end) of the kernel's
 *   parallel extent (RtStep.i[0], from cpu_kernel_extent):
 *
 *   - no reductions: the extent is N (the kernel's element count), [begin, end) a range of
 *     flat row-major indices;
 *   - with reductions: the extent is the number of index combinations of the iteration
 *     space's dimensions that every reduction keeps, in row-major order; for one
 *     reduction (or several over the same dims) that is the reduction result's element
 *     count.  Reductions over different dims keep fewer dims in common: the extent shrinks,
 *     down to 1 (the whole kernel runs in one call) when they keep none in common, or when
 *     a reduction's dims cannot be aligned with the other shapes of the kernel.
 *
 *   Different [begin, end) ranges write disjoint outputs, so the runtime may run them on
 *   different threads.  An N-element result may share its buffer with an N-element
 *   argument (in place: each element is read before it is written, at the same index);
 *   no other sharing between a kernel's buffers is allowed (lower.c refuses it).
 */
#ifndef LOOM_CODEGEN_CPU_H
#define LOOM_CODEGEN_CPU_H

#include "ir/ir.h"
#include "runtime/program.h"

/* ---------------------------------------------------------------- llvm_space.c */
/* The parallel extent of a kernel func (see above).  Fails, naming the op, on what the
   backend does not support. */
int cpu_kernel_extent(const Func *kernel, int64_t *extent, char *err, size_t errlen);

/* ---------------------------------------------------------------- llvm_module.c */
/* LLVM IR text (malloc'd) with one function per kernel func of m, named like the kernel
   func (kernels with the same code are LLVM aliases of one function), plus helpers.  The text is portable (no target triple; unoptimized): the
   runtime's jit_load optimizes it at O2 for the host it runs on (jit_optimize_ir shows the
   result, with the vectorized loops).  The text is parsed and verified with LLVM before it
   is returned, so a codegen bug is reported here and not at load time. */
int cpu_emit_llvm(const Module *m, char **llvm_ir_text, char *err, size_t errlen);

/* ---------------------------------------------------------------- lower.c */
/* Lowers every non-kernel function of m (after fuse and memory-plan: every value has an
   offset, every program function an arena size) into *out (free with rt_program_free),
   and the kernels into LLVM IR text (*llvm_ir_text, malloc'd; may be NULL if not wanted).
   Kernel k of out->kernel_names is the k-th kernel func of the module. */
int cpu_lower(const Module *m, RtProgram *out, char **llvm_ir_text, char *err, size_t errlen);

#endif
