/* runtime/cuda/cuda_gemm.h — the GEMM steps of a CudaProgram (cuda_gemm.c), for the files of
 * cuda_exec_internal.h only: they share the program's private state (LOOM_CUDA_INTERNAL). */
#ifndef LOOM_RUNTIME_CUDA_GEMM_H
#define LOOM_RUNTIME_CUDA_GEMM_H

#include "runtime/cuda/cuda_exec.h"

#if defined(LOOM_CUDA_INTERNAL) && defined(LOOM_HAVE_CUDA_HEADERS)
#include "runtime/cuda/cuda_api.h"

/* "at @func step s (label)", for messages */
void cuda_step_where(const CudaProgram *cp, int f, int s, char *w, size_t n);
/* The cuBLASLt plan of step s of function f (a GEMM step): 0, or 2/1 with a message. */
int cuda_plan_gemm(CudaProgram *cp, int f, int s, CudaGemmPlan **out, char *err, size_t errlen);
void cuda_plan_free(const CublasLtApi *l, CudaGemmPlan *g);
/* Runs the planned GEMM of step s on the program's stream. */
int cuda_run_gemm(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen);
/* Times the heuristic's candidates of every GEMM shape once (cached on disk) and keeps the
   fastest (CudaOptions.gemm_tune); the buffers are zeroed again afterwards. */
int cuda_tune_gemms(CudaProgram *cp, char *err, size_t errlen);
#endif

#endif
