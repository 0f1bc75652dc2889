/* runtime/cpu/cpu_vec.h — small loops shared by the CPU kernels (internal to runtime/cpu_*.c).
 *
 * GCC at -O2 (its "very cheap" vectorizer cost model) only vectorizes a loop whose trip
 * count it knows to be a multiple of the vector width, and never reassociates a float sum.
 * So hot loops are written as blocks of CV_W = 8 independent lanes (a constant-trip inner
 * loop the SLP vectorizer turns into vector instructions) plus a scalar tail, and sums
 * keep 8 partial accumulators combined in a fixed order.  The order of every float
 * operation is therefore fixed by the source, whatever the vector width the compiler
 * picks, and never depends on threads.
 */
#ifndef LOOM_RUNTIME_CPU_VEC_H
#define LOOM_RUNTIME_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CV_W 8

static inline float cv_hsum8(const float *a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* sum of x[0..n) in 8 lanes */
static inline float cv_sum(const float *restrict x, int64_t n) {
  float acc[CV_W] = {0};
  int64_t i = 0;
  for (; i + CV_W <= n; i += CV_W)
    for (int j = 0; j < CV_W; j++) acc[j] += x[i + j];
  float s = cv_hsum8(acc);
  for (; i < n; i++) s += x[i];
  return s;
}

/* sum of (x - c)^2 */
static inline float cv_sumsq_centered(const float *restrict x, float c, int64_t n) {
  float acc[CV_W] = {0};
  int64_t i = 0;
  for (; i + CV_W <= n; i += CV_W)
    for (int j = 0; j < CV_W; j++) acc[j] += (x[i + j] - c) * (x[i + j] - c);
  float s = cv_hsum8(acc);
  for (; i < n; i++) s += (x[i] - c) * (x[i] - c);
  return s;
}

static inline float cv_dot(const float *restrict a, const float *restrict b, int64_t n) {
  float acc[CV_W] = {0};
  int64_t i = 0;
  for (; i + CV_W <= n; i += CV_W)
    for (int j = 0; j < CV_W; j++) acc[j] += a[i + j] * b[i + j];
  float s = cv_hsum8(acc);
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

static inline float cv_max(const float *restrict x, int64_t n) {
  float acc[CV_W];
  for (int j = 0; j < CV_W; j++) acc[j] = -INFINITY;
  int64_t i = 0;
  for (; i + CV_W <= n; i += CV_W)
    for (int j = 0; j < CV_W; j++) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  float m = -INFINITY;
  for (int j = 0; j < CV_W; j++) m = fmaxf(m, acc[j]);
  for (; i < n; i++) m = fmaxf(m, x[i]);
  return m;
}

/* y += a * x */
static inline void cv_axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
  int64_t i = 0;
  for (; i + CV_W <= n; i += CV_W)
    for (int j = 0; j < CV_W; j++) y[i + j] += a * x[i + j];
  for (; i < n; i++) y[i] += a * x[i];
}

/* y = x / d (division, not a reciprocal multiply, as the reference executor does) */
static inline void cv_div(float *y, const float *x, float d, int64_t n) {
  int64_t i = 0;
  for (; i + CV_W <= n; i += CV_W) {
    float t[CV_W];
    for (int j = 0; j < CV_W; j++) t[j] = x[i + j] / d;
    for (int j = 0; j < CV_W; j++) y[i + j] = t[j];
  }
  for (; i < n; i++) y[i] = x[i] / d;
}

/* ---- 4-float vectors (GCC/clang vector extensions: SSE on x86-64, NEON on arm64) ----
   Where a loop nest keeps many accumulators in registers (attention's dot products),
   GCC -O2's auto-vectorizer leaves them in memory or scalar; explicit 16-byte vectors
   compile to plain vector code on every target.  Each lane does exactly the IEEE
   operations a scalar loop would, in the same order, so results do not depend on it. */
typedef float cv_f4 __attribute__((vector_size(16)));

/* The hottest loops (attention's register-blocked tiles) are also compiled for AVX2 and
   picked at load time: the same 4-lane code, but a broadcast from memory becomes a load
   (vbroadcastss) instead of a shuffle, the bottleneck of the SSE2 baseline, ~1.5x faster.
   Neither clone contracts a*b+c into an FMA (ISO C mode, and avx2 does not include fma),
   so both give bitwise the same results. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
/* (not under ThreadSanitizer: its instrumented ifunc resolvers run before it starts) */
#define CV_HOT __attribute__((target_clones("avx2", "default")))
#else
#define CV_HOT
#endif
typedef int32_t cv_i4 __attribute__((vector_size(16)));

static inline cv_f4 cv_ld4(const float *p) {
  cv_f4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void cv_st4(float *p, cv_f4 v) { memcpy(p, &v, sizeof v); }
static inline cv_f4 cv_set4(float x) { return (cv_f4){x, x, x, x}; }

/* exp(x) for 8 lanes, x <= 0: Cephes' expf (range reduction by ln 2 in two parts, degree-6
   polynomial), max relative error ~1e-7 (about one ulp; glibc's expf is within half an
   ulp).  Results below exp(-87.3) ~ 1.2e-38 flush to 0 (expf would give subnormals), and
   so do exp(-inf) and exp(NaN) (a NaN among softmax inputs still makes their maximum and so
   every result NaN).  Positive x is not supported (the callers subtract a maximum first).
   8 lanes: two SSE registers on the baseline, one AVX2 register in CV_HOT's AVX2 clone.
   ~4-8x faster than calling expf per element. */
typedef float cv_f8 __attribute__((vector_size(32)));
typedef int32_t cv_i8 __attribute__((vector_size(32)));

/* In place through a pointer: a 32-byte vector passed by value would make GCC warn about the
   AVX calling convention (-Wpsabi), though the function is always inlined. */
__attribute__((always_inline)) static inline void cv_exp8(cv_f8 *xp) {
  cv_f8 x = *xp;
  const cv_f8 lo = {-87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f};
  /* lanes that flush to 0 compute on -87.3 instead: no out-of-range float -> int below */
  cv_i8 under = ~(x >= lo);
  x = (cv_f8)(((cv_i8)x & ~under) | ((cv_i8)lo & under));
  /* n = round(x / ln 2) by the 1.5 * 2^23 trick (the default rounding mode) */
  cv_f8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  cv_f8 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  cv_f8 z = r * r, y = 1.9875691500e-4f * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  cv_i8 e = (__builtin_convertvector(n, cv_i8) + 127) << 23;
  y = y * (cv_f8)e;
  *xp = (cv_f8)((cv_i8)y & ~under);
}

/* y[i] = exp(x[i] - c) for i < n (x and y may be the same; y NULL: not stored); returns
   the sum of the exponentials in 8 lanes (fixed order). */
CV_HOT __attribute__((unused)) static float cv_exp_sub_sum(float *y, const float *x, float c, int64_t n) {
  cv_f8 acc = {0}, cc = {c, c, c, c, c, c, c, c}, v;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    memcpy(&v, x + i, sizeof v);
    v -= cc;
    cv_exp8(&v);
    if (y) memcpy(y + i, &v, sizeof v);
    acc += v;
  }
  float lanes[8], t[8] = {0};
  memcpy(lanes, &acc, sizeof lanes);
  float s = cv_hsum8(lanes);
  if (i < n) {   /* the tail through the same lanes: zero-padded, only n - i kept */
    memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
    memcpy(&v, t, sizeof v);
    v -= cc;
    cv_exp8(&v);
    memcpy(t, &v, sizeof t);
    for (int64_t k = 0; k < n - i; k++) {
      s += t[k];
      if (y) y[i + k] = t[k];
    }
  }
  return s;
}

/* 64-byte aligned allocation of n floats (n may be 0); free with free(). */
static inline float *cv_alloc(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return aligned_alloc(64, bytes ? bytes : 64);
}

/* Per-thread scratch stride: n floats rounded up to a cache line. */
static inline size_t cv_stride(size_t n) { return (n + 15) / 16 * 16; }

#endif
