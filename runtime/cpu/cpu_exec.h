/* runtime/cpu/cpu_exec.h — runs a lowered program (runtime/program.h) on the CPU.
 *
 * A CpuProgram owns the memory of one RtProgram: the global regions (parameters, gradient
 * accumulators, optimizer state) and one arena per function, all 64-byte aligned, plus a
 * thread pool.  Steps run in order; inside a step the work is split across the pool:
 *   RT_STEP_KERNEL   a JIT-compiled kernel `void k(char **args, int64_t begin, int64_t end)`
 *                    over its parallel extent i[0], in contiguous chunks, one per thread;
 *   RT_STEP_GEMM     runtime/cpu/cpu_gemm.h: tiles of C whose shapes depend on (M, N, K) only,
 *                    each one single-threaded cblas_sgemm, run by the pool (OpenBLAS never
 *                    threads itself);
 *   RT_STEP_BUILTIN  runtime/cpu/cpu_kernels.h.
 * After every step, float outputs with RtBuf.round set are rounded to that format.
 *
 * The program is checked once at init (buffers inside their regions, builtin sizes, GEMM
 * extents, kernel functions present), so a malformed program is an error, not a crash.
 * Results are bitwise the same for any thread count: the JIT kernels compute each index of
 * their extent independently (as codegen's kernels do), the builtins never split a float
 * sum at a thread boundary (cpu_kernels.h), and every GEMM tile is one single-threaded
 * BLAS call whose shape does not depend on the thread count (cpu_gemm.h).
 *
 * Errors: 0 ok, 2 bad input (malformed program, token id out of range), 1 run-time failure.
 */
#ifndef LOOM_RUNTIME_CPU_EXEC_H
#define LOOM_RUNTIME_CPU_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "runtime/program.h"
#include "runtime/cpu/threadpool.h"
#include "runtime/device.h"
#include "runtime/trainer.h"

typedef void (*CpuKernelFn)(char **args, int64_t begin, int64_t end);

typedef struct {
  const RtProgram *p;           /* borrowed: must outlive the CpuProgram */
  ThreadPool *tp;
  CpuKernelFn *kernels;         /* [p->n_kernels] */
  char *regions[RT_REGION_COUNT];   /* RT_REGION_ARENA unused: arenas are per function */
  char **arenas;                /* [p->n_funcs] */
  /* The rank's collectives (runtime/comm/comm.h) when the program is one rank of a mesh; NULL
     (cpu_program_init's default) for one rank. */
  Comm *comm;
  /* Async collectives (RT_B_COLL_START / RT_B_COLL_WAIT, runtime/cpu/cpu_async.c): the rank's
     communication thread, set by the mesh driver (NULL: starts run their collective at
     once), and one slot per handle.  With an engine every collective of the program goes
     through it, in program order. */
  CommEngine *engine;
  struct CpuAsync *async;
  int n_async;
  /* Exposed communication: seconds this rank's thread spent blocked on collectives and
     transfers (waits, and synchronous collectives), since the driver last reset it. */
  double comm_wait_s;
  /* A timeline (--trace-out), when tracing is set: compute steps (track 0) and collectives
     as the communication thread ran them (track 1), CLOCK_MONOTONIC seconds. */
  bool tracing;
  struct CpuTraceEvent *trace;
  int n_trace, cap_trace;
  /* The measured arena: [func] the bytes up to the highest byte the function's first call
     wrote in its arena (-1 before that call).  Arenas start filled with a sentinel word
     (ARENA_SENTINEL), and after the first call the arena is scanned down from its end. */
  int64_t *arena_touched;
  /* profile: accumulated wall seconds and runs of every step, [func][step] */
  double **step_seconds;
  int64_t **step_runs;
} CpuProgram;

typedef struct CpuTraceEvent {
  const char *label;   /* the step's label (lives as long as the program) */
  double t0, t1;
  int track;           /* 0 compute, 1 communication */
} CpuTraceEvent;

/* cpu_async.c: does the program start collectives asynchronously?  (the mesh driver then
   gives each rank an engine) */
bool cpu_program_has_async(const RtProgram *p);
/* cpu_async.c: runs a communication step (a start, a wait, a collective, send or recv) of
   rank cp; *handled = false when st is not one (the caller runs it). */
int cpu_async_step(CpuProgram *cp, const RtStep *st, void *const *bufs, bool *handled, char *err, size_t errlen);
void cpu_trace_add(CpuProgram *cp, const char *label, double t0, double t1, int track);

/* kernel_fns[k] is the JIT-compiled function of kernel k (p->kernel_names[k]); n_threads as
   tp_new (<= 0: LOOM_THREADS or the number of CPUs).  Global regions start zeroed. */
int cpu_program_init(CpuProgram *cp, const RtProgram *p, void *const *kernel_fns, int n_threads, char *err,
                     size_t errlen);
void cpu_program_free(CpuProgram *cp);

/* Runs function `func`: args[k] are host buffers of RtFunc.args[k] (n elements, f32 or
   int32), copied in; rets[k] caller buffers of RtFunc.rets[k], copied out. */
int cpu_program_call(CpuProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen);
int cpu_find_func(const CpuProgram *cp, const char *name);   /* -1 if absent */
#define ARENA_SENTINEL 0x7FA5A5A5u   /* a signaling-NaN bit pattern no kernel writes */
/* cp->arena_touched[func], or -1 (not called yet, or no such function). */
int64_t cpu_arena_touched(const CpuProgram *cp, int func);

/* A global's storage (f32), or NULL for a bad index. */
float *cpu_global(CpuProgram *cp, int g);
/* Initializes every global as the reference executor's globals_init does (ir/interp.c),
   through rt_global_init_values (runtime/program.h): bitwise the reference's parameters. */
void cpu_globals_init(CpuProgram *cp, uint64_t seed);

/* Profile: steps of `func` by accumulated time; writes up to max step indices, slowest
   first, and returns how many.  cpu_profile_reset zeroes the counters. */
int cpu_profile_top(const CpuProgram *cp, int func, int *steps, int max);
void cpu_profile_reset(CpuProgram *cp);

/* The program as an RtDevice (runtime/device.h: the one rank executor runs it): host
   storage (the globals are live), read and write copies of it.  d borrows cp (its close frees
   nothing). */
void cpu_device(RtDevice *d, CpuProgram *cp);

#endif
