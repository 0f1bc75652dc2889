/* runtime/cpu/cpu_data.c — embedding and data movement builtins of the CPU runtime.
 *
 * Data movement copies 4-byte elements (f32 or int32) bit for bit.  Transpose, slice, pad
 * and broadcast are one engine: a loop nest over an index space of up to 8 dims that reads
 * at source strides and writes at destination strides.  Dims that are contiguous in both
 * are merged first, so the innermost loop is as long as possible (a memcpy when both
 * strides are 1); the outer rows are split across threads.
 */
#include <stdio.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/cpu_vec.h"

#define MAXR 8
#define ELEM_BLOCK 16384

/* ---------------------------------------------------------------- strided copy */

typedef struct {
  int rank;                 /* after merging; the last dim is the inner loop */
  int64_t dims[MAXR], ss[MAXR], ds[MAXR];
  const uint32_t *src;
  uint32_t *dst;
} Strided;

static void strided_rows(void *c, int64_t r0, int64_t r1) {
  const Strided *p = c;
  int outer = p->rank - 1;
  int64_t inner = p->dims[outer], si = p->ss[outer], di = p->ds[outer];
  int64_t idx[MAXR] = {0}, so = 0, doff = 0, rem = r0;
  for (int d = outer - 1; d >= 0; d--) {   /* the odometer at row r0 */
    idx[d] = rem % p->dims[d];
    rem /= p->dims[d];
    so += idx[d] * p->ss[d];
    doff += idx[d] * p->ds[d];
  }
  for (int64_t r = r0; r < r1; r++) {
    const uint32_t *s = p->src + so;
    uint32_t *o = p->dst + doff;
    if (si == 1 && di == 1) memcpy(o, s, sizeof(uint32_t) * (size_t)inner);
    else if (si == 0)
      for (int64_t k = 0; k < inner; k++) o[k * di] = s[0];
    else
      for (int64_t k = 0; k < inner; k++) o[k * di] = s[k * si];
    for (int d = outer - 1; d >= 0; d--) {
      so += p->ss[d];
      doff += p->ds[d];
      if (++idx[d] < p->dims[d]) break;
      so -= idx[d] * p->ss[d];
      doff -= idx[d] * p->ds[d];
      idx[d] = 0;
    }
  }
}

/* Copies the index space dims[rank]: element c goes from src[sum c_d ss_d] to
   dst[sum c_d ds_d]. */
static void strided_copy(ThreadPool *tp, const void *src, void *dst, int rank, const int64_t *dims,
                         const int64_t *ss, const int64_t *ds) {
  Strided p = {.rank = 0, .src = src, .dst = dst};
  int64_t total = 1;
  for (int d = 0; d < rank; d++) {
    total *= dims[d];
    if (dims[d] == 1) continue;
    int k = p.rank - 1;
    if (k >= 0 && p.ss[k] == ss[d] * dims[d] && p.ds[k] == ds[d] * dims[d]) {
      p.dims[k] *= dims[d];   /* contiguous with the previous dim in both: merge */
      p.ss[k] = ss[d];
      p.ds[k] = ds[d];
    } else {
      p.dims[p.rank] = dims[d];
      p.ss[p.rank] = ss[d];
      p.ds[p.rank] = ds[d];
      p.rank++;
    }
  }
  if (total == 0) return;
  if (p.rank == 0) {   /* a single element */
    p.dims[0] = 1;
    p.ss[0] = p.ds[0] = 1;
    p.rank = 1;
  }
  int64_t rows = total / p.dims[p.rank - 1];
  if (total < ELEM_BLOCK || rows == 1) strided_rows(&p, 0, rows);
  else tp_run(tp, rows, strided_rows, &p);
}

static void row_major_strides(int rank, const int64_t *dims, int64_t *st) {
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    st[d] = s;
    s *= dims[d];
  }
}

void cpu_transpose(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *xdims, const int64_t *perm) {
  int64_t xst[MAXR], ydims[MAXR], yst[MAXR], ss[MAXR];
  row_major_strides(rank, xdims, xst);
  for (int d = 0; d < rank; d++) {
    ydims[d] = xdims[perm[d]];
    ss[d] = xst[perm[d]];
  }
  row_major_strides(rank, ydims, yst);
  strided_copy(tp, x, y, rank, ydims, ss, yst);
}

void cpu_slice(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *xdims, const int64_t *start,
               const int64_t *end) {
  int64_t xst[MAXR], ydims[MAXR], yst[MAXR], base = 0;
  row_major_strides(rank, xdims, xst);
  for (int d = 0; d < rank; d++) {
    ydims[d] = end[d] - start[d];
    base += start[d] * xst[d];
  }
  row_major_strides(rank, ydims, yst);
  strided_copy(tp, (const uint32_t *)x + base, y, rank, ydims, xst, yst);
}

void cpu_pad(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *xdims, const int64_t *low,
             const int64_t *high) {
  int64_t xst[MAXR], ydims[MAXR], yst[MAXR], base = 0, yn = 1;
  for (int d = 0; d < rank; d++) {
    ydims[d] = low[d] + xdims[d] + high[d];
    yn *= ydims[d];
  }
  row_major_strides(rank, xdims, xst);
  row_major_strides(rank, ydims, yst);
  for (int d = 0; d < rank; d++) base += low[d] * yst[d];
  cpu_fill(tp, y, true, 0, yn);   /* all-zero bits: 0 for f32 and int32 alike */
  strided_copy(tp, x, (uint32_t *)y + base, rank, xdims, xst, yst);
}

void cpu_broadcast(ThreadPool *tp, const void *x, void *y, int rank, const int64_t *ydims,
                   const int64_t *xstrides) {
  int64_t yst[MAXR];
  row_major_strides(rank, ydims, yst);
  strided_copy(tp, x, y, rank, ydims, xstrides, yst);
}

typedef struct {
  const void *const *xs;
  int n;
  uint32_t *y;
  int64_t inner;
  const int64_t *sizes;
  int64_t yrow;
} ConcatCtx;

static void concat_rows(void *c, int64_t o0, int64_t o1) {
  const ConcatCtx *k = c;
  for (int64_t o = o0; o < o1; o++) {
    int64_t off = 0;
    for (int j = 0; j < k->n; j++) {
      int64_t xrow = k->sizes[j] * k->inner;
      memcpy(k->y + o * k->yrow + off, (const uint32_t *)k->xs[j] + o * xrow, sizeof(uint32_t) * (size_t)xrow);
      off += xrow;
    }
  }
}

void cpu_concat(ThreadPool *tp, const void *const *xs, int n, void *y, int64_t outer, int64_t inner,
                const int64_t *sizes) {
  ConcatCtx c = {xs, n, y, inner, sizes, 0};
  for (int j = 0; j < n; j++) c.yrow += sizes[j] * inner;
  if (outer * c.yrow < ELEM_BLOCK) concat_rows(&c, 0, outer);
  else tp_run(tp, outer, concat_rows, &c);
}

typedef struct {
  void *y;
  bool is_int;
  int64_t stride, size;
} IotaCtx;

static void iota_chunk(void *c, int64_t b, int64_t e) {
  const IotaCtx *k = c;
  for (int64_t i = b; i < e; i++) {
    int64_t v = (i / k->stride) % k->size;
    if (k->is_int) ((int32_t *)k->y)[i] = (int32_t)v;
    else ((float *)k->y)[i] = (float)v;
  }
}

void cpu_iota(ThreadPool *tp, void *y, bool is_int, int rank, const int64_t *dims, int dim) {
  int64_t st[MAXR] = {0}, n = 1;
  if (rank < 1 || dim < 0 || dim >= rank) return;   /* cpu_builtin_check refuses these */
  row_major_strides(rank, dims, st);
  for (int d = 0; d < rank; d++) n *= dims[d];
  IotaCtx c = {y, is_int, st[dim], dims[dim]};
  if (n < ELEM_BLOCK) iota_chunk(&c, 0, n);
  else tp_run(tp, n, iota_chunk, &c);
}

/* ---------------------------------------------------------------- embedding */

static int check_ids(const int32_t *ids, int64_t n, int64_t V, char *err, size_t errlen) {
  for (int64_t r = 0; r < n; r++)
    if (ids[r] < 0 || ids[r] >= V) {
      snprintf(err, errlen, "token id %lld at position %lld is outside the vocabulary of %lld", (long long)ids[r],
               (long long)r, (long long)V);
      return 2;
    }
  return 0;
}

typedef struct {
  const float *src;
  const int32_t *ids;
  float *dst;
  int64_t n_ids, D, V, off;   /* a split table holds ids [off, off + V) */
} EmbCtx;

static void emb_rows(void *c, int64_t r0, int64_t r1) {
  const EmbCtx *e = c;
  for (int64_t r = r0; r < r1; r++) {
    int64_t id = (int64_t)e->ids[r] - e->off;
    if (id >= 0 && id < e->V) memcpy(e->dst + r * e->D, e->src + id * e->D, sizeof(float) * (size_t)e->D);
    else memset(e->dst + r * e->D, 0, sizeof(float) * (size_t)e->D);   /* another rank's row */
  }
}

int cpu_embedding(ThreadPool *tp, const float *table, const int32_t *ids, float *y, int64_t n_ids, int64_t V,
                  int64_t D, int64_t off, bool split, char *err, size_t errlen) {
  int rc = split ? 0 : check_ids(ids, n_ids, V, err, errlen);
  if (rc) return rc;
  EmbCtx c = {table, ids, y, n_ids, D, V, split ? off : 0};
  if (n_ids * D < ELEM_BLOCK) emb_rows(&c, 0, n_ids);
  else tp_run(tp, n_ids, emb_rows, &c);
  return 0;
}

/* Columns [16*c0, 16*c1) of every row of dy, added into dtable's rows in id order: each
   element's sum has the reference's order, and no two threads touch the same element. */
static void emb_grad_cols(void *c, int64_t c0, int64_t c1) {
  const EmbCtx *e = c;
  int64_t D = e->D, a = c0 * 16, b = c1 * 16 < D ? c1 * 16 : D;
  for (int64_t r = 0; r < e->n_ids; r++) {
    int64_t id = (int64_t)e->ids[r] - e->off;
    if (id >= 0 && id < e->V) cv_axpy(e->dst + id * D + a, 1.0f, e->src + r * D + a, b - a);
  }
}

int cpu_embedding_grad(ThreadPool *tp, const float *dy, const int32_t *ids, float *dtable, int64_t n_ids,
                       int64_t V, int64_t D, int64_t off, bool split, char *err, size_t errlen) {
  int rc = split ? 0 : check_ids(ids, n_ids, V, err, errlen);
  if (rc) return rc;
  cpu_fill(tp, dtable, false, 0, V * D);
  EmbCtx c = {dy, ids, dtable, n_ids, D, V, split ? off : 0};
  int64_t ncol = (D + 15) / 16;
  if (n_ids * D < ELEM_BLOCK) emb_grad_cols(&c, 0, ncol);
  else tp_run(tp, ncol, emb_grad_cols, &c);
  return 0;
}
