/* ---------------------------------------------------------------- flash attention
   q[B,T,H,D] k,v[B,S,KV,D]; query head h reads kv head h / (H/KV); causal: key s <= query t.
   Scores are never stored in memory: tiles of Q, K, V live in shared memory (f32), the
   softmax is online (running max and sum per query row), accumulation in f32.
   128 threads; thread (rg = tid/8, cg = tid%8) owns query rows 4*rg..4*rg+3 of the tile and
   the key columns / head dims cg, cg+8, cg+16, ... (row statistics: shuffles among the 8
   lanes of a row group, which share a warp).  Shared rows are padded to D+1 floats (no bank
   conflicts).  D (head dim) is a template parameter: a multiple of 8, at most 128. */
#define LOOM_FA_THREADS 128

/* Sliding-window attention (i[7] = W > 0: query t sees key s only when t - s < W): the key
   tiles before the first one a query tile from m0 on can see, and the query tiles from the
   first one no key of the tile n0..n0+bn-1 is visible to, are skipped. */
LOOM_DEV long long loom_win_first(long long m0, long long W, long long bn) {
  return W > 0 && m0 - W + 1 > 0 ? (m0 - W + 1) / bn * bn : 0;
}
LOOM_DEV long long loom_win_end(long long n0, long long bn, long long W, long long T) {
  return W > 0 && n0 + bn - 1 + W < T ? n0 + bn - 1 + W : T;
}

template <class S, int D>
LOOM_DEV void loom_fa_load(float *dst, const typename S::T *src, long long row0, long long nrows_valid,
                           long long row_stride, int nrows) {
  /* dst[r][0..D) = src[(row0 + r) * row_stride + d] for r < nrows (zeros past nrows_valid) */
  for (int idx = threadIdx.x; idx < nrows * D; idx += LOOM_FA_THREADS) {
    int r = idx / D, d = idx - r * D;
    dst[r * (D + 1) + d] = r < nrows_valid ? S::ld(src, (row0 + r) * row_stride + d) : 0.0f;
  }
}

/* The CUDA-core kernels' tile arithmetic, shared by loom_attn_* (here: masks by index, a
   sliding window) and loom_attnblk_* (attn_block.cuh: masks by global position, context
   parallelism): the kernels keep their own loops, tile skipping and masks, and call these for
   the products and the softmax (issue 30 found the two copied; issue 32 made them one).
   Thread (rg, cg) = (tid / 8, tid % 8) owns rows 4 rg .. 4 rg + 3 of a query tile and the
   columns cg, cg + 8, ...; in dk dv, (kg, qg) owns keys 2 kg, 2 kg + 1 and queries qg + 8 j.
   Every element keeps one fixed summation order. */

/* s[i][j] = Q[4 rg + i] . K[cg + 8 j] over d (and with DP, dp[i][j] = dO[4 rg + i] . V[cg + 8 j]) */
template <int D, int NC, bool DP>
LOOM_DEV void loom_fa_scores(float (*s)[NC], float (*dp)[NC], const float *sQ, const float *sO, const float *sK,
                             const float *sV, int rg, int cg) {
  constexpr int LD = D + 1;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < NC; j++) {
      s[i][j] = 0.0f;
      if (DP) dp[i][j] = 0.0f;
    }
#pragma unroll 4
  for (int d = 0; d < D; d++) {
    float qv[4], ov[4];
    for (int i = 0; i < 4; i++) {
      qv[i] = sQ[(rg * 4 + i) * LD + d];
      if (DP) ov[i] = sO[(rg * 4 + i) * LD + d];
    }
    for (int j = 0; j < NC; j++) {
      const float kv = sK[(cg + 8 * j) * LD + d];
      const float vv = DP ? sV[(cg + 8 * j) * LD + d] : 0.0f;
      for (int i = 0; i < 4; i++) {
        s[i][j] += qv[i] * kv;
        if (DP) dp[i][j] += ov[i] * vv;
      }
    }
  }
}

/* The forward's online softmax for row i of the thread's 4 (s: its 8 scores, scaled, -inf
   where masked): the running max and sum, p into sP, o rescaled. */
template <int NJ>
LOOM_DEV void loom_fa_online(float *s, float &mrow, float &lrow, float *o, float *sProw, int cg) {
  float mx = -LOOM_INF;
  for (int j = 0; j < 8; j++) mx = fmaxf(mx, s[j]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
  const float m_new = fmaxf(mrow, mx), m_use = m_new == -LOOM_INF ? 0.0f : m_new;
  const float alpha = expf(mrow - m_use);
  float ps = 0.0f;
  for (int j = 0; j < 8; j++) {
    float p = expf(s[j] - m_use);
    sProw[cg + 8 * j] = p;
    ps += p;
  }
  ps += __shfl_xor_sync(0xffffffffu, ps, 1);
  ps += __shfl_xor_sync(0xffffffffu, ps, 2);
  ps += __shfl_xor_sync(0xffffffffu, ps, 4);
  lrow = lrow * alpha + ps;
  mrow = m_new;
  for (int j = 0; j < NJ; j++) o[j] *= alpha;
}

/* acc[i][j] += sum_c W[4 rg + i][c] X[c][cg + 8 j] over the BN columns c of a tile: O += P V
   (W = P, X = V) in the forward, dQ += dS K (W = dS, X = K) in dq.  W's rows are BN + 1 apart. */
template <int D, int BN>
LOOM_DEV void loom_fa_acc_rows(float (*acc)[D / 8], const float *sW, const float *sX, int rg, int cg) {
  constexpr int LD = D + 1, NJ = D / 8;
#pragma unroll 2
  for (int c = 0; c < BN; c++) {
    float xv[NJ];
    for (int j = 0; j < NJ; j++) xv[j] = sX[c * LD + cg + 8 * j];
    for (int i = 0; i < 4; i++) {
      const float w = sW[(rg * 4 + i) * (BN + 1) + c];
      for (int j = 0; j < NJ; j++) acc[i][j] += w * xv[j];
    }
  }
}

/* dk dv: s[i][j] = K[2 kg + i] . Q[qg + 8 j], dp[i][j] = V[2 kg + i] . dO[qg + 8 j] */
template <int D, int NQ>
LOOM_DEV void loom_fa_scores_t(float (*s)[NQ], float (*dp)[NQ], const float *sK, const float *sV, const float *sQ,
                               const float *sO, int kg, int qg) {
  constexpr int LD = D + 1;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < NQ; j++) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < D; d++) {
    const float kv0 = sK[(kg * 2) * LD + d], kv1 = sK[(kg * 2 + 1) * LD + d];
    const float vv0 = sV[(kg * 2) * LD + d], vv1 = sV[(kg * 2 + 1) * LD + d];
    for (int j = 0; j < NQ; j++) {
      const float qv = sQ[(qg + 8 * j) * LD + d], ov = sO[(qg + 8 * j) * LD + d];
      s[0][j] += kv0 * qv;
      s[1][j] += kv1 * qv;
      dp[0][j] += vv0 * ov;
      dp[1][j] += vv1 * ov;
    }
  }
}

/* dk dv: dV[i] += sum_r P[2 kg + i][r] dO[r], dK[i] += sum_r dS[2 kg + i][r] Q[r] over the BM
   queries of the tile (P, dS rows BM + 1 apart). */
template <int D, int BM>
LOOM_DEV void loom_fa_acc_keys(float (*dK)[D / 8], float (*dV)[D / 8], const float *sP, const float *sS, const float *sQ,
                               const float *sO, int kg, int qg) {
  constexpr int LD = D + 1, NJ = D / 8;
  for (int r = 0; r < BM; r++) {
    float ov[NJ], qv[NJ];
    for (int j = 0; j < NJ; j++) {
      ov[j] = sO[r * LD + qg + 8 * j];
      qv[j] = sQ[r * LD + qg + 8 * j];
    }
    for (int i = 0; i < 2; i++) {
      const float p = sP[(kg * 2 + i) * (BM + 1) + r], ds = sS[(kg * 2 + i) * (BM + 1) + r];
      for (int j = 0; j < NJ; j++) {
        dV[i][j] += p * ov[j];
        dK[i][j] += ds * qv[j];
      }
    }
  }
}

/* Forward: grid (B*H, ceil(T/64)); dynamic smem (64*3*(D+1) + 64*65) floats.
   bufs: q k v -> out;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SQ, class SK, class SV, class SO, int D>
LOOM_DEV void loom_attn_fwd(const LoomArgs &a) {
  constexpr int BM = 64, BN = 64, LD = D + 1, NJ = D / 8;
  extern __shared__ float loom_smem[];
  float *sQ = loom_smem, *sK = sQ + BM * LD, *sV = sK + BN * LD, *sP = sV + BN * LD;
  const long long T = a.i[1], H = a.i[2], S = a.i[4], KV = a.i[5];
  const bool causal = a.i[6] != 0;
  const long long W = a.i[7];   /* the sliding window (ops.def attention); 0: none */
  const float scale = (float)a.f[0];
  const long long bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const long long n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (long long)blockIdx.y) * BM;   /* long rows first */
  const int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
  const typename SQ::T *q = LOOM_IN(SQ, 0);
  const typename SK::T *k = LOOM_IN(SK, 1);
  const typename SV::T *v = LOOM_IN(SV, 2);
  typename SO::T *out = LOOM_OUT(SO, 3);
  loom_fa_load<SQ, D>(sQ, q + ((b * T + m0) * H + h) * D, 0, T - m0, H * D, BM);
  float o[4][NJ], mrow[4], lrow[4];
  for (int i = 0; i < 4; i++) {
    mrow[i] = -LOOM_INF;
    lrow[i] = 0.0f;
    for (int j = 0; j < NJ; j++) o[i][j] = 0.0f;
  }
  const long long n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S;
  for (long long n0 = loom_win_first(m0, W, BN); n0 < n_end; n0 += BN) {
    __syncthreads();
    loom_fa_load<SK, D>(sK, k + ((b * S + n0) * KV + kvh) * D, 0, S - n0, KV * D, BN);
    loom_fa_load<SV, D>(sV, v + ((b * S + n0) * KV + kvh) * D, 0, S - n0, KV * D, BN);
    __syncthreads();
    float s[4][8];
    loom_fa_scores<D, 8, false>(s, nullptr, sQ, nullptr, sK, nullptr, rg, cg);
    for (int i = 0; i < 4; i++) {
      const long long t = m0 + rg * 4 + i;
      for (int j = 0; j < 8; j++) {
        const long long key = n0 + cg + 8 * j;
        s[i][j] = key < S && (!causal || key <= t) && (W <= 0 || t - key < W) ? s[i][j] * scale : -LOOM_INF;
      }
      loom_fa_online<NJ>(s[i], mrow[i], lrow[i], o[i], sP + (rg * 4 + i) * (BN + 1), cg);
    }
    __syncwarp();
    loom_fa_acc_rows<D, BN>(o, sP, sV, rg, cg);
  }
  for (int i = 0; i < 4; i++) {
    const long long t = m0 + rg * 4 + i;
    if (t >= T) continue;
    const float inv = 1.0f / lrow[i];
    for (int j = 0; j < NJ; j++) SO::st(out, ((b * T + t) * H + h) * D + cg + 8 * j, o[i][j] * inv);
  }
}

/* Backward, part 1 (per query tile): pass 1 recomputes each row's log-sum-exp L and
   Dsum = sum_s p_s (dout . v_s) (online, like the forward); pass 2 gives
   dq = scale * sum_s p_s (dout . v_s - Dsum) k_s.  L and Dsum go to scratch [B*H*T] each
   for part 2.  grid (B*H, ceil(T/64)); dynamic smem (2*64*(D+1) + 2*32*(D+1) + 64*33) floats.
   bufs: dout q k v -> dq L Dsum;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SDO, class SQ, class SK, class SV, class SDQ, int D>
LOOM_DEV void loom_attn_bwd_dq(const LoomArgs &a) {
  constexpr int BM = 64, BN = 32, LD = D + 1, NJ = D / 8, NC = BN / 8;
  extern __shared__ float loom_smem[];
  float *sQ = loom_smem, *sO = sQ + BM * LD, *sK = sO + BM * LD, *sV = sK + BN * LD, *sS = sV + BN * LD;
  const long long T = a.i[1], H = a.i[2], S = a.i[4], KV = a.i[5];
  const bool causal = a.i[6] != 0;
  const long long W = a.i[7];   /* the sliding window (ops.def attention); 0: none */
  const float scale = (float)a.f[0];
  const long long bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const long long n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (long long)blockIdx.y) * BM;
  const int tid = threadIdx.x, rg = tid >> 3, cg = tid & 7;
  const typename SDO::T *dout = LOOM_IN(SDO, 0);
  const typename SQ::T *q = LOOM_IN(SQ, 1);
  const typename SK::T *k = LOOM_IN(SK, 2);
  const typename SV::T *v = LOOM_IN(SV, 3);
  typename SDQ::T *dq = LOOM_OUT(SDQ, 4);
  float *Lout = (float *)a.buf[5], *Dout = (float *)a.buf[6];
  loom_fa_load<SQ, D>(sQ, q + ((b * T + m0) * H + h) * D, 0, T - m0, H * D, BM);
  loom_fa_load<SDO, D>(sO, dout + ((b * T + m0) * H + h) * D, 0, T - m0, H * D, BM);
  const long long n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S;
  float mrow[4], lrow[4], drow[4], acc[4][NJ];
  for (int i = 0; i < 4; i++) {
    mrow[i] = -LOOM_INF;
    lrow[i] = 0.0f;
    drow[i] = 0.0f;
    for (int j = 0; j < NJ; j++) acc[i][j] = 0.0f;
  }
  for (int pass = 0; pass < 2; pass++) {
    for (long long n0 = loom_win_first(m0, W, BN); n0 < n_end; n0 += BN) {
      __syncthreads();
      loom_fa_load<SK, D>(sK, k + ((b * S + n0) * KV + kvh) * D, 0, S - n0, KV * D, BN);
      loom_fa_load<SV, D>(sV, v + ((b * S + n0) * KV + kvh) * D, 0, S - n0, KV * D, BN);
      __syncthreads();
      float s[4][NC], dp[4][NC];
      loom_fa_scores<D, NC, true>(s, dp, sQ, sO, sK, sV, rg, cg);
      for (int i = 0; i < 4; i++) {
        const long long t = m0 + rg * 4 + i;
        for (int j = 0; j < NC; j++) {
          const long long key = n0 + cg + 8 * j;
          s[i][j] = key < S && (!causal || key <= t) && (W <= 0 || t - key < W) ? s[i][j] * scale : -LOOM_INF;
        }
        if (pass == 0) {
          float mx = -LOOM_INF;
          for (int j = 0; j < NC; j++) mx = fmaxf(mx, s[i][j]);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          const float m_new = fmaxf(mrow[i], mx), m_use = m_new == -LOOM_INF ? 0.0f : m_new;
          const float alpha = expf(mrow[i] - m_use);
          float ps = 0.0f, pd = 0.0f;
          for (int j = 0; j < NC; j++) {
            const float p = expf(s[i][j] - m_use);
            ps += p;
            pd += p * dp[i][j];
          }
          for (int o = 1; o < 8; o <<= 1) {
            ps += __shfl_xor_sync(0xffffffffu, ps, o);
            pd += __shfl_xor_sync(0xffffffffu, pd, o);
          }
          lrow[i] = lrow[i] * alpha + ps;
          drow[i] = drow[i] * alpha + pd;
          mrow[i] = m_new;
        } else {
          for (int j = 0; j < NC; j++) {
            const float p = expf(s[i][j] - mrow[i]);   /* mrow holds L in pass 2 */
            sS[(rg * 4 + i) * (BN + 1) + cg + 8 * j] = p * (dp[i][j] - drow[i]) * scale;
          }
        }
      }
      if (pass == 1) {
        __syncwarp();
        loom_fa_acc_rows<D, BN>(acc, sS, sK, rg, cg);
      }
    }
    if (pass == 0)
      for (int i = 0; i < 4; i++) {
        /* L = m + log(l); Dsum = sum p (dout . v) / l.  A row with no key (S == 0) keeps
           L = -inf: its p are 0. */
        drow[i] = lrow[i] > 0.0f ? drow[i] / lrow[i] : 0.0f;
        mrow[i] = lrow[i] > 0.0f ? mrow[i] + logf(lrow[i]) : LOOM_INF;
      }
  }
  for (int i = 0; i < 4; i++) {
    const long long t = m0 + rg * 4 + i;
    if (t >= T) continue;
    for (int j = 0; j < NJ; j++) SDQ::st(dq, ((b * T + t) * H + h) * D + cg + 8 * j, acc[i][j]);
    if (cg == 0) {
      Lout[bh * T + t] = mrow[i];
      Dout[bh * T + t] = drow[i];
    }
  }
}

/* Backward, part 2 (per key tile of 32 keys and kv head): loops over the query heads that
   share the kv head and over the query tiles (causal: from the tile of the first key on),
   dv += p dout, dk += scale p (dout . v - Dsum) q, from L and Dsum of part 1.  Each block
   owns its dk/dv rows: no atomics, a fixed order (deterministic).
   grid (B*KV, ceil(S/32)); dynamic smem (2*32*(D+1) + 2*64*(D+1) + 2*32*65 + 128) floats.
   bufs: dout q k v L Dsum -> dk dv;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SDO, class SQ, class SK, class SV, class SDK, class SDV, int D>
LOOM_DEV void loom_attn_bwd_dkdv(const LoomArgs &a) {
  constexpr int BN = 32, BM = 64, LD = D + 1, NJ = D / 8, NQ = BM / 8;
  extern __shared__ float loom_smem[];
  float *sK = loom_smem, *sV = sK + BN * LD, *sQ = sV + BN * LD, *sO = sQ + BM * LD, *sP = sO + BM * LD,
        *sS = sP + BN * (BM + 1), *sL = sS + BN * (BM + 1), *sD = sL + BM;
  const long long T = a.i[1], H = a.i[2], S = a.i[4], KV = a.i[5], G = H / KV;
  const bool causal = a.i[6] != 0;
  const long long W = a.i[7];   /* the sliding window (ops.def attention); 0: none */
  const float scale = (float)a.f[0];
  const long long bk = blockIdx.x, b = bk / KV, kvh = bk - b * KV, n0 = (long long)blockIdx.y * BN;
  const int tid = threadIdx.x, kg = tid >> 3, qg = tid & 7;
  const typename SDO::T *dout = LOOM_IN(SDO, 0);
  const typename SQ::T *q = LOOM_IN(SQ, 1);
  const typename SK::T *k = LOOM_IN(SK, 2);
  const typename SV::T *v = LOOM_IN(SV, 3);
  const float *Lin = (const float *)a.buf[4], *Din = (const float *)a.buf[5];
  typename SDK::T *dk = LOOM_OUT(SDK, 6);
  typename SDV::T *dv = LOOM_OUT(SDV, 7);
  loom_fa_load<SK, D>(sK, k + ((b * S + n0) * KV + kvh) * D, 0, S - n0, KV * D, BN);
  loom_fa_load<SV, D>(sV, v + ((b * S + n0) * KV + kvh) * D, 0, S - n0, KV * D, BN);
  float dK[2][NJ], dV[2][NJ];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < NJ; j++) dK[i][j] = dV[i][j] = 0.0f;
  const long long m_start = causal ? (n0 / BM) * BM : 0;
  for (long long hh = 0; hh < G; hh++) {
    const long long h = kvh * G + hh, bh = b * H + h;
    for (long long m0 = m_start; m0 < loom_win_end(n0, BN, W, T); m0 += BM) {
      __syncthreads();
      loom_fa_load<SQ, D>(sQ, q + ((b * T + m0) * H + h) * D, 0, T - m0, H * D, BM);
      loom_fa_load<SDO, D>(sO, dout + ((b * T + m0) * H + h) * D, 0, T - m0, H * D, BM);
      for (int r = tid; r < BM; r += LOOM_FA_THREADS) {
        sL[r] = m0 + r < T ? Lin[bh * T + m0 + r] : 0.0f;
        sD[r] = m0 + r < T ? Din[bh * T + m0 + r] : 0.0f;
      }
      __syncthreads();
      float s[2][NQ], dp[2][NQ];
      loom_fa_scores_t<D, NQ>(s, dp, sK, sV, sQ, sO, kg, qg);
      for (int i = 0; i < 2; i++) {
        const long long key = n0 + kg * 2 + i;
        for (int j = 0; j < NQ; j++) {
          const int r = qg + 8 * j;
          const long long t = m0 + r;
          const bool ok = t < T && key < S && (!causal || key <= t) && (W <= 0 || t - key < W);
          const float p = ok ? expf(s[i][j] * scale - sL[r]) : 0.0f;
          sP[(kg * 2 + i) * (BM + 1) + r] = p;
          sS[(kg * 2 + i) * (BM + 1) + r] = p * (dp[i][j] - sD[r]) * scale;
        }
      }
      __syncwarp();
      loom_fa_acc_keys<D, BM>(dK, dV, sP, sS, sQ, sO, kg, qg);
    }
  }
  for (int i = 0; i < 2; i++) {
    const long long key = n0 + kg * 2 + i;
    if (key >= S) continue;
    for (int j = 0; j < NJ; j++) {
      SDK::st(dk, ((b * S + key) * KV + kvh) * D + qg + 8 * j, dK[i][j]);
      SDV::st(dv, ((b * S + key) * KV + kvh) * D + qg + 8 * j, dV[i][j]);
    }
  }
}
