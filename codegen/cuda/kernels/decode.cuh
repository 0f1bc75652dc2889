/* ---------------------------------------------------------------- generation with a KV cache
   The ops rope_at, kv_write and attention_cached (ops.def; defined by ir/interp_ops.c): a
   decode step's few new tokens (one when sampling) at their positions pos[B,C] (i32), each
   new token's key and value written to row pos[b,c] of its layer's cache [B,Tmax,KV,Dh],
   and its queries attending to the cache's rows 0..pos[b,c].  Computed in f32 whatever the
   storage.  A position outside the cache (negative for rope_at) is a bug of the caller: the
   host checks positions before each call (as the CPU runtime does), and the kernels stop
   with a trap rather than clamp, skip or read past the cache (the launch fails, and the
   program's call reports it; on the emulated device the launch fails with this message). */
#ifdef LOOM_EMU
#define LOOM_BAD_POSITION() loom_emu::fail("%s", "a position outside the KV cache (a trap on a GPU)")
#else
#define LOOM_BAD_POSITION() __trap()
#endif

/* rope_at.  bufs: x pos -> y;  i: B, C, H, Dh;  f: theta and the scaling (as loom_rope).  As loom_rope: one thread per pair
   (j, j + Dh/2), the angle pos[b,c] * theta^(-2j/Dh) in double, cos and sin rounded to float,
   the rotation in float. */
template <class SX, class SY>
LOOM_DEV void loom_rope_at(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  const int *pos = (const int *)a.buf[1];
  typename SY::T *y = LOOM_OUT(SY, 2);
  const long long H = a.i[2], Dh = a.i[3], half = Dh / 2, n = a.i[0] * a.i[1] * H * half;
  LOOM_GRID_LOOP(k, n) {
    const long long j = k % half, bch = k / half, p = pos[bch / H];
    if (p < 0) {
      LOOM_BAD_POSITION();
      return;
    }
    const double ang = (double)p * loom_rope_inv_freq(a.f, j, Dh);
    const float c = (float)cos(ang), s = (float)sin(ang);
    const long long base = bch * Dh;
    const float x0 = SX::ld(x, base + j), x1 = SX::ld(x, base + j + half);
    SY::st(y, base + j, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    SY::st(y, base + j + half, __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
  }
}

/* kv_write.  bufs: cache x pos (the cache written in place, listed once, as input 0);
   i: B, C, Tmax, row (KV*Dh).  One thread per element of x: cache[b, pos[b,c]] = x[b,c],
   rounded to the cache's storage.  Two new tokens of a batch row at one position leave the
   later one's row, as the reference's writes in order do (the earlier skips its store). */
template <class SC, class SX>
LOOM_DEV void loom_kv_write(const LoomArgs &a) {
  typename SC::T *cache = LOOM_OUT(SC, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  const int *pos = (const int *)a.buf[2];
  const long long C = a.i[1], S = a.i[2], row = a.i[3], n = a.i[0] * C * row;
  LOOM_GRID_LOOP(k, n) {
    const long long bc = k / row, e = k - bc * row, b = bc / C, p = pos[bc];
    if (p < 0 || p >= S) {
      LOOM_BAD_POSITION();
      return;
    }
    bool later = false;
    for (long long c = bc - b * C + 1; c < C; c++) later = later || pos[b * C + c] == p;
    if (!later) SC::st(cache, (b * S + p) * row + e, SX::ld(x, k));
  }
}

/* attention_cached.  bufs: q kcache vcache pos -> out;  i: B, C, H, Dh, Tmax, KV, window;  f: scale.
   A block of 128 threads per query row (b, c, h) (grid-stride over the B*C*H rows), kv head
   h / (H/KV); dynamic smem (2*Dh + 128) floats: the query, the output's running sums, a
   tile's scores.  The keys 0..pos[b,c] go by in tiles of 128 with an online softmax:
     scores  warp w takes keys w, w+4, ... of the tile; lane l sums q[d] k[d] over d = l,
             l+32, ... in order, then a fixed shuffle tree adds the lanes;
     softmax the tile's max and sum of exp by loom_block_max / loom_block_sum (one key per
             thread); the running sums are rescaled by exp(m_old - m_new);
     values  thread d adds p_s v[s][d] over the tile's keys in order.
   Keys past the position, or (window > 0) window or more before it, are neither read nor counted.  Every sum has one fixed order (no
   atomics): the same inputs give the same bits.  The output is o[d] / l. */
#define LOOM_AC_THREADS 128
template <class SQ, class SK, class SV, class SO>
LOOM_DEV void loom_attn_cached(const LoomArgs &a) {
  __shared__ float sh[32];
  extern __shared__ float loom_smem[];
  const typename SQ::T *q = LOOM_IN(SQ, 0);
  const typename SK::T *kc = LOOM_IN(SK, 1);
  const typename SV::T *vc = LOOM_IN(SV, 2);
  const int *pos = (const int *)a.buf[3];
  typename SO::T *out = LOOM_OUT(SO, 4);
  const long long C = a.i[1], H = a.i[2], Dh = a.i[3], S = a.i[4], KV = a.i[5], rows = a.i[0] * C * H;
  const long long W = a.i[6];   /* the sliding window (ops.def attention_cached); 0: none */
  const float scale = (float)a.f[0];
  float *sQ = loom_smem, *sO = sQ + Dh, *sP = sO + Dh;
  const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long bc = r / H, h = r - bc * H, b = bc / C, kvh = h / (H / KV), p = pos[bc];
    if (p < 0 || p >= S) {
      LOOM_BAD_POSITION();
      return;
    }
    const long long n = p + 1, first = W > 0 && p - W + 1 > 0 ? p - W + 1 : 0;   /* the window's keys */
    __syncthreads();   /* the previous row's last reads of sO and sP */
    for (long long d = tid; d < Dh; d += LOOM_AC_THREADS) {
      sQ[d] = SQ::ld(q, r * Dh + d);
      sO[d] = 0.0f;
    }
    float m = -LOOM_INF, l = 0.0f;
    for (long long s0 = first; s0 < n; s0 += LOOM_AC_THREADS) {
      const int nt = (int)(n - s0 < LOOM_AC_THREADS ? n - s0 : LOOM_AC_THREADS);
      __syncthreads();   /* sQ written; the previous tile's sP read */
      for (int j = warp; j < LOOM_AC_THREADS; j += LOOM_AC_THREADS / 32) {
        float dot = 0.0f;
        if (j < nt) {
          const long long kb = ((b * S + s0 + j) * KV + kvh) * Dh;
          for (long long d = lane; d < Dh; d += 32) dot += sQ[d] * SK::ld(kc, kb + d);
        }
        dot = loom_warp_sum(dot);
        if (lane == 0) sP[j] = j < nt ? dot * scale : -LOOM_INF;
      }
      __syncthreads();
      const float sc = sP[tid], m_new = fmaxf(m, loom_block_max(sc, sh));
      const float alpha = expf(m - m_new), e = expf(sc - m_new);
      sP[tid] = e;
      l = l * alpha + loom_block_sum(e, sh);   /* its barriers publish sP */
      m = m_new;
      for (long long d = tid; d < Dh; d += LOOM_AC_THREADS) {
        const typename SV::T *v = vc + ((b * S + s0) * KV + kvh) * Dh + d;
        float o = sO[d] * alpha;
        for (int j = 0; j < nt; j++) o += sP[j] * SV::ld(v, (long long)j * KV * Dh);
        sO[d] = o;
      }
    }
    const float inv = 1.0f / l;
    for (long long d = tid; d < Dh; d += LOOM_AC_THREADS) SO::st(out, r * Dh + d, sO[d] * inv);
  }
}
