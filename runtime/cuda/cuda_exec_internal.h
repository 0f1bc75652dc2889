/* runtime/cuda/cuda_exec_internal.h — what the files that run a CudaProgram share (not for
 * other code: cuda_exec.h is the interface).  From the bottom up, each file calling only
 * those above it in this list (tests/lint/file_cycles.sh):
 *
 *   cuda_check.c   no device: conversions, the program's checks, the memory plan, options
 *   cuda_memory.c  zeroed allocations, the gradients' zeroing, the host's copies of globals
 *   cuda_call.c    a call: its steps (cuda_run_step) or its CUDA graph, the profile
 *   cuda_step.c    a training step as one CUDA graph (cuda_program_step_issue / _wait)
 *   cuda_exec.c    the program's init and free, and the program as an RtDevice
 *
 * (cuda_gemm.c, cuda_tmap.c and cuda_mesh.c below them all, with their own headers.) */
#ifndef LOOM_RUNTIME_CUDA_EXEC_INTERNAL_H
#define LOOM_RUNTIME_CUDA_EXEC_INTERNAL_H

#include "runtime/cuda/cuda_exec.h"

/* cuda_check.c: buffer b of function func inside its region, aligned to its storage, of
   the storage its is_int says (an RtChecker's buffer check; ctx unused).  0, or 2 with a
   message naming `what`. */
int cuda_check_buf(void *ctx, const RtProgram *p, int func, const RtBuf *b, const char *what, char *err, size_t errlen);

#if defined(LOOM_CUDA_INTERNAL) && defined(LOOM_HAVE_CUDA_HEADERS)
#include "runtime/cuda/cuda_api.h"

/* A driver (cuBLASLt) call checked: with `d` (`l`), `err` and `errlen` in scope, 0 or 1 with
   a message naming the call and `where`. */
#define CU(fn, args, where) cuda_cu_fail(d->fn args, #fn, where, err, errlen)
#define LT(fn, args, where) cuda_lt_fail(l->fn args, #fn, where, err, errlen)

/* cuda_memory.c: `bytes` of device memory, zeroed on the program's stream (its context
   current), named `what` in an out-of-memory message; *out 0 for bytes <= 0. */
int cuda_alloc_zeroed(CudaProgram *cp, uint64_t *out, int64_t bytes, const char *what, char *err, size_t errlen);
/* The gradients, when @optimizer_step left them stale (CudaProgram.grads_stale), zeroed on
   the stream. */
int cuda_grads_zero(CudaProgram *cp, char *err, size_t errlen);

/* cuda_call.c: step s of function func on the stream (a kernel, a GEMM or a mesh step). */
int cuda_run_step(CudaProgram *cp, int func, int s, char *err, size_t errlen);
/* Does function f run as a CUDA graph (CudaProgram.graph)? */
bool cuda_graphed(const CudaProgram *cp, int f);
/* Ends the stream's capture; its graph instantiated when ok and the driver takes it, else NULL. */
CUgraphExec cuda_end_capture(const CudaDriverApi *d, CUstream stream, bool ok);
/* The profile's events and times (CudaOptions.profile), made at init. */
int cuda_profile_init(CudaProgram *cp, char *err, size_t errlen);

/* cuda_step.c: the step slots' host images, freed (cuda_program_free). */
void cuda_step_slots_free(CudaProgram *cp, const CudaDriverApi *d);
#endif

#ifndef LOOM_HAVE_CUDA_HEADERS
#define NO_CUDA "this loom was built without the CUDA headers (cuda.h): use --backend cpu"
#endif

#endif
