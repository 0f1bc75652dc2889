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
   backward bufs: dloss logits targets -> dlogits;   i: rows, V
   The three kernels share the row's pieces below (one copy of the arithmetic: the fused
   kernel gives the same bits as the two). */
template <class SL>
LOOM_DEV void loom_xent_row_stats(const typename SL::T *l, long long base, long long V, float *sh, float &m, float &s) {
  m = -LOOM_INF;
  s = 0.0f;
  for (long long d = threadIdx.x; d < V; d += blockDim.x) loom_ms_add(m, s, SL::ld(l, base + d));
  loom_block_ms(m, s, sh);
}
/* the row's loss, from its (max, sum) */
template <class SL>
LOOM_DEV float loom_xent_row_loss(const typename SL::T *l, long long base, long long V, long long t, float m, float s) {
  return t >= 0 && t < V ? logf(s) + m - SL::ld(l, base + t) : __int_as_float(0x7fc00000);
}
/* the row's gradient dl (softmax - onehot(t)); g may be l (each element read, then written, by
   one thread) */
template <class SL, class SG>
LOOM_DEV void loom_xent_row_grad(const typename SL::T *l, typename SG::T *g, long long base, long long V, long long t,
                                 float m, float s, float dl) {
  const float bad = (t >= 0 && t < V) ? 0.0f : __int_as_float(0x7fc00000);
  for (long long d = threadIdx.x; d < V; d += blockDim.x) {
    float p = expf(SL::ld(l, base + d) - m) / s;
    if (d == t) p -= 1.0f;
    SG::st(g, base + d, p * dl + bad);
  }
}
template <class SL, class SLOSS>
LOOM_DEV void loom_xent_fwd(const LoomArgs &a) {
  __shared__ float sh[64];
  const typename SL::T *l = LOOM_IN(SL, 0);
  const int *tg = (const int *)a.buf[1];
  typename SLOSS::T *loss = LOOM_OUT(SLOSS, 2);
  const long long rows = a.i[0], V = a.i[1];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    float m, s;
    loom_xent_row_stats<SL>(l, r * V, V, sh, m, s);
    if (threadIdx.x == 0) SLOSS::st(loss, r, loom_xent_row_loss<SL>(l, r * V, V, tg[r], m, s));
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
    float m, s;
    loom_xent_row_stats<SL>(l, r * V, V, sh, m, s);
    loom_xent_row_grad<SL, SG>(l, g, r * V, V, tg[r], m, s, SDL::ld(dloss, r));
  }
}

/* Forward and backward in one launch (codegen/cuda/lower_fuse.c: the backward's dloss a
   constant, f[0]): per row the forward's (max, sum), its loss, then the backward's gradient,
   with the same row pieces (the same bits).  The gradient may be written over the logits:
   each element is read by the thread that then writes it, after the whole row was read for
   the statistics and the target's logit for the loss.
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
    float m, s;
    loom_xent_row_stats<SL>(l, r * V, V, sh, m, s);
    const long long t = tg[r];
    if (threadIdx.x == 0) SLOSS::st(loss, r, loom_xent_row_loss<SL>(l, r * V, V, t, m, s));
    __syncthreads();   /* the target's logit is read before the row is overwritten (in place) */
    loom_xent_row_grad<SL, SG>(l, g, r * V, V, t, m, s, dl);
  }
}
