/* ir/fmath.h — loom's exp and tanh, the definitions every backend's kernels follow.
 *
 * libm's expf/tanhf are scalar calls that no compiler vectorizes; a GELU over 2M elements
 * spent ~35 ms in them on one core.  These are straight-line arithmetic (range reduction,
 * polynomial, select) that the LLVM loop vectorizer turns into vector code, and the CPU
 * backend emits exactly these operations in this order (codegen/cpu/llvm_module.c), so the
 * reference executor and the JIT kernels agree bit for bit.  Both need IEEE f32 arithmetic
 * without contraction into FMAs (CMakeLists.txt builds with -ffp-contract=off).
 *
 * Accuracy against the exact functions (tests/unit/test_codegen_cpu.c sweeps ~37M points):
 * exp within 1.2 ulp on [-110, 110], tanh within 1.5 ulp; NaN stays NaN, exp(-inf) = 0,
 * exp(+inf) = +inf, tanh(+-inf) = +-1, tanh(-0) = -0; exp results below ~1e-38 are
 * subnormal or 0 (within one subnormal step).
 *
 * exp: x clamped to [-104, 89] (results outside are 0 / inf anyway); n = round(x log2 e) by
 * the 1.5 * 2^23 trick; r = x - n ln2 with ln2 in two parts (Cody-Waite: n * 0.693359375 is
 * exact for |n| <= 150), |r| <= ln2/2; e^r by its degree-7 Taylor polynomial (truncation
 * < 6e-9 relative); times 2^n as 2^(n>>1) * 2^(n - (n>>1)), two normal floats, so results
 * near the overflow and underflow ends need no special case.
 *
 * tanh: |x| < 0.55: the odd Taylor series x + x^3 P(x^2) through x^15 (truncation < 1e-9
 * relative there); otherwise 1 - 2 / (e^(2|x|) + 1) with |x| clamped to 9 (tanhf(9) rounds
 * to 1); the sign copied from x.
 */
#ifndef LOOM_IR_FMATH_H
#define LOOM_IR_FMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The constants as the emitters print them (codegen/cpu/llvm_module.c uses these arrays). */
static const double FM_EXP_COEF[8] = {1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
static const double FM_TANH_COEF[7] = {-1.0 / 3,         2.0 / 15,          -17.0 / 315,         62.0 / 2835,
                                       -1382.0 / 155925, 21844.0 / 6081075, -929569.0 / 638512875};
#define FM_EXP_LO (-104.0f)
#define FM_EXP_HI 89.0f
#define FM_LOG2E 1.44269504f
#define FM_ROUNDER 12582912.0f   /* 1.5 * 2^23 */
#define FM_LN2_HI 0.693359375f
#define FM_LN2_LO (-2.12194440e-4f)
#define FM_TANH_SMALL 0.55f
#define FM_TANH_CLAMP 9.0f

static inline float fm_pow2i(int32_t e) {   /* 2^e for -126 <= e <= 127 */
  uint32_t u = (uint32_t)(e + 127) << 23;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float fm_expf(float x) {
  float xc = fminf(fmaxf(x, FM_EXP_LO), FM_EXP_HI);
  float t = xc * FM_LOG2E;
  float n = (t + FM_ROUNDER) - FM_ROUNDER;
  float r = xc - n * FM_LN2_HI;
  r = r - n * FM_LN2_LO;
  float p = 0.0f + (float)FM_EXP_COEF[0];
  for (int i = 1; i < 8; i++) p = p * r + (float)FM_EXP_COEF[i];
  int32_t ni = (int32_t)n, e1 = ni >> 1, e2 = ni - e1;
  float y = p * fm_pow2i(e1) * fm_pow2i(e2);
  return isnan(x) ? x : y;
}

static inline float fm_tanhf(float x) {
  float a = fabsf(x);
  float e = fm_expf(fminf(a, FM_TANH_CLAMP) * 2.0f);
  float big = 1.0f - 2.0f / (e + 1.0f);
  float z = a * a;
  float p = 0.0f + (float)FM_TANH_COEF[6];
  for (int i = 5; i >= 0; i--) p = p * z + (float)FM_TANH_COEF[i];
  float small = a + a * z * p;
  float t = copysignf(a < FM_TANH_SMALL ? small : big, x);
  return isnan(x) ? x : t;
}

#endif
