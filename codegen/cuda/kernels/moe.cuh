/* ---------------------------------------------------------------- mixture of experts
   The ops topk, gather_last, scatter_last, moe_sort, moe_count, moe_dispatch, moe_combine,
   moe_weight_grad, grouped_matmul and grouped_matmul_wgrad (ops.def; defined by
   ir/interp_moe.c), i[] as runtime/program.h's RT_B_TOPK .. RT_B_GROUPED_WGRAD.  Expert
   indices, positions and counts are i32; a position of -1 is an assignment the capacity
   dropped.  Float tensors in any storage, computed in f32 and rounded once on store (the
   routing weights may be f32 beside bf16 rows).  Every output element is written by one
   thread, its sums in one fixed order (no atomics): the same inputs give the same bits in
   any thread order.  An index, position or count outside its range is a bug of the program
   (the reference and the CPU fail): the kernels stop with a trap (on the emulated device the
   launch fails with this message). */
#ifdef LOOM_EMU
#define LOOM_MOE_BAD(what) loom_emu::fail("%s", what " (a trap on a GPU)")
#else
#define LOOM_MOE_BAD(what) __trap()
#endif

/* topk.  bufs: x -> idx;  i: rows, E, k.  A thread per row: the j-th largest by selection,
   ties to the lower index (NaNs as the reference's comparisons leave them). */
template <class SX, class SI>
LOOM_DEV void loom_topk(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  int *idx = (int *)a.buf[1];
  const long long rows = a.i[0], E = a.i[1], k = a.i[2];
  LOOM_GRID_LOOP(r, rows) {
    int *o = idx + r * k;
    for (long long j = 0; j < k; j++) {
      long long best = -1;
      float bv = 0.0f;
      for (long long e = 0; e < E; e++) {
        bool taken = false;
        for (long long i = 0; i < j && !taken; i++) taken = o[i] == e;
        const float v = SX::ld(x, r * E + e);
        if (!taken && (best < 0 || v > bv)) {
          best = e;
          bv = v;
        }
      }
      o[j] = (int)best;
    }
  }
}

/* gather_last.  bufs: x idx -> y;  i: rows, E, k.  y[a] = x[a/k, idx[a]], a thread each. */
template <class SX, class SY>
LOOM_DEV void loom_gather_last(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  const int *idx = (const int *)a.buf[1];
  typename SY::T *y = LOOM_OUT(SY, 2);
  const long long E = a.i[1], k = a.i[2];
  LOOM_GRID_LOOP(t, a.i[0] * k) {
    const long long e = idx[t];
    if (e < 0 || e >= E) {
      LOOM_MOE_BAD("gather_last: an expert index is out of range");
      return;
    }
    SY::st(y, t, SX::ld(x, (t / k) * E + e));
  }
}

/* scatter_last.  bufs: dy idx -> y;  i: rows, E, k.  A thread per y[r, e]: 0 plus the dy[r, j]
   whose idx[r, j] is e, in j order (the reference's additions into zeros). */
template <class SX, class SY>
LOOM_DEV void loom_scatter_last(const LoomArgs &a) {
  const typename SX::T *dy = LOOM_IN(SX, 0);
  const int *idx = (const int *)a.buf[1];
  typename SY::T *y = LOOM_OUT(SY, 2);
  const long long E = a.i[1], k = a.i[2];
  LOOM_GRID_LOOP(t, a.i[0] * E) {
    const long long r = t / E, e = t - r * E;
    float acc = 0.0f;
    for (long long j = 0; j < k; j++) {
      const long long ej = idx[r * k + j];
      if (ej < 0 || ej >= E) {
        LOOM_MOE_BAD("scatter_last: an expert index is out of range");
        return;
      }
      if (ej == e) acc = __fadd_rn(acc, SX::ld(dy, r * k + j));
    }
    SY::st(y, t, acc);
  }
}

/* moe_sort and moe_count: a stable counting sort of the n assignments by expert, in chunks of
   i[3] (<= LOOM_MOE_CHUNK) assignments, a block each.  i: n, E, capacity, chunk.  Scratch
   (i32): parts[P][E] (the chunks' counts), offs[P][E] (each chunk's first rank per expert),
   count[E] (kept: min(total, capacity) when capacity > 0), start[E] (the first row of each
   expert: the kept counts of the experts before it).
     1 loom_moe_hist     idx -> parts                      a block per chunk
     2 loom_moe_offsets  parts -> count start offs         one block (moe_count ends here:
                                                           count is its result)
     3 loom_moe_place    idx count start offs -> pos       a block per chunk (moe_sort)
   In 1 and 3 a thread per expert walks the chunk in order (from shared memory). */
#define LOOM_MOE_CHUNK 1024
template <class SI>
LOOM_DEV void loom_moe_hist(const LoomArgs &a) {
  __shared__ int s_idx[LOOM_MOE_CHUNK];
  const int *idx = (const int *)a.buf[0];
  int *parts = (int *)a.buf[1];
  const long long n = a.i[0], E = a.i[1], chunk = a.i[3], P = (n + chunk - 1) / chunk;
  for (long long b = blockIdx.x; b < P; b += gridDim.x) {
    const long long lo = b * chunk, m = n - lo < chunk ? n - lo : chunk;
    __syncthreads();   /* the previous chunk's reads */
    for (long long t = threadIdx.x; t < m; t += blockDim.x) {
      const int e = idx[lo + t];
      if (e < 0 || e >= E) {
        LOOM_MOE_BAD("moe_sort: an expert index is out of range");
        return;
      }
      s_idx[t] = e;
    }
    __syncthreads();
    for (long long e = threadIdx.x; e < E; e += blockDim.x) {
      int c = 0;
      for (long long t = 0; t < m; t++) c += s_idx[t] == e;
      parts[b * E + e] = c;
    }
  }
}
template <class SI>
LOOM_DEV void loom_moe_offsets(const LoomArgs &a) {
  const int *parts = (const int *)a.buf[0];
  int *count = (int *)a.buf[1], *start = (int *)a.buf[2], *offs = (int *)a.buf[3];
  const long long n = a.i[0], E = a.i[1], cap = a.i[2], chunk = a.i[3], P = (n + chunk - 1) / chunk;
  if (blockIdx.x != 0) return;
  for (long long e = threadIdx.x; e < E; e += blockDim.x) {
    long long run = 0;
    for (long long b = 0; b < P; b++) {
      offs[b * E + e] = (int)run;
      run += parts[b * E + e];
    }
    count[e] = (int)(cap > 0 && run > cap ? cap : run);
  }
  __syncthreads();   /* every count written (a block's global writes are ordered by its barriers) */
  if (threadIdx.x == 0) {
    long long at = 0;
    for (long long e = 0; e < E; e++) {
      start[e] = (int)at;
      at += count[e];
    }
  }
}
template <class SI>
LOOM_DEV void loom_moe_place(const LoomArgs &a) {
  __shared__ int s_idx[LOOM_MOE_CHUNK];
  const int *idx = (const int *)a.buf[0], *count = (const int *)a.buf[1], *start = (const int *)a.buf[2];
  const int *offs = (const int *)a.buf[3];
  int *pos = (int *)a.buf[4];
  const long long n = a.i[0], E = a.i[1], chunk = a.i[3], P = (n + chunk - 1) / chunk;
  for (long long b = blockIdx.x; b < P; b += gridDim.x) {
    const long long lo = b * chunk, m = n - lo < chunk ? n - lo : chunk;
    __syncthreads();
    for (long long t = threadIdx.x; t < m; t += blockDim.x) s_idx[t] = idx[lo + t];
    __syncthreads();
    for (long long e = threadIdx.x; e < E; e += blockDim.x) {
      long long r = offs[b * E + e];
      const long long c = count[e], s = start[e];
      for (long long t = 0; t < m; t++)
        if (s_idx[t] == e) {
          pos[lo + t] = (int)(r < c ? s + r : -1);
          r++;
        }
    }
  }
}

/* moe_dispatch (after a fill of y with zeros).  bufs: x pos w -> y;  i: N, k, D, R.  A thread
   per (assignment, d): y[pos[a], d] = w[a] x[a/k, d] (positions are distinct). */
template <class SX, class SW, class SY>
LOOM_DEV void loom_moe_dispatch(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  const int *pos = (const int *)a.buf[1];
  const typename SW::T *w = LOOM_IN(SW, 2);
  typename SY::T *y = LOOM_OUT(SY, 3);
  const long long k = a.i[1], D = a.i[2], R = a.i[3];
  LOOM_GRID_LOOP(t, a.i[0] * k * D) {
    const long long as = t / D, d = t - as * D, p = pos[as];
    if (p < -1 || p >= R) {
      LOOM_MOE_BAD("moe_dispatch: a position is out of range");
      return;
    }
    if (p >= 0) SY::st(y, p * D + d, __fmul_rn(SW::ld(w, as), SX::ld(x, (as / k) * D + d)));
  }
}

/* moe_combine.  bufs: y pos w -> out;  i: N, k, D, R.  A thread per out[n, d]: 0 plus
   w[n, j] y[pos[n, j], d] in j order, the dropped skipped. */
template <class SY, class SW, class SO>
LOOM_DEV void loom_moe_combine(const LoomArgs &a) {
  const typename SY::T *y = LOOM_IN(SY, 0);
  const int *pos = (const int *)a.buf[1];
  const typename SW::T *w = LOOM_IN(SW, 2);
  typename SO::T *out = LOOM_OUT(SO, 3);
  const long long k = a.i[1], D = a.i[2], R = a.i[3];
  LOOM_GRID_LOOP(t, a.i[0] * D) {
    const long long tok = t / D, d = t - tok * D;
    float acc = 0.0f;
    for (long long j = 0; j < k; j++) {
      const long long as = tok * k + j, p = pos[as];
      if (p < -1 || p >= R) {
        LOOM_MOE_BAD("moe_combine: a position is out of range");
        return;
      }
      if (p >= 0) acc = __fadd_rn(acc, __fmul_rn(SW::ld(w, as), SY::ld(y, p * D + d)));
    }
    SO::st(out, t, acc);
  }
}

/* moe_weight_grad.  bufs: rows x pos -> dw;  i: N, k, D, R.  A warp per assignment a:
   dw[a] = rows[pos[a]] . x[a/k] (0 when dropped); lane l sums d = l, l+32, ... in order, then
   loom_warp_sum's fixed tree. */
template <class SR, class SX, class SO>
LOOM_DEV void loom_moe_wgrad(const LoomArgs &a) {
  const typename SR::T *rows = LOOM_IN(SR, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  const int *pos = (const int *)a.buf[2];
  typename SO::T *dw = LOOM_OUT(SO, 3);
  const long long k = a.i[1], D = a.i[2], R = a.i[3], n = a.i[0] * k;
  const long long warps = (long long)blockDim.x >> 5, lane = threadIdx.x & 31;
  for (long long as = (long long)blockIdx.x * warps + (threadIdx.x >> 5); as < n; as += (long long)gridDim.x * warps) {
    const long long p = pos[as];
    if (p < -1 || p >= R) {
      LOOM_MOE_BAD("moe_weight_grad: a position is out of range");
      return;
    }
    float acc = 0.0f;
    if (p >= 0)
      for (long long d = lane; d < D; d += 32) acc = __fmaf_rn(SR::ld(rows, p * D + d), SX::ld(x, (as / k) * D + d), acc);
    acc = loom_warp_sum(acc);
    if (lane == 0) SO::st(dw, as, acc);
  }
}

/* The grouped matmuls: counts[G] (G a multiple of E) cut the R rows into consecutive groups,
   group g with expert g mod E; rows past the groups are zero.  The counts are on the device
   (moe_count wrote them): every thread walks them (the same values, no barrier), and a count
   that is negative or runs past R is a trap.  Tiles of 64 x 64 outputs, 256 threads of 4 x 4
   (thread (ty, tx) has rows ty + 16i and columns tx + 16j), the reduced dimension in steps of
   16 through shared memory (f32), each output's products added in index order with fmaf. */
#define LOOM_GM_T 64
#define LOOM_GM_K 16
#ifndef LOOM_GM_NO_TC   /* 1: bf16 grouped matmuls on the f32 loop too (a comparison) */
#define LOOM_GM_NO_TC 0
#endif

/* The group layout of the counts: total rows, and the row tiles of 64 that start at each
   group's first row (a tile holds one group's rows only).  False on bad counts. */
LOOM_DEV bool loom_gm_walk(const int *cnt, long long G, long long R, long long *total, long long *tiles) {
  long long t = 0, n = 0;
  for (long long g = 0; g < G; g++) {
    const long long c = cnt[g];
    if (c < 0 || c > R - t) return false;
    t += c;
    n += (c + LOOM_GM_T - 1) / LOOM_GM_T;
  }
  *total = t;
  *tiles = n;
  return true;
}

/* Which slot s of the groups' row tiles: its first row, the end of its group and its expert
   (-1: a slot past the groups, whose rows are zeroed). */
LOOM_DEV void loom_gm_slot(const int *cnt, long long G, long long E, long long s, long long tiles, long long total,
                           long long R, long long *row0, long long *end, long long *e) {
  *row0 = total + (s - tiles) * LOOM_GM_T, *end = R, *e = -1;
  if (s >= tiles) return;
  long long at = 0, off = 0;
  for (long long g = 0; g < G; g++) {
    const long long c = cnt[g], t = (c + LOOM_GM_T - 1) / LOOM_GM_T;
    if (s < at + t) {
      *e = g % E;
      *row0 = off + (s - at) * LOOM_GM_T;
      *end = off + c;
      return;
    }
    at += t;
    off += c;
  }
}

/* Tensor cores for bf16 operands (sm_80 and later, and the emulated device): the same tiles
   and slots as below, each 64 x 64 tile as 32 mma.sync m16n8k16 products a step of 16 (8 warps,
   warp w: rows 16 (w / 2), columns 32 (w % 2)), the operands' bf16 values exact and the sums
   in f32 (in the tensor cores' order, not fmaf's: bf16 runs compare within 2e-2). */
template <class S> struct loom_gm_tc { static constexpr bool ok = false; };
template <> struct loom_gm_tc<loom_sbf16> { static constexpr bool ok = true; };

template <class SX, class SW, class SY, bool TB>
LOOM_DEV void loom_grouped_mm_tc(const LoomArgs &a, long long R, long long K, long long N, long long E, long long G,
                                 long long total, long long tiles) {
  __shared__ unsigned short Ah[LOOM_GM_T][LOOM_GM_K + 8];   /* [row][k], rows of 24: fewer bank conflicts */
  __shared__ unsigned short Bh[LOOM_GM_T][LOOM_GM_K + 8];   /* [column][k] */
  const typename SX::T *x = LOOM_IN(SX, 0);
  const typename SW::T *w = LOOM_IN(SW, 1);
  const int *cnt = (const int *)a.buf[2];
  typename SY::T *y = LOOM_OUT(SY, 3);
  const long long slots = tiles + (R - total + LOOM_GM_T - 1) / LOOM_GM_T;
  const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp >> 1) * 16, cb = (warp & 1) * 32;
  for (long long s = blockIdx.y; s < slots; s += gridDim.y) {
    long long row0, end, e;
    loom_gm_slot(cnt, G, E, s, tiles, total, R, &row0, &end, &e);
    const long long nrows = end - row0 < LOOM_GM_T ? end - row0 : LOOM_GM_T;
    const typename SW::T *we = w + (e < 0 ? 0 : e) * N * K;
    for (long long n0 = (long long)blockIdx.x * LOOM_GM_T; n0 < N; n0 += (long long)gridDim.x * LOOM_GM_T) {
      float acc[4][4];
      for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) acc[j][q] = 0.0f;
      for (long long k0 = 0; e >= 0 && k0 < K; k0 += LOOM_GM_K) {
        const int kn = (int)(K - k0 < LOOM_GM_K ? K - k0 : LOOM_GM_K);
        __syncthreads();   /* the previous step's reads */
        for (int q = tid; q < LOOM_GM_K * LOOM_GM_T; q += 256) {
          const int m = q / LOOM_GM_K, kk = q % LOOM_GM_K;
          Ah[m][kk] = m < nrows && kk < kn ? loom_f32_to_bf16(SX::ld(x, (row0 + m) * K + k0 + kk)) : (unsigned short)0;
          if (TB) {   /* w[e][n][k]: k fastest */
            Bh[m][kk] = n0 + m < N && kk < kn ? loom_f32_to_bf16(SW::ld(we, (n0 + m) * K + k0 + kk)) : (unsigned short)0;
          } else {    /* w[e][k][n]: n fastest */
            const int kr = q / LOOM_GM_T, nc = q % LOOM_GM_T;
            Bh[nc][kr] = n0 + nc < N && kr < kn ? loom_f32_to_bf16(SW::ld(we, (k0 + kr) * N + n0 + nc)) : (unsigned short)0;
          }
        }
        __syncthreads();
        unsigned af[4];
        af[0] = (unsigned)Ah[rb + g][2 * t] | (unsigned)Ah[rb + g][2 * t + 1] << 16;
        af[1] = (unsigned)Ah[rb + g + 8][2 * t] | (unsigned)Ah[rb + g + 8][2 * t + 1] << 16;
        af[2] = (unsigned)Ah[rb + g][2 * t + 8] | (unsigned)Ah[rb + g][2 * t + 9] << 16;
        af[3] = (unsigned)Ah[rb + g + 8][2 * t + 8] | (unsigned)Ah[rb + g + 8][2 * t + 9] << 16;
        for (int j = 0; j < 4; j++) {
          const int n = cb + 8 * j + g;
          unsigned bf[2];
          bf[0] = (unsigned)Bh[n][2 * t] | (unsigned)Bh[n][2 * t + 1] << 16;
          bf[1] = (unsigned)Bh[n][2 * t + 8] | (unsigned)Bh[n][2 * t + 9] << 16;
          loom_mma16816<true>(acc[j], af, bf);
        }
      }
      for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) {
          const long long m = rb + g + (q >= 2 ? 8 : 0), nn = n0 + cb + 8 * j + 2 * t + (q & 1);
          if (m < nrows && nn < N) SY::st(y, (row0 + m) * N + nn, acc[j][q]);
        }
    }
  }
}

/* grouped_matmul.  bufs: x w counts -> y;  i: R, K, N, E, G, tb.  Block (x: a tile of 64
   columns, y: a slot).  Slots 0 .. tiles-1 are the groups' row tiles in order; the slots after
   them zero the rows past the groups, 64 at a time.  TB: w[E,N,K], else w[E,K,N].  bf16
   operands go to the tensor cores (loom_grouped_mm_tc); the others to the f32 loop below. */
template <class SX, class SW, class SY, bool TB>
LOOM_DEV void loom_grouped_mm(const LoomArgs &a) {
  __shared__ float As[LOOM_GM_K][LOOM_GM_T + 1];
  __shared__ float Bs[LOOM_GM_K][LOOM_GM_T + 1];
  const typename SX::T *x = LOOM_IN(SX, 0);
  const typename SW::T *w = LOOM_IN(SW, 1);
  const int *cnt = (const int *)a.buf[2];
  typename SY::T *y = LOOM_OUT(SY, 3);
  const long long R = a.i[0], K = a.i[1], N = a.i[2], E = a.i[3], G = a.i[4];
  long long total = 0, tiles = 0;
  if (!loom_gm_walk(cnt, G, R, &total, &tiles)) {
    LOOM_MOE_BAD("grouped_matmul: the group counts exceed the rows");
    return;
  }
#if defined(LOOM_EMU) || __CUDA_ARCH__ >= 800
  if (loom_gm_tc<SX>::ok && loom_gm_tc<SW>::ok && !LOOM_GM_NO_TC) {
    loom_grouped_mm_tc<SX, SW, SY, TB>(a, R, K, N, E, G, total, tiles);
    return;
  }
#endif
  const long long slots = tiles + (R - total + LOOM_GM_T - 1) / LOOM_GM_T;
  const int tid = (int)threadIdx.x, tx = tid & 15, ty = tid >> 4;
  for (long long s = blockIdx.y; s < slots; s += gridDim.y) {
    long long row0, end, e;
    loom_gm_slot(cnt, G, E, s, tiles, total, R, &row0, &end, &e);
    const long long nrows = end - row0 < LOOM_GM_T ? end - row0 : LOOM_GM_T;
    const typename SW::T *we = w + (e < 0 ? 0 : e) * N * K;
    for (long long n0 = (long long)blockIdx.x * LOOM_GM_T; n0 < N; n0 += (long long)gridDim.x * LOOM_GM_T) {
      float acc[4][4];
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
      for (long long k0 = 0; e >= 0 && k0 < K; k0 += LOOM_GM_K) {
        const int kn = (int)(K - k0 < LOOM_GM_K ? K - k0 : LOOM_GM_K);
        __syncthreads();   /* the previous step's reads */
        for (int q = tid; q < LOOM_GM_K * LOOM_GM_T; q += 256) {
          const int m = q / LOOM_GM_K, kk = q % LOOM_GM_K;
          As[kk][m] = m < nrows && kk < kn ? SX::ld(x, (row0 + m) * K + k0 + kk) : 0.0f;
          if (TB) {
            const long long nn = n0 + m;   /* w[e][n][k]: k fastest */
            Bs[kk][m] = nn < N && kk < kn ? SW::ld(we, nn * K + k0 + kk) : 0.0f;
          } else {
            const int kr = q / LOOM_GM_T, nc = q % LOOM_GM_T;   /* w[e][k][n]: n fastest */
            Bs[kr][nc] = n0 + nc < N && kr < kn ? SW::ld(we, (k0 + kr) * N + n0 + nc) : 0.0f;
          }
        }
        __syncthreads();
        for (int kk = 0; kk < kn; kk++) {
          float av[4], bv[4];
#pragma unroll
          for (int i = 0; i < 4; i++) av[i] = As[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
        }
      }
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
          const long long m = ty + 16 * i, nn = n0 + tx + 16 * j;
          if (m < nrows && nn < N) SY::st(y, (row0 + m) * N + nn, acc[i][j]);
        }
    }
  }
}

/* The weight gradient on tensor cores (bf16 dy and x): the same tiles, each group's rows in
   steps of 16 as mma.sync products (dw's 64 n as the product's rows, its 64 k as columns), the
   groups' sums added in their order as below; the sums within a step in the tensor cores'
   order. */
template <class SD, class SX, class SO>
LOOM_DEV void loom_grouped_wgrad_tc(const LoomArgs &a, long long R, long long K, long long N, long long E, long long G) {
  __shared__ unsigned short Dh[LOOM_GM_T][LOOM_GM_K + 8];   /* [n][row] */
  __shared__ unsigned short Xh[LOOM_GM_T][LOOM_GM_K + 8];   /* [k][row] */
  const typename SD::T *dy = LOOM_IN(SD, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  const int *cnt = (const int *)a.buf[2];
  typename SO::T *dw = LOOM_OUT(SO, 3);
  const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int rb = (warp >> 1) * 16, cb = (warp & 1) * 32;
  for (long long e = blockIdx.z; e < E; e += gridDim.z)
    for (long long n0 = (long long)blockIdx.y * LOOM_GM_T; n0 < N; n0 += (long long)gridDim.y * LOOM_GM_T)
      for (long long k0 = (long long)blockIdx.x * LOOM_GM_T; k0 < K; k0 += (long long)gridDim.x * LOOM_GM_T) {
        float tot[4][4];
        for (int j = 0; j < 4; j++)
          for (int q = 0; q < 4; q++) tot[j][q] = 0.0f;
        long long off = 0;
        for (long long gr = 0; gr < G; gr++) {
          const long long c = cnt[gr];
          if (gr % E != e) {
            off += c;
            continue;
          }
          float acc[4][4];
          for (int j = 0; j < 4; j++)
            for (int q = 0; q < 4; q++) acc[j][q] = 0.0f;
          for (long long r0 = off; r0 < off + c; r0 += LOOM_GM_K) {
            const int rn = (int)(off + c - r0 < LOOM_GM_K ? off + c - r0 : LOOM_GM_K);
            __syncthreads();
            for (int q = tid; q < LOOM_GM_K * LOOM_GM_T; q += 256) {
              const int rr = q / LOOM_GM_T, cc = q % LOOM_GM_T;
              Dh[cc][rr] = rr < rn && n0 + cc < N ? loom_f32_to_bf16(SD::ld(dy, (r0 + rr) * N + n0 + cc)) : (unsigned short)0;
              Xh[cc][rr] = rr < rn && k0 + cc < K ? loom_f32_to_bf16(SX::ld(x, (r0 + rr) * K + k0 + cc)) : (unsigned short)0;
            }
            __syncthreads();
            unsigned af[4];
            af[0] = (unsigned)Dh[rb + g][2 * t] | (unsigned)Dh[rb + g][2 * t + 1] << 16;
            af[1] = (unsigned)Dh[rb + g + 8][2 * t] | (unsigned)Dh[rb + g + 8][2 * t + 1] << 16;
            af[2] = (unsigned)Dh[rb + g][2 * t + 8] | (unsigned)Dh[rb + g][2 * t + 9] << 16;
            af[3] = (unsigned)Dh[rb + g + 8][2 * t + 8] | (unsigned)Dh[rb + g + 8][2 * t + 9] << 16;
            for (int j = 0; j < 4; j++) {
              const int kc = cb + 8 * j + g;
              unsigned bf[2];
              bf[0] = (unsigned)Xh[kc][2 * t] | (unsigned)Xh[kc][2 * t + 1] << 16;
              bf[1] = (unsigned)Xh[kc][2 * t + 8] | (unsigned)Xh[kc][2 * t + 9] << 16;
              loom_mma16816<true>(acc[j], af, bf);
            }
          }
          for (int j = 0; j < 4; j++)
            for (int q = 0; q < 4; q++) tot[j][q] = __fadd_rn(tot[j][q], acc[j][q]);
          off += c;
        }
        for (int j = 0; j < 4; j++)
          for (int q = 0; q < 4; q++) {
            const long long nn = n0 + rb + g + (q >= 2 ? 8 : 0), kk = k0 + cb + 8 * j + 2 * t + (q & 1);
            if (nn < N && kk < K) SO::st(dw, (e * N + nn) * K + kk, tot[j][q]);
          }
      }
}

/* grouped_matmul_wgrad.  bufs: dy x counts -> dw;  i: R, K (x's), N (dy's), E, G.  Block (x: a
   tile of 64 k, y: of 64 n, z: the expert e).  dw[e][n][k] = 0 + (sum over the rows of group
   e) + (over those of group e + E) + ..., each group's sum over its rows in order (the
   reference's order; bf16 operands: loom_grouped_wgrad_tc). */
template <class SD, class SX, class SO>
LOOM_DEV void loom_grouped_wgrad(const LoomArgs &a) {
  __shared__ float Ds[LOOM_GM_K][LOOM_GM_T + 1];
  __shared__ float Xs[LOOM_GM_K][LOOM_GM_T + 1];
  const typename SD::T *dy = LOOM_IN(SD, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  const int *cnt = (const int *)a.buf[2];
  typename SO::T *dw = LOOM_OUT(SO, 3);
  const long long R = a.i[0], K = a.i[1], N = a.i[2], E = a.i[3], G = a.i[4];
  long long total = 0, tiles = 0;
  if (!loom_gm_walk(cnt, G, R, &total, &tiles)) {
    LOOM_MOE_BAD("grouped_matmul_wgrad: the group counts exceed the rows");
    return;
  }
#if defined(LOOM_EMU) || __CUDA_ARCH__ >= 800
  if (loom_gm_tc<SD>::ok && loom_gm_tc<SX>::ok && !LOOM_GM_NO_TC) {
    loom_grouped_wgrad_tc<SD, SX, SO>(a, R, K, N, E, G);
    return;
  }
#endif
  const int tid = (int)threadIdx.x, tx = tid & 15, ty = tid >> 4;
  for (long long e = blockIdx.z; e < E; e += gridDim.z)
    for (long long n0 = (long long)blockIdx.y * LOOM_GM_T; n0 < N; n0 += (long long)gridDim.y * LOOM_GM_T)
      for (long long k0 = (long long)blockIdx.x * LOOM_GM_T; k0 < K; k0 += (long long)gridDim.x * LOOM_GM_T) {
        float tot[4][4];
        for (int i = 0; i < 4; i++)
          for (int j = 0; j < 4; j++) tot[i][j] = 0.0f;
        long long off = 0;
        for (long long g = 0; g < G; g++) {
          const long long c = cnt[g];
          if (g % E != e) {
            off += c;
            continue;
          }
          float acc[4][4];
          for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
          for (long long r0 = off; r0 < off + c; r0 += LOOM_GM_K) {
            const int rn = (int)(off + c - r0 < LOOM_GM_K ? off + c - r0 : LOOM_GM_K);
            __syncthreads();
            for (int q = tid; q < LOOM_GM_K * LOOM_GM_T; q += 256) {
              const int rr = q / LOOM_GM_T, cc = q % LOOM_GM_T;
              Ds[rr][cc] = rr < rn && n0 + cc < N ? SD::ld(dy, (r0 + rr) * N + n0 + cc) : 0.0f;
              Xs[rr][cc] = rr < rn && k0 + cc < K ? SX::ld(x, (r0 + rr) * K + k0 + cc) : 0.0f;
            }
            __syncthreads();
            for (int rr = 0; rr < rn; rr++) {
              float dv[4], xv[4];
#pragma unroll
              for (int i = 0; i < 4; i++) dv[i] = Ds[rr][ty + 16 * i];
#pragma unroll
              for (int j = 0; j < 4; j++) xv[j] = Xs[rr][tx + 16 * j];
#pragma unroll
              for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = __fmaf_rn(dv[i], xv[j], acc[i][j]);
            }
          }
          for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) tot[i][j] = __fadd_rn(tot[i][j], acc[i][j]);
          off += c;
        }
        for (int i = 0; i < 4; i++)
          for (int j = 0; j < 4; j++) {
            const long long nn = n0 + ty + 16 * i, kk = k0 + tx + 16 * j;
            if (nn < N && kk < K) SO::st(dw, (e * N + nn) * K + kk, tot[i][j]);
          }
      }
}

/* The batched lowering (LOOM_CUDA_MOE_GEMM=batched, codegen/cuda/lower_moe.c): with a
   capacity, the groups (G = E) copied to [E, cap, D], group e's rows first and zeros after,
   so that one strided-batched cuBLASLt GEMM multiplies every expert; then the products copied
   back to the groups' rows.  The zero rows add nothing to a weight gradient's sums.  Each
   block turns the counts into offsets in shared memory once (thread 0; E <= LOOM_MOE_PAD_E,
   which the lowering checks): a count that is negative, above the capacity, or runs past R
   is a trap, as in the grouped matmuls. */
#define LOOM_MOE_PAD_E 1024
LOOM_DEV bool loom_moe_pad_offsets(const int *cnt, long long E, long long cap, long long R, long long *off) {
  __shared__ int s_bad;
  if (threadIdx.x == 0) {
    long long t = 0;
    int bad = 0;
    for (long long e = 0; e < E; e++) {
      const long long c = cnt[e];
      if (c < 0 || c > cap || c > R - t) bad = 1;
      off[e] = t;
      if (!bad) t += c;
    }
    off[E] = t;
    s_bad = bad;
  }
  __syncthreads();
  return !s_bad;
}

/* moe_pad.  bufs: x counts -> xp;  i: E cap D, R.  A thread per xp[e, r, d]: x[off_e + r, d]
   for r < counts[e], else 0 (the values copied as they are). */
template <class SX>
LOOM_DEV void loom_moe_pad(const LoomArgs &a) {
  __shared__ long long off[LOOM_MOE_PAD_E + 1];
  const typename SX::T *x = LOOM_IN(SX, 0);
  const int *cnt = (const int *)a.buf[1];
  typename SX::T *xp = LOOM_OUT(SX, 2);
  const long long E = a.i[0], cap = a.i[1], D = a.i[2], R = a.i[3];
  if (!loom_moe_pad_offsets(cnt, E, cap, R, off)) {
    if (threadIdx.x == 0) LOOM_MOE_BAD("moe_pad: the group counts exceed the capacity or the rows");
    return;
  }
  LOOM_GRID_LOOP(t, E * cap * D) {
    const long long e = t / (cap * D), rd = t - e * cap * D, r = rd / D, d = rd - r * D;
    xp[t] = r < off[e + 1] - off[e] ? x[(off[e] + r) * D + d] : typename SX::T();
  }
}

/* moe_unpad.  bufs: yp counts -> y;  i: E cap D, R.  A thread per y[r, d]: yp[e, r - off_e, d]
   of the group e that holds row r (a binary search of the offsets), 0 past the groups (as the
   grouped matmul's rows past the groups). */
template <class SY>
LOOM_DEV void loom_moe_unpad(const LoomArgs &a) {
  __shared__ long long off[LOOM_MOE_PAD_E + 1];
  const typename SY::T *yp = LOOM_IN(SY, 0);
  const int *cnt = (const int *)a.buf[1];
  typename SY::T *y = LOOM_OUT(SY, 2);
  const long long E = a.i[0], cap = a.i[1], D = a.i[2], R = a.i[3];
  if (!loom_moe_pad_offsets(cnt, E, cap, R, off)) {
    if (threadIdx.x == 0) LOOM_MOE_BAD("moe_unpad: the group counts exceed the capacity or the rows");
    return;
  }
  LOOM_GRID_LOOP(t, R * D) {
    const long long r = t / D, d = t - r * D;
    if (r >= off[E]) {
      y[t] = typename SY::T();
      continue;
    }
    long long lo = 0, hi = E - 1;   /* the last e with off[e] <= r: its group holds r */
    while (lo < hi) {
      const long long mid = (lo + hi + 1) / 2;
      if (off[mid] <= r) lo = mid;
      else hi = mid - 1;
    }
    y[t] = yp[(lo * cap + r - off[lo]) * D + d];
  }
}
