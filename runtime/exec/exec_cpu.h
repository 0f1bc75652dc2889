/* runtime/exec/exec_cpu.h — the CPU backend: a lowered program (codegen/cpu) JIT-compiled and run
   by the runtime (runtime/cpu_exec).  Built from a module here, or from the bytes a
   compiled executable carries (then no IR is involved). */
#ifndef LOOM_RUNTIME_EXEC_EXEC_CPU_H
#define LOOM_RUNTIME_EXEC_EXEC_CPU_H

#include <stdio.h>

#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/jit.h"
#include "runtime/program.h"

typedef struct {
  RtProgram prog;
  Jit *jit;
  void **fns;
  CpuProgram cp;
  RtDevice dev;      /* cp as a device, and the rank executor over it */
  RtRankExec re;
  char *llvm;        /* the kernels' LLVM IR text (owned) */
  bool have_cp, have_re;
} CpuBackend;

/* From bytes (rt_program_save) and the kernels' LLVM IR text. */
int cpu_backend_load(CpuBackend *b, const unsigned char *prog, size_t n, const char *llvm, int threads, char *err,
                     size_t errlen);
/* Parameters: seeded (bitwise as the reference executor) or from safetensors by HF name. */
int cpu_backend_init_params(CpuBackend *b, uint64_t seed, const char *init, char *err, size_t errlen);
/* The training Executor (needs grad_step and optimizer_step): re.ex, the rank executor over
   the program as a device (runtime/device.h). */
int cpu_backend_executor(CpuBackend *b, int64_t batch, int64_t seq, char *err, size_t errlen);
/* Per function: time per call by step kind, then the `top` slowest steps with their share
   (LOOM_PROFILE=N asks `loom train --backend cpu` for this with top N). */
void cpu_backend_profile(const CpuBackend *b, FILE *out, int top);
/* For every function called: its planned arena and, per rank (cps[0..n)), the measured one
   (runtime/cpu/cpu_exec.h: the highest byte its first call wrote). */
void cpu_arena_report(FILE *out, const CpuProgram *cps, int n);
void cpu_backend_free(CpuBackend *b);

#endif
