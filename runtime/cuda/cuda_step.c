/* runtime/cuda/cuda_step.c — a whole training step on the device (cuda_program_step and its
 * two halves, _issue and _wait): every micro-batch's @grad_step and the @optimizer_step as ONE
 * CUDA graph, its inputs and losses through one device buffer (step_io) and a host image per
 * step in flight, so that the training loop issues step N+1 before it reads step N's loss.  Its
 * own file: the step's buffers, slots and events (CudaProgram.step_*) are touched nowhere
 * else but in cuda_program_free. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/cuda/cuda_exec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDA_HEADERS

/* ---- one CUDA graph a training step (cuda_program_step) ----
   step_io holds, 64-byte aligned each: per micro-batch its tokens and targets (in @grad_step's
   argument storages), @optimizer_step's lr and t, then (the outputs, from step_in on) each
   micro-batch's loss and the gradient norm.  The graph moves them with device copies (no host
   copy can be captured); the host copies them in before the launch and out after it. */
static size_t io_bytes(const RtBuf *b) { return ((size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage) + 63) / 64 * 64; }

static bool step_graph_wanted(CudaProgram *cp, int fg, int fo) {
  const char *e = getenv("LOOM_CUDA_STEP_GRAPH");
  if ((e && !strcmp(e, "0")) || cp->step_graph_off || !cuda_graphed(cp, fg) || !cuda_graphed(cp, fo)) return false;
  const RtFunc *g = &cp->p->funcs[fg], *o = &cp->p->funcs[fo];
  return g->n_args == 2 && g->n_rets >= 1 && o->n_args == 2 && o->n_rets >= 1;
}

/* The slots' host images (page-locked where the driver gives them) and events. */
void cuda_step_slots_free(CudaProgram *cp, const CudaDriverApi *d) {
  for (int k = 0; k < CUDA_STEP_SLOTS; k++) {
    if (cp->step_slot[k].pinned && d) d->cuMemFreeHost(cp->step_slot[k].host);
    else if (!cp->step_slot[k].pinned) free(cp->step_slot[k].host);
    cp->step_slot[k].host = NULL;
    cp->step_slot[k].pinned = false;
  }
}

/* step_io and its slots' host images for n micro-batches (kept while n stays; not while a
   step is in flight, whose copies use them) */
static int step_io_init(CudaProgram *cp, int fg, int fo, int64_t n, char *err, size_t errlen) {
  const RtFunc *g = &cp->p->funcs[fg], *o = &cp->p->funcs[fo];
  size_t in = (size_t)n * (io_bytes(&g->args[0]) + io_bytes(&g->args[1])) + io_bytes(&o->args[0]) + io_bytes(&o->args[1]);
  size_t all = in + (size_t)n * io_bytes(&g->rets[0]) + io_bytes(&o->rets[0]);
  if (cp->step_io && cp->step_graph_n == n) return 0;
  if (cp->step_count)
    return rt_fail(err, errlen, 2, "a training step of %lld micro-batches issued while one of %lld is in flight; wait for it "
                   "first", (long long)n, (long long)cp->step_graph_n);
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  if (cp->step_graph) d->cuGraphExecDestroy((CUgraphExec)cp->step_graph);
  cp->step_graph = NULL;
  if (cp->step_io) d->cuMemFree((CUdeviceptr)cp->step_io);
  cp->step_io = 0;
  cuda_step_slots_free(cp, d);
  for (int k = 0; k < CUDA_STEP_SLOTS; k++) {
    void *h = NULL;
    /* page-locked: a copy from or to pageable memory may wait for the stream, which would
       make the host wait for step N before step N+1 is issued */
    if (d->cuMemAllocHost(&h, all) == CUDA_SUCCESS && h) cp->step_slot[k].pinned = true;
    else h = malloc(all);
    if (!(cp->step_slot[k].host = h)) return rt_fail(err, errlen, 1, "out of memory");
    if (!cp->step_slot[k].done && CU(cuEventCreate, ((CUevent *)&cp->step_slot[k].done, CU_EVENT_DISABLE_TIMING),
                                     "(the training step's events)"))
      return 1;
  }
  CUdeviceptr at = 0;
  if (CU(cuMemAlloc, (&at, all), "(the training step's inputs and outputs)")) return 1;
  cp->step_io = (uint64_t)at;
  cp->step_in = in;
  cp->step_bytes = all;
  cp->step_graph_n = n;
  return 0;
}

/* The step's launches on the stream (captured into the graph): per micro-batch its tokens and
   targets into @grad_step's arguments, its steps, its loss out; then lr and t, @optimizer_step's
   steps, the norm out. */
static int step_issue(CudaProgram *cp, int fg, int fo, int64_t n, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  CUstream stream = (CUstream)cp->stream;
  const RtFunc *g = &cp->p->funcs[fg], *o = &cp->p->funcs[fo];
  const char *where = "(the training step's graph)";
  size_t in = 0, out = cp->step_in;
  int rc = 0;
  for (int64_t m = 0; !rc && m < n; m++) {
    for (int a = 0; !rc && a < 2; a++) {
      size_t bytes = (size_t)g->args[a].n * (size_t)cuda_storage_size((RtStorage)g->args[a].storage);
      if (bytes)
        rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, fg, &g->args[a]), (CUdeviceptr)(cp->step_io + in), bytes, stream), where);
      in += io_bytes(&g->args[a]);
    }
    /* the first micro-batch writes the gradients, whatever they held (the same buffers) */
    int f = m == 0 && fg == cp->f_grad && cp->f_first >= 0 ? cp->f_first : fg;
    for (int s = 0; !rc && s < cp->p->funcs[f].n_steps; s++) rc = cuda_run_step(cp, f, s, err, errlen);
    size_t bytes = (size_t)g->rets[0].n * (size_t)cuda_storage_size((RtStorage)g->rets[0].storage);
    if (!rc && bytes)
      rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)(cp->step_io + out), (CUdeviceptr)cuda_buf_addr(cp, fg, &g->rets[0]), bytes, stream), where);
    out += io_bytes(&g->rets[0]);
  }
  for (int a = 0; !rc && a < 2; a++) {
    size_t bytes = (size_t)o->args[a].n * (size_t)cuda_storage_size((RtStorage)o->args[a].storage);
    if (bytes) rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)cuda_buf_addr(cp, fo, &o->args[a]), (CUdeviceptr)(cp->step_io + in), bytes, stream), where);
    in += io_bytes(&o->args[a]);
  }
  for (int s = 0; !rc && s < o->n_steps; s++) rc = cuda_run_step(cp, fo, s, err, errlen);
  size_t bytes = (size_t)o->rets[0].n * (size_t)cuda_storage_size((RtStorage)o->rets[0].storage);
  if (!rc && bytes)
    rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)(cp->step_io + out), (CUdeviceptr)cuda_buf_addr(cp, fo, &o->rets[0]), bytes, stream), where);
  return rc;
}

/* Captures the step's graph; a capture the driver refuses is not an error: the step goes call
   by call from then on (step_graph_off). */
static void step_capture(CudaProgram *cp, int fg, int fo, int64_t n) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  CUstream stream = (CUstream)cp->stream;
  char e[512] = "";
  if (!d || d->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) {
    cp->step_graph_off = true;
    return;
  }
  int rc = step_issue(cp, fg, fo, n, e, sizeof e);
  CUgraphExec exec = cuda_end_capture(d, stream, rc == 0);
  if (!exec) cp->step_graph_off = true;
  cp->step_graph = exec;
}

int cuda_program_step_issue(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs,
                            const int32_t *targets, float lr, float t, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (f_grad < 0 || f_grad >= cp->p->n_funcs || f_opt < 0 || f_opt >= cp->p->n_funcs || n < 1 ||
      cp->p->funcs[f_grad].n_rets < 1 || cp->p->funcs[f_grad].rets[0].n != 1 || cp->p->funcs[f_opt].n_rets < 1 ||
      cp->p->funcs[f_opt].rets[0].n != 1)
    return rt_fail(err, errlen, 2, "the program has no @grad_step -> loss and @optimizer_step -> grad_norm");
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  if (cp->step_count >= CUDA_STEP_SLOTS)
    return rt_fail(err, errlen, 2, "%d training steps are in flight already; wait for one first", CUDA_STEP_SLOTS);
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  const RtFunc *g = &cp->p->funcs[f_grad], *o = &cp->p->funcs[f_opt];
  int64_t ntok = g->n_args == 2 ? g->args[0].n : 0;
  bool graph = step_graph_wanted(cp, f_grad, f_opt) && g->args[1].n == ntok && !(cp->f_first >= 0 && cp->grads_held);
  if (graph) {
    int rc = step_io_init(cp, f_grad, f_opt, n, err, errlen);
    if (rc == 2) return rc;   /* a step of another size in flight: the caller's mistake */
    graph = !rc;
  }
  int k = (cp->step_head + cp->step_count) % CUDA_STEP_SLOTS;
  if (!graph) {   /* call by call: the same launches, complete now; the results wait in the slot */
    if (cp->step_slot[k].res_cap < n + 1) {
      float *r = realloc(cp->step_slot[k].res, sizeof(float) * (size_t)(n + 1));
      if (!r) return rt_fail(err, errlen, 1, "out of memory");
      cp->step_slot[k].res = r;
      cp->step_slot[k].res_cap = n + 1;
    }
    float *res = cp->step_slot[k].res;
    void *rets[RT_MAX_FUNC_IO] = {0};
    int rc = 0;
    for (int64_t m = 0; !rc && m < n; m++) {
      void *args[2] = {(void *)(inputs + m * ntok), (void *)(targets + m * ntok)};
      rets[0] = &res[m];
      rc = cuda_program_call(cp, f_grad, args, rets, err, errlen);
    }
    void *oargs[2] = {&lr, &t};
    rets[0] = &res[n];
    if (!rc) rc = cuda_program_call(cp, f_opt, oargs, rets, err, errlen);
    if (rc) return rc;
    cp->step_slot[k].direct = true;
    cp->step_slot[k].n = n, cp->step_slot[k].fg = f_grad, cp->step_slot[k].fo = f_opt;
    cp->step_count++;
    return 0;
  }
  CUstream stream = (CUstream)cp->stream;
  unsigned char *host = cp->step_slot[k].host;
  int rc = 0;
  if (cp->copies_stale && cp->f_copies >= 0) {   /* the bf16 copies, after the host wrote a global */
    for (int s = 0; !rc && s < cp->p->funcs[cp->f_copies].n_steps; s++) rc = cuda_run_step(cp, cp->f_copies, s, err, errlen);
    if (!rc) cp->copies_stale = false;
  }
  /* this slot's image is free: the step that used it last was waited for */
  size_t off = 0;
  for (int64_t m = 0; m < n; m++)
    for (int a = 0; a < 2; a++) {
      cuda_f32_to_storage((RtStorage)g->args[a].storage, (const float *)(const void *)((a ? targets : inputs) + m * ntok),
                          host + off, g->args[a].n);
      off += io_bytes(&g->args[a]);
    }
  const float *oin[2] = {&lr, &t};
  for (int a = 0; a < 2; a++) {
    cuda_f32_to_storage((RtStorage)o->args[a].storage, oin[a], host + off, o->args[a].n);
    off += io_bytes(&o->args[a]);
  }
  if (!rc) rc = CU(cuMemcpyHtoDAsync, ((CUdeviceptr)cp->step_io, host, cp->step_in, stream), "(the training step's inputs)");
  if (!rc && !cp->step_graph) step_capture(cp, f_grad, f_opt, n);
  if (!rc && cp->step_graph)
    rc = CU(cuGraphLaunch, ((CUgraphExec)cp->step_graph, stream), "launching the CUDA graph of the training step");
  else if (!rc)
    rc = step_issue(cp, f_grad, f_opt, n, err, errlen);   /* refused: the same launches, one by one */
  if (!rc)
    rc = CU(cuMemcpyDtoHAsync, (host + cp->step_in, (CUdeviceptr)(cp->step_io + cp->step_in), cp->step_bytes - cp->step_in,
                                stream), "(the training step's losses)");
  if (!rc) rc = CU(cuEventRecord, ((CUevent)cp->step_slot[k].done, stream), "(the training step's event)");
  if (rc) {
    cp->broken = true;
    d->cuStreamSynchronize(stream);
    return rc;
  }
  cp->step_slot[k].direct = false;
  cp->step_slot[k].n = n, cp->step_slot[k].fg = f_grad, cp->step_slot[k].fo = f_opt;
  cp->step_count++;
  if (cp->f_first >= 0 && f_opt == cp->f_opt) cp->grads_stale = true, cp->grads_held = false;   /* @optimizer_step leaves them */
  return 0;
}

int cuda_program_step_wait(CudaProgram *cp, float *losses, float *grad_norm, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (!cp->step_count) return rt_fail(err, errlen, 2, "no training step is in flight to wait for");
  int k = cp->step_head;
  int64_t n = cp->step_slot[k].n;
  cp->step_head = (k + 1) % CUDA_STEP_SLOTS;
  cp->step_count--;
  if (cp->step_slot[k].direct) {
    memcpy(losses, cp->step_slot[k].res, sizeof(float) * (size_t)n);
    *grad_norm = cp->step_slot[k].res[n];
    return 0;
  }
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  int rc = CU(cuEventSynchronize, ((CUevent)cp->step_slot[k].done),
              "after the training step (a kernel or GEMM of it failed; LOOM_CUDA_SYNC=1 names the step)");
  if (rc) {
    cp->broken = true;
    d->cuStreamSynchronize((CUstream)cp->stream);
    return rc;
  }
  const RtFunc *g = &cp->p->funcs[cp->step_slot[k].fg], *o = &cp->p->funcs[cp->step_slot[k].fo];
  const unsigned char *host = cp->step_slot[k].host;
  size_t off = cp->step_in;
  for (int64_t m = 0; m < n; m++) {
    cuda_storage_to_f32((RtStorage)g->rets[0].storage, host + off, &losses[m], 1);
    off += io_bytes(&g->rets[0]);
  }
  cuda_storage_to_f32((RtStorage)o->rets[0].storage, host + off, grad_norm, 1);
  return 0;
}

/* The synchronous step: issued, then waited for (nothing else may be in flight, so that the
   results are this step's). */
int cuda_program_step(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                      float lr, float t, float *losses, float *grad_norm, char *err, size_t errlen) {
  if (cp->step_count)
    return rt_fail(err, errlen, 2, "a training step is in flight: wait for it before a synchronous one");
  int rc = cuda_program_step_issue(cp, f_grad, f_opt, n, inputs, targets, lr, t, err, errlen);
  return rc ? rc : cuda_program_step_wait(cp, losses, grad_norm, err, errlen);
}

#else /* built without the CUDA headers */

int cuda_program_step_issue(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs,
                            const int32_t *targets, float lr, float t, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_program_step_wait(CudaProgram *cp, float *losses, float *grad_norm, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_program_step(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                      float lr, float t, float *losses, float *grad_norm, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}


#endif
