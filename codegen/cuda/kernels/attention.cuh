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
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 8; j++) s[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d++) {
      float qv[4];
      for (int i = 0; i < 4; i++) qv[i] = sQ[(rg * 4 + i) * LD + d];
      for (int j = 0; j < 8; j++) {
        float kv = sK[(cg + 8 * j) * LD + d];
        for (int i = 0; i < 4; i++) s[i][j] += qv[i] * kv;
      }
    }
    for (int i = 0; i < 4; i++) {
      const long long t = m0 + rg * 4 + i;
      float mx = -LOOM_INF;
      for (int j = 0; j < 8; j++) {
        const long long key = n0 + cg + 8 * j;
        s[i][j] = key < S && (!causal || key <= t) && (W <= 0 || t - key < W) ? s[i][j] * scale : -LOOM_INF;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(mrow[i], mx), m_use = m_new == -LOOM_INF ? 0.0f : m_new;
      const float alpha = expf(mrow[i] - m_use);
      float ps = 0.0f;
      for (int j = 0; j < 8; j++) {
        float p = expf(s[i][j] - m_use);
        sP[(rg * 4 + i) * (BN + 1) + cg + 8 * j] = p;
        ps += p;
      }
      ps += __shfl_xor_sync(0xffffffffu, ps, 1);
      ps += __shfl_xor_sync(0xffffffffu, ps, 2);
      ps += __shfl_xor_sync(0xffffffffu, ps, 4);
      lrow[i] = lrow[i] * alpha + ps;
      mrow[i] = m_new;
      for (int j = 0; j < NJ; j++) o[i][j] *= alpha;
    }
    __syncwarp();
#pragma unroll 2
    for (int c = 0; c < BN; c++) {
      float vv[NJ];
      for (int j = 0; j < NJ; j++) vv[j] = sV[c * LD + cg + 8 * j];
      for (int i = 0; i < 4; i++) {
        const float p = sP[(rg * 4 + i) * (BN + 1) + c];
        for (int j = 0; j < NJ; j++) o[i][j] += p * vv[j];
      }
    }
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
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < NC; j++) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; d++) {
        float qv[4], ov[4];
        for (int i = 0; i < 4; i++) {
          qv[i] = sQ[(rg * 4 + i) * LD + d];
          ov[i] = sO[(rg * 4 + i) * LD + d];
        }
        for (int j = 0; j < NC; j++) {
          const float kv = sK[(cg + 8 * j) * LD + d], vv = sV[(cg + 8 * j) * LD + d];
          for (int i = 0; i < 4; i++) {
            s[i][j] += qv[i] * kv;
            dp[i][j] += ov[i] * vv;
          }
        }
      }
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
        for (int c = 0; c < BN; c++) {
          float kv[NJ];
          for (int j = 0; j < NJ; j++) kv[j] = sK[c * LD + cg + 8 * j];
          for (int i = 0; i < 4; i++) {
            const float ds = sS[(rg * 4 + i) * (BN + 1) + c];
            for (int j = 0; j < NJ; j++) acc[i][j] += ds * kv[j];
          }
        }
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
/* ---------------------------------------------------------------- tensor cores
   mma.sync.aligned.m16n8k16 (sm_80 and later): D[16x8] += A[16x16] B[16x8], A and B in bf16
   (BF) or f16, accumulation in f32.  Fragments as the PTX ISA lays them out, with
   g = lane / 4, t = lane % 4, each register two 16-bit elements (the lower index low):
     a[0] (g, 2t..2t+1)  a[1] (g+8, 2t..)  a[2] (g, 2t+8..)  a[3] (g+8, 2t+8..)
     b[0] (k 2t..2t+1, n g)  b[1] (k 2t+8.., n g)
     d[0] d[1] (g, 2t..2t+1)  d[2] d[3] (g+8, 2t..2t+1)
   so an accumulator tile pair is, packed, the A operand of the next product.  Built for the
   emulated device (tests/cuda_emu) it calls the emulator's twin of the instruction. */
template <bool BF>
LOOM_DEV void loom_mma16816(float d[4], const unsigned a[4], const unsigned b[2]) {
#if defined(LOOM_EMU)
  loom_emu_mma(d, a, b, d, BF);
#elif __CUDA_ARCH__ >= 800
  if (BF)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();   /* the tensor-core kernels need sm_80 or later */
#endif
}
/* LOOM_ATTN_SPLIT 0 (LOOM_CUDA_ATTN_ROUND=1 when lowering): P and dS enter their products
   rounded to bf16/f16, as flash-attention does, one mma instead of two; faster, and up to
   2^-9 of the output off the f32 kernels' results. */
#ifndef LOOM_ATTN_SPLIT
#define LOOM_ATTN_SPLIT 1
#endif
/* Two f32 values rounded to bf16 (BF) or f16, packed into one register, lo first. */
template <bool BF>
LOOM_DEV unsigned loom_pack2(float lo, float hi) {
  return BF ? (unsigned)loom_f32_to_bf16(lo) | (unsigned)loom_f32_to_bf16(hi) << 16
            : (unsigned)loom_f32_to_f16(lo) | (unsigned)loom_f32_to_f16(hi) << 16;
}
/* x = hi + lo with hi = x rounded to the format and lo = the rest rounded: 16 + 8 bits of
   mantissa (bf16) for x in [0, 1], so a product with P = hi + lo is as exact as f32's. */
template <bool BF>
LOOM_DEV void loom_split2(float x0, float x1, unsigned &hi, unsigned &lo) {
  hi = loom_pack2<BF>(x0, x1);
  const float h0 = BF ? loom_bf16_to_f32(hi & 0xffffu) : loom_f16_to_f32(hi & 0xffffu);
  const float h1 = BF ? loom_bf16_to_f32(hi >> 16) : loom_f16_to_f32(hi >> 16);
  lo = loom_pack2<BF>(__fsub_rn(x0, h0), __fsub_rn(x1, h1));
}
struct alignas(16) loom_u4 { unsigned x, y, z, w; };

/* Rows [0, R) of a 16-bit tensor (row r at src + r * stride, D elements, zeros from row
   nvalid on) into shared memory: row-major with rows of D + 8 (dst) and/or transposed,
   [D][R + 8] (dst_t): fragment loads from either are one 32-bit word per register. */
template <int D, int R>
LOOM_DEV void loom_tc_load(unsigned short *dst, unsigned short *dst_t, const unsigned short *src, long long nvalid,
                           long long stride) {
  for (int idx = threadIdx.x; idx < R * (D / 8); idx += LOOM_FA_THREADS) {
    const int r = idx / (D / 8), c = (idx - r * (D / 8)) * 8;
    loom_u4 w = {0u, 0u, 0u, 0u};
    if (r < nvalid) {
      LOOM_CHECK_ALIGN(src + r * stride + c, 16);
      w = *(const loom_u4 *)(src + r * stride + c);
    }
    if (dst) {
      LOOM_CHECK_ALIGN(dst + r * (D + 8) + c, 16);
      *(loom_u4 *)(dst + r * (D + 8) + c) = w;
    }
    if (dst_t) {
      const unsigned ws[4] = {w.x, w.y, w.z, w.w};
      for (int e = 0; e < 4; e++) {
        dst_t[(c + 2 * e) * (R + 8) + r] = (unsigned short)(ws[e] & 0xffffu);
        dst_t[(c + 2 * e + 1) * (R + 8) + r] = (unsigned short)(ws[e] >> 16);
      }
    }
  }
}
LOOM_DEV unsigned loom_ld32(const unsigned short *p) {
  LOOM_CHECK_ALIGN(p, 4);
  return *(const unsigned *)p;
}
/* The A operand for rows [rb, rb + 16) and k-step kk of a row-major tile (row stride ld). */
LOOM_DEV void loom_frag_a(unsigned f[4], const unsigned short *x, int ld, int rb, int kk, int g, int t2) {
  f[0] = loom_ld32(x + (rb + g) * ld + 16 * kk + t2);
  f[1] = loom_ld32(x + (rb + g + 8) * ld + 16 * kk + t2);
  f[2] = loom_ld32(x + (rb + g) * ld + 16 * kk + 8 + t2);
  f[3] = loom_ld32(x + (rb + g + 8) * ld + 16 * kk + 8 + t2);
}
/* The B operand for columns [nb, nb + 8) and k-step kk of a tile stored n-major (element
   (k, n) at y[n * ld + k]). */
LOOM_DEV void loom_frag_b(unsigned f[2], const unsigned short *y, int ld, int nb, int kk, int g, int t2) {
  f[0] = loom_ld32(y + (nb + g) * ld + 16 * kk + t2);
  f[1] = loom_ld32(y + (nb + g) * ld + 16 * kk + 8 + t2);
}
/* Accumulator tiles j0 and j0 + 1 (16 x 16, f32) as an A operand in two parts, hi + lo. */
template <bool BF>
LOOM_DEV void loom_frag_split(const float (*acc)[4], int j0, unsigned hi[4], unsigned lo[4]) {
  loom_split2<BF>(acc[j0][0], acc[j0][1], hi[0], lo[0]);
  loom_split2<BF>(acc[j0][2], acc[j0][3], hi[1], lo[1]);
  loom_split2<BF>(acc[j0 + 1][0], acc[j0 + 1][1], hi[2], lo[2]);
  loom_split2<BF>(acc[j0 + 1][2], acc[j0 + 1][3], hi[3], lo[3]);
}

/* Forward on tensor cores, for q, k, v all bf16 or all f16 and D a multiple of 16 (at most
   128): the loom_attn_fwd algorithm with S = Q K^T and O += P V as mma.sync.  P enters the
   second product as two parts in the input format (loom_split2), not rounded to it as
   flash-attention does: the output is then within f32 rounding of loom_attn_fwd's (one
   bf16 P would add errors of 2^-9 of it, 4x the deviation of the CPU's bf16 gradients on
   the tiny Llama).  Statistics and O stay f32.
   4 warps, each owning 16 query rows of the 64-row tile: its Q fragments, scores,
   P and O live in registers; a tile of 64 keys is in shared memory, K row-major and V
   transposed (both fragment loads are then one 32-bit word), rows padded by 8 elements
   (no bank conflicts).  grid (B*H, ceil(T/64)); dynamic smem (64*(D+8) + D*72) * 2 bytes.
   bufs: q k v -> out;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SQ, class SK, class SV, class SO, int D>
LOOM_DEV void loom_attn_fwd_tc(const LoomArgs &a) {
  constexpr bool BF = SQ::is_bf16;
  constexpr int BM = 64, BN = 64, LK = D + 8, LV = BN + 8, NT = BN / 8, ND = D / 8, KD = D / 16, KN = BN / 16;
  extern __shared__ float loom_smem[];
  unsigned short *sK = (unsigned short *)loom_smem, *sVt = sK + BN * LK;
  const long long T = a.i[1], H = a.i[2], S = a.i[4], KV = a.i[5];
  const bool causal = a.i[6] != 0;
  const long long W = a.i[7];   /* the sliding window (ops.def attention); 0: none */
  const float scale = (float)a.f[0];
  const long long bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const long long n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (long long)blockIdx.y) * BM;   /* long rows first */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const long long r0 = m0 + warp * 16 + g, r1 = r0 + 8;   /* this thread's two query rows */
  const unsigned short *q = LOOM_IN(SQ, 0), *k = LOOM_IN(SK, 1), *v = LOOM_IN(SV, 2);
  typename SO::T *out = LOOM_OUT(SO, 3);
  unsigned qf[KD][4];
  for (int kk = 0; kk < KD; kk++)
    for (int r = 0; r < 4; r++) {
      const long long row = r & 1 ? r1 : r0;
      const int col = 16 * kk + (r & 2 ? 8 : 0) + t2;
      qf[kk][r] = row < T ? *(const unsigned *)(q + ((b * T + row) * H + h) * D + col) : 0u;
    }
  float o[ND][4], mrow[2] = {-LOOM_INF, -LOOM_INF}, lrow[2] = {0.0f, 0.0f};
  for (int d = 0; d < ND; d++)
    for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
  const long long n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S;
  for (long long n0 = loom_win_first(m0, W, BN); n0 < n_end; n0 += BN) {
    __syncthreads();
    loom_tc_load<D, BN>(sK, (unsigned short *)0, k + ((b * S + n0) * KV + kvh) * D, S - n0, KV * D);
    loom_tc_load<D, BN>((unsigned short *)0, sVt, v + ((b * S + n0) * KV + kvh) * D, S - n0, KV * D);
    __syncthreads();
    float s[NT][4];
    for (int j = 0; j < NT; j++)
      for (int e = 0; e < 4; e++) s[j][e] = 0.0f;
    for (int kk = 0; kk < KD; kk++)
      for (int j = 0; j < NT; j++) {
        unsigned bk[2];
        loom_frag_b(bk, sK, LK, 8 * j, kk, g, t2);
        loom_mma16816<BF>(s[j], qf[kk], bk);
      }
    for (int hr = 0; hr < 2; hr++) {   /* row r0 (elements 0, 1), row r1 (2, 3) */
      const long long row = hr ? r1 : r0;
      float mx = -LOOM_INF;
      for (int j = 0; j < NT; j++)
        for (int e = 2 * hr; e < 2 * hr + 2; e++) {
          const long long key = n0 + 8 * j + t2 + (e & 1);
          s[j][e] = key < S && (!causal || key <= row) && (W <= 0 || row - key < W) ? s[j][e] * scale : -LOOM_INF;
          mx = fmaxf(mx, s[j][e]);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(mrow[hr], mx), m_use = m_new == -LOOM_INF ? 0.0f : m_new;
      const float alpha = expf(mrow[hr] - m_use);
      float ps = 0.0f;
      for (int j = 0; j < NT; j++)
        for (int e = 2 * hr; e < 2 * hr + 2; e++) {
          s[j][e] = expf(s[j][e] - m_use);
          ps += s[j][e];
        }
      ps += __shfl_xor_sync(0xffffffffu, ps, 1);
      ps += __shfl_xor_sync(0xffffffffu, ps, 2);
      lrow[hr] = lrow[hr] * alpha + ps;
      mrow[hr] = m_new;
      for (int d = 0; d < ND; d++) {
        o[d][2 * hr] *= alpha;
        o[d][2 * hr + 1] *= alpha;
      }
    }
    for (int kk = 0; kk < KN; kk++) {
      unsigned hi[4], lo[4];   /* P = hi + lo: P V to about f32 accuracy in two products */
      loom_frag_split<BF>(s, 2 * kk, hi, lo);
      for (int d = 0; d < ND; d++) {
        unsigned bv[2];
        loom_frag_b(bv, sVt, LV, 8 * d, kk, g, t2);
        if (LOOM_ATTN_SPLIT) loom_mma16816<BF>(o[d], lo, bv);
        loom_mma16816<BF>(o[d], hi, bv);
      }
    }
  }
  for (int hr = 0; hr < 2; hr++) {
    const long long row = hr ? r1 : r0;
    if (row >= T) continue;
    const float inv = 1.0f / lrow[hr];
    for (int d = 0; d < ND; d++) {
      SO::st(out, ((b * T + row) * H + h) * D + 8 * d + t2, o[d][2 * hr] * inv);
      SO::st(out, ((b * T + row) * H + h) * D + 8 * d + t2 + 1, o[d][2 * hr + 1] * inv);
    }
  }
}

/* Backward part 1 on tensor cores (the operands of loom_attn_fwd_tc): loom_attn_bwd_dq's
   two passes with S = Q K^T, dP = dO V^T and dQ += dS K as mma.sync, dS in two parts
   (hi + lo).  4 warps of 16 query rows; Q and dO fragments in registers; a tile of BN keys
   (64, or 32 when D > 64) in shared memory: K and V row-major, K also transposed.
   grid (B*H, ceil(T/64)); dynamic smem (2*BN*(D+8) + D*(BN+8)) * 2 bytes.
   bufs: dout q k v -> dq L Dsum;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SDO, class SQ, class SK, class SV, class SDQ, int D>
LOOM_DEV void loom_attn_bwd_dq_tc(const LoomArgs &a) {
  constexpr bool BF = SQ::is_bf16;
  constexpr int BM = 64, BN = D <= 64 ? 64 : 32, LD = D + 8, LT = BN + 8, NT = BN / 8, ND = D / 8, KD = D / 16,
                KN = BN / 16;
  extern __shared__ float loom_smem[];
  unsigned short *sK = (unsigned short *)loom_smem, *sV = sK + BN * LD, *sKt = sV + BN * LD;
  const long long T = a.i[1], H = a.i[2], S = a.i[4], KV = a.i[5];
  const bool causal = a.i[6] != 0;
  const long long W = a.i[7];   /* the sliding window (ops.def attention); 0: none */
  const float scale = (float)a.f[0];
  const long long bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const long long n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (long long)blockIdx.y) * BM;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const long long r0 = m0 + warp * 16 + g, r1 = r0 + 8;
  const unsigned short *dout = LOOM_IN(SDO, 0), *q = LOOM_IN(SQ, 1), *k = LOOM_IN(SK, 2), *v = LOOM_IN(SV, 3);
  typename SDQ::T *dq = LOOM_OUT(SDQ, 4);
  float *Lout = (float *)a.buf[5], *Dout = (float *)a.buf[6];
  unsigned qf[KD][4], of[KD][4];
  #pragma unroll
  for (int kk = 0; kk < KD; kk++)
    #pragma unroll
    for (int r = 0; r < 4; r++) {
      const long long row = r & 1 ? r1 : r0;
      const long long at = ((b * T + row) * H + h) * D + 16 * kk + (r & 2 ? 8 : 0) + t2;
      qf[kk][r] = row < T ? loom_ld32(q + at) : 0u;
      of[kk][r] = row < T ? loom_ld32(dout + at) : 0u;
    }
  float mrow[2] = {-LOOM_INF, -LOOM_INF}, lrow[2] = {0.0f, 0.0f}, drow[2] = {0.0f, 0.0f}, acc[ND][4];
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) acc[d][e] = 0.0f;
  const long long n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S;
  for (int pass = 0; pass < 2; pass++) {
    for (long long n0 = loom_win_first(m0, W, BN); n0 < n_end; n0 += BN) {
      __syncthreads();
      loom_tc_load<D, BN>(sK, pass ? sKt : (unsigned short *)0, k + ((b * S + n0) * KV + kvh) * D, S - n0, KV * D);
      loom_tc_load<D, BN>(sV, (unsigned short *)0, v + ((b * S + n0) * KV + kvh) * D, S - n0, KV * D);
      __syncthreads();
      float s[NT][4], dp[NT][4];
      #pragma unroll
      for (int j = 0; j < NT; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
      #pragma unroll
      for (int kk = 0; kk < KD; kk++)
        #pragma unroll
        for (int j = 0; j < NT; j++) {
          unsigned bk[2], bv[2];
          loom_frag_b(bk, sK, LD, 8 * j, kk, g, t2);
          loom_frag_b(bv, sV, LD, 8 * j, kk, g, t2);
          loom_mma16816<BF>(s[j], qf[kk], bk);
          loom_mma16816<BF>(dp[j], of[kk], bv);
        }
      #pragma unroll
      for (int hr = 0; hr < 2; hr++) {
        const long long row = hr ? r1 : r0;
        #pragma unroll
        for (int j = 0; j < NT; j++)
          #pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; e++) {
            const long long key = n0 + 8 * j + t2 + (e & 1);
            s[j][e] = key < S && (!causal || key <= row) && (W <= 0 || row - key < W) ? s[j][e] * scale : -LOOM_INF;
          }
        if (pass == 0) {
          float mx = -LOOM_INF;
          #pragma unroll
          for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[j][2 * hr], s[j][2 * hr + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(mrow[hr], mx), m_use = m_new == -LOOM_INF ? 0.0f : m_new;
          const float alpha = expf(mrow[hr] - m_use);
          float ps = 0.0f, pd = 0.0f;
          #pragma unroll
          for (int j = 0; j < NT; j++)
            #pragma unroll
            for (int e = 2 * hr; e < 2 * hr + 2; e++) {
              const float p = expf(s[j][e] - m_use);
              ps += p;
              pd += p * dp[j][e];
            }
          #pragma unroll
          for (int o = 1; o < 4; o <<= 1) {
            ps += __shfl_xor_sync(0xffffffffu, ps, o);
            pd += __shfl_xor_sync(0xffffffffu, pd, o);
          }
          lrow[hr] = lrow[hr] * alpha + ps;
          drow[hr] = drow[hr] * alpha + pd;
          mrow[hr] = m_new;
        } else {
          #pragma unroll
          for (int j = 0; j < NT; j++)
            #pragma unroll
            for (int e = 2 * hr; e < 2 * hr + 2; e++)   /* dS, in s; mrow holds L in pass 2 */
              s[j][e] = expf(s[j][e] - mrow[hr]) * (dp[j][e] - drow[hr]) * scale;
        }
      }
      if (pass == 1)
        #pragma unroll
        for (int kk = 0; kk < KN; kk++) {
          unsigned hi[4], lo[4];
          loom_frag_split<BF>(s, 2 * kk, hi, lo);
          #pragma unroll
          for (int d = 0; d < ND; d++) {
            unsigned bk[2];
            loom_frag_b(bk, sKt, LT, 8 * d, kk, g, t2);
            if (LOOM_ATTN_SPLIT) loom_mma16816<BF>(acc[d], lo, bk);
            loom_mma16816<BF>(acc[d], hi, bk);
          }
        }
    }
    if (pass == 0)
      #pragma unroll
      for (int hr = 0; hr < 2; hr++) {   /* L = m + log(l), Dsum = sum p (dout . v) / l; no key: L = inf */
        drow[hr] = lrow[hr] > 0.0f ? drow[hr] / lrow[hr] : 0.0f;
        mrow[hr] = lrow[hr] > 0.0f ? mrow[hr] + logf(lrow[hr]) : LOOM_INF;
      }
  }
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const long long row = hr ? r1 : r0;
    if (row >= T) continue;
    #pragma unroll
    for (int d = 0; d < ND; d++) {
      SDQ::st(dq, ((b * T + row) * H + h) * D + 8 * d + t2, acc[d][2 * hr]);
      SDQ::st(dq, ((b * T + row) * H + h) * D + 8 * d + t2 + 1, acc[d][2 * hr + 1]);
    }
    if (t2 == 0) {
      Lout[bh * T + row] = mrow[hr];
      Dout[bh * T + row] = drow[hr];
    }
  }
}

/* Backward part 2 on tensor cores: loom_attn_bwd_dkdv with S^T = K Q^T, dP^T = V dO^T,
   dV += P^T dO and dK += dS^T Q as mma.sync (P^T and dS^T in two parts, hi + lo).  4 warps
   of 16 keys (64 keys a block); K and V row-major in shared memory for the block's life; per
   tile of BM queries (64, or 32 when D > 64) Q and dO row-major and transposed, L and Dsum.
   Each block owns its dk/dv rows: deterministic, no atomics.
   grid (B*KV, ceil(S/64)); dynamic smem (2*64*(D+8) + 2*BM*(D+8) + 2*D*(BM+8)) * 2 + 8*BM bytes.
   bufs: dout q k v L Dsum -> dk dv;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SDO, class SQ, class SK, class SV, class SDK, class SDV, int D>
LOOM_DEV void loom_attn_bwd_dkdv_tc(const LoomArgs &a) {
  constexpr bool BF = SQ::is_bf16;
  constexpr int BN = 64, BM = D <= 64 ? 64 : 32, LD = D + 8, LT = BM + 8, NQ = BM / 8, ND = D / 8, KD = D / 16,
                KM = BM / 16;
  extern __shared__ float loom_smem[];
  unsigned short *sK = (unsigned short *)loom_smem, *sV = sK + BN * LD, *sQ = sV + BN * LD, *sO = sQ + BM * LD,
                 *sQt = sO + BM * LD, *sOt = sQt + D * LT;
  float *sL = (float *)(sOt + D * LT), *sD = sL + BM;
  const long long T = a.i[1], H = a.i[2], S = a.i[4], KV = a.i[5], G = H / KV;
  const bool causal = a.i[6] != 0;
  const long long W = a.i[7];   /* the sliding window (ops.def attention); 0: none */
  const float scale = (float)a.f[0];
  const long long bk = blockIdx.x, b = bk / KV, kvh = bk - b * KV, n0 = (long long)blockIdx.y * BN;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const long long k0 = n0 + warp * 16 + g, k1 = k0 + 8;   /* this thread's two keys */
  const unsigned short *dout = LOOM_IN(SDO, 0), *q = LOOM_IN(SQ, 1), *k = LOOM_IN(SK, 2), *v = LOOM_IN(SV, 3);
  const float *Lin = (const float *)a.buf[4], *Din = (const float *)a.buf[5];
  typename SDK::T *dk = LOOM_OUT(SDK, 6);
  typename SDV::T *dv = LOOM_OUT(SDV, 7);
  loom_tc_load<D, BN>(sK, (unsigned short *)0, k + ((b * S + n0) * KV + kvh) * D, S - n0, KV * D);
  loom_tc_load<D, BN>(sV, (unsigned short *)0, v + ((b * S + n0) * KV + kvh) * D, S - n0, KV * D);
  float dK[ND][4], dV[ND][4];
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) dK[d][e] = dV[d][e] = 0.0f;
  const long long m_start = causal ? (n0 / BM) * BM : 0;
  for (long long hh = 0; hh < G; hh++) {
    const long long h = kvh * G + hh, bh = b * H + h;
    for (long long m0 = m_start; m0 < loom_win_end(n0, BN, W, T); m0 += BM) {
      __syncthreads();
      loom_tc_load<D, BM>(sQ, sQt, q + ((b * T + m0) * H + h) * D, T - m0, H * D);
      loom_tc_load<D, BM>(sO, sOt, dout + ((b * T + m0) * H + h) * D, T - m0, H * D);
      for (int r = tid; r < BM; r += LOOM_FA_THREADS) {
        sL[r] = m0 + r < T ? Lin[bh * T + m0 + r] : 0.0f;
        sD[r] = m0 + r < T ? Din[bh * T + m0 + r] : 0.0f;
      }
      __syncthreads();
      float s[NQ][4], dp[NQ][4];
      #pragma unroll
      for (int j = 0; j < NQ; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
      #pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        unsigned ka[4], va[4];
        loom_frag_a(ka, sK, LD, warp * 16, kk, g, t2);
        loom_frag_a(va, sV, LD, warp * 16, kk, g, t2);
        #pragma unroll
        for (int j = 0; j < NQ; j++) {
          unsigned bq[2], bo[2];
          loom_frag_b(bq, sQ, LD, 8 * j, kk, g, t2);
          loom_frag_b(bo, sO, LD, 8 * j, kk, g, t2);
          loom_mma16816<BF>(s[j], ka, bq);
          loom_mma16816<BF>(dp[j], va, bo);
        }
      }
      #pragma unroll
      for (int j = 0; j < NQ; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = 8 * j + t2 + (e & 1);
          const long long key = e < 2 ? k0 : k1, t = m0 + r;
          const bool ok = t < T && key < S && (!causal || key <= t) && (W <= 0 || t - key < W);
          const float p = ok ? expf(s[j][e] * scale - sL[r]) : 0.0f;
          s[j][e] = p;
          dp[j][e] = p * (dp[j][e] - sD[r]) * scale;
        }
      #pragma unroll
      for (int kk = 0; kk < KM; kk++) {
        unsigned phi[4], plo[4], dhi[4], dlo[4];
        loom_frag_split<BF>(s, 2 * kk, phi, plo);
        loom_frag_split<BF>(dp, 2 * kk, dhi, dlo);
        #pragma unroll
        for (int d = 0; d < ND; d++) {
          unsigned bo[2], bq[2];
          loom_frag_b(bo, sOt, LT, 8 * d, kk, g, t2);
          loom_frag_b(bq, sQt, LT, 8 * d, kk, g, t2);
          if (LOOM_ATTN_SPLIT) loom_mma16816<BF>(dV[d], plo, bo);
          loom_mma16816<BF>(dV[d], phi, bo);
          if (LOOM_ATTN_SPLIT) loom_mma16816<BF>(dK[d], dlo, bq);
          loom_mma16816<BF>(dK[d], dhi, bq);
        }
      }
    }
  }
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const long long key = hr ? k1 : k0;
    if (key >= S) continue;
    #pragma unroll
    for (int d = 0; d < ND; d++)
      #pragma unroll
      for (int e = 0; e < 2; e++) {
        SDK::st(dk, ((b * S + key) * KV + kvh) * D + 8 * d + t2 + e, dK[d][2 * hr + e]);
        SDV::st(dv, ((b * S + key) * KV + kvh) * D + 8 * d + t2 + e, dV[d][2 * hr + e]);
      }
  }
}
