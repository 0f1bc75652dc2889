/* runtime/exec/exec_cpu.c — the CPU backend behind eval, train and compiled executables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/exec_cpu.h"
#include "runtime/exec/exec.h"

int cpu_backend_load(CpuBackend *b, const unsigned char *prog, size_t n, const char *llvm, int threads, char *err,
                     size_t errlen) {
  memset(b, 0, sizeof *b);
  int rc = rt_program_load(prog, n, &b->prog, err, errlen);
  if (rc) return rc;
  b->llvm = strdup(llvm);
  b->fns = calloc((size_t)b->prog.n_kernels + 1, sizeof(void *));
  const char **syms = calloc((size_t)b->prog.n_kernels + 1, sizeof(char *));
  if (!b->llvm || !b->fns || !syms) {
    free(syms);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int k = 0; k < b->prog.n_kernels; k++) syms[k] = b->prog.kernel_names[k];
  rc = b->prog.n_kernels ? jit_load(b->llvm, syms, b->prog.n_kernels, b->fns, &b->jit, err, errlen) : 0;
  free(syms);
  if (rc) return rc;
  rc = cpu_program_init(&b->cp, &b->prog, b->fns, threads, err, errlen);
  b->have_cp = rc == 0;
  return rc;
}

int cpu_backend_init_params(CpuBackend *b, uint64_t seed, const char *init, char *err, size_t errlen) {
  cpu_globals_init(&b->cp, seed);
  return init ? load_weights_rt(&b->prog, &b->cp, init, err, errlen) : 0;
}

int cpu_backend_executor(CpuBackend *b, int64_t batch, int64_t seq, char *err, size_t errlen) {
  cpu_device(&b->dev, &b->cp);
  int rc = rt_rank_exec_init(&b->re, &b->dev, batch, seq, err, errlen);
  b->have_re = rc == 0;
  return rc;
}

void cpu_backend_profile(const CpuBackend *b, FILE *out, int top) {
  const CpuProgram *cp = &b->cp;
  int *steps = calloc((size_t)(top > 0 ? top : 1), sizeof(int));
  if (!steps || !b->have_cp) {
    free(steps);
    return;
  }
  for (int f = 0; f < cp->p->n_funcs; f++) {
    const RtFunc *fn = &cp->p->funcs[f];
    double total = 0, kind_s[3] = {0, 0, 0};
    int64_t runs = 0;
    for (int s = 0; s < fn->n_steps; s++) {
      total += cp->step_seconds[f][s];
      kind_s[fn->steps[s].kind] += cp->step_seconds[f][s];
      if (cp->step_runs[f][s] > runs) runs = cp->step_runs[f][s];
    }
    if (!runs) continue;
    fprintf(out, "profile @%s: %d steps, %lld calls, %.1f ms per call (kernels %.1f, gemm %.1f, builtins %.1f)\n",
            fn->name, fn->n_steps, (long long)runs, 1e3 * total / (double)runs, 1e3 * kind_s[RT_STEP_KERNEL] / (double)runs,
            1e3 * kind_s[RT_STEP_GEMM] / (double)runs, 1e3 * kind_s[RT_STEP_BUILTIN] / (double)runs);
    int n = cpu_profile_top(cp, f, steps, top);
    for (int k = 0; k < n; k++) {
      const RtStep *st = &fn->steps[steps[k]];
      double ms = 1e3 * cp->step_seconds[f][steps[k]] / (double)runs;
      char gemm[128] = "";
      if (st->kind == RT_STEP_GEMM) {   /* batch x M x N x K, transposes, achieved rate */
        double flops = 2.0 * (double)st->i[0] * (double)st->i[1] * (double)st->i[2] * (double)st->i[3];
        snprintf(gemm, sizeof gemm, "  [%lldx%lldx%lldx%lld%s%s] %.1f GFLOP/s", (long long)st->i[0], (long long)st->i[1],
                 (long long)st->i[2], (long long)st->i[3], st->i[4] ? " ta" : "", st->i[5] ? " tb" : "",
                 ms > 0 ? flops / (ms * 1e6) : 0.0);
      }
      fprintf(out, "  %8.2f ms %5.1f%%  #%-4d %-7s %s%s\n", ms, total > 0 ? 100 * cp->step_seconds[f][steps[k]] / total : 0,
              steps[k], st->kind == RT_STEP_KERNEL ? "kernel" : st->kind == RT_STEP_GEMM ? "gemm" : "builtin", st->label, gemm);
    }
  }
  free(steps);
}

void cpu_arena_report(FILE *out, const CpuProgram *cps, int n) {
  if (!out || n < 1) return;
  const RtProgram *p = cps[0].p;
  for (int f = 0; f < p->n_funcs; f++) {
    if (cpu_arena_touched(&cps[0], f) < 0) continue;
    fprintf(out, "memory @%s: planned arena %lld bytes, measured", p->funcs[f].name, (long long)p->funcs[f].arena_bytes);
    for (int k = 0; k < n; k++) {
      int64_t t = cpu_arena_touched(&cps[k], f);
      fprintf(out, "%s %lld", k ? "," : "", (long long)((t + 63) / 64 * 64));
    }
    int64_t t0 = (cpu_arena_touched(&cps[0], f) + 63) / 64 * 64;
    fprintf(out, " (%s: the highest byte its first call wrote, to the plan's 64-byte alignment)%s\n",
            n > 1 ? "per rank" : "one rank",
            t0 < p->funcs[f].arena_bytes ? "; less than planned: the plan reserved bytes no step writes (an adamw "
            "whose results are assigned back updates the parameters and moments in place)" : "");
  }
}

void cpu_backend_free(CpuBackend *b) {
  if (b->have_re) rt_rank_exec_free(&b->re);
  if (b->have_cp) cpu_program_free(&b->cp);
  if (b->jit) jit_free(b->jit);
  rt_program_free(&b->prog);
  free(b->fns);
  free(b->llvm);
  memset(b, 0, sizeof *b);
}
