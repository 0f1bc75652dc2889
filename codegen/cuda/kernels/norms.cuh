/* ---------------------------------------------------------------- norms
   layernorm (LN) / rmsnorm: one block per row (grid-stride over rows).
   bufs: x w [b] -> y;  i: rows, D;  f: eps */
template <class SX, class SW, class SB, class SY, bool LN>
LOOM_DEV void loom_norm_fwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SX::T *x = LOOM_IN(SX, 0);
  const typename SW::T *w = LOOM_IN(SW, 1);
  const typename SB::T *b = LN ? LOOM_IN(SB, 2) : 0;
  typename SY::T *y = LOOM_OUT(SY, LN ? 3 : 2);
  const long long rows = a.i[0], D = a.i[1];
  const float eps = (float)a.f[0];
  /* i[2] = 1 (codegen/cuda/lower_fuse.c): the statistics saved for the backward, (mean, rstd)
     of row r at stats[2r] (f32, the buffer after y), and its counter (stats[2 rows]) zeroed */
  float *stats = a.i[2] ? (float *)a.buf[LN ? 4 : 3] : 0;
  if (stats && blockIdx.x == 0 && threadIdx.x == 0) *(unsigned *)(stats + 2 * rows) = 0u;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * D;
    float mean = 0.0f;
    if (LN) {
      float s = 0.0f;
      for (long long d = threadIdx.x; d < D; d += blockDim.x) s += SX::ld(x, base + d);
      mean = loom_block_sum(s, sh) / (float)D;
    }
    float v = 0.0f;
    for (long long d = threadIdx.x; d < D; d += blockDim.x) {
      float t = SX::ld(x, base + d) - mean;
      v += t * t;
    }
    const float rstd = 1.0f / sqrtf(loom_block_sum(v, sh) / (float)D + eps);
    if (stats && threadIdx.x == 0) stats[2 * r] = mean, stats[2 * r + 1] = rstd;
    for (long long d = threadIdx.x; d < D; d += blockDim.x) {
      float t = (SX::ld(x, base + d) - mean) * rstd * SW::ld(w, d);
      if (LN) t += SB::ld(b, d);
      SY::st(y, base + d, t);
    }
  }
}

/* One row of the norm's backward from its (mean, rstd), shared by loom_norm_bwd and
   loom_norm_bwd_saved (one copy of the arithmetic: the same bits): adds the row's dw (db)
   terms to this block's part (column d always by the same thread) and stores dx, or r + dx
   (RES: the residual stream's gradient added; each element read and written by one thread). */
template <class SDY, class SX, class SW, class SDX, class SR, bool LN, bool RES>
LOOM_DEV void loom_norm_bwd_row(const typename SDY::T *dy, const typename SX::T *x, const typename SW::T *w,
                                const typename SR::T *res, typename SDX::T *dx, float *part, long long base, long long D,
                                float mean, float rstd, float *sh) {
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (long long d = threadIdx.x; d < D; d += blockDim.x) {
    float xhat = (SX::ld(x, base + d) - mean) * rstd, dyv = SDY::ld(dy, base + d), g = dyv * SW::ld(w, d);
    sum_g += g;
    sum_gx += g * xhat;
    part[d] += dyv * xhat;
    if (LN) part[D + d] += dyv;
  }
  loom_block_sum2(sum_g, sum_gx, sh);
  sum_g /= (float)D;
  sum_gx /= (float)D;
  for (long long d = threadIdx.x; d < D; d += blockDim.x) {
    float xhat = (SX::ld(x, base + d) - mean) * rstd, g = SDY::ld(dy, base + d) * SW::ld(w, d);
    float v = rstd * (g - (LN ? sum_g : 0.0f) - xhat * sum_gx);
    SDX::st(dx, base + d, RES ? SR::ld(res, base + d) + v : v);
  }
}

/* Backward, part 1: dx per row, and this block's partial sums of dw (and db) over its rows
   into part[blockIdx.x][LN ? 2 : 1][D] (f32 scratch; column d always by the same thread).
   bufs: dy x w -> dx part;  i: rows, D;  f: eps */
template <class SDY, class SX, class SW, class SDX, bool LN>
LOOM_DEV void loom_norm_bwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SDY::T *dy = LOOM_IN(SDY, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  const typename SW::T *w = LOOM_IN(SW, 2);
  typename SDX::T *dx = LOOM_OUT(SDX, 3);
  const long long rows = a.i[0], D = a.i[1];
  const float eps = (float)a.f[0];
  float *part = (float *)a.buf[4] + (long long)blockIdx.x * (LN ? 2 : 1) * D;
  for (long long d = threadIdx.x; d < D; d += blockDim.x) {
    part[d] = 0.0f;
    if (LN) part[D + d] = 0.0f;
  }
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * D;
    float mean = 0.0f;
    if (LN) {
      float s = 0.0f;
      for (long long d = threadIdx.x; d < D; d += blockDim.x) s += SX::ld(x, base + d);
      mean = loom_block_sum(s, sh) / (float)D;
    }
    float v = 0.0f;
    for (long long d = threadIdx.x; d < D; d += blockDim.x) {
      float t = SX::ld(x, base + d) - mean;
      v += t * t;
    }
    const float rstd = 1.0f / sqrtf(loom_block_sum(v, sh) / (float)D + eps);
    loom_norm_bwd_row<SDY, SX, SW, SDX, SDX, LN, false>(dy, x, w, 0, dx, part, base, D, mean, rstd, sh);
  }
}

/* Backward in one launch (codegen/cuda/lower_fuse.c), from the forward's statistics: dx per row
   as loom_norm_bwd computes it, and the same per-block partial sums of dw (db) in part; the
   block that finishes last (a counter the forward zeroed) sums the parts in block order, as
   loom_norm_colsum does, into dw (db), or adds them to the f32 gradients dw (db) (ACC).  The
   same bits as loom_norm_bwd + loom_norm_colsum (+ an f32 accumulate).  RES: the residual
   stream's gradient r (an input after stats) is added to dx, which is stored as r + dx (the
   add that followed; each element read and written by the same thread, so in place is safe).
   bufs: dy x w stats [r] -> dx dw [db], then part and the counter at buffers i[2], i[2] + 1;
   i: rows, D, i[2] */
template <class SDY, class SX, class SW, class SDX, class SDW, class SR, bool LN, bool ACC, bool RES>
LOOM_DEV void loom_norm_bwd_saved(const LoomArgs &a) {
  __shared__ float sh[64];
  __shared__ int last;
  const typename SDY::T *dy = LOOM_IN(SDY, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  const typename SW::T *w = LOOM_IN(SW, 2);
  const float *stats = (const float *)a.buf[3];
  const typename SR::T *res = RES ? LOOM_IN(SR, 4) : 0;
  typename SDX::T *dx = LOOM_OUT(SDX, RES ? 5 : 4);
  typename SDW::T *dw = LOOM_OUT(SDW, RES ? 6 : 5);
  typename SDW::T *db = LN ? LOOM_OUT(SDW, RES ? 7 : 6) : 0;
  const long long rows = a.i[0], D = a.i[1], np = LN ? 2 : 1;
  float *part_all = (float *)a.buf[a.i[2]];
  unsigned *counter = (unsigned *)a.buf[a.i[2] + 1];
  float *part = part_all + (long long)blockIdx.x * np * D;
  for (long long d = threadIdx.x; d < D; d += blockDim.x) {
    part[d] = 0.0f;
    if (LN) part[D + d] = 0.0f;
  }
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * D;
    const float mean = LN ? stats[2 * r] : 0.0f, rstd = stats[2 * r + 1];
    loom_norm_bwd_row<SDY, SX, SW, SDX, SR, LN, RES>(dy, x, w, res, dx, part, base, D, mean, rstd, sh);
  }
  /* this block's parts are written: the last block to get here sums them all */
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const volatile float *pv = part_all;   /* other blocks' writes: not from this SM's L1 */
  const long long nb = gridDim.x;
  for (long long k = threadIdx.x; k < np * D; k += blockDim.x) {
    const long long p = k / D, d = k - p * D;
    float s = 0.0f;
    for (long long b = 0; b < nb; b++) s += pv[(b * np + p) * D + d];
    typename SDW::T *out = p == 0 ? dw : db;
    SDW::st(out, d, ACC ? SDW::ld(out, d) + s : s);
  }
  if (threadIdx.x == 0) *counter = 0u;
}

/* Backward, part 2: sums the partial rows in block order (deterministic).
   bufs: part -> dw [db];  i: nb (partial blocks), D, parts (2: dw and db, 1: dw) */
template <class SW, class SB>
LOOM_DEV void loom_norm_colsum(const LoomArgs &a) {
  const float *part = (const float *)a.buf[0];
  typename SW::T *dw = LOOM_OUT(SW, 1);
  typename SB::T *db = a.i[2] > 1 ? LOOM_OUT(SB, 2) : 0;
  const long long nb = a.i[0], D = a.i[1], np = a.i[2], n = np * D;
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x) {
    long long p = k / D, d = k - p * D;
    float s = 0.0f;
    for (long long b = 0; b < nb; b++) s += part[(b * np + p) * D + d];
    if (p == 0) SW::st(dw, d, s);
    else SB::st(db, d, s);
  }
}

