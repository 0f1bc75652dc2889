/* runtime/exec/exec_cuda.c — trains a lowered CUDA program (codegen/cuda) from its compiled image
   on GPU 0: what `loom train --backend cuda` does after NVRTC, and what a compiled
   executable carrying a cubin does at start (then no compiler is involved).
   GPU checks of this path are owed until a session with a GPU runs tests/gpu/run.sh. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/exec/exec.h"

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
  RtDevice dev;
  RtRankExec re;
  bool have_cp = false, have_re = false;
  int rc = 0;
  have_cp = !(rc = cuda_program_init(&cp, prog, image, n, 0, err, errlen));
  double t0 = seconds_now();
  if (!rc) rc = cuda_globals_init(&cp, plan->seed, err, errlen);
  if (!rc && plan->opt.log && seconds_now() - t0 >= 1)   /* a billion parameters take a while */
    fprintf(plan->opt.log, "cuda: parameters and optimizer state initialized in %.1f s\n", seconds_now() - t0);
  if (!rc) cuda_device(&dev, &cp);
  if (!rc) have_re = !(rc = rt_rank_exec_init(&re, &dev, plan->batch, plan->seq, err, errlen));
  if (!rc && plan->init) {   /* into the host copies, then to the device */
    rc = load_weights_views(re.ex.params, re.ex.n_params, plan->init, err, errlen);
    if (!rc) rc = re.ex.sync_in(re.ex.self, err, errlen);
  }
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: parameters %s; host memory peak so far %.0f MiB\n", plan->init ? "loaded" : "initialized",
            peak_rss_mib());
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: device memory %.1f MiB (arenas %.1f, parameters and state %.1f, workspace %.1f)\n",
            cp.mem.total / 1048576.0, cp.mem.arenas / 1048576.0, cp.mem.regions / 1048576.0, cp.mem.workspace / 1048576.0);
  if (!rc) rc = train_and_write(&re.ex, plan, err, errlen);
  if (!rc && cp.opt.profile) {
    if (cuda_profile_printer) cuda_profile_printer(&cp, plan->opt.grad_accum, stderr);
    else fprintf(stderr, "LOOM_PROFILE: the per-kernel table is printed by loom train, not by a compiled executable\n");
  }
  if (have_re) rt_rank_exec_free(&re);
  if (have_cp) cuda_program_free(&cp);
  return rc;
}
