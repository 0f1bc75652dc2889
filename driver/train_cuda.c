/* driver/train_cuda.c — training on the CUDA backend: the module lowered for the CUDA
   target (codegen/cuda), its translation unit compiled by NVRTC for this GPU (cached on
   disk), run by runtime/cuda_exec with cuBLASLt.  Only `loom` links this.
   GPU checks of this path are owed until a session with a GPU runs tests/gpu/run.sh. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cost.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/comm/comm_nccl.h"
#include "driver/driver.h"

bool cuda_backend_available(char *why, size_t n) {
  if (!cuda_available(why, n)) return false;
  int major, minor;
  return nvrtc_available(&major, &minor, why, n) != 0;
}

/* LOOM_PROFILE=N on the CUDA backend: the table of the last step's times (codegen/cuda/cost.c),
   the roofline of the device's hardware file (by its name; h100 when none matches). */
static void cuda_profile_print(const CudaProgram *cp, int64_t grad_accum, FILE *out) {
  static const char *const known[][2] = {{"H200", "h200"}, {"A100", "a100"}, {"B200", "b200"}};
  const char *hw_name = "h100";
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
    if (strstr(cp->info.name, known[k][0])) hw_name = known[k][1];
  Hardware hw;
  char err[512];
  const float **ms = calloc((size_t)cp->p->n_funcs + 1, sizeof *ms);
  if (!ms || hardware_load(hw_name, &hw, err, sizeof err)) {
    fprintf(out, "LOOM_PROFILE: no table (%s)\n", ms ? err : "out of memory");
    free(ms);
    return;
  }
  for (int f = 0; f < cp->p->n_funcs; f++) ms[f] = cuda_profile_ms(cp, f);
  const char *n = getenv("LOOM_PROFILE");
  fprintf(out, "device: %s\n", cp->info.name);
  cuda_profile_report(out, cp->p, &hw, ms, grad_accum > 0 ? grad_accum : 1, n && atoi(n) > 1 ? atoi(n) : 20);
  free(ms);
}

int run_training_cuda(Module *m, const RunPlan *plan, char *err, size_t errlen) {
  cuda_profile_printer = cuda_profile_print;
  char why[512];
  if (!cuda_available(why, sizeof why)) {
    snprintf(err, errlen, "--backend cuda: %s", why);
    return EXIT_USAGE;
  }
  CudaDeviceInfo info;
  int rc = cuda_device_query(0, &info, err, errlen);
  if (rc) return rc;
  RtProgram prog;
  memset(&prog, 0, sizeof prog);
  char *src = NULL, *log = NULL;
  unsigned char *image = NULL;
  size_t n = 0;
  bool is_cubin = false, hit = false;
  double t0 = seconds_now();
  rc = cuda_lower(m, &prog, &src, err, errlen);
  if (!rc && plan->opt.log)   /* NVRTC can take tens of seconds on a large model: say so first */
    fprintf(plan->opt.log, "cuda: compiling %d kernels with NVRTC for %s (cached for the next run) ...\n", prog.n_kernels,
            info.arch);
  if (!rc) rc = nvrtc_compile_programs(src, info.arch, NULL, 0, &image, &n, &is_cubin, &log, &hit, NULL, err, errlen);
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: %s (%s), %d kernels compiled for %s in %.2f s%s\n", info.name, info.arch,
            prog.n_kernels, info.arch, seconds_now() - t0, hit ? " (from the cache)" : "");
  if (!rc) rc = cuda_train_program(&prog, image, n, plan, err, errlen);
  rt_program_free(&prog);
  free(src);
  free(log);
  free(image);
  return rc;
}

int cuda_mesh_precheck(Module *m, char *err, size_t errlen) {
  RtProgram prog;
  int rc = cuda_lower(m, &prog, NULL, err, errlen);
  /* the ring transfers' plans (no device needed): what the ranks would refuse at start */
  for (int f = 0; !rc && f < prog.n_funcs; f++) {
    CudaP2pPlan pl;
    char why[1024];
    if (cuda_p2p_plan(&prog.funcs[f], &pl, why, sizeof why)) {
      bool split = m->pipe.kind == PIPE_ZBH1 || m->pipe.kind == PIPE_DUALPIPEV;
      snprintf(err, errlen, "%s%s", why,
               split && m->mesh.size[AX_CP] > 1
                   ? " — with cp, a split backward's ring sends its gradients from @bwd_b to @bwd_w, which the CUDA "
                     "backend cannot pair yet: use --pp-schedule 1f1b or interleaved with cp on cuda"
                   : "");
      rc = 2;
    }
    cuda_p2p_plan_free(&pl);
  }
  rt_program_free(&prog);
  if (rc) return EXIT_USAGE;
  char why[512];
  if (!cuda_backend_available(why, sizeof why)) {
    snprintf(err, errlen, "--backend cuda: %s", why);
    return EXIT_USAGE;
  }
  return 0;
}

/* loom train's side of a rank: lowered here, compiled by NVRTC for the GPU this rank will
   use (its LOCAL_RANK, as the NCCL world picks it), then trained by cuda_rank_train. */
int run_training_cuda_rank(Module *m, const RunPlan *plan, char *err, size_t errlen) {
  NcclBootstrap b;
  int rc = nccl_bootstrap_from_env(&b, err, errlen), count = 0;
  if (!rc && !cuda_available(err, errlen)) rc = EXIT_USAGE;
  if (!rc) rc = cuda_device_count(&count, err, errlen);
  int device = b.device >= 0 ? b.device : count > 0 ? b.rank % count : 0;
  CudaDeviceInfo info;
  if (!rc && device >= count) {
    snprintf(err, errlen, "rank %d: LOCAL_RANK %d but this machine has %d GPU%s", b.rank, device, count, count == 1 ? "" : "s");
    rc = EXIT_USAGE;
  }
  if (!rc) rc = cuda_device_query(device, &info, err, errlen);
  RtProgram prog;
  memset(&prog, 0, sizeof prog);
  char *src = NULL, *log = NULL;
  unsigned char *image = NULL;
  size_t n = 0;
  bool is_cubin = false, hit = false;
  double t0 = seconds_now();
  if (!rc) rc = cuda_lower(m, &prog, &src, err, errlen);
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: compiling %d kernels with NVRTC for %s (cached for the next run) ...\n", prog.n_kernels,
            info.arch);
  if (!rc) rc = nvrtc_compile_programs(src, info.arch, NULL, 0, &image, &n, &is_cubin, &log, &hit, NULL, err, errlen);
  if (!rc && plan->opt.log)
    fprintf(plan->opt.log, "cuda: %d kernels compiled for %s in %.2f s%s\n", prog.n_kernels, info.arch, seconds_now() - t0,
            hit ? " (from the cache)" : "");
  if (!rc) rc = cuda_rank_train(&prog, image, n, plan, err, errlen);
  rt_program_free(&prog);
  free(src);
  free(log);
  free(image);
  return rc;
}
