/* driver/eval.c — what `loom eval` runs: the model through the eval pipeline (the forward,
 * with --grads the autodiff pass, on a mesh the shard pass), lowered for its backend, and
 * handed to the execution layer (runtime/exec/eval.c) as an opened Evaluator.  Only `loom`
 * links this: it calls the passes and the code generators. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda.h"
#include "codegen/lower_common.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/nvrtc.h"
#include "driver/driver.h"

/* GPU 0: lowered for CUDA, compiled by NVRTC for its architecture (cached). */
static int open_cuda(Module *m, const char *weights, Evaluator *e, char *err, size_t errlen) {
  char why[512];
  if (!cuda_available(why, sizeof why)) {
    snprintf(err, errlen, "--backend cuda: %s", why);
    return EXIT_USAGE;
  }
  CudaDeviceInfo info;
  RtProgram prog;
  memset(&prog, 0, sizeof prog);
  char *src = NULL, where[300];
  unsigned char *image = NULL;
  size_t n = 0;
  bool is_cubin = false;
  int rc = cuda_device_query(0, &info, err, errlen);
  if (!rc) rc = cuda_lower(m, &prog, &src, err, errlen);
  if (!rc) rc = nvrtc_compile_programs(src, info.arch, NULL, 0, &image, &n, &is_cubin, NULL, NULL, NULL, err, errlen);
  free(src);
  if (rc) {
    rt_program_free(&prog);
    free(image);
    return rc;
  }
  snprintf(where, sizeof where, "%s (%s)", info.name, info.arch);
  return eval_open_cuda(e, &prog, image, n, where, weights, err, errlen);
}

/* The cpu backend: lowered to bytes, as a compiled executable would carry them. */
static int open_cpu(Module *m, const char *weights, Evaluator *e, char *err, size_t errlen) {
  unsigned char *prog = NULL;
  size_t n = 0;
  char *llvm = NULL;
  int rc = lower_cpu_bytes(m, &prog, &n, &llvm, err, errlen);
  if (!rc)
    rc = mesh_world(&m->mesh) > 1 ? eval_open_cpu_mesh(e, m, prog, n, llvm, weights, err, errlen)
                                  : eval_open_cpu(e, prog, n, llvm, weights, err, errlen);
  free(prog);
  free(llvm);
  return rc;
}

int driver_eval_open(Input *in, Backend backend, bool grads, const PassOptions *hooks, const char *repro,
                     const char *weights, Evaluator *e, char *err, size_t errlen) {
  Module *m = in->m;
  bool mesh = mesh_world(&m->mesh) > 1;
  memset(e, 0, sizeof *e);
  if (mesh && backend == BACKEND_CUDA) {
    snprintf(err, errlen, "--backend cuda runs one rank (one GPU) for now; drop --mesh, or evaluate the mesh on the CPU");
    return EXIT_USAGE;
  }
  if (mesh && grads) {
    snprintf(err, errlen, "--grads runs one rank; drop --mesh (or --grads)");
    return EXIT_USAGE;
  }
  /* the spec's precision applies; on a mesh its sequence parallelism too */
  TrainSettings ts = train_defaults;
  ts.bf16 = !strcmp(in->spec.precision, "bf16");
  if (mesh) ts.sp = in->spec.sequence_parallel;
  PassOptions popt = *hooks;   /* the command's --print-ir-after, --dump-dir, ... */
  popt.train = &ts;
  popt.repro_cmd = repro;
  if (backend == BACKEND_CUDA) popt.target = TARGET_CUDA;
  char pipeline[512];
  snprintf(pipeline, sizeof pipeline, "%s%s",
           mesh ? EVAL_MESH_PIPELINE : grads ? EVAL_GRADS_PIPELINE : DEFAULT_PIPELINE,
           backend == BACKEND_REF ? "" : "," LOWER_PIPELINE);
  int rc = pipeline_run(m, pipeline, &popt, err, errlen);
  if (rc) return rc;
  switch (backend) {
  case BACKEND_CUDA: return open_cuda(m, weights, e, err, errlen);
  case BACKEND_CPU: return open_cpu(m, weights, e, err, errlen);
  default: {   /* the reference interpreter: the module described as a program (no steps) */
    RtProgram desc;
    rc = cg_describe_module(m, &desc, err, errlen);
    return rc ? rc : eval_open_ref(e, m, &desc, weights, err, errlen);
  }
  }
}
