/* runtime/cuda/cuda_call.c — one call of a CudaProgram's function: the arguments copied in,
 * the steps launched on the stream (a kernel, a GEMM, a collective: cuda_run_step), or the
 * function's CUDA graph (captured at its first call, CudaOptions.graphs) launched instead, the
 * results copied out, one synchronization; and the profile (CudaOptions.profile) of its steps.
 * Its own file: the one path every call takes; the training step (cuda_step.c) reuses its
 * steps and its graph capture for a whole step's graph. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/cuda/cuda_exec_internal.h"
#include "runtime/cuda/cuda_tmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDA_HEADERS

#include "runtime/cuda/cuda_gemm.h"   /* the GEMM steps: plans, runs, the algorithms' timing */

/* The profile's events and times (CudaOptions.profile). */
int cuda_profile_init(CudaProgram *cp, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  int most = 0, nf = cp->p->n_funcs;
  for (int f = 0; f < nf; f++)
    if (cp->p->funcs[f].n_steps > most) most = cp->p->funcs[f].n_steps;
  cp->prof_ev = calloc((size_t)most + 1, sizeof *cp->prof_ev);
  cp->prof_ms = calloc((size_t)(nf ? nf : 1), sizeof *cp->prof_ms);
  cp->prof_calls = calloc((size_t)(nf ? nf : 1), sizeof *cp->prof_calls);
  if (!cp->prof_ev || !cp->prof_ms || !cp->prof_calls) return rt_fail(err, errlen, 1, "out of memory");
  for (int f = 0; f < nf; f++)
    if (!(cp->prof_ms[f] = calloc((size_t)cp->p->funcs[f].n_steps + 1, sizeof(float)))) return rt_fail(err, errlen, 1, "out of memory");
  for (int e = 0; e <= most; e++) {
    CUevent ev = NULL;
    if (CU(cuEventCreate, (&ev, CU_EVENT_DEFAULT), "(the profile's events)")) return 1;
    cp->prof_ev[cp->n_prof_ev++] = ev;
  }
  return 0;
}

/* After a profiled call's synchronization: every step's time. */
static int profile_read(CudaProgram *cp, int f, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  int n = cp->p->funcs[f].n_steps;
  for (int s = 0; s < n; s++) {
    float ms = 0;
    if (CU(cuEventElapsedTime, (&ms, (CUevent)cp->prof_ev[s], (CUevent)cp->prof_ev[s + 1]), "(reading the profile)")) return 1;
    cp->prof_ms[f][s] = ms;
  }
  cp->prof_calls[f]++;
  return 0;
}

const float *cuda_profile_ms(const CudaProgram *cp, int f) {
  return cp->prof_calls && f >= 0 && f < cp->p->n_funcs && cp->prof_calls[f] ? cp->prof_ms[f] : NULL;
}

static int launch(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  const RtStep *st = &cp->p->funcs[f].steps[s];
  uint64_t base[RT_REGION_COUNT];
  for (int r = 0; r < RT_REGION_COUNT; r++) base[r] = r == RT_REGION_ARENA ? cp->arena : cp->regions[r];
  CudaLoomArgs args;
  cuda_pack_args(st, base, &args);
  if (st->coord_at && st->coord_at <= RT_MAX_INTS && st->coord_axis < 5) args.i[st->coord_at - 1] = cp->coord[st->coord_axis];
  void *params[2] = {&args, (void *)cuda_tmaps_of(cp, f, s)};   /* the second for a kernel that takes tensor maps */
  return CU(cuLaunchKernel,
            ((CUfunction)cp->fns[st->which], st->grid[0], st->grid[1], st->grid[2], st->block[0], st->block[1],
             st->block[2], st->smem, (CUstream)cp->stream, params, NULL),
            where);
}

int cuda_run_step(CudaProgram *cp, int func, int s, char *err, size_t errlen) {
  char where[256];
  cuda_step_where(cp, func, s, where, sizeof where);
  const RtStep *st = &cp->p->funcs[func].steps[s];
  return st->kind == RT_STEP_GEMM      ? cuda_run_gemm(cp, func, s, where, err, errlen)
         : st->kind == RT_STEP_BUILTIN ? cuda_mesh_step(cp, func, s, where, err, errlen)
                                       : launch(cp, func, s, where, err, errlen);
}

/* CUDA graphs (CudaOptions.graphs): function f's steps are captured once into a graph; every
   call launches it, one launch instead of one per step.  The steps' parameters are the same at
   every call (fixed addresses: the arena, the regions, the workspace; i[] and f[]), so the
   graph is valid for the program's life.  Not for steps on other streams (a mesh's NCCL calls,
   a pipeline's transfers), nor when each step is timed or synchronized. */
bool cuda_graphed(const CudaProgram *cp, int f) {
  if (!cp->opt.graphs || !cp->graph || cp->graph_off[f] || cp->comm || cp->pipe_slot || cp->prof_ev ||
      cp->opt.sync_each_step)
    return false;
  const RtFunc *fn = &cp->p->funcs[f];
  for (int s = 0; s < fn->n_steps; s++)
    if (fn->steps[s].kind == RT_STEP_BUILTIN) return false;
  return fn->n_steps > 0;
}

/* Ends the stream's capture and, when the captured launches all went well (ok), instantiates
   it: the runnable graph, or NULL where the driver refused either (the caller runs step by
   step from then on). */
CUgraphExec cuda_end_capture(const CudaDriverApi *d, CUstream stream, bool ok) {
  CUgraph g = NULL;
  CUresult r = d->cuStreamEndCapture(stream, &g);
  CUgraphExec exec = NULL;
  if (ok && r == CUDA_SUCCESS && g) r = d->cuGraphInstantiate(&exec, g, 0);
  if (g) d->cuGraphDestroy(g);
  if (r != CUDA_SUCCESS && exec) {
    d->cuGraphExecDestroy(exec);
    exec = NULL;
  }
  return exec;
}

/* Captures function f's steps into cp->graph[f].  A capture the driver refuses (an operation
   it cannot record) is not an error: the function runs step by step from then on
   (graph_off); the steps ran nowhere during the capture. */
static int capture(CudaProgram *cp, int f, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  CUstream stream = (CUstream)cp->stream;
  char where[256];
  snprintf(where, sizeof where, "capturing @%s into a CUDA graph", cp->p->funcs[f].name);
  if (CU(cuStreamBeginCapture, (stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), where)) return 1;
  char step_err[512] = "";
  int rc = 0;
  for (int s = 0; !rc && s < cp->p->funcs[f].n_steps; s++) rc = cuda_run_step(cp, f, s, step_err, sizeof step_err);
  CUgraphExec exec = cuda_end_capture(d, stream, rc == 0);
  if (!exec) cp->graph_off[f] = true;
  cp->graph[f] = exec;
  return 0;
}

int cuda_program_call(CudaProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return cuda_program_call_dev(cp, func, args, NULL, rets, NULL, err, errlen);
}

static bool reads_grads(const CudaProgram *cp, int f) {
  const RtFunc *fn = &cp->p->funcs[f];
  for (int s = 0; s < fn->n_steps; s++)
    for (int b = 0; b < fn->steps[s].n_in + fn->steps[s].n_out; b++)
      if (fn->steps[s].bufs[b].region == RT_REGION_GRADS) return true;
  return false;
}

int cuda_program_call_dev(CudaProgram *cp, int func, void *const *args, const uint64_t *dargs, void **rets,
                          const uint64_t *drets, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (func < 0 || func >= cp->p->n_funcs) return rt_fail(err, errlen, 2, "no function #%d in the program", func);
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  int rc = 0;
  if (cp->f_first >= 0 && cp->grads_stale) {   /* the gradients after @optimizer_step: written, or zeroed first */
    if (func == cp->f_grad) func = cp->f_first;
    else if (func != cp->f_first && reads_grads(cp, func)) rc = cuda_grads_zero(cp, err, errlen);
  }
  const RtFunc *fn = &cp->p->funcs[func];
  CUstream stream = (CUstream)cp->stream;
  char where[256];
  /* the bf16 copies of the parameters, after the host wrote them (or anything else) */
  if (!rc && cp->copies_stale && cp->f_copies >= 0 && func != cp->f_copies) {
    for (int s = 0; !rc && s < cp->p->funcs[cp->f_copies].n_steps; s++) rc = cuda_run_step(cp, cp->f_copies, s, err, errlen);
    if (rc) {
      cp->broken = true;
      d->cuStreamSynchronize(stream);
      return rc;
    }
    cp->copies_stale = false;
  }
  snprintf(where, sizeof where, "copying the arguments of @%s", fn->name);
  size_t off = 0;
  for (int a = 0; !rc && a < fn->n_args; a++) {
    const RtBuf *b = &fn->args[a];
    size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
    if (dargs && dargs[a]) {   /* already on the device, in the argument's storage */
      if (bytes) rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, func, b), (CUdeviceptr)dargs[a], bytes, stream), where);
      continue;
    }
    cuda_f32_to_storage((RtStorage)b->storage, args[a], cp->staging + off, b->n);
    if (bytes)
      rc = CU(cuMemcpyHtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, func, b), cp->staging + off, bytes, stream), where);
    off += (bytes + 63) / 64 * 64;
  }
  bool prof = cp->prof_ev != NULL;
  if (!rc && cuda_graphed(cp, func)) {
    if (!cp->graph[func]) rc = capture(cp, func, err, errlen);
    snprintf(where, sizeof where, "launching the CUDA graph of @%s", fn->name);
    if (!rc && cp->graph[func]) rc = CU(cuGraphLaunch, ((CUgraphExec)cp->graph[func], stream), where);
  }
  for (int s = 0; !rc && !cp->graph[func] && s < fn->n_steps; s++) {
    if (prof && (rc = CU(cuEventRecord, ((CUevent)cp->prof_ev[s], stream), where))) break;
    rc = cuda_run_step(cp, func, s, err, errlen);
    if (!rc && cp->opt.sync_each_step) rc = CU(cuStreamSynchronize, (stream), where);
  }
  if (!rc && prof) rc = CU(cuEventRecord, ((CUevent)cp->prof_ev[fn->n_steps], stream), "(the profile's last event)");
  off = 0;
  snprintf(where, sizeof where, "copying the results of @%s", fn->name);
  for (int r = 0; !rc && r < fn->n_rets; r++) {
    const RtBuf *b = &fn->rets[r];
    size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
    if (drets && drets[r] && bytes)
      rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)drets[r], (CUdeviceptr)cuda_buf_addr(cp, func, b), bytes, stream), where);
    else if (rets[r] && bytes)
      rc = CU(cuMemcpyDtoHAsync, (cp->staging + off, (CUdeviceptr)cuda_buf_addr(cp, func, b), bytes, stream), where);
    off += (bytes + 63) / 64 * 64;
  }
  if (!rc) {
    snprintf(where, sizeof where, "after @%s (a kernel or GEMM of it failed; LOOM_CUDA_SYNC=1 names the step)", fn->name);
    rc = cp->comm ? cuda_mesh_sync(cp, where, err, errlen) : CU(cuStreamSynchronize, (stream), where);
  }
  if (!rc && prof) rc = profile_read(cp, func, err, errlen);
  off = 0;
  for (int r = 0; !rc && r < fn->n_rets; r++) {
    const RtBuf *b = &fn->rets[r];
    size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
    if (rets[r] && !(drets && drets[r])) cuda_storage_to_f32((RtStorage)b->storage, cp->staging + off, rets[r], b->n);
    off += (bytes + 63) / 64 * 64;
  }
  if (rc) {
    cp->broken = true;
    /* Let queued work finish (or fail) before anyone frees what it uses. */
    d->cuStreamSynchronize(stream);
  }
  if (!rc && cp->f_first >= 0 && (func == cp->f_first || func == cp->f_grad)) cp->grads_stale = false, cp->grads_held = true;
  if (!rc && cp->f_first >= 0 && func == cp->f_opt) cp->grads_stale = true, cp->grads_held = false;
  return rc;
}

#else /* built without the CUDA headers */

int cuda_program_call(CudaProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return rt_fail(err, errlen, cp->p ? 1 : 2, "%s", NO_CUDA);
}
int cuda_program_call_dev(CudaProgram *cp, int func, void *const *args, const uint64_t *dargs, void **rets,
                          const uint64_t *drets, char *err, size_t errlen) {
  return rt_fail(err, errlen, cp->p ? 1 : 2, "%s", NO_CUDA);
}

#endif
