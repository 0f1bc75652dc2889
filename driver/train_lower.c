/* driver/train_lower.c — training on the cpu backend from a module: lower it (codegen/cpu),
   then run the bytes a compiled executable would carry.  Only `loom` links this: compiled
   executables start from those bytes and need no compiler. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu.h"
#include "runtime/exec/exec_cpu.h"
#include "driver/driver.h"

int lower_cpu_bytes(Module *m, unsigned char **prog, size_t *n, char **llvm, char *err, size_t errlen) {
  RtProgram p;
  *prog = NULL;
  *n = 0;
  *llvm = NULL;
  int rc = cpu_lower(m, &p, llvm, err, errlen);
  if (!rc) {
    rc = rt_program_save(&p, prog, n, err, errlen);
    rt_program_free(&p);
  }
  return rc;
}

/* A phase's line with its time (no silent phase of seconds before step 1; -q keeps quiet). */
static void phase(const RunPlan *plan, const char *what, double t0) {
  if (plan->opt.log) fprintf(plan->opt.log, "%s in %.2f s\n", what, seconds_now() - t0);
}

int run_training_cpu(Module *m, const RunPlan *plan, char *err, size_t errlen) {
  FILE *log = plan->opt.log;
  double t0 = seconds_now();
  if (mesh_world(&m->mesh) > 1) {   /* every rank a thread */
    unsigned char *prog;
    size_t n;
    char *llvm;
    int rc = lower_cpu_bytes(m, &prog, &n, &llvm, err, errlen);
    if (!rc) phase(plan, "lowered to cpu kernels", t0);
    if (!rc && log)
      fprintf(log, "starting %lld ranks as threads: JIT-compiling the kernels with LLVM and %s ...\n",
              (long long)mesh_world(&m->mesh), plan->init ? "loading the weights" : "initializing the parameters");
    if (!rc) rc = run_training_cpu_mesh(prog, n, llvm, plan, err, errlen);
    free(prog);
    free(llvm);
    return rc;
  }
  CpuBackend b;
  unsigned char *bytes = NULL;
  size_t n = 0;
  char *llvm = NULL;
  RtProgram prog;
  memset(&b, 0, sizeof b);
  int rc = cpu_lower(m, &prog, &llvm, err, errlen);
  if (!rc) {
    rc = rt_program_save(&prog, &bytes, &n, err, errlen);
    rt_program_free(&prog);
  }
  if (!rc) phase(plan, "lowered to cpu kernels", t0);
  if (!rc && log) fprintf(log, "JIT-compiling the kernels with LLVM ...\n");
  t0 = seconds_now();
  if (!rc) rc = cpu_backend_load(&b, bytes, n, llvm, plan->threads, err, errlen);
  if (!rc && log) fprintf(log, "JIT-compiled %d kernels in %.2f s%s\n", b.prog.n_kernels, seconds_now() - t0,
                        jit_from_cache(b.jit) ? " (object code from the cache)" : "");
  t0 = seconds_now();
  if (!rc) rc = cpu_backend_init_params(&b, plan->seed, plan->init, err, errlen);
  if (!rc && log) {
    if (plan->init) fprintf(log, "loaded the weights from %s in %.2f s\n", plan->init, seconds_now() - t0);
    else fprintf(log, "initialized the parameters (seed %llu) in %.2f s\n", (unsigned long long)plan->seed,
                 seconds_now() - t0);
  }
  if (!rc) rc = cpu_backend_executor(&b, plan->batch, plan->seq, err, errlen);
  if (!rc) rc = train_and_write(&b.re.ex, plan, err, errlen);
  if (!rc && plan->verbose) cpu_arena_report(plan->opt.log, &b.cp, 1);
  if (!rc && plan->trace_out && plan->opt.log)
    fprintf(plan->opt.log, "note: --trace-out records pipelines and meshes (compute and communication per rank); a "
            "single rank writes no timeline\n");
  const char *prof = getenv("LOOM_PROFILE");
  if (!rc && prof && *prof) cpu_backend_profile(&b, stderr, atoi(prof) > 0 ? atoi(prof) : 20);
  cpu_backend_free(&b);
  free(bytes);
  free(llvm);
  return rc;
}
