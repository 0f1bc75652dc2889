/* ---------------------------------------------------------------- softmax
   bufs: x -> y  (GRAD: dy y -> dx);  i: rows, D.  One block per row. */
template <class SX, class SY>
LOOM_DEV void loom_softmax_fwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SX::T *x = LOOM_IN(SX, 0);
  typename SY::T *y = LOOM_OUT(SY, 1);
  const long long rows = a.i[0], D = a.i[1];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * D;
    float mx = -LOOM_INF;
    for (long long d = threadIdx.x; d < D; d += blockDim.x) mx = fmaxf(mx, SX::ld(x, base + d));
    mx = loom_block_max(mx, sh);
    float s = 0.0f;
    for (long long d = threadIdx.x; d < D; d += blockDim.x) s += expf(SX::ld(x, base + d) - mx);
    s = loom_block_sum(s, sh);
    for (long long d = threadIdx.x; d < D; d += blockDim.x) SY::st(y, base + d, expf(SX::ld(x, base + d) - mx) / s);
  }
}
template <class SDY, class SY, class SDX>
LOOM_DEV void loom_softmax_bwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SDY::T *dy = LOOM_IN(SDY, 0);
  const typename SY::T *y = LOOM_IN(SY, 1);
  typename SDX::T *dx = LOOM_OUT(SDX, 2);
  const long long rows = a.i[0], D = a.i[1];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * D;
    float dot = 0.0f;
    for (long long d = threadIdx.x; d < D; d += blockDim.x) dot += SDY::ld(dy, base + d) * SY::ld(y, base + d);
    dot = loom_block_sum(dot, sh);
    for (long long d = threadIdx.x; d < D; d += blockDim.x) {
      float yv = SY::ld(y, base + d);
      SDX::st(dx, base + d, yv * (SDY::ld(dy, base + d) - dot));
    }
  }
}

/* ---------------------------------------------------------------- cross entropy
   One block per row; one pass over the logits for (max, sum of exp) (online softmax).
   A target outside [0, V) gives NaN (the reference executor reports an error).
   forward  bufs: logits targets -> loss;            i: rows, V
   backward bufs: dloss logits targets -> dlogits;   i: rows, V */
template <class SL, class SLOSS>
LOOM_DEV void loom_xent_fwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SL::T *l = LOOM_IN(SL, 0);
  const int *tg = (const int *)a.buf[1];
  typename SLOSS::T *loss = LOOM_OUT(SLOSS, 2);
  const long long rows = a.i[0], V = a.i[1];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * V;
    float m = -LOOM_INF, s = 0.0f;
    for (long long d = threadIdx.x; d < V; d += blockDim.x) loom_ms_add(m, s, SL::ld(l, base + d));
    loom_block_ms(m, s, sh);
    if (threadIdx.x == 0) {
      long long t = tg[r];
      float v = t >= 0 && t < V ? logf(s) + m - SL::ld(l, base + t) : __int_as_float(0x7fc00000);
      SLOSS::st(loss, r, v);
    }
  }
}
template <class SDL, class SL, class SG>
LOOM_DEV void loom_xent_bwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SDL::T *dloss = LOOM_IN(SDL, 0);
  const typename SL::T *l = LOOM_IN(SL, 1);
  const int *tg = (const int *)a.buf[2];
  typename SG::T *g = LOOM_OUT(SG, 3);
  const long long rows = a.i[0], V = a.i[1];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * V;
    float m = -LOOM_INF, s = 0.0f;
    for (long long d = threadIdx.x; d < V; d += blockDim.x) loom_ms_add(m, s, SL::ld(l, base + d));
    loom_block_ms(m, s, sh);
    const long long t = tg[r];
    const float dl = SDL::ld(dloss, r), bad = (t >= 0 && t < V) ? 0.0f : __int_as_float(0x7fc00000);
    for (long long d = threadIdx.x; d < V; d += blockDim.x) {
      float p = expf(SL::ld(l, base + d) - m) / s;
      if (d == t) p -= 1.0f;
      SG::st(g, base + d, p * dl + bad);
    }
  }
}

/* Forward and backward in one launch (codegen/cuda/lower_fuse.c: the backward's dloss a
   constant, f[0]): per row the forward's (max, sum), its loss, then the backward's gradient,
   with loom_xent_fwd's and loom_xent_bwd's arithmetic (the same bits).  The gradient may be
   written over the logits: each element is read by the thread that then writes it, after the
   whole row was read for the statistics and the target's logit for the loss.
   bufs: logits targets -> loss dlogits;  i: rows, V;  f: dloss */
template <class SL, class SLOSS, class SG>
LOOM_DEV void loom_xent_fused(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SL::T *l = LOOM_IN(SL, 0);
  const int *tg = (const int *)a.buf[1];
  typename SLOSS::T *loss = LOOM_OUT(SLOSS, 2);
  typename SG::T *g = LOOM_OUT(SG, 3);
  const long long rows = a.i[0], V = a.i[1];
  const float dl = (float)a.f[0];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    const long long base = r * V;
    float m = -LOOM_INF, s = 0.0f;
    for (long long d = threadIdx.x; d < V; d += blockDim.x) loom_ms_add(m, s, SL::ld(l, base + d));
    loom_block_ms(m, s, sh);
    const long long t = tg[r];
    const bool good = t >= 0 && t < V;
    if (threadIdx.x == 0) SLOSS::st(loss, r, good ? logf(s) + m - SL::ld(l, base + t) : __int_as_float(0x7fc00000));
    __syncthreads();   /* the target's logit is read before the row is overwritten (in place) */
    const float bad = good ? 0.0f : __int_as_float(0x7fc00000);
    for (long long d = threadIdx.x; d < V; d += blockDim.x) {
      float p = expf(SL::ld(l, base + d) - m) / s;
      if (d == t) p -= 1.0f;
      SG::st(g, base + d, p * dl + bad);
    }
  }
}
