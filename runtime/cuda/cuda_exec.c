/* runtime/cuda/cuda_exec.c — see cuda_exec.h: a CudaProgram's life, its init (the context,
 * the CUDA module and its kernels, the memory, the GEMMs' plans) and its free, and the program
 * as an RtDevice.  What it runs lives beside it, each file on the program's private state
 * (LOOM_CUDA_INTERNAL, cuda_exec_internal.h): cuda_check.c (no device: conversions, checks,
 * the memory plan), cuda_memory.c (allocations and the host's copies), cuda_call.c (a call:
 * launches, CUDA graphs, the profile), cuda_step.c (a training step's graph), cuda_gemm.c
 * (GEMM steps), cuda_tmap.c (tensor maps), cuda_mesh.c (NCCL steps).  This file calls them;
 * none calls back (tests/lint/file_cycles.sh). */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/cuda/cuda_exec_internal.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/cuda_tmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuda_program_init(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device, char *err,
                      size_t errlen) {
  CudaOptions o;
  cuda_options_default(&o);
  return cuda_program_init_opts(cp, p, image, n, device, &o, err, errlen);
}

#ifdef LOOM_HAVE_CUDA_HEADERS
/* ================================================================== on the device */

#include "runtime/cuda/cuda_gemm.h"   /* the GEMM steps: plans, runs, the algorithms' timing */

static bool looks_binary(const unsigned char *b, size_t n) {
  if (n >= 4 && b[0] == 0x7F && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') return true;   /* cubin */
  if (n >= 4 && b[0] == 0x50 && b[1] == 0xED && b[2] == 0x55 && b[3] == 0xBA) return true; /* fatbin */
  return false;
}

static int load_module(CudaProgram *cp, const void *image, size_t n, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  /* a bundle of several NVRTC programs' cubins (nvrtc.h): a module each */
  _Static_assert(sizeof cp->modules / sizeof *cp->modules >= NVRTC_MAX_PROGRAMS, "a module per program");
  const unsigned char *parts[NVRTC_MAX_PROGRAMS];
  size_t sizes[NVRTC_MAX_PROGRAMS];
  int count = nvrtc_bundle_parts(image, n, parts, sizes, NVRTC_MAX_PROGRAMS);
  if (count < 0) return rt_fail(err, errlen, 2, "the program's CUDA module (%zu bytes) is a damaged bundle", n);
  if (count > 1) {
    for (int i = 0; i < count; i++) {
      int rc = load_module(cp, parts[i], sizes[i], err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  const unsigned char *b = image;
  char *copy = NULL;
  const void *img = image;
  if (!looks_binary(b, n) && (n == 0 || b[n - 1] != 0)) {   /* PTX text must end in a NUL */
    copy = malloc(n + 1);
    if (!copy) return rt_fail(err, errlen, 1, "out of memory");
    memcpy(copy, image, n);
    copy[n] = 0;
    img = copy;
  }
  enum { LOG_BYTES = 8192 };
  char *jit_log = calloc(1, LOG_BYTES);
  CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {jit_log, (void *)(uintptr_t)(jit_log ? LOG_BYTES - 1 : 0)};
  CUmodule m = NULL;
  CUresult r = d->cuModuleLoadDataEx(&m, img, jit_log ? 2 : 0, opts, vals);
  free(copy);
  int rc = 0;
  if (r != CUDA_SUCCESS) {
    char where[1024];
    snprintf(where, sizeof where, "loading the program's CUDA module (%zu bytes, for %s %s)%s%.400s", n, cp->info.name,
             cp->info.arch, jit_log && jit_log[0] ? ": " : "", jit_log ? jit_log : "");
    rc = cuda_cu_fail(r, "cuModuleLoadData", where, err, errlen);
  }
  free(jit_log);
  if (!rc) cp->modules[cp->n_modules++] = m;
  return rc;
}

static int load_kernels(CudaProgram *cp, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  const RtProgram *p = cp->p;
  cp->fns = calloc((size_t)(p->n_kernels ? p->n_kernels : 1), sizeof(void *));
  if (!cp->fns) return rt_fail(err, errlen, 1, "out of memory");
  for (int k = 0; k < p->n_kernels; k++) {
    char name[sizeof p->kernel_names[0] + 1];
    memcpy(name, p->kernel_names[k], sizeof p->kernel_names[0]);
    name[sizeof p->kernel_names[0]] = 0;
    CUfunction fn = NULL;
    char where[128];
    snprintf(where, sizeof where, "(kernel %s, #%d, is not in the CUDA module)", name, k);
    for (int m = 0; m < cp->n_modules - 1 && !fn; m++)   /* the last module says why it is missing */
      if (d->cuModuleGetFunction(&fn, (CUmodule)cp->modules[m], name) != CUDA_SUCCESS) fn = NULL;
    if (!fn && CU(cuModuleGetFunction, (&fn, (CUmodule)cp->modules[cp->n_modules - 1], name), where)) return 1;
    cp->fns[k] = fn;
    /* Launch limits of this kernel, checked once against every step that launches it. */
    uint32_t smem = 0, threads = 0;
    for (int f = 0; f < p->n_funcs; f++)
      for (int s = 0; s < p->funcs[f].n_steps; s++) {
        const RtStep *st = &p->funcs[f].steps[s];
        if (st->kind != RT_STEP_KERNEL || st->which != k) continue;
        if (st->smem > smem) smem = st->smem;
        uint32_t t = st->block[0] * st->block[1] * st->block[2];
        if (t > threads) threads = t;
      }
    snprintf(where, sizeof where, "(kernel %s)", name);
    if (smem > 48 * 1024) {
      if ((int)smem > cp->info.max_smem_optin)
        return rt_fail(err, errlen, 2, "kernel %s asks for %u bytes of shared memory; %s allows %d", name, smem,
                    cp->info.name, cp->info.max_smem_optin);
      if (CU(cuFuncSetAttribute, (fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem), where)) return 1;
    }
    int max_threads = 0;
    if (CU(cuFuncGetAttribute, (&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn), where)) return 1;
    if (threads > (uint32_t)max_threads)
      return rt_fail(err, errlen, 2, "kernel %s is launched with %u threads per block; compiled it allows %d (registers?)",
                  name, threads, max_threads);
  }
  return 0;
}

int cuda_program_init_opts(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device,
                           const CudaOptions *opt, char *err, size_t errlen) {
  memset(cp, 0, sizeof *cp);
  cp->p = p;
  cp->device = -1;
  if (opt) cp->opt = *opt;
  else cuda_options_default(&cp->opt);
  int rc = cuda_program_check(p, err, errlen);
  if (rc) {
    cp->p = NULL;
    return rc;
  }
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) {
    cp->p = NULL;
    return 1;
  }
  if (cuda_device_query(device, &cp->info, err, errlen) || cuda_device_retain(device, &cp->ctx, err, errlen)) {
    cp->p = NULL;
    return 1;
  }
  cp->device = device;
  size_t nf = (size_t)(p->n_funcs ? p->n_funcs : 1);
  CudaMemory plan;
  cuda_program_memory_plan(p, cp->opt.workspace_bytes, &plan);
  cp->plans = calloc(nf, sizeof *cp->plans);
  cp->gstorage = calloc((size_t)(p->n_globals ? p->n_globals : 1), sizeof *cp->gstorage);
  rc = cp->plans && cp->gstorage ? 0 : rt_fail(err, errlen, 1, "out of memory");
  for (int f = 0; !rc && f < p->n_funcs; f++)
    if (!(cp->plans[f] = calloc((size_t)(p->funcs[f].n_steps ? p->funcs[f].n_steps : 1), sizeof(CudaGemmPlan *))))
      rc = rt_fail(err, errlen, 1, "out of memory");
  for (int g = 0; !rc && g < p->n_globals; g++) cp->gstorage[g] = cuda_global_storage(p, g);
  /* Host staging: the largest function's arguments, or its results, in their storage. */
  for (int f = 0; !rc && f < p->n_funcs; f++) {
    size_t in = 0, out = 0;
    for (int a = 0; a < p->funcs[f].n_args; a++)
      in += ((size_t)p->funcs[f].args[a].n * (size_t)cuda_storage_size((RtStorage)p->funcs[f].args[a].storage) + 63) / 64 * 64;
    for (int a = 0; a < p->funcs[f].n_rets; a++)
      out += ((size_t)p->funcs[f].rets[a].n * (size_t)cuda_storage_size((RtStorage)p->funcs[f].rets[a].storage) + 63) / 64 * 64;
    if (in > cp->staging_bytes) cp->staging_bytes = in;
    if (out > cp->staging_bytes) cp->staging_bytes = out;
  }
  if (!rc && !(cp->staging = malloc(cp->staging_bytes ? cp->staging_bytes : 64))) rc = rt_fail(err, errlen, 1, "out of memory");
  CUstream stream = NULL;
  if (!rc) rc = CU(cuStreamCreate, (&stream, CU_STREAM_NON_BLOCKING), "");
  cp->stream = stream;
  if (!rc && p->n_kernels > 0) {
    if (!image || !n) rc = rt_fail(err, errlen, 2, "the program has %d kernels but no CUDA module", p->n_kernels);
    else rc = load_module(cp, image, n, err, errlen);
    if (!rc) rc = load_kernels(cp, err, errlen);
  }
  static const char *const region_name[RT_REGION_COUNT] = {"the arena", "the parameters", "the gradient accumulators",
                                                            "the optimizer state"};
  for (int r = 1; !rc && r < RT_REGION_COUNT; r++)
    if (!(rc = cuda_alloc_zeroed(cp, &cp->regions[r], p->region_bytes[r], region_name[r], err, errlen)))
      cp->mem.regions += p->region_bytes[r];
  /* One arena for every function, as the memory plan (loom ir --memory) counts it: calls
     never overlap (each ends with a synchronization after copying its results out), and no
     function keeps anything in its arena from one call to the next. */
  if (!rc && (rc = cuda_alloc_zeroed(cp, &cp->arena, plan.max_arena, "the arena", err, errlen)) == 0)
    cp->mem.arenas = cp->mem.max_arena = plan.max_arena;
  if (!rc) rc = cuda_tmaps_build(cp, err, errlen);   /* the addresses are fixed from here on */
  if (!rc && plan.workspace > 0) {
    const CublasLtApi *l = cuda_cublaslt(err, errlen);
    cublasLtHandle_t h = NULL;
    rc = l ? 0 : 1;
    if (!rc && LT(cublasLtCreate, (&h), "")) {
      char m[700];
      snprintf(m, sizeof m, "%s (the driver supports CUDA %d.%d; cuBLASLt %zu)", err, d->driver_version / 1000,
               d->driver_version % 1000 / 10, l->cublasLtGetVersion());
      snprintf(err, errlen, "%s", m);
      rc = 1;
    }
    cp->lt = h;
    if (!rc && !(rc = cuda_alloc_zeroed(cp, &cp->workspace, plan.workspace, "the cuBLASLt workspace", err, errlen)))
      cp->mem.workspace = plan.workspace;
  }
  for (int f = 0; !rc && f < p->n_funcs; f++)
    for (int s = 0; !rc && s < p->funcs[f].n_steps; s++)
      if (p->funcs[f].steps[s].kind == RT_STEP_GEMM) rc = cuda_plan_gemm(cp, f, s, &cp->plans[f][s], err, errlen);
  if (!rc && cp->opt.gemm_tune) rc = cuda_tune_gemms(cp, err, errlen);
  if (!rc && cp->opt.profile) rc = cuda_profile_init(cp, err, errlen);
  if (!rc && !(cp->graph = calloc(nf, sizeof *cp->graph))) rc = rt_fail(err, errlen, 1, "out of memory");
  if (!rc && !(cp->graph_off = calloc(nf, sizeof *cp->graph_off))) rc = rt_fail(err, errlen, 1, "out of memory");
  if (!rc) rc = CU(cuStreamSynchronize, ((CUstream)cp->stream), "(initializing the program's memory)");
  cp->f_copies = cuda_find_func(cp, RT_FUNC_WEIGHT_COPIES);
  cp->copies_stale = true;
  cp->f_first = cuda_find_func(cp, RT_FUNC_FIRST_GRAD_STEP);
  cp->f_grad = cuda_find_func(cp, "grad_step");
  cp->f_opt = cuda_find_func(cp, "optimizer_step");
  if (cp->f_grad < 0 || cp->f_opt < 0) cp->f_first = -1;
  cp->grads_stale = cp->grads_held = false;   /* allocated as zeros */
  cp->mem.total = cp->mem.arenas + cp->mem.regions + cp->mem.workspace;
  if (!rc && cuda_device_query(device, &cp->info, err, errlen)) rc = 1;   /* free memory, now */
  if (rc) cuda_program_free(cp);
  return rc;
}

void cuda_program_free(CudaProgram *cp) {
  if (!cp->p) return;
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  const CublasLtApi *l = cp->lt ? cuda_cublaslt(NULL, 0) : NULL;
  bool spoiled = false;
  if (d && cp->ctx) {
    d->cuCtxSetCurrent((CUcontext)cp->ctx);
    if (cp->stream) d->cuStreamSynchronize((CUstream)cp->stream);   /* errors here change nothing: free anyway */
    spoiled = cp->broken && d->cuCtxSynchronize() != CUDA_SUCCESS;
  }
  cuda_mesh_free(cp);
  for (int f = 0; d && cp->graph && f < cp->p->n_funcs; f++)
    if (cp->graph[f]) d->cuGraphExecDestroy((CUgraphExec)cp->graph[f]);
  free(cp->graph);
  free(cp->graph_off);
  if (d && cp->step_graph) d->cuGraphExecDestroy((CUgraphExec)cp->step_graph);
  if (d && cp->step_io) d->cuMemFree((CUdeviceptr)cp->step_io);
  cuda_step_slots_free(cp, d);
  for (int k = 0; k < CUDA_STEP_SLOTS; k++) {
    if (d && cp->step_slot[k].done) d->cuEventDestroy((CUevent)cp->step_slot[k].done);
    free(cp->step_slot[k].res);
  }
  for (int e = 0; d && cp->prof_ev && e < cp->n_prof_ev; e++)
    if (cp->prof_ev[e]) d->cuEventDestroy((CUevent)cp->prof_ev[e]);
  free(cp->prof_ev);
  for (int f = 0; cp->prof_ms && f < cp->p->n_funcs; f++) free(cp->prof_ms[f]);
  free(cp->prof_ms);
  free(cp->prof_calls);
  for (int f = 0; cp->plans && f < cp->p->n_funcs; f++) {
    for (int s = 0; cp->plans[f] && s < cp->p->funcs[f].n_steps; s++) cuda_plan_free(l, cp->plans[f][s]);
    free(cp->plans[f]);
  }
  free(cp->plans);
  cuda_tmaps_free(cp);
  if (d && cp->ctx) {
    if (l && cp->lt) l->cublasLtDestroy((cublasLtHandle_t)cp->lt);
    if (cp->arena) d->cuMemFree((CUdeviceptr)cp->arena);
    for (int r = 1; r < RT_REGION_COUNT; r++)
      if (cp->regions[r]) d->cuMemFree((CUdeviceptr)cp->regions[r]);
    if (cp->workspace) d->cuMemFree((CUdeviceptr)cp->workspace);
    if (cp->stream) d->cuStreamDestroy((CUstream)cp->stream);
    for (int m = 0; m < cp->n_modules; m++) d->cuModuleUnload((CUmodule)cp->modules[m]);
  }
  /* A fault spoiled the context for the whole process: drop our reference, then reset it
     (others may hold it: NCCL's CUDA runtime does until exit), so the next user gets a fresh one. */
  if (cp->device >= 0 && cp->ctx) cuda_device_release(cp->device);
  if (spoiled) cuda_device_recover(cp->device);
  free(cp->fns);
  free(cp->gstorage);
  free(cp->staging);
  memset(cp, 0, sizeof *cp);
}


#else /* built without the CUDA headers */

int cuda_program_init_opts(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device,
                           const CudaOptions *opt, char *err, size_t errlen) {
  memset(cp, 0, sizeof *cp);
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
void cuda_program_free(CudaProgram *cp) { memset(cp, 0, sizeof *cp); }

#endif

/* ================================================================== the device (runtime/device.h) */

static int dev_call(RtDevice *d, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return cuda_program_call(d->impl, func, args, rets, err, errlen);
}
static int dev_read(RtDevice *d, int g, float *out, char *err, size_t errlen) {
  return cuda_global_read(d->impl, g, out, err, errlen);
}
static int dev_write(RtDevice *d, int g, const float *in, char *err, size_t errlen) {
  return cuda_global_write(d->impl, g, in, err, errlen);
}

/* one CUDA graph a training step (cuda_program_step) */
static int dev_step(RtDevice *d, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets, float lr,
                    float t, float *losses, float *grad_norm, char *err, size_t errlen) {
  return cuda_program_step(d->impl, f_grad, f_opt, n, inputs, targets, lr, t, losses, grad_norm, err, errlen);
}

/* the same in two halves: the training loop issues step N+1 before it waits for step N */
static int dev_step_issue(RtDevice *d, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                          float lr, float t, char *err, size_t errlen) {
  return cuda_program_step_issue(d->impl, f_grad, f_opt, n, inputs, targets, lr, t, err, errlen);
}
static int dev_step_wait(RtDevice *d, float *losses, float *grad_norm, char *err, size_t errlen) {
  return cuda_program_step_wait(d->impl, losses, grad_norm, err, errlen);
}

/* device memory a caller keeps between calls (a pipeline's stash), and calls that read and
   write it in place (cuda_program_call_dev) */
static int dev_buf_alloc(RtDevice *d, int64_t bytes, uint64_t *addr, char *err, size_t errlen) {
  return cuda_dev_alloc(d->impl, addr, bytes, "a pipeline stash", err, errlen);
}
static void dev_buf_free(RtDevice *d, uint64_t addr) { cuda_dev_free(d->impl, addr); }
static int dev_call_dev(RtDevice *d, int func, void *const *args, const uint64_t *dargs, void **rets, const uint64_t *drets,
                        char *err, size_t errlen) {
  return cuda_program_call_dev(d->impl, func, args, dargs, rets, drets, err, errlen);
}

void cuda_device(RtDevice *d, CudaProgram *cp) {
  *d = (RtDevice){.p = cp->p, .kind = "CUDA", .impl = cp, .call = dev_call, .read = dev_read, .write = dev_write,
                  .host = NULL, .close = NULL, .step = dev_step, .buf_alloc = dev_buf_alloc, .buf_free = dev_buf_free,
                  .call_dev = dev_call_dev};
  if (!cp->opt.sync_step && !cp->comm) d->step_issue = dev_step_issue, d->step_wait = dev_step_wait;
}
