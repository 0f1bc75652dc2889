/* runtime/exec/exec_cuda.c — trains a lowered CUDA program (codegen/cuda) from its compiled image
   on GPU 0: what `loom train --backend cuda` does after NVRTC, and what a compiled
   executable carrying a cubin does at start (then no compiler is involved).
   GPU checks of this path are owed until a session with a GPU runs tests/gpu/run.sh. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/exec/exec.h"

/* Validation: the program's @forward -> (logits, loss), only the loss copied out. */
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  CudaExecutor *ce = self;
  int f = cuda_find_func(ce->cp, "forward");
  if (f < 0 || ce->cp->p->funcs[f].n_rets != 2) {
    snprintf(err, errlen, "the program has no @forward(tokens, targets) -> (logits, loss) to validate with");
    return EXIT_USAGE;
  }
  void *args[2] = {(void *)inputs, (void *)targets}, *rets[8] = {NULL, loss};
  return cuda_program_call(ce->cp, f, args, rets, err, errlen);
}

int cuda_load_params(CudaProgram *cp, const RtProgram *prog, const char *path, char *err, size_t errlen) {
  int nmax = 1;
  for (int i = 0; i < prog->n_globals; i++)
    nmax += rt_views_of(prog->globals[i].rank, prog->globals[i].shape, prog->globals[i].experts);
  float **host = calloc((size_t)prog->n_globals + 1, sizeof *host);
  RtTensor *views = calloc((size_t)nmax, sizeof *views);   /* a stack of experts: one per expert */
  int rc = host && views ? 0 : EXIT_RUN, nv = 0;
  if (rc) snprintf(err, errlen, "out of memory");
  for (int i = 0; !rc && i < prog->n_globals; i++) {
    const RtGlobal *g = &prog->globals[i];
    if (g->region != RT_REGION_PARAMS) continue;
    if (!(host[i] = calloc((size_t)g->n + 1, sizeof(float))) ||
        rt_views_add(views, &nv, g->name, g->rank, g->shape, host[i], g->experts)) {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
      break;
    }
  }
  if (!rc) rc = load_weights_views(views, nv, path, err, errlen);
  for (int i = 0; !rc && i < prog->n_globals; i++)
    if (host[i]) rc = cuda_global_write(cp, i, host[i], err, errlen);
  for (int i = 0; host && i < prog->n_globals; i++) free(host[i]);
  rt_views_free(views, nv);
  free(host);
  free(views);
  return rc;
}

void (*cuda_profile_printer)(const CudaProgram *cp, int64_t grad_accum, FILE *out);

int cuda_train_program(const RtProgram *prog, const unsigned char *image, size_t n, const RunPlan *plan, char *err,
                       size_t errlen) {
  CudaProgram cp;
  CudaExecutor ce;
  bool have_cp = false, have_ce = false;
  int rc = 0;
  have_cp = !(rc = cuda_program_init(&cp, prog, image, n, 0, err, errlen));
  double t0 = seconds_now();
  if (!rc) rc = cuda_globals_init(&cp, plan->seed, err, errlen);
  if (!rc && plan->opt.log && seconds_now() - t0 >= 1)   /* a billion parameters take a while */
    fprintf(plan->opt.log, "cuda: parameters and optimizer state initialized in %.1f s\n", seconds_now() - t0);
  if (!rc) have_ce = !(rc = cuda_executor_init(&ce, &cp, err, errlen));
  if (!rc) rc = cuda_executor_set_shape(&ce, plan->batch, plan->seq, err, errlen);
  if (!rc && cuda_find_func(&cp, "forward") >= 0) ce.ex.eval_step = eval_step;
  if (!rc && plan->init) {   /* into the host copies, then to the device */
    rc = load_weights_views(ce.ex.params, ce.ex.n_params, plan->init, err, errlen);
    if (!rc) rc = ce.ex.sync_in(ce.ex.self, err, errlen);
  }
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: parameters %s; host memory peak so far %.0f MiB\n", plan->init ? "loaded" : "initialized",
            peak_rss_mib());
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: device memory %.1f MiB (arenas %.1f, parameters and state %.1f, workspace %.1f)\n",
            cp.mem.total / 1048576.0, cp.mem.arenas / 1048576.0, cp.mem.regions / 1048576.0, cp.mem.workspace / 1048576.0);
  if (!rc) rc = train_and_write(&ce.ex, plan, err, errlen);
  if (!rc && cp.opt.profile) {
    if (cuda_profile_printer) cuda_profile_printer(&cp, plan->opt.grad_accum, stderr);
    else fprintf(stderr, "LOOM_PROFILE: the per-kernel table is printed by loom train, not by a compiled executable\n");
  }
  if (have_ce) cuda_executor_free(&ce);
  if (have_cp) cuda_program_free(&cp);
  return rc;
}
