/* ---------------------------------------------------------------- attention blocks
   Ring attention's pieces (context parallelism; ops.def attention_block and
   attention_block_grad, defined by ir/interp_ops.c): the queries of this rank against one
   block of keys, on CUDA cores in f32, with the tiles and thread layout of loom_attn_fwd,
   loom_attn_bwd_dq and loom_attn_bwd_dkdv, and their tile arithmetic (loom_fa_scores,
   loom_fa_online, loom_fa_acc_rows, loom_fa_scores_t, loom_fa_acc_keys of attention.cuh: one
   copy).  What differs is the causal mask: it compares global positions (ir_seq_pos), not
   indices.  i: B, Tq, H, D, Tk, KV, causal, seq axis + 1,
   seq_n, zigzag, kv_shift, c, window;  f: scale.  window = i[12] > 0: a key is also hidden
   when it lies window or more positions before the query (a tile before every row's window
   is skipped like a tile past the causal diagonal).
   c = i[11] is the rank's coordinate on the seq axis (mesh axis i[7] - 1): the runtime
   writes it before the launch (RtStep.coord_at), as i[9] of loom_rope_*.
   Query row t is at pos(c, t); the keys are rank r = (c - kv_shift) mod n's rows (key j at
   pos(r, j)), or with kv_shift = -1 every rank's in rank order (key j at pos(j / Tq, j % Tq)).
   A key tile whose smallest position is past the largest query position of the query tile
   at hand is hidden from all its rows by the causal mask and skipped (the same decision on
   every thread: barriers stay uniform); loom_cp_rows finds both with one look per rank.
   Every output element has one fixed summation order: no atomics.  The loops over a
   thread's rows that hold position look-ups carry #pragma unroll: without it nvcc kept the
   row arrays (o, m, l) in local memory. */
/* The positions of a block's rows: rank r's L rows, or (all) every rank's in rank order.  A
   rank's positions increase with its rows (zigzag's second half-chunk lies after its first),
   so the smallest position of rows [lo, hi) is at the first of them in each rank's chunk,
   and the largest at the last. */
struct loom_cp_rows {
  long long r, L, n;
  bool zigzag, all;
  LOOM_DEV long long at(long long j) const {
    const long long rr = all ? j / L : r;
    return loom_seq_pos(rr, all ? j - rr * L : j, L, n, zigzag);
  }
  LOOM_DEV long long chunk_end(long long j) const { return all ? (j / L + 1) * L : L; }
  LOOM_DEV long long min_at(long long lo, long long hi) const {
    long long m = 0x7fffffffffffffffLL;
    for (long long j = lo; j < hi; j = chunk_end(j)) {
      const long long p = at(j);
      m = p < m ? p : m;
    }
    return m;
  }
  LOOM_DEV long long max_at(long long lo, long long hi) const {
    long long m = -1;
    for (long long j = lo; j < hi;) {
      const long long e = chunk_end(j) < hi ? chunk_end(j) : hi, p = at(e - 1);
      m = p > m ? p : m;
      j = e;
    }
    return m;
  }
};
LOOM_DEV loom_cp_rows loom_cp_queries(const LoomArgs &a) {
  loom_cp_rows q = {a.i[11], a.i[1], a.i[8], a.i[9] != 0, false};
  return q;
}
LOOM_DEV loom_cp_rows loom_cp_keys(const LoomArgs &a) {
  const long long n = a.i[8], shift = a.i[10], c = a.i[11];
  loom_cp_rows k = {shift < 0 ? 0 : ((c - shift) % n + n) % n, a.i[1], n, a.i[9] != 0, shift < 0};
  return k;
}
#define LOOM_LSE_NONE (-1e30f)   /* the lse of a row that sees no key of the block (ops.def) */

/* Forward: grid (B*H, ceil(Tq/64)); dynamic smem (64*3*(D+1) + 64*65) floats and the key
   tile's 64 positions (long long).  bufs: q k v -> o lse (f32).  As loom_attn_fwd, then
   o = acc / l and lse = m + log l; a row that sees no key keeps l = 0: o = 0, lse = -1e30. */
template <class SQ, class SK, class SV, int D>
LOOM_DEV void loom_attnblk_fwd(const LoomArgs &a) {
  constexpr int BM = 64, BN = 64, LD = D + 1, NJ = D / 8;
  extern __shared__ float loom_smem[];
  float *sQ = loom_smem, *sK = sQ + BM * LD, *sV = sK + BN * LD, *sP = sV + BN * LD;
  long long *sKp = (long long *)(sP + BM * (BN + 1));   /* an even number of floats before it */
  const long long Tq = a.i[1], H = a.i[2], Tk = a.i[4], KV = a.i[5];
  const bool causal = a.i[6] != 0;
  const long long W = a.i[12];   /* the sliding window (ops.def attention_block); 0: none */
  const float scale = (float)a.f[0];
  const loom_cp_rows qr = loom_cp_queries(a), kr = loom_cp_keys(a);
  const long long bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const long long n_tiles = (Tq + BM - 1) / BM, m0 = (n_tiles - 1 - (long long)blockIdx.y) * BM;
  if (m0 < 0) return;   /* Tq = 0 */
  const long long m1 = Tq < m0 + BM ? Tq : m0 + BM, qmax = qr.max_at(m0, m1), qmin = qr.min_at(m0, m1);
  const int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
  const typename SQ::T *q = LOOM_IN(SQ, 0);
  const typename SK::T *k = LOOM_IN(SK, 1);
  const typename SV::T *v = LOOM_IN(SV, 2);
  float *out = (float *)a.buf[3], *lse = (float *)a.buf[4];
  loom_fa_load<SQ, D>(sQ, q + ((b * Tq + m0) * H + h) * D, 0, Tq - m0, H * D, BM);
  float o[4][NJ], mrow[4], lrow[4];
  long long qpos[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const long long t = m0 + rg * 4 + i;
    qpos[i] = t < Tq ? qr.at(t) : -1;   /* rows past Tq: never stored */
    mrow[i] = -LOOM_INF;
    lrow[i] = 0.0f;
    for (int j = 0; j < NJ; j++) o[i][j] = 0.0f;
  }
  for (long long n0 = 0; n0 < Tk; n0 += BN) {
    if (causal && kr.min_at(n0, Tk < n0 + BN ? Tk : n0 + BN) > qmax) continue;   /* hidden from every row */
    if (W > 0 && qmin - kr.max_at(n0, Tk < n0 + BN ? Tk : n0 + BN) >= W) continue;   /* before every row's window */
    __syncthreads();
    loom_fa_load<SK, D>(sK, k + ((b * Tk + n0) * KV + kvh) * D, 0, Tk - n0, KV * D, BN);
    loom_fa_load<SV, D>(sV, v + ((b * Tk + n0) * KV + kvh) * D, 0, Tk - n0, KV * D, BN);
    for (int j = tid; j < BN; j += LOOM_FA_THREADS) sKp[j] = n0 + j < Tk ? kr.at(n0 + j) : -1;   /* -1: no key */
    __syncthreads();
    float s[4][8];
    loom_fa_scores<D, 8, false>(s, nullptr, sQ, nullptr, sK, nullptr, rg, cg);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      for (int j = 0; j < 8; j++) {
        const long long kp = sKp[cg + 8 * j];
        s[i][j] = kp >= 0 && (!causal || kp <= qpos[i]) && (W <= 0 || qpos[i] - kp < W) ? s[i][j] * scale : -LOOM_INF;
      }
      loom_fa_online<NJ>(s[i], mrow[i], lrow[i], o[i], sP + (rg * 4 + i) * (BN + 1), cg);
    }
    __syncwarp();
    loom_fa_acc_rows<D, BN>(o, sP, sV, rg, cg);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const long long t = m0 + rg * 4 + i, row = (b * Tq + t) * H + h;
    if (t >= Tq) continue;
    const bool seen = lrow[i] > 0.0f;   /* at least exp(0) = 1 once a key is seen */
    const float inv = seen ? 1.0f / lrow[i] : 0.0f;
    for (int j = 0; j < NJ; j++) out[row * D + cg + 8 * j] = o[i][j] * inv;
    if (cg == 0) lse[row] = seen ? mrow[i] + logf(lrow[i]) : LOOM_LSE_NONE;
  }
}

/* Backward, dq (per query tile): lse and delta are given (the whole row's, merged over the
   blocks), so one pass: p = exp(scale s - lse), ds = p (dout . v - delta) scale, dq = sum ds k
   over the seen keys, in key order.  grid (B*H, ceil(Tq/64)); dynamic smem
   (2*64*(D+1) + 2*32*(D+1) + 64*33) floats and the key tile's 32 positions (long long).
   bufs: dout q k v lse delta -> dq (f32) */
template <class SDO, class SQ, class SK, class SV, int D>
LOOM_DEV void loom_attnblk_dq(const LoomArgs &a) {
  constexpr int BM = 64, BN = 32, LD = D + 1, NJ = D / 8, NC = BN / 8;
  extern __shared__ float loom_smem[];
  float *sQ = loom_smem, *sO = sQ + BM * LD, *sK = sO + BM * LD, *sV = sK + BN * LD, *sS = sV + BN * LD;
  long long *sKp = (long long *)(sS + BM * (BN + 1));
  const long long Tq = a.i[1], H = a.i[2], Tk = a.i[4], KV = a.i[5];
  const bool causal = a.i[6] != 0;
  const long long W = a.i[12];   /* the sliding window (ops.def attention_block); 0: none */
  const float scale = (float)a.f[0];
  const loom_cp_rows qr = loom_cp_queries(a), kr = loom_cp_keys(a);
  const long long bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const long long n_tiles = (Tq + BM - 1) / BM, m0 = (n_tiles - 1 - (long long)blockIdx.y) * BM;
  if (m0 < 0) return;   /* Tq = 0 */
  const long long m1 = Tq < m0 + BM ? Tq : m0 + BM, qmax = qr.max_at(m0, m1), qmin = qr.min_at(m0, m1);
  const int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
  const typename SDO::T *dout = LOOM_IN(SDO, 0);
  const typename SQ::T *q = LOOM_IN(SQ, 1);
  const typename SK::T *k = LOOM_IN(SK, 2);
  const typename SV::T *v = LOOM_IN(SV, 3);
  const float *Lin = (const float *)a.buf[4], *Din = (const float *)a.buf[5];
  float *dq = (float *)a.buf[6];
  loom_fa_load<SQ, D>(sQ, q + ((b * Tq + m0) * H + h) * D, 0, Tq - m0, H * D, BM);
  loom_fa_load<SDO, D>(sO, dout + ((b * Tq + m0) * H + h) * D, 0, Tq - m0, H * D, BM);
  float lrow[4], drow[4], acc[4][NJ];
  long long qpos[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const long long t = m0 + rg * 4 + i;
    qpos[i] = t < Tq ? qr.at(t) : -1;
    lrow[i] = t < Tq ? Lin[(b * Tq + t) * H + h] : 0.0f;
    drow[i] = t < Tq ? Din[(b * Tq + t) * H + h] : 0.0f;
    for (int j = 0; j < NJ; j++) acc[i][j] = 0.0f;
  }
  for (long long n0 = 0; n0 < Tk; n0 += BN) {
    if (causal && kr.min_at(n0, Tk < n0 + BN ? Tk : n0 + BN) > qmax) continue;
    __syncthreads();
    loom_fa_load<SK, D>(sK, k + ((b * Tk + n0) * KV + kvh) * D, 0, Tk - n0, KV * D, BN);
    loom_fa_load<SV, D>(sV, v + ((b * Tk + n0) * KV + kvh) * D, 0, Tk - n0, KV * D, BN);
    for (int j = tid; j < BN; j += LOOM_FA_THREADS) sKp[j] = n0 + j < Tk ? kr.at(n0 + j) : -1;
    __syncthreads();
    float s[4][NC], dp[4][NC];
    loom_fa_scores<D, NC, true>(s, dp, sQ, sO, sK, sV, rg, cg);
#pragma unroll
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < NC; j++) {
        const long long kp = sKp[cg + 8 * j];
        const bool seen = qpos[i] >= 0 && kp >= 0 && (!causal || kp <= qpos[i]) && (W <= 0 || qpos[i] - kp < W);
        const float p = seen ? expf(s[i][j] * scale - lrow[i]) : 0.0f;
        sS[(rg * 4 + i) * (BN + 1) + cg + 8 * j] = p * (dp[i][j] - drow[i]) * scale;
      }
    __syncwarp();   /* a row's ds are written and read by the 8 lanes of its row group */
    loom_fa_acc_rows<D, BN>(acc, sS, sK, rg, cg);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const long long t = m0 + rg * 4 + i;
    if (t >= Tq) continue;
    for (int j = 0; j < NJ; j++) dq[((b * Tq + t) * H + h) * D + cg + 8 * j] = acc[i][j];
  }
}

/* Backward, dk dv (per tile of 32 keys and kv head): over the query heads that share the kv
   head, then the query tiles in order (those whose largest position is before every key of
   the tile skipped), dv += p dout, dk += ds q.  Each block owns its dk/dv rows: a fixed
   order, no atomics.  grid (B*KV, ceil(Tk/32)); dynamic smem
   (2*32*(D+1) + 2*64*(D+1) + 2*32*65 + 128) floats and the query tile's 64 positions.
   bufs: dout q k v lse delta -> dk dv (f32) */
template <class SDO, class SQ, class SK, class SV, int D>
LOOM_DEV void loom_attnblk_dkdv(const LoomArgs &a) {
  constexpr int BN = 32, BM = 64, LD = D + 1, NJ = D / 8, NQ = BM / 8;
  extern __shared__ float loom_smem[];
  float *sK = loom_smem, *sV = sK + BN * LD, *sQ = sV + BN * LD, *sO = sQ + BM * LD, *sP = sO + BM * LD,
        *sS = sP + BN * (BM + 1), *sL = sS + BN * (BM + 1), *sD = sL + BM;
  long long *sQp = (long long *)(sD + BM);
  const long long Tq = a.i[1], H = a.i[2], Tk = a.i[4], KV = a.i[5], G = H / KV;
  const bool causal = a.i[6] != 0;
  const long long W = a.i[12];   /* the sliding window (ops.def attention_block); 0: none */
  const float scale = (float)a.f[0];
  const loom_cp_rows qr = loom_cp_queries(a), kr = loom_cp_keys(a);
  const long long bk = blockIdx.x, b = bk / KV, kvh = bk - b * KV, n0 = (long long)blockIdx.y * BN;
  const int tid = threadIdx.x, kg = tid >> 3, qg = tid & 7;
  const typename SDO::T *dout = LOOM_IN(SDO, 0);
  const typename SQ::T *q = LOOM_IN(SQ, 1);
  const typename SK::T *k = LOOM_IN(SK, 2);
  const typename SV::T *v = LOOM_IN(SV, 3);
  const float *Lin = (const float *)a.buf[4], *Din = (const float *)a.buf[5];
  float *dk = (float *)a.buf[6], *dv = (float *)a.buf[7];
  if (n0 >= Tk) return;
  const long long kmin = kr.min_at(n0, Tk < n0 + BN ? Tk : n0 + BN), kmax = kr.max_at(n0, Tk < n0 + BN ? Tk : n0 + BN);
  loom_fa_load<SK, D>(sK, k + ((b * Tk + n0) * KV + kvh) * D, 0, Tk - n0, KV * D, BN);
  loom_fa_load<SV, D>(sV, v + ((b * Tk + n0) * KV + kvh) * D, 0, Tk - n0, KV * D, BN);
  float dK[2][NJ], dV[2][NJ];
  long long kpos[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const long long key = n0 + kg * 2 + i;
    kpos[i] = key < Tk ? kr.at(key) : -1;
    for (int j = 0; j < NJ; j++) dK[i][j] = dV[i][j] = 0.0f;
  }
  for (long long hh = 0; hh < G; hh++) {
    const long long h = kvh * G + hh;
    for (long long m0 = 0; m0 < Tq; m0 += BM) {
      if (causal && kmin > qr.max_at(m0, Tq < m0 + BM ? Tq : m0 + BM)) continue;   /* no row sees a key here */
      if (W > 0 && qr.min_at(m0, Tq < m0 + BM ? Tq : m0 + BM) - kmax >= W) continue;   /* every key before the windows */
      __syncthreads();
      loom_fa_load<SQ, D>(sQ, q + ((b * Tq + m0) * H + h) * D, 0, Tq - m0, H * D, BM);
      loom_fa_load<SDO, D>(sO, dout + ((b * Tq + m0) * H + h) * D, 0, Tq - m0, H * D, BM);
      for (int r = tid; r < BM; r += LOOM_FA_THREADS) {
        sL[r] = m0 + r < Tq ? Lin[(b * Tq + m0 + r) * H + h] : 0.0f;
        sD[r] = m0 + r < Tq ? Din[(b * Tq + m0 + r) * H + h] : 0.0f;
        sQp[r] = m0 + r < Tq ? qr.at(m0 + r) : -1;
      }
      __syncthreads();
      float s[2][NQ], dp[2][NQ];
      loom_fa_scores_t<D, NQ>(s, dp, sK, sV, sQ, sO, kg, qg);
#pragma unroll
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < NQ; j++) {
          const int r = qg + 8 * j;
          const bool seen = sQp[r] >= 0 && kpos[i] >= 0 && (!causal || kpos[i] <= sQp[r]) && (W <= 0 || sQp[r] - kpos[i] < W);
          const float p = seen ? expf(s[i][j] * scale - sL[r]) : 0.0f;
          sP[(kg * 2 + i) * (BM + 1) + r] = p;
          sS[(kg * 2 + i) * (BM + 1) + r] = p * (dp[i][j] - sD[r]) * scale;
        }
      __syncwarp();   /* a key's p and ds are written and read by the 8 lanes of its key group */
      loom_fa_acc_keys<D, BM>(dK, dV, sP, sS, sQ, sO, kg, qg);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const long long key = n0 + kg * 2 + i;
    if (key >= Tk) continue;
    for (int j = 0; j < NJ; j++) {
      dk[((b * Tk + key) * KV + kvh) * D + qg + 8 * j] = dK[i][j];
      dv[((b * Tk + key) * KV + kvh) * D + qg + 8 * j] = dV[i][j];
    }
  }
}
