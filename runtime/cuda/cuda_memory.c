/* runtime/cuda/cuda_memory.c — a CudaProgram's device memory seen from the host: zeroed
 * allocations, the gradients zeroed when @optimizer_step left them stale, and the copies of
 * globals and buffers between the host's f32 (int32) and their storage on the device, with
 * the globals' initial values.  Its own file because these are the program's only
 * synchronous host <-> device copies; the calls (cuda_call.c) and the training step
 * (cuda_step.c) stage theirs on the stream. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/cuda/cuda_exec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDA_HEADERS

int cuda_alloc_zeroed(CudaProgram *cp, uint64_t *out, int64_t bytes, const char *what, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  *out = 0;
  if (bytes <= 0) return 0;
  CUdeviceptr p = 0;
  CUresult r = d->cuMemAlloc(&p, (size_t)bytes);
  if (r != CUDA_SUCCESS) {
    char where[640];
    size_t fr = 0, tot = 0;
    d->cuMemGetInfo(&fr, &tot);
    snprintf(where, sizeof where, "allocating %s (%.1f MiB; %.1f of %.1f MiB free on %s)", what,
             (double)bytes / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0, cp->info.name);
    return cuda_cu_fail(r, "cuMemAlloc", where, err, errlen);
  }
  *out = (uint64_t)p;
  return CU(cuMemsetD8Async, (p, 0, (size_t)bytes, (CUstream)cp->stream), what);
}

int cuda_dev_alloc(CudaProgram *cp, uint64_t *addr, int64_t bytes, const char *what, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  return cuda_alloc_zeroed(cp, addr, bytes, what, err, errlen);
}

void cuda_dev_free(CudaProgram *cp, uint64_t addr) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  if (d && addr && cp->ctx) {
    d->cuCtxSetCurrent((CUcontext)cp->ctx);
    d->cuMemFree((CUdeviceptr)addr);
  }
}

/* The gradients after @optimizer_step (which no longer zeroes them: codegen/cuda/lower_grads.c)
   are stale: zeroed here, on the stream, before anything but the first micro-batch's
   @grad_step reads them. */
int cuda_grads_zero(CudaProgram *cp, char *err, size_t errlen) {
  if (!cp->grads_stale) return 0;
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  size_t bytes = (size_t)cp->p->region_bytes[RT_REGION_GRADS];
  if (bytes && CU(cuMemsetD8Async, ((CUdeviceptr)cp->regions[RT_REGION_GRADS], 0, bytes, (CUstream)cp->stream),
                  "(zeroing the gradients)"))
    return 1;
  cp->grads_stale = false;
  return 0;
}

/* Host <-> device copy of n elements of storage s at addr, converting from/to f32 (int32). */
static int xfer(CudaProgram *cp, uint64_t addr, RtStorage s, int64_t n, float *out, const float *in, const char *what,
                char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  if (cp->broken) return rt_fail(err, errlen, 1, "the CUDA program failed earlier; free it and start again");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  size_t bytes = (size_t)n * (size_t)cuda_storage_size(s);
  if (!bytes) return 0;
  void *tmp = malloc(bytes);
  if (!tmp) return rt_fail(err, errlen, 1, "out of memory %s", what);
  CUstream stream = (CUstream)cp->stream;
  int rc;
  if (in) {
    cuda_f32_to_storage(s, in, tmp, n);
    rc = CU(cuMemcpyHtoDAsync, ((CUdeviceptr)addr, tmp, bytes, stream), what);
  } else {
    rc = CU(cuMemcpyDtoHAsync, (tmp, (CUdeviceptr)addr, bytes, stream), what);
  }
  if (!rc) rc = CU(cuStreamSynchronize, (stream), what);
  if (!rc && out) cuda_storage_to_f32(s, tmp, out, n);
  free(tmp);
  return rc;
}

static int global_xfer(CudaProgram *cp, int g, float *out, const float *in, char *err, size_t errlen) {
  if (!cp->p || g < 0 || g >= cp->p->n_globals) return rt_fail(err, errlen, 2, "no global #%d in the program", g);
  const RtGlobal *gl = &cp->p->globals[g];
  char what[320];
  snprintf(what, sizeof what, "(%s global $%s)", in ? "writing" : "reading", gl->name);
  if (gl->region == RT_REGION_GRADS && cuda_grads_zero(cp, err, errlen)) return 1;   /* stale: zeros, as the program says */
  if (gl->region == RT_REGION_GRADS && in) cp->grads_held = true;
  return xfer(cp, cp->regions[gl->region] + (uint64_t)gl->offset, cp->gstorage[g], gl->n, out, in, what, err, errlen);
}

int cuda_global_read(CudaProgram *cp, int g, float *out, char *err, size_t errlen) {
  return global_xfer(cp, g, out, NULL, err, errlen);
}

int cuda_global_write(CudaProgram *cp, int g, const float *in, char *err, size_t errlen) {
  cp->copies_stale = true;   /* the parameters' bf16 copies are rewritten before the next call */
  return global_xfer(cp, g, NULL, in, err, errlen);
}

static int buf_xfer(CudaProgram *cp, int func, const RtBuf *b, void *out, const void *in, char *err, size_t errlen) {
  if (!cp->p || func < 0 || func >= cp->p->n_funcs) return rt_fail(err, errlen, 2, "no function #%d in the program", func);
  char what[200];
  snprintf(what, sizeof what, "(%s a buffer of @%s)", in ? "writing" : "reading", cp->p->funcs[func].name);
  if (cuda_check_buf(NULL, cp->p, func, b, "buffer", err, errlen)) return 2;
  return xfer(cp, cuda_buf_addr(cp, func, b), (RtStorage)b->storage, b->n, out, in, what, err, errlen);
}

int cuda_buf_read(CudaProgram *cp, int func, const RtBuf *b, void *out, char *err, size_t errlen) {
  return buf_xfer(cp, func, b, out, NULL, err, errlen);
}

int cuda_buf_write(CudaProgram *cp, int func, const RtBuf *b, const void *in, char *err, size_t errlen) {
  return buf_xfer(cp, func, b, NULL, in, err, errlen);
}

int cuda_globals_init(CudaProgram *cp, uint64_t seed, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  cp->copies_stale = true;
  cp->grads_stale = cp->grads_held = false;   /* zeroed below */
  for (int g = 0; g < cp->p->n_globals; g++) {
    const RtGlobal *gl = &cp->p->globals[g];
    if (gl->init == RT_INIT_ZEROS) {   /* Adam's moments, gradients: zero bytes in every storage, on the device */
      char what[320];
      snprintf(what, sizeof what, "(zeroing global $%s)", gl->name);
      size_t bytes = (size_t)gl->n * (size_t)cuda_storage_size(cp->gstorage[g]);
      CUdeviceptr at = (CUdeviceptr)(cp->regions[gl->region] + (uint64_t)gl->offset);
      if (bytes && CU(cuMemsetD8Async, (at, 0, bytes, (CUstream)cp->stream), what)) return 1;
      continue;
    }
    float *t = malloc(sizeof(float) * (size_t)(gl->n ? gl->n : 1));
    if (!t) return rt_fail(err, errlen, 1, "out of memory initializing $%s", gl->name);
    rt_global_init_values(gl, seed, t);
    int rc = cuda_global_write(cp, g, t, err, errlen);
    free(t);
    if (rc) return rc;
  }
  return CU(cuStreamSynchronize, ((CUstream)cp->stream), "(initializing the globals)");
}

#else /* built without the CUDA headers */

int cuda_dev_alloc(CudaProgram *cp, uint64_t *addr, int64_t bytes, const char *what, char *err, size_t errlen) {
  *addr = 0;
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
void cuda_dev_free(CudaProgram *cp, uint64_t addr) { (void)cp, (void)addr; }
int cuda_global_read(CudaProgram *cp, int g, float *out, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }
int cuda_global_write(CudaProgram *cp, int g, const float *in, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_buf_read(CudaProgram *cp, int func, const RtBuf *b, void *out, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_buf_write(CudaProgram *cp, int func, const RtBuf *b, const void *in, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int cuda_globals_init(CudaProgram *cp, uint64_t seed, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }

#endif
