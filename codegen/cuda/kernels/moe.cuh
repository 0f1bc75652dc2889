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

/* The group layout of the counts: total rows, and the row tiles of bm rows that start at each
   group's first row (a tile holds one group's rows only).  False on bad counts. */
LOOM_DEV bool loom_gm_walk(const int *cnt, long long G, long long R, long long bm, long long *total, long long *tiles) {
  long long t = 0, n = 0;
  for (long long g = 0; g < G; g++) {
    const long long c = cnt[g];
    if (c < 0 || c > R - t) return false;
    t += c;
    n += (c + bm - 1) / bm;
  }
  *total = t;
  *tiles = n;
  return true;
}

/* Which slot s of the groups' row tiles of bm rows: its first row, the end of its group and its
   expert (-1: a slot past the groups, whose rows are zeroed). */
LOOM_DEV void loom_gm_slot(const int *cnt, long long G, long long E, long long bm, long long s, long long tiles,
                           long long total, long long R, long long *row0, long long *end, long long *e) {
  *row0 = total + (s - tiles) * bm, *end = R, *e = -1;
  if (s >= tiles) return;
  long long at = 0, off = 0;
  for (long long g = 0; g < G; g++) {
    const long long c = cnt[g], t = (c + bm - 1) / bm;
    if (s < at + t) {
      *e = g % E;
      *row0 = off + (s - at) * bm;
      *end = off + c;
      return;
    }
    at += t;
    off += c;
  }
}

/* Tensor cores for bf16 operands (sm_80 and later, and the emulated device).  Tiles of
   LOOM_GMT x LOOM_GMT (128 x 128) outputs, 8 warps of 64 x 32 (warp w: rows 64 (w / 4), columns
   32 (w % 4)), the reduced dimension in stages of 32 through shared memory, three stages: the
   next two stages' 16-byte cp.async copies run under this stage's products (one barrier a
   stage).  Each stage is two
   k-steps of 16, every output's step an mma.sync m16n8k16 (fragments by ldmatrix, .trans for
   operands stored k-major), the steps in index order: the operands' bf16 values exact, the sums
   in f32 in the tensor cores' order within a step (not fmaf's: bf16 runs compare within 2e-2),
   a step wholly past the end skipped.  Shared rows are padded by 8 elements (rows of 40 or 136:
   ldmatrix's eight rows fall in distinct banks).  Rows whose length or start is not a multiple
   of 8 elements (16 bytes) are copied element by element instead (the same tiles, zeros past
   the ends).  Index arithmetic in the loop is 32-bit offsets from 64-bit row pointers made
   once a tile.  Shared memory: 60 KB (w [E,N,K]) or 55.5 KB for the forward (dynamic: the
   lowering's launch gives it, codegen/cuda/lower.c), 39 KB for the weight gradient (static). */
#define LOOM_GMT 128
#define LOOM_GMT_K 32
#define LOOM_GMT_STAGES 3
#define LOOM_GMW_N 128   /* the weight gradient's tiles: 128 n x 64 k */
#define LOOM_GMW_K 64
template <class S> struct loom_gm_tc { static constexpr bool ok = false; };
template <> struct loom_gm_tc<loom_sbf16> { static constexpr bool ok = true; };

LOOM_DEV bool loom_gm_a16(const void *p) { return ((unsigned long long)p & 15u) == 0; }

/* 8 consecutive 16-bit elements into shared memory (16 bytes): the first n (0 .. 8) of src,
   zeros after.  vec (src 16-byte aligned and n 0 or 8): one cp.async; else element by element. */
LOOM_DEV void loom_gm_chunk(unsigned short *dst, const unsigned short *src, int n, bool vec) {
  if (vec) {
    loom_cp_async16(dst, src, n > 0);
    return;
  }
  unsigned v[4];
  #pragma unroll
  for (int e = 0; e < 4; e++)
    v[e] = (2 * e < n ? (unsigned)src[2 * e] : 0u) | (2 * e + 1 < n ? (unsigned)src[2 * e + 1] : 0u) << 16;
  LOOM_CHECK_ALIGN(dst, 16);
  *(loom_u4 *)dst = loom_u4{v[0], v[1], v[2], v[3]};
}
LOOM_DEV int loom_gm_n8(int left) { return left <= 0 ? 0 : left < 8 ? left : 8; }

/* Outputs i and i + 1 (two: the second in range too), each rounded as S::st does, in one store
   when the pair is aligned to its size. */
template <class S>
LOOM_DEV void loom_gm_st2(typename S::T *p, long long i, float v0, float v1, bool two) {
  struct alignas(2 * sizeof(typename S::T)) P { typename S::T v[2]; };
  if (two && ((unsigned long long)(p + i) & (2 * sizeof(typename S::T) - 1)) == 0) {
    P w;
    S::st(w.v, 0, v0);
    S::st(w.v, 1, v1);
    *(P *)(p + i) = w;
    return;
  }
  S::st(p, i, v0);
  if (two) S::st(p, i + 1, v1);
}

/* One stage's products for a warp's 16 MI x 8 NJ outputs: ks (1 or 2) k-steps of 16.  A and B
   at this lane's ldmatrix row (lane 8m + r: row r of 8 x 8 matrix m); AT / BT: stored k-major
   ([k][m], [k][n], row strides LDA / LDB), read by ldmatrix.trans; else [m][k], [n][k]. */
template <int MI, int NJ, int LDA, int LDB, bool AT, bool BT>
LOOM_DEV void loom_gm_stage(float (&acc)[MI][NJ][4], const unsigned short *sA, const unsigned short *sB, int ks) {
  #pragma unroll
  for (int kk = 0; kk < 2; kk++) {
    if (kk == ks) break;
    unsigned b[NJ / 2][4];
    #pragma unroll
    for (int jp = 0; jp < NJ / 2; jp++) {
      if (BT) loom_ldsm_x4_t(b[jp], sB + 16 * kk * LDB + 16 * jp);
      else loom_ldsm_x4(b[jp], sB + 16 * jp * LDB + 16 * kk);
    }
    #pragma unroll
    for (int i = 0; i < MI; i++) {
      unsigned af[4];
      if (AT) loom_ldsm_x4_t(af, sA + 16 * kk * LDA + 16 * i);
      else loom_ldsm_x4(af, sA + 16 * i * LDA + 16 * kk);
      #pragma unroll
      for (int j = 0; j < NJ; j++) loom_mma16816<true>(acc[i][j], af, b[j >> 1] + 2 * (j & 1));
    }
  }
}

/* This lane's ldmatrix row (lane 8m + r gives row r of matrix m) as an offset in a stage stored
   [k][.] (kmajor) or [.][k], row stride ld: matrix bit 0 steps k by 8 when b0k (the B operands:
   k halves, then 8-column blocks), else the rows (the A operands: m halves, then k halves). */
LOOM_DEV int loom_gm_lrow(int lane, int ld, bool kmajor, bool b0k) {
  const int r = lane & 7, m = lane >> 3, dk = 8 * (b0k ? m & 1 : m >> 1), dx = 8 * (b0k ? m >> 1 : m & 1);
  return kmajor ? (r + dk) * ld + dx : (r + dx) * ld + dk;
}

/* The forward's dynamic shared memory: three stages of A [128][40] and B ([128][40], or
   [32][136]); lower.c's CUDA_GM_TC_SMEM. */
template <bool TB> struct loom_gm_tc_smem {
  static constexpr int bytes =
      LOOM_GMT_STAGES * 2 * (LOOM_GMT * (LOOM_GMT_K + 8) + (TB ? LOOM_GMT * (LOOM_GMT_K + 8) : LOOM_GMT_K * (LOOM_GMT + 8)));
};

template <class SX, class SW, class SY, bool TB>
LOOM_DEV void loom_grouped_mm_tc(const LoomArgs &a, long long R, long long K_, long long N_, long long E, long long G,
                                 long long total, long long tiles) {
  constexpr int BM = LOOM_GMT, BN = LOOM_GMT, BK = LOOM_GMT_K, LA = BK + 8, LB = TB ? BK + 8 : BN + 8, ST = LOOM_GMT_STAGES;
  constexpr int SA = BM * LA, SB = TB ? BN * LA : BK * LB;   /* a stage's elements */
  static_assert(ST * 2 * (SA + SB) == loom_gm_tc_smem<TB>::bytes, "the forward's shared memory");
  extern __shared__ float loom_smem[];
#if !defined(LOOM_EMU)
  unsigned dyn;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < (unsigned)loom_gm_tc_smem<TB>::bytes) {   /* a launch that does not match lower.c's */
    LOOM_MOE_BAD("grouped_matmul: launched with too little dynamic shared memory");
    return;
  }
#endif
  unsigned short *sA = (unsigned short *)loom_smem, *sB = sA + ST * SA;
  const unsigned short *x = (const unsigned short *)a.buf[0], *w = (const unsigned short *)a.buf[1];
  const int *cnt = (const int *)a.buf[2];
  typename SY::T *y = LOOM_OUT(SY, 3);
  const int K = (int)K_, N = (int)N_;   /* the lowering checks both fit int32 */
  const bool vec = K % 8 == 0 && (TB || N % 8 == 0) && loom_gm_a16(x) && loom_gm_a16(w);
  const long long slots = tiles + (R - total + BM - 1) / BM;
  const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wm = 64 * (warp >> 2), wn = 32 * (warp & 3);
  /* this thread's copies: A rows ar, ar + 64 at k ac; B (TB) rows n br, br + 64 at k ac, or
     (!TB) k rows bk, bk + 16 at n bc */
  const int ar = tid >> 2, ac = (tid & 3) * 8, bk = tid >> 4, bc = (tid & 15) * 8;
  /* this lane's ldmatrix rows: A [m][k] (matrices: m halves, then k halves); B [n][k] (k
     halves, then n blocks) or [k][n] (k halves, then n blocks), at the warp's corner */
  const int aoff = wm * LA + loom_gm_lrow(lane, LA, false, false);
  const int boff = TB ? wn * LA + loom_gm_lrow(lane, LA, false, true) : wn + loom_gm_lrow(lane, LB, true, true);
  for (long long s = blockIdx.y; s < slots; s += gridDim.y) {
    long long row0, end, e;
    loom_gm_slot(cnt, G, E, BM, s, tiles, total, R, &row0, &end, &e);
    const int nrows = (int)(end - row0 < BM ? end - row0 : BM);
    for (int n0 = (int)blockIdx.x * BN; n0 < N; n0 += (int)gridDim.x * BN) {
      float acc[4][4][4];
      #pragma unroll
      for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
          #pragma unroll
          for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
      if (e >= 0) {
        /* the rows this thread copies (a row past the tile reads nothing: its own start) */
        const unsigned short *we = w + e * N_ * K_;
        const bool va0 = ar < nrows, va1 = ar + 64 < nrows;
        const unsigned short *pa0 = x + (row0 + (va0 ? ar : 0)) * K_ + ac, *pa1 = x + (row0 + (va1 ? ar + 64 : 0)) * K_ + ac;
        const bool vb0 = TB ? n0 + ar < N : n0 + bc < N, vb1 = TB ? n0 + ar + 64 < N : vb0;
        const unsigned short *pb0 = TB ? we + (long long)(vb0 ? n0 + ar : 0) * K + ac : we + (long long)bk * N + (vb0 ? n0 + bc : 0);
        const unsigned short *pb1 = TB ? we + (long long)(vb1 ? n0 + ar + 64 : 0) * K + ac : pb0 + 16 * N_;
        const int nb = TB ? 0 : loom_gm_n8(N - n0 - bc);
        /* the stage of k [k0, k0 + BK) into buffer st */
        auto load = [&](int st, int k0) {
          unsigned short *dA = sA + st * SA + ar * LA + ac;
          const int na = loom_gm_n8(K - k0 - ac);
          loom_gm_chunk(dA, pa0 + k0, va0 ? na : 0, vec);
          loom_gm_chunk(dA + 64 * LA, pa1 + k0, va1 ? na : 0, vec);
          if (TB) {
            unsigned short *dB = sB + st * SB + ar * LA + ac;
            loom_gm_chunk(dB, pb0 + k0, vb0 ? na : 0, vec);
            loom_gm_chunk(dB + 64 * LA, pb1 + k0, vb1 ? na : 0, vec);
          } else {
            unsigned short *dB = sB + st * SB + bk * LB + bc;
            const bool k_0 = k0 + bk < K, k_1 = k0 + bk + 16 < K;
            loom_gm_chunk(dB, pb0 + (k_0 ? (long long)k0 * N : 0), k_0 ? nb : 0, vec);
            loom_gm_chunk(dB + 16 * LB, pb1 + (k_1 ? (long long)k0 * N : 0), k_1 ? nb : 0, vec);
          }
          loom_cp_commit();
        };
        const int nk = (K + BK - 1) / BK;
        load(0, 0);
        if (nk > 1) load(1, BK);
        for (int kt = 0, st = 0, ls = 2; kt < nk; kt++) {
          if (kt + 1 < nk) loom_cp_wait<1>();   /* stage kt landed (kt + 1 may be in flight) */
          else loom_cp_wait<0>();
          __syncthreads();   /* ... for every thread; and every warp is done with stage kt - 1's buffer */
          if (kt + 2 < nk) load(ls, (kt + 2) * BK);   /* into it, under this stage's products */
          loom_gm_stage<4, 4, LA, LB, false, !TB>(acc, sA + st * SA + aoff, sB + st * SB + boff, K - kt * BK > 16 ? 2 : 1);
          st = st == ST - 1 ? 0 : st + 1;
          ls = ls == ST - 1 ? 0 : ls + 1;
        }
        __syncthreads();   /* every warp is done with the buffers before the next tile loads them */
      }
      #pragma unroll
      for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
          #pragma unroll
          for (int h = 0; h < 2; h++) {   /* rows g and g + 8: columns 2t, 2t + 1 */
            const int m = wm + 16 * i + g + 8 * h, nn = n0 + wn + 8 * j + 2 * t;
            if (m < nrows && nn < N)
              loom_gm_st2<SY>(y, (row0 + m) * N_ + nn, acc[i][j][2 * h], acc[i][j][2 * h + 1], nn + 1 < N);
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
  constexpr bool TC = loom_gm_tc<SX>::ok && loom_gm_tc<SW>::ok && !LOOM_GM_NO_TC;
  const typename SX::T *x = LOOM_IN(SX, 0);
  const typename SW::T *w = LOOM_IN(SW, 1);
  const int *cnt = (const int *)a.buf[2];
  typename SY::T *y = LOOM_OUT(SY, 3);
  const long long R = a.i[0], K = a.i[1], N = a.i[2], E = a.i[3], G = a.i[4];
  long long total = 0, tiles = 0;
#if defined(LOOM_EMU) || __CUDA_ARCH__ >= 800
  const bool tc = TC;
#else
  const bool tc = false;
#endif
  if (!loom_gm_walk(cnt, G, R, tc ? LOOM_GMT : LOOM_GM_T, &total, &tiles)) {
    LOOM_MOE_BAD("grouped_matmul: the group counts exceed the rows");
    return;
  }
  if (tc) {   /* tiles of LOOM_GMT rows */
    loom_grouped_mm_tc<SX, SW, SY, TB>(a, R, K, N, E, G, total, tiles);
    return;
  }
  const long long slots = tiles + (R - total + LOOM_GM_T - 1) / LOOM_GM_T;
  const int tid = (int)threadIdx.x, tx = tid & 15, ty = tid >> 4;
  for (long long s = blockIdx.y; s < slots; s += gridDim.y) {
    long long row0, end, e;
    loom_gm_slot(cnt, G, E, LOOM_GM_T, s, tiles, total, R, &row0, &end, &e);
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

/* The weight gradient on tensor cores (bf16 dy and x): tiles of 128 n x 64 k of dw[e] (dw's n
   as the products' rows, its k as their columns; 8 warps of 32 x 32: the per-group sums beside
   the total leave registers for two blocks an SM), each group's rows in stages of 32 by
   cp.async, three stages (static shared memory), both operands stored row-major ([row][n], [row][k], rows of 136 and 72)
   and read by ldmatrix.trans.  Each group's sum over its rows in k-steps of 16 from
   its first row, as mma.sync products in order (within a step the tensor cores' order), the
   groups' sums added in their order as below. */
template <class SD, class SX, class SO>
LOOM_DEV void loom_grouped_wgrad_tc(const LoomArgs &a, long long R, long long K_, long long N_, long long E, long long G) {
  constexpr int BM = LOOM_GMW_N, BN = LOOM_GMW_K, BK = LOOM_GMT_K, LD = BM + 8, LX = BN + 8, ZD = BK * LD, ZX = BK * LX;
  constexpr int ST = LOOM_GMT_STAGES;
  __shared__ loom_u4 smem[ST * (ZD + ZX) / 8];
  unsigned short *sD = (unsigned short *)smem, *sX = sD + ST * ZD;   /* stage st: dy rows at sD + st ZD, x's at sX + st ZX */
  const unsigned short *dy = (const unsigned short *)a.buf[0], *x = (const unsigned short *)a.buf[1];
  const int *cnt = (const int *)a.buf[2];
  typename SO::T *dw = LOOM_OUT(SO, 3);
  const int K = (int)K_, N = (int)N_;
  const bool vec = K % 8 == 0 && N % 8 == 0 && loom_gm_a16(dy) && loom_gm_a16(x);
  const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wm = 32 * (warp >> 1), wn = 32 * (warp & 1);
  /* this thread's copies: dy rows cr, cr + 16 at column cc; x row xr at column xc */
  const int cr = tid >> 4, cc = (tid & 15) * 8, xr = tid >> 3, xc = (tid & 7) * 8;
  const int aoff = wm + loom_gm_lrow(lane, LD, true, false), boff = wn + loom_gm_lrow(lane, LX, true, true);
  for (long long e = blockIdx.z; e < E; e += gridDim.z)
    for (int n0 = (int)blockIdx.y * BM; n0 < N; n0 += (int)gridDim.y * BM)
      for (int k0 = (int)blockIdx.x * BN; k0 < K; k0 += (int)gridDim.x * BN) {
        float tot[2][4][4], acc[2][4][4];
        #pragma unroll
        for (int i = 0; i < 2; i++)
          #pragma unroll
          for (int j = 0; j < 4; j++)
            #pragma unroll
            for (int q = 0; q < 4; q++) tot[i][j][q] = 0.0f;
        const int nd = loom_gm_n8(N - n0 - cc), nx = loom_gm_n8(K - k0 - xc);
        long long off = 0;
        for (long long gr = 0; gr < G; gr++) {
          const int c = cnt[gr];
          if (gr % E != e) {
            off += c;
            continue;
          }
          #pragma unroll
          for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++)
              #pragma unroll
              for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
          /* the group's rows from its first: row r of it at pd + r N, px + r K */
          const unsigned short *pd = dy + off * N_ + (nd ? n0 + cc : 0), *px = x + off * K_ + (nx ? k0 + xc : 0);
          auto load = [&](int st, int r0) {
            #pragma unroll
            for (int h = 0; h < 2; h++) {
              const int r = r0 + cr + 16 * h;
              const bool ok = r < c;
              loom_gm_chunk(sD + st * ZD + (cr + 16 * h) * LD + cc, pd + (ok ? (long long)r * N : 0), ok ? nd : 0, vec);
            }
            const int r = r0 + xr;
            const bool ok = r < c;
            loom_gm_chunk(sX + st * ZX + xr * LX + xc, px + (ok ? (long long)r * K : 0), ok ? nx : 0, vec);
            loom_cp_commit();
          };
          const int nk = (c + BK - 1) / BK;
          if (nk) load(0, 0);
          if (nk > 1) load(1, BK);
          for (int kt = 0, st = 0, ls = 2; kt < nk; kt++) {   /* as the forward's */
            if (kt + 1 < nk) loom_cp_wait<1>();
            else loom_cp_wait<0>();
            __syncthreads();
            if (kt + 2 < nk) load(ls, (kt + 2) * BK);
            loom_gm_stage<2, 4, LD, LX, true, true>(acc, sD + st * ZD + aoff, sX + st * ZX + boff, c - kt * BK > 16 ? 2 : 1);
            st = st == ST - 1 ? 0 : st + 1;
            ls = ls == ST - 1 ? 0 : ls + 1;
          }
          __syncthreads();
          #pragma unroll
          for (int i = 0; i < 2; i++)
            #pragma unroll
            for (int j = 0; j < 4; j++)
              #pragma unroll
              for (int q = 0; q < 4; q++) tot[i][j][q] = __fadd_rn(tot[i][j][q], acc[i][j][q]);
          off += c;
        }
        #pragma unroll
        for (int i = 0; i < 2; i++)
          #pragma unroll
          for (int j = 0; j < 4; j++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
              const int nn = n0 + wm + 16 * i + g + 8 * h, kk = k0 + wn + 8 * j + 2 * t;
              if (nn < N && kk < K)
                loom_gm_st2<SO>(dw, (e * N_ + nn) * K_ + kk, tot[i][j][2 * h], tot[i][j][2 * h + 1], kk + 1 < K);
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
  if (!loom_gm_walk(cnt, G, R, LOOM_GM_T, &total, &tiles)) {
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
