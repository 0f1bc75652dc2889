/* ---------------------------------------------------------------- loom prelude
   Everything below is self-contained CUDA C++ (no headers needed): it compiles as is with NVRTC
   and with nvcc.  Storage conversions are bit manipulations that round like ir/types.c
   (dtype_round): bf16 round-to-nearest-even on the upper 16 bits, f16 and f8 with
   subnormals, f8e4m3 saturating at +-448. */
#define LOOM_INF __int_as_float(0x7f800000)
#define LOOM_DEV __device__ __forceinline__
/* A wide access's address must be a multiple of its size on a GPU (else a misaligned-address
   fault); x86 does not care, so the emulated device checks it here. */
#ifdef LOOM_EMU
#define LOOM_CHECK_ALIGN(p, n) loom_emu_check_align((const void *)(p), n, #p)
#else
#define LOOM_CHECK_ALIGN(p, n) ((void)0)
#endif

LOOM_DEV bool loom_isnan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }
LOOM_DEV bool loom_isinf(float x) { return (__float_as_uint(x) & 0x7fffffffu) == 0x7f800000u; }

LOOM_DEV float loom_bf16_to_f32(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
LOOM_DEV unsigned short loom_f32_to_bf16(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);   /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
LOOM_DEV float loom_round_bf16(float x) { return loom_isnan(x) ? x : loom_bf16_to_f32(loom_f32_to_bf16(x)); }

/* ir/types.c round_to_format: mbits mantissa bits, exponent bias, largest finite value. */
LOOM_DEV float loom_round_fmt(float x, int mbits, int bias, float maxval, bool has_inf) {
  if (loom_isnan(x)) return x;
  if (loom_isinf(x)) return has_inf ? x : copysignf(maxval, x);
  if (x == 0.0f) return x;
  int e;
  frexpf(fabsf(x), &e);
  int ex = e - 1;
  if (ex < 1 - bias) ex = 1 - bias;
  float q = ldexpf(1.0f, ex - mbits);
  float r = rintf(x / q) * q;
  if (fabsf(r) > maxval) return has_inf ? copysignf(LOOM_INF, x) : copysignf(maxval, x);
  return r;
}
LOOM_DEV float loom_round_f16(float x) { return loom_round_fmt(x, 10, 15, 65504.0f, true); }
LOOM_DEV float loom_round_f8e4m3(float x) { return loom_round_fmt(x, 3, 7, 448.0f, false); }
LOOM_DEV float loom_round_f8e5m2(float x) { return loom_round_fmt(x, 2, 15, 57344.0f, true); }

LOOM_DEV float loom_f16_to_f32(unsigned short h) {
  unsigned s = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 31u, m = (unsigned)h & 1023u;
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f;   /* m * 2^-24 */
    return s ? -v : v;
  }
  if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
  return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
/* Bits of an f32 that is already an f16 value (or inf/NaN). */
LOOM_DEV unsigned short loom_f16_bits(float r) {
  unsigned u = __float_as_uint(r), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u);
  if (a == 0x7f800000u) return (unsigned short)(s | 0x7c00u);
  if (a == 0) return (unsigned short)s;
  int e = (int)(a >> 23) - 127;
  if (e >= -14) return (unsigned short)(s | ((unsigned)(e + 15) << 10) | ((a >> 13) & 1023u));
  return (unsigned short)(s | (unsigned)(__uint_as_float(a) * 16777216.0f));   /* subnormal: |r| / 2^-24 */
}
LOOM_DEV unsigned short loom_f32_to_f16(float x) { return loom_f16_bits(loom_round_f16(x)); }
LOOM_DEV float loom_f8e5m2_to_f32(unsigned char b) { return loom_f16_to_f32((unsigned short)((unsigned)b << 8)); }
LOOM_DEV unsigned char loom_f32_to_f8e5m2(float x) { return (unsigned char)(loom_f16_bits(loom_round_f8e5m2(x)) >> 8); }
LOOM_DEV float loom_f8e4m3_to_f32(unsigned char b) {
  unsigned s = b & 0x80u, e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return __int_as_float(0x7fc00000);
  float v = e == 0 ? (float)m * 0.001953125f : ldexpf(1.0f + (float)m * 0.125f, (int)e - 7);
  return s ? -v : v;
}
LOOM_DEV unsigned char loom_f32_to_f8e4m3(float x) {
  float r = loom_round_f8e4m3(x);
  unsigned u = __float_as_uint(r), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned char)(s | 0x7fu);
  if (a == 0) return (unsigned char)s;
  int e = (int)(a >> 23) - 127;
  if (e >= -6) return (unsigned char)(s | ((unsigned)(e + 7) << 3) | ((a >> 20) & 7u));
  return (unsigned char)(s | (unsigned)(fabsf(r) * 512.0f));   /* subnormal: |r| / 2^-9 */
}

/* Storage classes: T is the element in memory, V the value computed with (float for every
   float dtype, long long for integers); ld reads element i as V, st rounds and writes. */
struct loom_sf32 {
  typedef float T;
  typedef float V;
  static LOOM_DEV float ld(const T *p, long long i) { return p[i]; }
  static LOOM_DEV void st(T *p, long long i, float v) { p[i] = v; }
  static LOOM_DEV float rnd(float v) { return v; }
};
struct loom_sbf16 {
  typedef unsigned short T;
  static constexpr bool is_bf16 = true;
  typedef float V;
  static LOOM_DEV float ld(const T *p, long long i) { return loom_bf16_to_f32(p[i]); }
  static LOOM_DEV void st(T *p, long long i, float v) { p[i] = loom_f32_to_bf16(v); }
  static LOOM_DEV float rnd(float v) { return loom_round_bf16(v); }
};
struct loom_sf16 {
  typedef unsigned short T;
  static constexpr bool is_bf16 = false;
  typedef float V;
  static LOOM_DEV float ld(const T *p, long long i) { return loom_f16_to_f32(p[i]); }
  static LOOM_DEV void st(T *p, long long i, float v) { p[i] = loom_f32_to_f16(v); }
  static LOOM_DEV float rnd(float v) { return loom_round_f16(v); }
};
struct loom_sf8e4m3 {
  typedef unsigned char T;
  typedef float V;
  static LOOM_DEV float ld(const T *p, long long i) { return loom_f8e4m3_to_f32(p[i]); }
  static LOOM_DEV void st(T *p, long long i, float v) { p[i] = loom_f32_to_f8e4m3(v); }
  static LOOM_DEV float rnd(float v) { return loom_round_f8e4m3(v); }
};
struct loom_sf8e5m2 {
  typedef unsigned char T;
  typedef float V;
  static LOOM_DEV float ld(const T *p, long long i) { return loom_f8e5m2_to_f32(p[i]); }
  static LOOM_DEV void st(T *p, long long i, float v) { p[i] = loom_f32_to_f8e5m2(v); }
  static LOOM_DEV float rnd(float v) { return loom_round_f8e5m2(v); }
};
struct loom_si32 {
  typedef int T;
  typedef long long V;
  static LOOM_DEV long long ld(const T *p, long long i) { return p[i]; }
  static LOOM_DEV void st(T *p, long long i, long long v) { p[i] = (int)v; }
  static LOOM_DEV long long rnd(long long v) { return v; }
};
struct loom_sbool {
  typedef unsigned char T;
  typedef long long V;
  static LOOM_DEV long long ld(const T *p, long long i) { return p[i]; }
  static LOOM_DEV void st(T *p, long long i, long long v) { p[i] = v != 0; }
  static LOOM_DEV long long rnd(long long v) { return v; }
};
/* Raw elements of 4, 2 and 1 bytes (data movement that only copies). */
struct loom_sraw4 { typedef unsigned int T; };
struct loom_sraw2 { typedef unsigned short T; };
struct loom_sraw1 { typedef unsigned char T; };

/* Four elements moved as one access (8 or 16 bytes for 2- and 4-byte elements): the fused
   elementwise kernels' loads and stores. */
template <class T>
struct alignas(4 * sizeof(T)) loom_v4 { T v[4]; };
template <class T>
LOOM_DEV loom_v4<T> loom_ldv4(const T *p) {
  LOOM_CHECK_ALIGN(p, sizeof(loom_v4<T>));
  return *(const loom_v4<T> *)p;
}
template <class T>
LOOM_DEV void loom_stv4(T *p, const loom_v4<T> &x) {
  LOOM_CHECK_ALIGN(p, sizeof(loom_v4<T>));
  *(loom_v4<T> *)p = x;
}

#define LOOM_IN(S, k) ((const typename S::T *)a.buf[k])
#define LOOM_OUT(S, k) ((typename S::T *)a.buf[k])

/* ---------------------------------------------------------------- reductions
   Deterministic: a fixed tree of shuffles inside each warp, then warp results in warp order;
   every thread of the block gets the same total.  The block size is a multiple of 32;
   sh holds at least 32 floats (two calls in a row are safe: each starts with a barrier). */
LOOM_DEV float loom_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
LOOM_DEV float loom_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
LOOM_DEV float loom_block_sum(float v, float *sh) {
  v = loom_warp_sum(v);
  int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31), nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  return loom_warp_sum(l < nw ? sh[l] : 0.0f);
}
LOOM_DEV float loom_block_max(float v, float *sh) {
  v = loom_warp_max(v);
  int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31), nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  return loom_warp_max(l < nw ? sh[l] : -LOOM_INF);
}
/* Two sums at once (sh: 64 floats). */
LOOM_DEV void loom_block_sum2(float &a0, float &a1, float *sh) {
  a0 = loom_warp_sum(a0);
  a1 = loom_warp_sum(a1);
  int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31), nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (l == 0) {
    sh[w] = a0;
    sh[32 + w] = a1;
  }
  __syncthreads();
  a0 = loom_warp_sum(l < nw ? sh[l] : 0.0f);
  a1 = loom_warp_sum(l < nw ? sh[32 + l] : 0.0f);
}
/* Online softmax statistics: (max m, sum s of exp(x - m)); merging two. */
LOOM_DEV void loom_ms_merge(float &m, float &s, float m2, float s2) {
  float mx = fmaxf(m, m2);
  if (mx == -LOOM_INF) return;   /* both empty */
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}
LOOM_DEV void loom_ms_add(float &m, float &s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else if (x != -LOOM_INF) {   /* -inf adds nothing (masked logits; exp(-inf - -inf) would be NaN) */
    s += expf(x - m);
  }
}
LOOM_DEV void loom_block_ms(float &m, float &s, float *sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    loom_ms_merge(m, s, m2, s2);
  }
  int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31), nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (l == 0) {
    sh[w] = m;
    sh[32 + w] = s;
  }
  __syncthreads();
  m = l < nw ? sh[l] : -LOOM_INF;
  s = l < nw ? sh[32 + l] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    loom_ms_merge(m, s, m2, s2);
  }
}

/* Generic block reduction of fused kernels (sum or max; float or long long); sh: 32 slots. */
LOOM_DEV float loom_max(float a, float b) { return fmaxf(a, b); }
LOOM_DEV long long loom_max(long long a, long long b) { return a > b ? a : b; }
template <class T, bool MAX>
LOOM_DEV T loom_block_reduce(T v, T *sh, T init) {
  for (int o = 16; o > 0; o >>= 1) {
    T u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? loom_max(v, u) : v + u;
  }
  int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31), nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = l < nw ? sh[l] : init;
  for (int o = 16; o > 0; o >>= 1) {
    T u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? loom_max(v, u) : v + u;
  }
  return v;
}

/* ---------------------------------------------------------------- fused-kernel arithmetic
   The reference executor's expressions (ir/interp_ops.c), operation for operation, with the
   _rn intrinsics so that no multiply-add is contracted into an FMA. */
LOOM_DEV float loom_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
LOOM_DEV float loom_silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
LOOM_DEV float loom_gelu_tanh(float x) {
  const float c = 0.7978845608028654f;
  float inner = __fadd_rn(x, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(__fmul_rn(c, inner))));
}
LOOM_DEV float loom_gelu_tanh_grad(float a, float b) {
  const float c = 0.7978845608028654f;
  float u = __fmul_rn(c, __fadd_rn(a, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, a), a), a))), t = tanhf(u);
  float left = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
  float right = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, a), __fsub_rn(1.0f, __fmul_rn(t, t))), c),
                          __fadd_rn(1.0f, __fmul_rn(__fmul_rn(__fmul_rn(3.0f, 0.044715f), a), a)));
  return __fmul_rn(b, __fadd_rn(left, right));
}
LOOM_DEV float loom_silu_grad(float a, float b) {
  float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-a)));
  return __fmul_rn(__fmul_rn(b, sg), __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, sg))));
}
LOOM_DEV long long loom_idiv(long long a, long long b) {
  return b == 0 ? 0 : b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b;
}
LOOM_DEV long long loom_ineg(long long a) { return (long long)(0ull - (unsigned long long)a); }

