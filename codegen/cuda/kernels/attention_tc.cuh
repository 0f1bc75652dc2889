/* ---------------------------------------------------------------- flash attention on tensor cores
   The mma.sync kernels (sm_80 and later; docs/attention.md "The tensor-core kernels"): the
   forward, dq and dk/dv for bf16 and f16 at head sizes up to 128, with the fragment helpers
   they share with the Hopper kernels after them (attention_sm90.cuh) and the grouped matmuls
   of moe.cuh.  The CUDA-core kernels and the tile helpers of ring attention are in
   attention.cuh, before this file. */
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
/* LOOM_ATTN_SPLIT 1 (the default): P and dS enter their products as a bf16/f16 part and the
   rounded remainder, two mma each, so those products are as exact as f32's (the suite's bf16
   checks against the CPU backend, 2e-2 on the tiny models, need it: rounded once they reach
   2.1-3.1e-2).  LOOM_ATTN_SPLIT 0 (LOOM_CUDA_ATTN_ROUND=1 when lowering): rounded once, as
   FlashAttention does, one mma each (about 2^-9 of P off). */
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

/* The sm_80 instructions of the FlashAttention-2 style kernels, each with its emulated twin
   (tests/cuda_emu/emu.h) so the emulated device runs the same data flow:
     loom_cvt_pack   cvt.rn.{bf16x2,f16x2}.f32 (F2FP): two f32 rounded and packed, lo first
     loom_ex2        ex2.approx.ftz.f32 (MUFU.EX2)
     loom_ldsm_x4    ldmatrix .x4 (.trans): four 8x8 16-bit tiles from shared memory, lane
                     8m + r giving row r of tile m; each lane gets the mma fragment layout
     loom_cp_async16 cp.async.cg 16 bytes global -> shared (zeros when !valid), with
                     loom_cp_commit / loom_cp_wait<N> (at most N groups still in flight) */
template <bool BF>
LOOM_DEV unsigned loom_cvt_pack(float lo, float hi) {
#if defined(LOOM_EMU)
  return loom_emu_cvt_pack(lo, hi, BF);
#elif __CUDA_ARCH__ >= 800
  unsigned r;
  if (BF) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return BF ? (unsigned)loom_f32_to_bf16(lo) | (unsigned)loom_f32_to_bf16(hi) << 16
            : (unsigned)loom_f32_to_f16(lo) | (unsigned)loom_f32_to_f16(hi) << 16;
#endif
}
LOOM_DEV float loom_ex2(float x) {
#if defined(LOOM_EMU)
  return loom_emu_ex2(x);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#endif
}
LOOM_DEV unsigned loom_smem_addr(const void *p) {   /* a pointer's shared-memory address */
#if defined(LOOM_EMU)
  return loom_emu_smem_addr(p);   /* the byte offset into the emulator's block (the wgmma kernels' descriptors) */
#else
  return (unsigned)__cvta_generic_to_shared(p);
#endif
}
LOOM_DEV void loom_ldsm_x4(unsigned r[4], const unsigned short *row) {
#if defined(LOOM_EMU)
  loom_emu_ldmatrix(r, 4, row, false);
#elif __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(loom_smem_addr(row)));
#else
  __trap();
#endif
}
LOOM_DEV void loom_ldsm_x4_t(unsigned r[4], const unsigned short *row) {
#if defined(LOOM_EMU)
  loom_emu_ldmatrix(r, 4, row, true);
#elif __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(loom_smem_addr(row)));
#else
  __trap();
#endif
}
LOOM_DEV void loom_cp_async16(void *dst, const void *src, bool valid) {
#if defined(LOOM_EMU)
  loom_emu_cp_async16(dst, src, valid ? 16 : 0);
#elif __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(loom_smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  __trap();
#endif
}
LOOM_DEV void loom_cp_commit() {
#if !defined(LOOM_EMU) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
LOOM_DEV void loom_cp_wait() {
#if !defined(LOOM_EMU) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
/* A 16-bit element pair of a packed register back in f32 (the split's hi part). */
template <bool BF>
LOOM_DEV float loom_half_lo(unsigned x) {
  return BF ? __uint_as_float(x << 16) : loom_f16_to_f32((unsigned short)(x & 0xffffu));
}
template <bool BF>
LOOM_DEV float loom_half_hi(unsigned x) {
  return BF ? __uint_as_float(x & 0xffff0000u) : loom_f16_to_f32((unsigned short)(x >> 16));
}
/* P (or dS) tiles j0, j0 + 1 of a 16-row accumulator as the A operand of the next product:
   rounded to the input format (hi), and, with LOOM_ATTN_SPLIT, the rest (lo: hi + lo carries
   16 + 8 bits of mantissa for bf16). */
template <bool BF>
LOOM_DEV void loom_frag_pack(const float (*acc)[4], int j0, unsigned hi[4], unsigned lo[4]) {
  const float *x[4] = {&acc[j0][0], &acc[j0][2], &acc[j0 + 1][0], &acc[j0 + 1][2]};
  #pragma unroll
  for (int r = 0; r < 4; r++) {
    hi[r] = loom_cvt_pack<BF>(x[r][0], x[r][1]);
    if (LOOM_ATTN_SPLIT)
      lo[r] = loom_cvt_pack<BF>(__fsub_rn(x[r][0], loom_half_lo<BF>(hi[r])), __fsub_rn(x[r][1], loom_half_hi<BF>(hi[r])));
  }
}

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

/* The end of a dk dv kernel for a thread's two keys (k0, k1; keys from S on are not stored):
   dK and dV stored.  The one copy for the mma.sync and wgmma kernels. */
template <class SDK, class SDV, int ND>
LOOM_DEV void loom_kv_grads_store(typename SDK::T *dk, typename SDV::T *dv, const float (&dK)[ND][4],
                                  const float (&dV)[ND][4], int k0, int k1, int S, int b, int kvh, int t2, long long KVD,
                                  int D) {
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int key = hr ? k1 : k0;
    if (key >= S) continue;
    const long long at = ((long long)b * S + key) * KVD + (long long)kvh * D + t2;
    #pragma unroll
    for (int d = 0; d < ND; d++)
      #pragma unroll
      for (int e = 0; e < 2; e++) {
        SDK::st(dk, at + 8 * d + e, dK[d][2 * hr + e]);
        SDV::st(dv, at + 8 * d + e, dV[d][2 * hr + e]);
      }
  }
}

/* acc += P B for a warp's 16 rows: P the scores tile s (k16 steps kk < KN of its keys), packed
   to the input format (and with LOOM_ATTN_SPLIT its remainder, first), B's rows those keys in
   shared memory, row-major with stride ld, read transposed by ldmatrix (off: the lane's
   offset).  The forward's O += P V and dq's dQ += dS K. */
template <bool BF, int KN, int NT, int ND>
LOOM_DEV void loom_acc_pb(float (&acc)[ND][4], const float (&s)[NT][4], const unsigned short *sB, int ld, int off) {
  #pragma unroll
  for (int kk = 0; kk < KN; kk++) {
    unsigned hi[4], lo[4];
    loom_frag_pack<BF>(s, 2 * kk, hi, lo);
    #pragma unroll
    for (int d = 0; d < ND; d += 2) {
      unsigned b[4];
      loom_ldsm_x4_t(b, sB + 16 * kk * ld + 8 * d + off);
      if (LOOM_ATTN_SPLIT) {
        loom_mma16816<BF>(acc[d], lo, b);
        loom_mma16816<BF>(acc[d + 1], lo, b + 2);
      }
      loom_mma16816<BF>(acc[d], hi, b);
      loom_mma16816<BF>(acc[d + 1], hi, b + 2);
    }
  }
}

/* The online softmax of one tile for a thread's two rows of an m16n8 accumulator layout (row
   r0: elements 0 and 1 of each 8-key group j, r1: 2 and 3; a quad's 4 threads hold a row's
   keys): the running max over the quad, s turned into p = 2^(s c2 - m c2) (base 2; where
   edge, a row with no key yet, m = -inf, gets p = 0), this thread's part of the row sum (the
   quad adds the parts at the end), and the factor alpha = 2^(m_old c2 - m c2) o is to be
   rescaled by (loom_softmax_tile does it at once; the wgmma forward after the previous tile's
   P V, which is in flight meanwhile).  The one copy for the mma.sync forward
   (loom_attn_fwd_tc) and the wgmma forward (attention_sm90.cuh), whose accumulators share the
   layout. */
template <int NT>
LOOM_DEV void loom_softmax_stats(float (&s)[NT][4], float (&mrow)[2], float (&lsum)[2], float (&alpha)[2], float c2,
                                 bool edge) {
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float mx = mrow[hr];
    #pragma unroll
    for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[j][2 * hr], s[j][2 * hr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mc = edge && mx == -LOOM_INF ? 0.0f : mx * c2;
    const float a = loom_ex2(__fmaf_rn(mrow[hr], c2, -mc));
    mrow[hr] = mx;
    float ps = 0.0f;
    #pragma unroll
    for (int j = 0; j < NT; j++)
      #pragma unroll
      for (int e = 2 * hr; e < 2 * hr + 2; e++) {
        s[j][e] = loom_ex2(__fmaf_rn(s[j][e], c2, -mc));
        ps += s[j][e];
      }
    lsum[hr] = lsum[hr] * a + ps;
    alpha[hr] = a;
  }
}
/* o's rows (r0: elements 0 and 1, r1: 2 and 3) times their alpha */
template <int ND>
LOOM_DEV void loom_rescale(float (&o)[ND][4], const float (&alpha)[2]) {
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) o[d][e] *= alpha[e >> 1];
}
template <int NT, int ND>
LOOM_DEV void loom_softmax_tile(float (&s)[NT][4], float (&o)[ND][4], float (&mrow)[2], float (&lsum)[2], float c2,
                                bool edge) {
  float alpha[2];
  loom_softmax_stats<NT>(s, mrow, lsum, alpha, c2, edge);
  loom_rescale<ND>(o, alpha);
}

/* The end of a forward for a thread's two rows (r0, r1; rows from T on are not stored): the
   quad's row sums added, out = o / l, and where Lsave is given the gradient's inputs, L2 (the
   log-sum-exp in base 2, as loom_attn_bwd_dq_tc's pass 1 has it) and O unrounded in f32.  The
   one copy for the mma.sync and wgmma forwards. */
template <class SO, int ND>
LOOM_DEV void loom_fwd_finish(typename SO::T *out, float *Lsave, float *Osave, const float (&o)[ND][4],
                              const float (&mrow)[2], const float (&lsum)[2], float c2, int r0, int r1, int T, int b,
                              int h, long long bh, int t2, long long HD, int D) {
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float l = lsum[hr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = hr ? r1 : r0;
    if (row >= T) continue;
    const float inv = 1.0f / l;
    const long long at = ((long long)b * T + row) * HD + (long long)h * D + t2;
    #pragma unroll
    for (int d = 0; d < ND; d++) {
      SO::st(out, at + 8 * d, o[d][2 * hr] * inv);
      SO::st(out, at + 8 * d + 1, o[d][2 * hr + 1] * inv);
    }
    if (Lsave) {
      if (t2 == 0) Lsave[bh * T + row] = l > 0.0f ? mrow[hr] * c2 + log2f(l) : LOOM_INF;
      #pragma unroll
      for (int d = 0; d < ND; d++) {
        Osave[at + 8 * d] = o[d][2 * hr] * inv;
        Osave[at + 8 * d + 1] = o[d][2 * hr + 1] * inv;
      }
    }
  }
}

/* Forward on tensor cores (FlashAttention-2's loop), for q, k, v all bf16 or all f16 and D a
   multiple of 16 (at most 128).  4 warps, each owning 16 query rows of the block's 64: its
   Q fragments, scores, P and O in registers.  Tiles of 64 keys stream through shared memory
   by cp.async, two stages (the next tile's copy runs under this tile's products), K and V
   row-major with rows of D + 8 (ldmatrix without bank conflicts; V's B fragments by
   ldmatrix.trans).  S = Q K^T and O += P V as mma.sync; the softmax in base 2 (the scale
   times log2 e folded into one multiply, ex2.approx); each thread keeps its part of the row
   sums and the quad adds them once at the end.  Only tiles that cross the causal diagonal
   or the end of the keys are masked.  P enters P V rounded to the input format (F2FP), and
   with LOOM_ATTN_SPLIT also its remainder (docs/attention.md: the numerics).  Indices
   within a (batch, head) are 32-bit (the lowering checks T*H*D and S*KV*D < 2^31).  A
   sliding window (W > 0): the key tiles before the window of the block's first query are
   not visited, tiles crossing the window's edge are masked.
   With i[8] = 1 (a gradient op of the same function reads them: lower_attn.c) it also saves
   each row's log-sum-exp in base 2 (L2 = m c2 + log2 l, +inf for a row that sees no key) and
   O before its rounding to the output's format (f32), for loom_attn_bwd_dq_tc's one pass.
   grid (B*H, ceil(T/64)); dynamic smem 2 stages * 2 * 64 * (D+8) * 2 bytes.
   bufs: q k v -> out [L2 O];  i: B, T, H, D, S, KV, causal, window[, save];  f: scale */
template <class SQ, class SK, class SV, class SO, int D>
LOOM_DEV void loom_attn_fwd_tc(const LoomArgs &a) {
  constexpr bool BF = SQ::is_bf16;
  constexpr int BM = 64, BN = 64, LK = D + 8, NT = BN / 8, ND = D / 8, KD = D / 16, KN = BN / 16;
  constexpr int NL = BN * (D / 8) / LOOM_FA_THREADS;   /* 16-byte copies a thread per tile, of K and of V */
  extern __shared__ float loom_smem[];
  unsigned short *sbase = (unsigned short *)loom_smem;   /* stage s: K at s * 2 * BN * LK, V after it */
  const int T = (int)a.i[1], H = (int)a.i[2], S = (int)a.i[4], KV = (int)a.i[5];
  const bool causal = a.i[6] != 0;
  const int W = a.i[7] > 0 && a.i[7] < T + S ? (int)a.i[7] : 0;   /* the sliding window; 0: none */
  const float c2 = (float)a.f[0] * 1.4426950408889634f;   /* scale * log2(e); the lowering takes scale > 0 */
  const int bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const int n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (int)blockIdx.y) * BM;   /* long rows first */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const int r0 = m0 + warp * 16 + g, r1 = r0 + 8;   /* this thread's two query rows */
  const int qs = H * D, ks = KV * D;
  const unsigned short *q = LOOM_IN(SQ, 0) + ((long long)b * T * H + h) * D;
  const unsigned short *k = LOOM_IN(SK, 1) + ((long long)b * S * KV + kvh) * D;
  const unsigned short *v = LOOM_IN(SV, 2) + ((long long)b * S * KV + kvh) * D;
  typename SO::T *out = LOOM_OUT(SO, 3);
  const int n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S, n_first = (int)loom_win_first(m0, W, BN);
  /* this thread's copies: row lrow[c] of the tile, its 8 elements at lcol[c] */
  int lrow_[NL], loff[NL];
  #pragma unroll
  for (int c = 0; c < NL; c++) {
    const int idx = tid + c * LOOM_FA_THREADS;
    lrow_[c] = idx / (D / 8);
    loff[c] = lrow_[c] * ks + (idx - lrow_[c] * (D / 8)) * 8;
  }
  /* the tile of keys [n0, n0 + BN) into stage st (zeros past S) */
  auto load = [&](int st, int n0) {
    unsigned short *sK = sbase + st * 2 * BN * LK, *sV = sK + BN * LK;
    const int base = n0 * ks;
    #pragma unroll
    for (int c = 0; c < NL; c++) {
      const bool ok = n0 + lrow_[c] < S;
      const int at = ok ? base + loff[c] : 0, so = lrow_[c] * LK + (loff[c] - lrow_[c] * ks);
      loom_cp_async16(sK + so, k + at, ok);
      loom_cp_async16(sV + so, v + at, ok);
    }
    loom_cp_commit();
  };
  if (n_first < n_end) load(0, n_first);
  unsigned qf[KD][4];
  #pragma unroll
  for (int kk = 0; kk < KD; kk++)
    #pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = r & 1 ? r1 : r0;
      qf[kk][r] = row < T ? loom_ld32(q + row * qs + 16 * kk + (r & 2 ? 8 : 0) + t2) : 0u;
    }
  float o[ND][4], mrow[2] = {-LOOM_INF, -LOOM_INF}, lsum[2] = {0.0f, 0.0f};
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
  /* the keys rows r0 and r1 see: [kmin, kmax) (the end of S, causality, the window) */
  int kmin[2], kmax[2];
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = hr ? r1 : r0;
    kmin[hr] = W > 0 ? row - W + 1 : 0;
    kmax[hr] = causal && row + 1 < S ? row + 1 : S;
  }
  /* this lane's ldmatrix rows: tile m = lane / 8, row lane % 8 */
  const int lr = lane & 7, lm = lane >> 3;
  const int koff = (8 * (lm >> 1) + lr) * LK + 8 * (lm & 1);   /* K: key blocks j, j+1 x d halves */
  const int voff = (8 * (lm & 1) + lr) * LK + 8 * (lm >> 1);   /* V^T: key halves x d blocks d, d+1 */
  /* one tile: EDGE when it crosses the causal diagonal or the end of the keys (masked) */
  /* (a plain lambda: NVRTC refuses generic ones in device code; EDGE is a literal at each
     call, so each is compiled with its own mask code or none) */
  auto tile = [&](const bool EDGE, int n0, int st) {
    const unsigned short *sK = sbase + st * 2 * BN * LK, *sV = sK + BN * LK;
    float s[NT][4];
    #pragma unroll
    for (int j = 0; j < NT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < KD; kk++)
      #pragma unroll
      for (int j = 0; j < NT; j += 2) {
        unsigned bk[4];
        loom_ldsm_x4(bk, sK + 8 * j * LK + 16 * kk + koff);
        loom_mma16816<BF>(s[j], qf[kk], bk);
        loom_mma16816<BF>(s[j + 1], qf[kk], bk + 2);
      }
    if (EDGE)
      #pragma unroll
      for (int j = 0; j < NT; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = n0 + 8 * j + t2 + (e & 1);
          if (key < kmin[e >> 1] || key >= kmax[e >> 1]) s[j][e] = -LOOM_INF;
        }
    loom_softmax_tile<NT, ND>(s, o, mrow, lsum, c2, EDGE);
    loom_acc_pb<BF, KN>(o, s, sV, LK, voff);
  };
  /* tiles before the warp's diagonal, inside S and inside the window of its last row are
     interior: no mask */
  const int interior_end = causal ? m0 + warp * 16 + 1 - BN : S - BN + 1;   /* n0 < this: no key masked */
  const int window_start = W > 0 ? m0 + warp * 16 + 15 - W + 1 : 0;          /* n0 >= this: all in the window */
  for (int n0 = n_first, st = 0; n0 < n_end; n0 += BN, st ^= 1) {
    if (n0 + BN < n_end) {   /* the next tile's copy, under this tile's products */
      load(st ^ 1, n0 + BN);
      loom_cp_wait<1>();
    } else {
      loom_cp_wait<0>();
    }
    __syncthreads();
    if (n0 < interior_end && n0 + BN <= S && n0 >= window_start) tile(false, n0, st);
    else tile(true, n0, st);
    __syncthreads();   /* every warp is done with this stage before it is loaded again */
  }
  /* i[8]: also L2 -> buf 4 and O in f32 -> buf 5 (read here, after the loop: no registers held
     through it) */
  const bool save = a.i[8] != 0;
  float *Lsave = (float *)a.buf[4], *Osave = (float *)a.buf[5];
  loom_fwd_finish<SO, ND>(out, save ? Lsave : nullptr, Osave, o, mrow, lsum, c2, r0, r1, T, b, h, bh, t2, H * D, D);
}

/* Loads for the backward kernels: rows [0, R) of a 16-bit [rows, D] tile (row r at
   src + r * stride, zeros from row nvalid on) into shared memory with rows of D + 8, by
   16-byte cp.async (the caller commits). */
template <int D, int R>
LOOM_DEV void loom_tc_async(unsigned short *dst, const unsigned short *src, int nvalid, int stride) {
  #pragma unroll
  for (int idx = threadIdx.x; idx < R * (D / 8); idx += LOOM_FA_THREADS) {
    const int r = idx / (D / 8), c = (idx - r * (D / 8)) * 8;
    const bool ok = r < nvalid;
    loom_cp_async16(dst + r * (D + 8) + c, src + (ok ? r * stride + c : 0), ok);
  }
}

/* The one-pass dq's row statistics from what the forward saved: L2 as saved (+inf for a row
   past T) and Dsum = dout . O over this thread's columns (16 kk + 8 half + t2 and one more),
   then the quad's.  The one copy for loom_attn_bwd_dq_tc and the wgmma dq (attention_sm90.cuh),
   so their Dsum is the same sum in the same order. */
template <bool BF, int KD>
LOOM_DEV void loom_dq_saved_stats(const unsigned short *dout, const float *Osaved, const float *Lsaved, float (&dsum)[2],
                                  float (&mrow)[2], int r0, int r1, int T, int b, int h, int bh, int t2, int qs,
                                  int HD, int D) {
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = hr ? r1 : r0;
    float dd = 0.0f;
    if (row < T) {
      const float *orow = Osaved + ((long long)b * T + row) * HD + (long long)h * D;
      #pragma unroll
      for (int kk = 0; kk < KD; kk++)
        #pragma unroll
        for (int half = 0; half < 2; half++) {
          const unsigned x = loom_ld32(dout + row * qs + 16 * kk + 8 * half + t2);
          const float *oo = orow + 16 * kk + 8 * half + t2;
          dd = __fmaf_rn(loom_half_lo<BF>(x), oo[0], dd);
          dd = __fmaf_rn(loom_half_hi<BF>(x), oo[1], dd);
        }
    }
    dd += __shfl_xor_sync(0xffffffffu, dd, 1);
    dd += __shfl_xor_sync(0xffffffffu, dd, 2);
    dsum[hr] = dd;
    mrow[hr] = row < T ? Lsaved[(long long)bh * T + row] : LOOM_INF;
  }
}

/* dq's stores (a thread's two rows of an m16n8 accumulator layout), with the rows' L2 (when
   Lout: the two-pass dq) and Dsum for the dk/dv kernel; any: the rows saw a key tile.  The
   one copy for loom_attn_bwd_dq_tc and the wgmma dq. */
template <class SDQ, int ND>
LOOM_DEV void loom_dq_finish(typename SDQ::T *dq, float *Lout, float *Dout, const float (&acc)[ND][4],
                             const float (&mrow)[2], const float (&dsum)[2], bool any, int r0, int r1, int T, int b,
                             int h, int bh, int t2, int HD, int D) {
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = hr ? r1 : r0;
    if (row >= T) continue;
    const long long at = ((long long)b * T + row) * HD + (long long)h * D + t2;
    #pragma unroll
    for (int d = 0; d < ND; d++) {
      SDQ::st(dq, at + 8 * d, acc[d][2 * hr]);
      SDQ::st(dq, at + 8 * d + 1, acc[d][2 * hr + 1]);
    }
    if (t2 == 0) {
      if (Lout) Lout[(long long)bh * T + row] = any ? mrow[hr] : LOOM_INF;
      Dout[(long long)bh * T + row] = any ? dsum[hr] : 0.0f;
    }
  }
}

/* Backward part 1 on tensor cores (the operands of loom_attn_fwd_tc): loom_attn_bwd_dq's two
   passes, with S = Q K^T, dP = dO V^T and dQ += dS K as mma.sync.  Pass 1 gives each row's
   log-sum-exp (base 2: L2 = m c2 + log2 l, c2 = scale log2 e) and Dsum = sum p (dout . v);
   pass 2 dQ, dS rounded to the input format for its product (and with LOOM_ATTN_SPLIT its
   remainder too).  4 warps of 16 query rows; Q and dO fragments in registers; tiles of BN
   keys (64, or 32 when D > 64) stream through shared memory by cp.async in two stages, K
   and V row-major (rows D + 8): S and dP's B fragments by ldmatrix, dQ's (K^T) by
   ldmatrix.trans.  Masked only on tiles that cross the diagonal or the end of the keys;
   32-bit indices within a (batch, head).  A sliding window as the forward's.  L2 and Dsum
   go to scratch for part 2.
   With i[8] = 1 the forward saved L2 and O (f32; loom_attn_fwd_tc): Dsum = dout . O, and the
   one pass is pass 2 (FlashAttention-2's dq: 3 tile products a key tile, not 5).
   grid (B*H, ceil(T/64)); dynamic smem 2 stages * 2 * BN * (D+8) * 2 bytes.
   bufs: dout q k v -> dq L2 Dsum;  i: B, T, H, D, S, KV, causal, window;  f: scale
   (i[8] = 1: dout q k v L2 O -> dq Dsum) */
template <class SDO, class SQ, class SK, class SV, class SDQ, int D>
LOOM_DEV void loom_attn_bwd_dq_tc(const LoomArgs &a) {
  constexpr bool BF = SQ::is_bf16;
  constexpr int BM = 64, BN = D <= 64 ? 64 : 32, LD = D + 8, NT = BN / 8, ND = D / 8, KD = D / 16, KN = BN / 16;
  extern __shared__ float loom_smem[];
  unsigned short *sbase = (unsigned short *)loom_smem;   /* stage s: K at s * 2 * BN * LD, V after it */
  const int T = (int)a.i[1], H = (int)a.i[2], S = (int)a.i[4], KV = (int)a.i[5];
  const bool causal = a.i[6] != 0;
  const int W = a.i[7] > 0 && a.i[7] < T + S ? (int)a.i[7] : 0;   /* the sliding window; 0: none */
  const float scale = (float)a.f[0], c2 = scale * 1.4426950408889634f;
  const int bh = blockIdx.x, b = bh / H, h = bh - b * H, kvh = h / (H / KV);
  const int n_tiles = (T + BM - 1) / BM, m0 = (n_tiles - 1 - (int)blockIdx.y) * BM;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const int r0 = m0 + warp * 16 + g, r1 = r0 + 8;
  const int qs = H * D, ks = KV * D;
  const long long qbase = ((long long)b * T * H + h) * D, kbase = ((long long)b * S * KV + kvh) * D;
  const unsigned short *dout = LOOM_IN(SDO, 0) + qbase, *q = LOOM_IN(SQ, 1) + qbase;
  const unsigned short *k = LOOM_IN(SK, 2) + kbase, *v = LOOM_IN(SV, 3) + kbase;
  const bool saved = a.i[8] != 0;   /* i[8]: L2 and O saved by the forward (one pass) */
  typename SDQ::T *dq = LOOM_OUT(SDQ, saved ? 6 : 4);
  float *Lout = (float *)a.buf[saved ? 4 : 5], *Dout = (float *)a.buf[saved ? 7 : 6];
  const float *Osaved = saved ? (const float *)a.buf[5] : nullptr;
  const int n_end = causal ? (S < m0 + BM ? S : m0 + BM) : S, n_first = (int)loom_win_first(m0, W, BN);
  const int nk = n_end > n_first ? (n_end - n_first + BN - 1) / BN : 0;
  auto load = [&](int st, int n0) {
    unsigned short *sK = sbase + st * 2 * BN * LD;
    loom_tc_async<D, BN>(sK, k + n0 * ks, S - n0, ks);
    loom_tc_async<D, BN>(sK + BN * LD, v + n0 * ks, S - n0, ks);
    loom_cp_commit();
  };
  if (nk > 0) load(0, n_first);
  unsigned qf[KD][4], of[KD][4];
  #pragma unroll
  for (int kk = 0; kk < KD; kk++)
    #pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = r & 1 ? r1 : r0, at = row * qs + 16 * kk + (r & 2 ? 8 : 0) + t2;
      qf[kk][r] = row < T ? loom_ld32(q + at) : 0u;
      of[kk][r] = row < T ? loom_ld32(dout + at) : 0u;
    }
  float mrow[2] = {-LOOM_INF, -LOOM_INF}, lsum[2] = {0.0f, 0.0f}, dsum[2] = {0.0f, 0.0f}, acc[ND][4];
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) acc[d][e] = 0.0f;
  int kmin[2], kmax[2];   /* the keys rows r0 and r1 see: [kmin, kmax) */
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = hr ? r1 : r0;
    kmin[hr] = W > 0 ? row - W + 1 : 0;
    kmax[hr] = causal && row + 1 < S ? row + 1 : S;
  }
  if (saved) loom_dq_saved_stats<BF, KD>(dout, Osaved, Lout, dsum, mrow, r0, r1, T, b, h, bh, t2, qs, H * D, D);
  const int lr = lane & 7, lm = lane >> 3;
  const int boff = (8 * (lm >> 1) + lr) * LD + 8 * (lm & 1);   /* K, V as B of S, dP: key blocks j, j+1 x d halves */
  const int toff = (8 * (lm & 1) + lr) * LD + 8 * (lm >> 1);   /* K^T as B of dQ: key halves x d blocks d, d+1 */
  const int interior_end = causal ? m0 + warp * 16 + 1 - BN : S - BN + 1;
  const int window_start = W > 0 ? m0 + warp * 16 + 15 - W + 1 : 0;
  /* item i: pass i / nk over tile i % nk; the next item's tile is copied under this one */
  auto item = [&](const bool EDGE, const bool P2, int n0, int st) {   /* literals at each call */
    const unsigned short *sK = sbase + st * 2 * BN * LD, *sV = sK + BN * LD;
    float s[NT][4], dp[NT][4];
    #pragma unroll
    for (int j = 0; j < NT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < KD; kk++)
      #pragma unroll
      for (int j = 0; j < NT; j += 2) {
        unsigned bk[4], bv[4];
        loom_ldsm_x4(bk, sK + 8 * j * LD + 16 * kk + boff);
        loom_ldsm_x4(bv, sV + 8 * j * LD + 16 * kk + boff);
        loom_mma16816<BF>(s[j], qf[kk], bk);
        loom_mma16816<BF>(s[j + 1], qf[kk], bk + 2);
        loom_mma16816<BF>(dp[j], of[kk], bv);
        loom_mma16816<BF>(dp[j + 1], of[kk], bv + 2);
      }
    if (EDGE)
      #pragma unroll
      for (int j = 0; j < NT; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = n0 + 8 * j + t2 + (e & 1);
          if (key < kmin[e >> 1] || key >= kmax[e >> 1]) s[j][e] = -LOOM_INF;
        }
    #pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      if (!P2) {   /* online: the row's max, its sums of p and of p dp (this thread's part) */
        float mx = mrow[hr];
        #pragma unroll
        for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[j][2 * hr], s[j][2 * hr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mc = EDGE && mx == -LOOM_INF ? 0.0f : mx * c2;
        const float alpha = loom_ex2(__fmaf_rn(mrow[hr], c2, -mc));
        mrow[hr] = mx;
        float ps = 0.0f, pd = 0.0f;
        #pragma unroll
        for (int j = 0; j < NT; j++)
          #pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; e++) {
            const float p = loom_ex2(__fmaf_rn(s[j][e], c2, -mc));
            ps += p;
            pd = __fmaf_rn(p, dp[j][e], pd);
          }
        lsum[hr] = __fmaf_rn(lsum[hr], alpha, ps);
        dsum[hr] = __fmaf_rn(dsum[hr], alpha, pd);
      } else {   /* dS = p (dp - Dsum) scale, in s; mrow holds L2, dsum Dsum */
        #pragma unroll
        for (int j = 0; j < NT; j++)
          #pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; e++)
            s[j][e] = loom_ex2(__fmaf_rn(s[j][e], c2, -mrow[hr])) * (dp[j][e] - dsum[hr]) * scale;
      }
    }
    if (P2) loom_acc_pb<BF, KN>(acc, s, sK, LD, toff);
  };
  const int n_items = saved ? nk : 2 * nk, i_p2 = saved ? 0 : nk;   /* items from i_p2 on: pass 2 */
  for (int i = 0, st = 0; i < n_items; i++, st ^= 1) {
    const int n0 = n_first + (i % nk) * BN;
    if (i + 1 < n_items) {
      load(st ^ 1, n_first + ((i + 1) % nk) * BN);
      loom_cp_wait<1>();
    } else {
      loom_cp_wait<0>();
    }
    __syncthreads();
    const bool edge = !(n0 < interior_end && n0 + BN <= S && n0 >= window_start);
    if (i < i_p2) {
      if (edge) item(true, false, n0, st);
      else item(false, false, n0, st);
      if (i == nk - 1)
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {   /* L2 = m c2 + log2 l, Dsum = sum p dp / l; no key: L2 = inf */
          float l = lsum[hr], dd = dsum[hr];
          l += __shfl_xor_sync(0xffffffffu, l, 1);
          l += __shfl_xor_sync(0xffffffffu, l, 2);
          dd += __shfl_xor_sync(0xffffffffu, dd, 1);
          dd += __shfl_xor_sync(0xffffffffu, dd, 2);
          dsum[hr] = l > 0.0f ? dd / l : 0.0f;
          mrow[hr] = l > 0.0f ? mrow[hr] * c2 + log2f(l) : LOOM_INF;
        }
    } else {
      if (edge) item(true, true, n0, st);
      else item(false, true, n0, st);
    }
    __syncthreads();
  }
  loom_dq_finish<SDQ, ND>(dq, saved ? nullptr : Lout, Dout, acc, mrow, dsum, nk > 0, r0, r1, T, b, h, bh, t2, H * D, D);
}

/* Backward part 2 on tensor cores: loom_attn_bwd_dkdv with S^T = K Q^T, dP^T = V dO^T,
   dV += P^T dO and dK += dS^T Q as mma.sync (P^T and dS^T rounded to the input format, and
   with LOOM_ATTN_SPLIT their remainders too), P^T = 2^(S^T c2 - L2) from part 1.  4 warps
   of 16 keys (64 keys a block); K and V row-major in shared memory for the block's life
   (their A fragments by ldmatrix); per tile of BM queries (64, or 32 when D > 64) Q and dO
   row-major (B fragments by ldmatrix, .trans for dV and dK), L2 and Dsum, two stages by
   cp.async over the query heads sharing the kv head and their tiles.  Masked only on tiles
   that cross the diagonal, the end of the queries or the edge of a sliding window (the
   query tiles past the window of the block's last key are not visited).  Each block owns
   its dk/dv rows: deterministic, no atomics.
   grid (B*KV, ceil(S/64)); dynamic smem 2*64*(D+8)*2 + 2 stages * (2*BM*(D+8)*2 + 8*BM) bytes.
   bufs: dout q k v L2 Dsum -> dk dv;  i: B, T, H, D, S, KV, causal, window;  f: scale */
template <class SDO, class SQ, class SK, class SV, class SDK, class SDV, int D>
LOOM_DEV void loom_attn_bwd_dkdv_tc(const LoomArgs &a) {
  constexpr bool BF = SQ::is_bf16;
  constexpr int BN = 64, BM = D <= 64 ? 64 : 32, LD = D + 8, NQ = BM / 8, ND = D / 8, KD = D / 16, KM = BM / 16;
  constexpr int STAGE = 2 * BM * LD + 4 * BM;   /* 16-bit elements a stage: Q, dO, then L2 and Dsum (f32) */
  extern __shared__ float loom_smem[];
  unsigned short *sK = (unsigned short *)loom_smem, *sV = sK + BN * LD, *sbase = sV + BN * LD;
  const int T = (int)a.i[1], H = (int)a.i[2], S = (int)a.i[4], KV = (int)a.i[5], G = H / KV;
  const bool causal = a.i[6] != 0;
  const int W = a.i[7] > 0 && a.i[7] < T + S ? (int)a.i[7] : 0;   /* the sliding window; 0: none */
  const float scale = (float)a.f[0], c2 = scale * 1.4426950408889634f;
  const int bk = blockIdx.x, b = bk / KV, kvh = bk - b * KV, n0 = (int)blockIdx.y * BN;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t2 = (lane & 3) * 2;
  const int k0 = n0 + warp * 16 + g, k1 = k0 + 8;   /* this thread's two keys */
  const int qs = H * D, ks = KV * D;
  const long long kbase = ((long long)b * S * KV + kvh) * D;
  const unsigned short *dout = LOOM_IN(SDO, 0), *q = LOOM_IN(SQ, 1);
  const unsigned short *k = LOOM_IN(SK, 2) + kbase, *v = LOOM_IN(SV, 3) + kbase;
  const float *Lin = (const float *)a.buf[4], *Din = (const float *)a.buf[5];
  typename SDK::T *dk = LOOM_OUT(SDK, 6);
  typename SDV::T *dv = LOOM_OUT(SDV, 7);
  loom_tc_async<D, BN>(sK, k + n0 * ks, S - n0, ks);
  loom_tc_async<D, BN>(sV, v + n0 * ks, S - n0, ks);
  loom_cp_commit();
  const int m_start = causal ? (n0 / BM) * BM : 0, m_end = (int)loom_win_end(n0, BN, W, T);
  const int nm = m_end > m_start ? (m_end - m_start + BM - 1) / BM : 0, n_items = G * nm;
  /* item i: query head kvh * G + i / nm, its query tile m_start + (i % nm) * BM */
  auto load = [&](int st, int i) {
    const int h = kvh * G + i / nm, m0 = m_start + (i % nm) * BM;
    const long long qbase = ((long long)b * T * H + h) * D;
    unsigned short *sQ = sbase + st * STAGE, *sO = sQ + BM * LD;
    float *sL = (float *)(sO + BM * LD), *sD = sL + BM;
    loom_tc_async<D, BM>(sQ, q + qbase + m0 * qs, T - m0, qs);
    loom_tc_async<D, BM>(sO, dout + qbase + m0 * qs, T - m0, qs);
    loom_cp_commit();
    const long long lb = ((long long)b * H + h) * T + m0;
    for (int r = tid; r < 2 * BM; r += LOOM_FA_THREADS) {   /* plain loads: L's rows need not be 16-byte aligned */
      const int rr = r < BM ? r : r - BM;
      const float x = m0 + rr < T ? (r < BM ? Lin : Din)[lb + rr] : 0.0f;
      (r < BM ? sL : sD)[rr] = x;
    }
  };
  if (n_items > 0) load(0, 0);
  float dK[ND][4], dV[ND][4];
  #pragma unroll
  for (int d = 0; d < ND; d++)
    #pragma unroll
    for (int e = 0; e < 4; e++) dK[d][e] = dV[d][e] = 0.0f;
  int tmin[2], tmax[2];   /* the queries keys k0 and k1 are seen by: [tmin, tmax) */
  #pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int key = hr ? k1 : k0;
    tmin[hr] = causal ? key : 0;
    tmax[hr] = W > 0 && key + W < T ? key + W : T;
  }
  const int lr = lane & 7, lm = lane >> 3;
  const int aoff = (warp * 16 + 8 * (lm & 1) + lr) * LD + 8 * (lm >> 1);   /* K, V as A: row halves x k halves */
  const int boff = (8 * (lm >> 1) + lr) * LD + 8 * (lm & 1);               /* Q, dO as B of S^T, dP^T */
  const int toff = (8 * (lm & 1) + lr) * LD + 8 * (lm >> 1);               /* dO^T, Q^T as B of dV, dK */
  auto item = [&](const bool EDGE, int m0, int st) {   /* a literal at each call */
    const unsigned short *sQ = sbase + st * STAGE, *sO = sQ + BM * LD;
    const float *sL = (const float *)(sO + BM * LD), *sD = sL + BM;
    float s[NQ][4], dp[NQ][4];
    #pragma unroll
    for (int j = 0; j < NQ; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      unsigned ka[4], va[4];
      loom_ldsm_x4(ka, sK + 16 * kk + aoff);
      loom_ldsm_x4(va, sV + 16 * kk + aoff);
      #pragma unroll
      for (int j = 0; j < NQ; j += 2) {
        unsigned bq[4], bo[4];
        loom_ldsm_x4(bq, sQ + 8 * j * LD + 16 * kk + boff);
        loom_ldsm_x4(bo, sO + 8 * j * LD + 16 * kk + boff);
        loom_mma16816<BF>(s[j], ka, bq);
        loom_mma16816<BF>(s[j + 1], ka, bq + 2);
        loom_mma16816<BF>(dp[j], va, bo);
        loom_mma16816<BF>(dp[j + 1], va, bo + 2);
      }
    }
    #pragma unroll
    for (int j = 0; j < NQ; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = 8 * j + t2 + (e & 1);
        float p = loom_ex2(__fmaf_rn(s[j][e], c2, -sL[r]));
        if (EDGE) {
          const int t = m0 + r;
          if (t < tmin[e >> 1] || t >= tmax[e >> 1]) p = 0.0f;
        }
        s[j][e] = p;
        dp[j][e] = p * (dp[j][e] - sD[r]) * scale;
      }
    #pragma unroll
    for (int kk = 0; kk < KM; kk++) {   /* dV += P^T dO, then dK += dS^T Q (fewer fragments live at once) */
      #pragma unroll
      for (int which = 0; which < 2; which++) {
        unsigned hi[4], lo[4];
        loom_frag_pack<BF>(which ? dp : s, 2 * kk, hi, lo);
        const unsigned short *src = which ? sQ : sO;
        float(*acc)[4] = which ? dK : dV;
        #pragma unroll
        for (int d = 0; d < ND; d += 2) {
          unsigned bb[4];
          loom_ldsm_x4_t(bb, src + 16 * kk * LD + 8 * d + toff);
          if (LOOM_ATTN_SPLIT) {
            loom_mma16816<BF>(acc[d], lo, bb);
            loom_mma16816<BF>(acc[d + 1], lo, bb + 2);
          }
          loom_mma16816<BF>(acc[d], hi, bb);
          loom_mma16816<BF>(acc[d + 1], hi, bb + 2);
        }
      }
    }
  };
  for (int i = 0, st = 0; i < n_items; i++, st ^= 1) {
    const int m0 = m_start + (i % nm) * BM;
    if (i + 1 < n_items) {
      load(st ^ 1, i + 1);
      loom_cp_wait<1>();
    } else {
      loom_cp_wait<0>();
    }
    __syncthreads();
    /* no query of the tile before a key of this warp's, none past T, none past the window
       of the warp's first key: no mask */
    if (m0 + BM <= T && (!causal || m0 >= n0 + warp * 16 + 15) && (W <= 0 || m0 + BM - 1 - (n0 + warp * 16) < W))
      item(false, m0, st);
    else item(true, m0, st);
    __syncthreads();
  }
  loom_cp_wait<0>();   /* no copy in flight at exit (no query tile: K and V's) */
  loom_kv_grads_store<SDK, SDV, ND>(dk, dv, dK, dV, k0, k1, S, b, kvh, t2, (long long)KV * D, D);
}
