/* ---------------------------------------------------------------- the gradient norm
   (codegen/cuda/lower.c: lower_norm_chain).  Parts: block b sums the squares of elements
   [b*per, (b+1)*per) of a span of f32 gradients into parts[b].  i: n, per.  Then one block
   adds the parts in order into out.  i: n_parts.  Both deterministic. */
template <class SO>
LOOM_DEV void loom_sumsq_parts(const LoomArgs &a) {
  __shared__ float sh[32];
  const float *x = (const float *)a.buf[0];
  float *parts = (float *)a.buf[1];
  const long long n = a.i[0], per = a.i[1], lo = (long long)blockIdx.x * per, hi = lo + per < n ? lo + per : n;
  float s = 0.0f;
  for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) s = __fadd_rn(s, __fmul_rn(x[k], x[k]));
  s = loom_block_sum(s, sh);
  if (threadIdx.x == 0) parts[blockIdx.x] = s;
}
template <class SO>
LOOM_DEV void loom_sum_parts(const LoomArgs &a) {
  __shared__ float sh[32];
  const float *parts = (const float *)a.buf[0];
  typename SO::T *out = LOOM_OUT(SO, 1);
  float s = 0.0f;
  for (long long k = threadIdx.x; k < a.i[0]; k += blockDim.x) s = __fadd_rn(s, parts[k]);
  s = loom_block_sum(s, sh);
  if (threadIdx.x == 0) SO::st(out, 0, s);
}

/* ---------------------------------------------------------------- adamw
   bufs: p m v g gscale lr t -> p2 m2 v2 (outputs may be the inputs);  i: n;
   f: beta1, beta2, eps, weight_decay.  The CPU runtime's expressions, operation for
   operation (no FMA contraction: the same bits as runtime/cpu/cpu_kernels.c for f32).
   VEC: 4 elements per access (every buffer f32 and n % 4 == 0; offsets are 64-byte aligned). */
struct alignas(16) loom_f4 { float x, y, z, w; };
struct loom_adam_k {
  float gscale, decay, b1, b2, omb1, omb2, eps, bc2_sqrt, step;
  __device__ __forceinline__ void one(float p, float m, float v, float g, float &p2, float &m2, float &v2) const {
    float gk = __fmul_rn(g, gscale);
    float pk = __fmul_rn(p, decay);
    float mk = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(omb1, gk));
    float vk = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(omb2, gk), gk));
    float denom = __fadd_rn(__fdiv_rn(sqrtf(vk), bc2_sqrt), eps);
    m2 = mk;
    v2 = vk;
    p2 = __fsub_rn(pk, __fdiv_rn(__fmul_rn(step, mk), denom));
  }
};
/* COPY: in place, and the parameter's bf16 (f16) copy written from the new value
   (codegen/cuda/lower_fuse.c): bufs p m v g gscale lr t -> p m v copy (buffer 10).  The copy is
   rounded as loom_copy rounds the cast it replaces: the same bits. */
template <class SP, class SM, class SV, class SG, class SS, class SC, bool COPY, bool VEC>
LOOM_DEV void loom_adamw_impl(const LoomArgs &a) {
  const long long n = a.i[0];
  loom_adam_k c;
  const float lr = SS::ld(LOOM_IN(SS, 5), 0);
  const double t = (double)SS::ld(LOOM_IN(SS, 6), 0);
  c.gscale = SS::ld(LOOM_IN(SS, 4), 0);
  c.b1 = (float)a.f[0];
  c.b2 = (float)a.f[1];
  c.eps = (float)a.f[2];
  c.decay = __fsub_rn(1.0f, __fmul_rn(lr, (float)a.f[3]));
  c.omb1 = __fsub_rn(1.0f, c.b1);
  c.omb2 = __fsub_rn(1.0f, c.b2);
  c.bc2_sqrt = (float)sqrt(1.0 - pow(a.f[1], t));
  c.step = __fdiv_rn(lr, (float)(1.0 - pow(a.f[0], t)));
  if (VEC) {
    const loom_f4 *p = (const loom_f4 *)a.buf[0], *m = (const loom_f4 *)a.buf[1], *v = (const loom_f4 *)a.buf[2],
                  *g = (const loom_f4 *)a.buf[3];
    loom_f4 *p2 = (loom_f4 *)a.buf[7], *m2 = (loom_f4 *)a.buf[8], *v2 = (loom_f4 *)a.buf[9];
    LOOM_CHECK_ALIGN(p, 16), LOOM_CHECK_ALIGN(m, 16), LOOM_CHECK_ALIGN(v, 16), LOOM_CHECK_ALIGN(g, 16);
    LOOM_CHECK_ALIGN(p2, 16), LOOM_CHECK_ALIGN(m2, 16), LOOM_CHECK_ALIGN(v2, 16);
    LOOM_GRID_LOOP(k, n / 4) {
      loom_f4 P = p[k], M = m[k], Vv = v[k], G = g[k], P2, M2, V2;
      c.one(P.x, M.x, Vv.x, G.x, P2.x, M2.x, V2.x);
      c.one(P.y, M.y, Vv.y, G.y, P2.y, M2.y, V2.y);
      c.one(P.z, M.z, Vv.z, G.z, P2.z, M2.z, V2.z);
      c.one(P.w, M.w, Vv.w, G.w, P2.w, M2.w, V2.w);
      p2[k] = P2;
      m2[k] = M2;
      v2[k] = V2;
      if (COPY) {   /* 4 copies in one 8-byte store (the copy of a 16-byte-aligned span is 8-byte aligned) */
        loom_v4<typename SC::T> C;
        typename SC::T *cp = LOOM_OUT(SC, 10);
        SC::st(C.v, 0, P2.x), SC::st(C.v, 1, P2.y), SC::st(C.v, 2, P2.z), SC::st(C.v, 3, P2.w);
        loom_stv4(cp + 4 * k, C);
      }
    }
  } else {
    const typename SP::T *p = LOOM_IN(SP, 0);
    const typename SM::T *m = LOOM_IN(SM, 1);
    const typename SV::T *v = LOOM_IN(SV, 2);
    const typename SG::T *g = LOOM_IN(SG, 3);
    typename SP::T *p2 = LOOM_OUT(SP, 7);
    typename SM::T *m2 = LOOM_OUT(SM, 8);
    typename SV::T *v2 = LOOM_OUT(SV, 9);
    LOOM_GRID_LOOP(k, n) {
      float P2, M2, V2;
      c.one(SP::ld(p, k), SM::ld(m, k), SV::ld(v, k), SG::ld(g, k), P2, M2, V2);
      SP::st(p2, k, P2);
      SM::st(m2, k, M2);
      SV::st(v2, k, V2);
      if (COPY) SC::st(LOOM_OUT(SC, 10), k, SP::rnd(P2));
    }
  }
}
template <class SP, class SM, class SV, class SG, class SS, bool VEC>
LOOM_DEV void loom_adamw(const LoomArgs &a) {
  loom_adamw_impl<SP, SM, SV, SG, SS, loom_sbf16, false, VEC>(a);
}
template <class SP, class SM, class SV, class SG, class SS, class SC, bool VEC>
LOOM_DEV void loom_adamw_copy(const LoomArgs &a) {
  loom_adamw_impl<SP, SM, SV, SG, SS, SC, true, VEC>(a);
}

