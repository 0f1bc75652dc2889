/* runtime/cuda/cuda_tmap.c — see cuda_tmap.h. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/cuda/cuda_tmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_gemm.h"   /* cuda_step_where */
#include "runtime/fail.h"

enum { TMAP_BYTES = 128, BOX_BYTES = 128 };

int cuda_tmap_check(const RtStep *st, char *msg, size_t n) {
  const int count = st->tmaps;
  if (count == 0) return 0;
  if (st->kind != RT_STEP_KERNEL || count > RT_TMAP_MAX) return rt_fail(msg, n, 2, "%d tensor maps (at most %d, kernels only)", count, RT_TMAP_MAX);
  for (int m = 0; m < count; m++) {
    const int64_t *f = &st->i[RT_TMAP_INT + RT_TMAP_FIELDS * m];
    const int64_t buf = f[0], rows = f[5];
    if (buf < 0 || buf >= st->n_in + st->n_out) return rt_fail(msg, n, 2, "tensor map %d names buffer %lld, which the step lacks", m, (long long)buf);
    const RtBuf *b = &st->bufs[buf];
    if (b->storage != RT_ST_BF16 && b->storage != RT_ST_F16)
      return rt_fail(msg, n, 2, "tensor map %d: buffer %lld is not bf16 or f16", m, (long long)buf);
    int64_t elems = 1;
    for (int d = 1; d <= 4; d++) {
      if (f[d] < 1 || f[d] > ((int64_t)1 << 32) || elems > INT64_MAX / f[d])
        return rt_fail(msg, n, 2, "tensor map %d: dim %d is %lld", m, d - 1, (long long)f[d]);
      elems *= f[d];
    }
    if (f[1] * 2 % 16) return rt_fail(msg, n, 2, "tensor map %d: rows of %lld elements are not a multiple of 16 bytes", m, (long long)f[1]);
    if (elems > b->n) return rt_fail(msg, n, 2, "tensor map %d covers %lld elements of a %lld-element buffer", m, (long long)elems, (long long)b->n);
    if (rows < 1 || rows > 256) return rt_fail(msg, n, 2, "tensor map %d: a box of %lld rows (1 to 256)", m, (long long)rows);
  }
  return 0;
}

#ifdef LOOM_HAVE_CUDA_HEADERS

void cuda_tmaps_free(CudaProgram *cp) {
  for (int f = 0; cp->tmaps && f < cp->p->n_funcs; f++) {
    for (int s = 0; cp->tmaps[f] && s < cp->p->funcs[f].n_steps; s++) free(cp->tmaps[f][s]);
    free(cp->tmaps[f]);
  }
  free(cp->tmaps);
  cp->tmaps = NULL;
}

const void *cuda_tmaps_of(const CudaProgram *cp, int f, int s) {
  return cp->tmaps && cp->tmaps[f] ? cp->tmaps[f][s] : NULL;
}

/* Map m of step st, whose buffer lies at address `at`: the tensor [d3][d2][d1][d0] of 16-bit
   elements, a box of 128 bytes of d0, one d1, `rows` of d2, one d3; the 128-byte swizzle,
   zeros out of bounds (the kernels' tiles at the sequence's end). */
static int encode(const CudaDriverApi *d, void *map, const RtStep *st, int m, uint64_t at, const char *where, char *err,
                  size_t errlen) {
  const int64_t *f = &st->i[RT_TMAP_INT + RT_TMAP_FIELDS * m];
  const bool bf = st->bufs[f[0]].storage == RT_ST_BF16;
  const cuuint64_t dim[4] = {(cuuint64_t)f[1], (cuuint64_t)f[2], (cuuint64_t)f[3], (cuuint64_t)f[4]};
  const cuuint64_t stride[3] = {dim[0] * 2, dim[0] * dim[1] * 2, dim[0] * dim[1] * dim[2] * 2};
  const cuuint32_t box[4] = {BOX_BYTES / 2, 1, (cuuint32_t)f[5], 1}, estr[4] = {1, 1, 1, 1};
  if (at % 16)
    return rt_fail(err, errlen, 2, "tensor map %d %s: the buffer's address %#llx is not 16-byte aligned", m, where,
                   (unsigned long long)at);
  char w[400];
  snprintf(w, sizeof w, "(tensor map %d: [%llu][%llu][%llu][%llu] %s, box rows %u) %s", m, (unsigned long long)dim[3],
           (unsigned long long)dim[2], (unsigned long long)dim[1], (unsigned long long)dim[0], bf ? "bf16" : "f16", box[2], where);
  return cuda_cu_fail(d->cuTensorMapEncodeTiled((CUtensorMap *)map, bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                                4, (void *)(uintptr_t)at, dim, stride, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                      "cuTensorMapEncodeTiled", w, err, errlen);
}

int cuda_tmaps_build(CudaProgram *cp, char *err, size_t errlen) {
  const RtProgram *p = cp->p;
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  for (int f = 0; f < p->n_funcs; f++)
    for (int s = 0; s < p->funcs[f].n_steps; s++) {
      const RtStep *st = &p->funcs[f].steps[s];
      if (st->kind != RT_STEP_KERNEL || st->tmaps == 0) continue;
      char where[256];
      cuda_step_where(cp, f, s, where, sizeof where);
      if (!d->cuTensorMapEncodeTiled)
        return rt_fail(err, errlen, 1,
                       "the NVIDIA driver lacks cuTensorMapEncodeTiled (CUDA 12.0 or later), which the wgmma attention "
                       "kernels (LOOM_CUDA_WGMMA=1) need %s: update the driver, or lower without LOOM_CUDA_WGMMA", where);
      if (!cp->tmaps && !(cp->tmaps = calloc((size_t)p->n_funcs, sizeof *cp->tmaps)))
        return rt_fail(err, errlen, 1, "out of memory");
      if (!cp->tmaps[f] && !(cp->tmaps[f] = calloc((size_t)p->funcs[f].n_steps, sizeof **cp->tmaps)))
        return rt_fail(err, errlen, 1, "out of memory");
      /* the kernel's LoomTmaps: 64-byte aligned, the maps it does not use zero */
      unsigned char *maps = aligned_alloc(64, RT_TMAP_MAX * TMAP_BYTES);
      if (!maps) return rt_fail(err, errlen, 1, "out of memory");
      memset(maps, 0, RT_TMAP_MAX * TMAP_BYTES);
      cp->tmaps[f][s] = maps;
      for (int m = 0; m < st->tmaps; m++) {
        const RtBuf *b = &st->bufs[st->i[RT_TMAP_INT + RT_TMAP_FIELDS * m]];
        int rc = encode(d, maps + TMAP_BYTES * m, st, m, cuda_buf_addr(cp, f, b), where, err, errlen);
        if (rc) return rc;
      }
    }
  return 0;
}

#endif
