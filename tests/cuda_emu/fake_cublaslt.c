/* tests/cuda_emu/fake_cublaslt.c — a test double of cuBLASLt for the emulated device.
 *
 * Built as a shared library and loaded by the loom runtime through LOOM_LIBCUBLASLT on
 * machines without a GPU.  On the emulated device, device pointers are host pointers and
 * streams are synchronous, so cublasLtMatmul computes D = alpha op(A) op(B) + beta C on
 * the host right away.  Only what loom uses is here: f32 scale, f32 / f16 / bf16 data,
 * column-major strided batches, transposes, beta, the epilogues loom sets (BIAS, GELU_AUX_BIAS,
 * BGRADA, DGELU, DGELU_BGRAD).  Not for performance.
 * On a stream that is capturing (the emulated driver's cuStreamIsCapturing, found through
 * LOOM_LIBCUDA), the matmul is recorded instead as a host function of the graph
 * (cuLaunchHostFunc) holding copies of its descriptors and scalars, run when the graph is.
 *
 * Written from the cuBLASLt documentation's semantics (and the prototypes of cublasLt.h):
 *   gcc -std=c11 -O2 -fPIC -shared -I/usr/local/cuda/include fake_cublaslt.c -o libfakelt.so -lm
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#define ALGO_MAGIC 0x10f7a1e0u /* what the heuristic hands out and the matmul wants back */
#define FAKE_CANDIDATES 3      /* algorithms the heuristic offers; the last fails to run */

typedef struct {
  cublasComputeType_t compute;
  int32_t trans_a, trans_b; /* cublasOperation_t: N or T */
  /* epilogues (loom's: BIAS, GELU_AUX_BIAS): D = epi(alpha op(A) op(B) + beta C + bias), the
     bias a vector of m (one per row of D), GELU's aux the pre-activation (m x n, ld aux_ld);
     BGRADA: D = alpha op(A) op(B) + beta C, and the bias pointer receives the bias gradient
     sum_k op(A)[i][k] for each of the m rows (batch 1); DGELU: D = (alpha op(A) op(B) + beta C)
     times GELU's derivative at aux (the forward's pre-activation, m x n, ld aux_ld, D's
     type); DGELU_BGRAD also sums each row of that D (before it is rounded to D's type) into
     the bias pointer */
  uint32_t epilogue;
  const void *bias;
  int32_t bias_type;        /* cudaDataType_t; -1: D's type */
  void *aux;
  int64_t aux_ld;
} Desc;

typedef struct {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride; /* elements between batch items */
} Layout;

typedef struct {
  uint64_t max_workspace;
  uint32_t align[4]; /* minimum alignment of A, B, C, D in bytes */
} Pref;

/* ------------------------------------------------------------------ numbers */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static int elem_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0) return u2f(sign | f2u(ldexpf((float)m, -24)));  /* zero or subnormal */
  if (e == 31) return u2f(sign | 0x7F800000u | (m << 13));    /* inf or NaN */
  return u2f(sign | ((e + 112) << 23) | (m << 13));
}

static uint16_t f32_to_f16(float f) {
  uint32_t x = f2u(f), sign = (x >> 16) & 0x8000, ax = x & 0x7FFFFFFF;
  if (ax > 0x7F800000) return (uint16_t)(sign | 0x7E00);
  if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* 65520 and up round to inf */
  if (ax < 0x38800000)                                     /* below 2^-14: subnormal, units of 2^-24 */
    return (uint16_t)(sign | (uint32_t)rintf(u2f(ax) * 0x1p24f)); /* rintf: nearest even */
  uint32_t r = ax + 0xFFF + ((ax >> 13) & 1);              /* round to nearest even at bit 13 */
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40); /* keep NaN quiet */
  return (uint16_t)((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

/* TF32 keeps 10 mantissa bits: what FAST_TF32 tensor cores read of an f32 input. */
static float to_tf32(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7F800000) == 0x7F800000) return f;
  return u2f((x + 0xFFF + ((x >> 13) & 1)) & ~0x1FFFu);
}

static float load(cudaDataType_t t, const void *p, int64_t i) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return t == CUDA_R_16BF ? u2f((uint32_t)h << 16) : f16_to_f32(h);
}

static void store(cudaDataType_t t, void *p, int64_t i, float v) {
  if (t == CUDA_R_32F) ((float *)p)[i] = v;
  else ((uint16_t *)p)[i] = t == CUDA_R_16BF ? f32_to_bf16(v) : f32_to_f16(v);
}

/* ------------------------------------------------------------------ handles and descriptors */

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle) {
  if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = (cublasLtHandle_t)calloc(1, 16);
  return *lightHandle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  free(lightHandle);
  return CUBLAS_STATUS_SUCCESS;
}

size_t CUBLASWINAPI cublasLtGetVersion(void) { return 130000; }

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) { return cublasLtGetStatusName(status); }

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
  if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
  *matmulDesc = NULL;
  if ((computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32 &&
       computeType != CUBLAS_COMPUTE_32F_PEDANTIC) || scaleType != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  Desc *d = calloc(1, sizeof *d);
  if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
  d->compute = computeType;
  d->trans_a = d->trans_b = CUBLAS_OP_N;
  d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d->bias_type = -1;   /* D's type */
  *matmulDesc = (cublasLtMatmulDesc_t)d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  free(matmulDesc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                           size_t sizeInBytes) {
  Desc *d = (Desc *)matmulDesc;
  if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER || attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER) {
    if (sizeInBytes != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER ? (void *)&d->bias : (void *)&d->aux, buf, sizeof(void *));
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) {
    if (sizeInBytes != 8) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&d->aux_ld, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (sizeInBytes != 4) return CUBLAS_STATUS_INVALID_VALUE; /* the others are 32-bit */
  int32_t v;
  memcpy(&v, buf, 4);
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA:
  case CUBLASLT_MATMUL_DESC_TRANSB:
    if (v == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
    *(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->trans_a : &d->trans_b) = v;
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_EPILOGUE:
    if ((uint32_t)v != CUBLASLT_EPILOGUE_DEFAULT && (uint32_t)v != CUBLASLT_EPILOGUE_BIAS &&
        (uint32_t)v != CUBLASLT_EPILOGUE_GELU_AUX_BIAS && (uint32_t)v != CUBLASLT_EPILOGUE_BGRADA &&
        (uint32_t)v != CUBLASLT_EPILOGUE_DGELU && (uint32_t)v != CUBLASLT_EPILOGUE_DGELU_BGRAD)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    d->epilogue = (uint32_t)v;
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    if (v != CUDA_R_32F && v != CUDA_R_16F && v != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    d->bias_type = v;
    return CUBLAS_STATUS_SUCCESS;
  default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
  *matLayout = NULL;
  if (type != CUDA_R_32F && type != CUDA_R_16F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < 0 || (uint64_t)ld < rows) return CUBLAS_STATUS_INVALID_VALUE; /* columns would overlap */
  Layout *l = calloc(1, sizeof *l);
  if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
  *l = (Layout){.type = type, .rows = rows, .cols = cols, .ld = ld, .batch = 1, .stride = 0};
  *matLayout = (cublasLtMatrixLayout_t)l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  free(matLayout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                             size_t sizeInBytes) {
  Layout *l = (Layout *)matLayout;
  if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t v32;
  switch (attr) {
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
    if (sizeInBytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&v32, buf, 4);
    if (v32 < 1) return CUBLAS_STATUS_INVALID_VALUE;
    l->batch = v32;
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
    if (sizeInBytes != 8) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&l->stride, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
  case CUBLASLT_MATRIX_LAYOUT_ORDER:
    if (sizeInBytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&v32, buf, 4);
    return v32 == CUBLASLT_ORDER_COL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
  default: return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  Pref *p = calloc(1, sizeof *p);
  *pref = (cublasLtMatmulPreference_t)p;
  if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
  for (int i = 0; i < 4; i++) p->align[i] = 256; /* the documented default */
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  free(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void *buf, size_t sizeInBytes) {
  Pref *p = (Pref *)pref;
  if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (sizeInBytes != 8) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&p->max_workspace, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    if (sizeInBytes != 4) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

/* ------------------------------------------------------------------ the problem */

typedef struct { int64_t m, n, k, batch; } Shape;

/* op(A) m x k, op(B) k x n, C and D m x n, one batch count: false on any mismatch. */
static bool check_shape(const Desc *d, const Layout *a, const Layout *b, const Layout *c, const Layout *dd, Shape *s) {
  uint64_t m = d->trans_a == CUBLAS_OP_T ? a->cols : a->rows, k = d->trans_a == CUBLAS_OP_T ? a->rows : a->cols;
  uint64_t bk = d->trans_b == CUBLAS_OP_T ? b->cols : b->rows, n = d->trans_b == CUBLAS_OP_T ? b->rows : b->cols;
  if (bk != k || c->rows != m || c->cols != n || dd->rows != m || dd->cols != n) return false;
  if (a->batch != b->batch || a->batch != c->batch || a->batch != dd->batch) return false;
  *s = (Shape){(int64_t)m, (int64_t)n, (int64_t)k, a->batch};
  return true;
}

/* f32 throughout, or f16 / bf16 inputs with the same type or f32 out. */
static bool check_types(const Layout *a, const Layout *b, const Layout *c, const Layout *d) {
  if (a->type != b->type || c->type != d->type) return false;
  return a->type == c->type || c->type == CUDA_R_32F;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int *returnAlgoCount) {
  if (returnAlgoCount) *returnAlgoCount = 0;
  if (!lightHandle || !operationDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !preference ||
      requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
    return CUBLAS_STATUS_INVALID_VALUE;
  const Layout *L[4] = {(Layout *)Adesc, (Layout *)Bdesc, (Layout *)Cdesc, (Layout *)Ddesc};
  const Pref *p = (const Pref *)preference;
  Shape s;
  if (!check_shape((Desc *)operationDesc, L[0], L[1], L[2], L[3], &s) || !check_types(L[0], L[1], L[2], L[3]))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < 4; i++) /* no kernel reads elements split across pointers */
    if (p->align[i] % (uint32_t)elem_size(L[i]->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  /* Up to FAKE_CANDIDATES algorithms, as the real heuristic offers several: they compute the
     same, but the last one always fails to run (NOT_SUPPORTED), as a real candidate can, so
     loom's timing of the candidates (LOOM_CUDA_GEMM_TUNE) passes over a failure every time. */
  int n = requestedAlgoCount < FAKE_CANDIDATES ? requestedAlgoCount : FAKE_CANDIDATES;
  for (int k = 0; k < n; k++) {
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[k];
    memset(r, 0, sizeof *r);
    r->algo.data[0] = ALGO_MAGIC; /* workspaceSize stays 0 */
    r->algo.data[1] = (uint64_t)k;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
  }
  *returnAlgoCount = n;
  return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ the matmul */

/* Copies op(X) of one batch item as floats, nv vectors of nk each, a vector's k contiguous:
   out[v*nk + kk].  k_contig says X holds a vector's k at stride 1 (else at stride ld). */
static void pack(float *out, const void *x, const Layout *l, bool k_contig, int64_t nv, int64_t nk, bool tf32) {
  for (int64_t v = 0; v < nv; v++)
    for (int64_t kk = 0; kk < nk; kk++) {
      float f = load(l->type, x, k_contig ? kk + v * l->ld : v + kk * l->ld);
      out[v * nk + kk] = tf32 ? to_tf32(f) : f;
    }
}

/* Four rows of op(A) against one column of op(B), the rows interleaved (a[4 kk + r] is row
   r's k = kk, see interleave4): four accumulators, each still summing k in order 0..K-1, one
   multiply and one add per element as before, so the bits do not depend on how the compiler
   groups the lanes.  Not instrumented by the sanitizers: it reads only the packed copies this
   file allocated (pack() reads loom's buffers and store() writes them, both checked), and it
   is most of the emulated device's time. */
__attribute__((no_sanitize("address", "undefined"), noinline))
static void dot4(const float *a, const float *b, int64_t k, float *out) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t kk = 0; kk < k; kk++) {
    const float bk = b[kk], *ak = a + 4 * kk;
    s0 += ak[0] * bk;
    s1 += ak[1] * bk;
    s2 += ak[2] * bk;
    s3 += ak[3] * bk;
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

/* The packed rows of op(A) (m of k each) as groups of four rows interleaved by k, zeros past
   row m: out[(i / 4) * 4k + 4 kk + i % 4] = in[i k + kk].  Both buffers are this file's own. */
__attribute__((no_sanitize("address", "undefined"), noinline))
static void interleave4(float *out, const float *in, int64_t m, int64_t k) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t kk = 0; kk < k; kk++) out[(i / 4) * 4 * k + 4 * kk + i % 4] = in[i * k + kk];
}

static const char *batch_ptr(const void *p, const Layout *l, int64_t b) {
  return (const char *)p + b * l->stride * elem_size(l->type);
}

/* GELU, tanh form (cuBLASLt's GELU epilogue, GPT-2's gelu_new), in f32. */
static float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* GELU's derivative, tanh form (cuBLASLt's DGELU), in f32: with u = c (x + 0.044715 x^3),
   d/dx 0.5 x (1 + tanh u) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 * 0.044715 x^2). */
static float gelu_tanh_grad(float x) {
  const float c = 0.7978845608028654f;
  float t = tanhf(c * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

/* D = al op(A) op(B) + be C (+ bias, GELU), now (checked by the caller). */
static cublasStatus_t matmul_now(const Desc *d, float al, const void *A, const Layout *la, const void *B, const Layout *lb,
                                 float be, const void *C, const Layout *lc, void *D, const Layout *ld, Shape s) {
  bool bgrad = d->epilogue == CUBLASLT_EPILOGUE_BGRADA;
  bool dgelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU || d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  bool dbias = d->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  bool epi = d->epilogue == CUBLASLT_EPILOGUE_BIAS || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;   /* a bias added */
  bool aux = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || dgelu;
  if (((epi || bgrad || dbias) && !d->bias) || (aux && (!d->aux || d->aux_ld < s.m))) return CUBLAS_STATUS_INVALID_VALUE;
  if ((bgrad || dgelu) && s.batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  float *sums = dbias ? calloc((size_t)s.m + 1, sizeof(float)) : NULL;
  if (dbias && !sums) return CUBLAS_STATUS_ALLOC_FAILED;
  bool tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && la->type == CUDA_R_32F;
  float *pa = malloc((size_t)(s.m * s.k + 1) * sizeof(float));
  float *pa4 = calloc((size_t)((s.m + 3) / 4 * 4 * s.k + 1), sizeof(float)); /* zeroed room for dot4 past row m */
  float *pb = malloc((size_t)(s.n * s.k + 1) * sizeof(float));
  if (!pa || !pa4 || !pb) {
    free(pa), free(pa4), free(pb), free(sums);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  for (int64_t b = 0; b < s.batch; b++) {
    pack(pa, batch_ptr(A, la, b), la, d->trans_a == CUBLAS_OP_T, s.m, s.k, tf32); /* rows of op(A) */
    pack(pb, batch_ptr(B, lb, b), lb, d->trans_b == CUBLAS_OP_N, s.n, s.k, tf32); /* columns of op(B) */
    interleave4(pa4, pa, s.m, s.k);
    const char *cb = C ? batch_ptr(C, lc, b) : NULL;
    void *db = (void *)batch_ptr(D, ld, b);
    for (int64_t i = 0; bgrad && i < s.m; i++) {   /* row i of op(A), summed in order of k */
      float g = 0.0f;
      for (int64_t kk = 0; kk < s.k; kk++) g += pa[i * s.k + kk];
      store(d->bias_type >= 0 ? (cudaDataType_t)d->bias_type : ld->type, (void *)d->bias, i, g);
    }
    for (int64_t j = 0; j < s.n; j++)
      for (int64_t i = 0; i < s.m; i += 4) {
        float acc[4];
        dot4(pa4 + i * s.k, pb + j * s.k, s.k, acc);   /* i is a multiple of 4: its group */
        for (int64_t r = 0; r < 4 && i + r < s.m; r++) {
          float v = al * acc[r];
          /* beta == 0: C is not read, it may hold NaN (documented cuBLAS behaviour) */
          if (be != 0) v += be * load(lc->type, cb, i + r + j * lc->ld);
          if (epi) v += load(d->bias_type >= 0 ? (cudaDataType_t)d->bias_type : ld->type, d->bias, i + r);
          if (d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            store(ld->type, (char *)d->aux + b * ld->stride * elem_size(ld->type), i + r + j * d->aux_ld, v);
            v = gelu_tanh(v);
          }
          if (dgelu) v *= gelu_tanh_grad(load(ld->type, d->aux, i + r + j * d->aux_ld));
          if (dbias) sums[i + r] += v;   /* in order of j */
          store(ld->type, db, i + r + j * ld->ld, v);
        }
      }
  }
  for (int64_t i = 0; dbias && i < s.m; i++) store(d->bias_type >= 0 ? (cudaDataType_t)d->bias_type : ld->type, (void *)d->bias, i, sums[i]);
  free(pa), free(pa4), free(pb), free(sums);
  return CUBLAS_STATUS_SUCCESS;
}

/* A matmul recorded in a graph: everything it reads from the call, copied.  Kept on a list
   for the life of the process (a graph may be replayed until its end). */
typedef struct Captured {
  struct Captured *next;
  Desc d;
  Layout la, lb, lc, ld;
  float al, be;
  const void *A, *B, *C;
  void *D;
  Shape s;
} Captured;
static Captured *captured;

static void run_captured(void *p) {
  Captured *c = p;
  if (matmul_now(&c->d, c->al, c->A, &c->la, c->B, &c->lb, c->be, c->C, &c->lc, c->D, &c->ld, c->s) != CUBLAS_STATUS_SUCCESS)
    fprintf(stderr, "loom-emu: a captured cublasLtMatmul failed (out of memory)\n");
}

/* The emulated driver's capture calls, if LOOM_LIBCUDA is loaded (no driver: nothing captures). */
typedef int (*IsCapturingFn)(void *stream, int *status);
typedef int (*HostFuncFn)(void *stream, void (*fn)(void *), void *data);
static bool driver_capture(IsCapturingFn *is_capturing, HostFuncFn *host_func) {
  const char *lib = getenv("LOOM_LIBCUDA");
  void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (!h) return false;
  *is_capturing = (IsCapturingFn)dlsym(h, "cuStreamIsCapturing");
  *host_func = (HostFuncFn)dlsym(h, "cuLaunchHostFunc");
  dlclose(h);   /* still loaded: loom holds it */
  return *is_capturing && *host_func;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                           const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                           void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  (void)workspace, (void)workspaceSizeInBytes; /* no workspace */
  if (!lightHandle || !computeDesc || !alpha || !beta || !A || !B || !D || !Adesc || !Bdesc || !Cdesc || !Ddesc)
    return CUBLAS_STATUS_INVALID_VALUE;
  const Desc *d = (const Desc *)computeDesc;
  const Layout *la = (Layout *)Adesc, *lb = (Layout *)Bdesc, *lc = (Layout *)Cdesc, *ld = (Layout *)Ddesc;
  Shape s;
  if (!check_shape(d, la, lb, lc, ld, &s) || (algo && algo->data[0] != ALGO_MAGIC)) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo && algo->data[1] == FAKE_CANDIDATES - 1 && FAKE_CANDIDATES > 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!check_types(la, lb, lc, ld)) return CUBLAS_STATUS_NOT_SUPPORTED;
  float al = *(const float *)alpha, be = *(const float *)beta;
  if (be != 0 && !C) return CUBLAS_STATUS_INVALID_VALUE;
  IsCapturingFn is_capturing;
  HostFuncFn host_func;
  int status = 0;
  if (stream && driver_capture(&is_capturing, &host_func) && is_capturing(stream, &status) == 0 && status != 0) {
    Captured *c = calloc(1, sizeof *c);
    if (!c) return CUBLAS_STATUS_ALLOC_FAILED;
    *c = (Captured){.next = captured, .d = *d, .la = *la, .lb = *lb, .lc = *lc, .ld = *ld, .al = al, .be = be,
                    .A = A, .B = B, .C = C, .D = D, .s = s};
    captured = c;
    return host_func(stream, run_captured, c) == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return matmul_now(d, al, A, la, B, lb, be, C, lc, D, ld, s);
}
