/* runtime/cuda/cuda_gemm.c — a program's GEMM steps on the device: the cuBLASLt plan of each
 * (descriptors, layouts, epilogue, the heuristic's candidates), a GEMM's run, and the timing
 * of the candidates at start-up (cuda_tune_gemms).  Split from cuda_exec.c, whose private
 * state (LOOM_CUDA_INTERNAL) it shares; cuda_gemm.h declares what cuda_exec.c calls. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/cuda/cuda_gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/fail.h"
#include "runtime/io/diskcache.h"   /* the GEMM algorithms' choices (cuda_tune_gemms) */

/* Below cuda_exec.c (which calls them too): a GEMM's layout, a buffer's address, a step's name. */

static int64_t at_least_1(int64_t x) { return x > 0 ? x : 1; }

CudaGemmLayout cuda_gemm_layout(int64_t M, int64_t N, int64_t K, int ta, int tb) {
  CudaGemmLayout L;
  memset(&L, 0, sizeof L);
  L.m = N;
  L.n = M;
  L.k = K;
  /* Lt's A = our B.  tb = 0: B is row-major [K,N] = column-major [N,K], already op(A) for
     Lt's m x k.  tb = 1: B is row-major [N,K] = column-major [K,N], transposed by Lt. */
  L.trans_a = tb ? 1 : 0;
  L.a_rows = tb ? K : N;
  L.a_cols = tb ? N : K;
  /* Lt's B = our A.  ta = 0: A row-major [M,K] = column-major [K,M] (Lt's k x n).
     ta = 1: A row-major [K,M] = column-major [M,K], transposed by Lt. */
  L.trans_b = ta ? 1 : 0;
  L.b_rows = ta ? M : K;
  L.b_cols = ta ? K : M;
  /* C row-major [M,N] = column-major [N,M]. */
  L.c_rows = N;
  L.c_cols = M;
  L.lda = at_least_1(L.a_rows);
  L.ldb = at_least_1(L.b_rows);
  L.ldc = at_least_1(L.c_rows);
  return L;
}

uint64_t cuda_buf_addr(const CudaProgram *cp, int func, const RtBuf *b) {
  uint64_t base = b->region == RT_REGION_ARENA ? cp->arena : cp->regions[b->region];   /* one arena for every function */
  return base + (uint64_t)b->offset;
}

#ifdef LOOM_HAVE_CUDA_HEADERS

void cuda_step_where(const CudaProgram *cp, int f, int s, char *w, size_t n) {
  snprintf(w, n, "at @%s step %d (%s)", cp->p->funcs[f].name, s, cp->p->funcs[f].steps[s].label);
}


#define CU(fn, args, where) cuda_cu_fail(d->fn args, #fn, where, err, errlen)
#define LT(fn, args, where) cuda_lt_fail(l->fn args, #fn, where, err, errlen)

struct CudaGemmPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  bool empty;       /* batch, M or N is 0: nothing to compute */
  bool zero;        /* K = 0: C = 0 */
  bool per_batch;   /* no algorithm for the strided batch: one matmul per batch */
  /* the heuristic's candidates, best first (cuda_options_default: LOOM_CUDA_GEMM_TUNE); the
     one in use is algo (cuda_tune_gemms picks it) */
  cublasLtMatmulAlgo_t cand[LOOM_GEMM_CANDIDATES];
  int n_cand;
  unsigned char key[32];   /* tune_key's, once cuda_tune_gemms has seen it */
};

void cuda_plan_free(const CublasLtApi *l, CudaGemmPlan *g) {
  if (!g) return;
  if (l) {
    if (g->a) l->cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) l->cublasLtMatrixLayoutDestroy(g->b);
    if (g->c) l->cublasLtMatrixLayoutDestroy(g->c);
    if (g->desc) l->cublasLtMatmulDescDestroy(g->desc);
  }
  free(g);
}

static cudaDataType_t lt_type(RtStorage s) {
  return s == RT_ST_BF16 ? CUDA_R_16BF : s == RT_ST_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The alignment cuBLASLt may assume for a pointer and, batched, every pointer after it. */
static uint32_t ptr_align(uint64_t addr, uint64_t stride_bytes) {
  uint64_t x = addr | stride_bytes;
  uint32_t a = 256;
  while (a > 1 && x % a) a >>= 1;
  return a;
}

static int make_layout(const CublasLtApi *l, cublasLtMatrixLayout_t *out, RtStorage s, int64_t rows, int64_t cols,
                       int64_t ld, int64_t batch, int64_t stride, const char *where, char *err, size_t errlen) {
  if (LT(cublasLtMatrixLayoutCreate, (out, lt_type(s), (uint64_t)rows, (uint64_t)cols, ld), where)) return 1;
  if (batch > 1) {
    int32_t bc = (int32_t)batch;
    int64_t so = stride;
    if (LT(cublasLtMatrixLayoutSetAttribute, (*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc), where) ||
        LT(cublasLtMatrixLayoutSetAttribute, (*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &so, sizeof so), where))
      return 1;
  }
  return 0;
}

/* Layouts, preference and the heuristic's best algorithm for `batch` (1 when per batch).
   Returns 0 with *found set, or 1 on a cuBLASLt failure. */
static int plan_try(CudaProgram *cp, CudaGemmPlan *g, const RtStep *st, uint64_t pa, uint64_t pb, uint64_t pc,
                    int64_t batch, bool *found, const char *where, char *err, size_t errlen) {
  const CublasLtApi *l = cp->lt ? cuda_cublaslt(NULL, 0) : NULL;
  const int64_t *i = st->i;
  CudaGemmLayout L = cuda_gemm_layout(i[1], i[2], i[3], (int)i[4], (int)i[5]);
  /* views: our row stride is Lt's leading dimension (Lt's A is our B) */
  if (i[RT_GEMM_LDB_INT] > 0) L.lda = i[RT_GEMM_LDB_INT];
  if (i[RT_GEMM_LDA_INT] > 0) L.ldb = i[RT_GEMM_LDA_INT];
  if (i[RT_GEMM_LDC_INT] > 0) L.ldc = i[RT_GEMM_LDC_INT];
  RtStorage sa = (RtStorage)st->bufs[0].storage, sb = (RtStorage)st->bufs[1].storage,
            sc = (RtStorage)st->bufs[st->n_in].storage;
  *found = false;
  if (g->a) l->cublasLtMatrixLayoutDestroy(g->a);
  if (g->b) l->cublasLtMatrixLayoutDestroy(g->b);
  if (g->c) l->cublasLtMatrixLayoutDestroy(g->c);
  g->a = g->b = g->c = NULL;
  /* Lt's A is our B (stride i[7]), Lt's B our A (i[6]). */
  if (make_layout(l, &g->a, sb, L.a_rows, L.a_cols, L.lda, batch, i[7], where, err, errlen) ||
      make_layout(l, &g->b, sa, L.b_rows, L.b_cols, L.ldb, batch, i[6], where, err, errlen) ||
      make_layout(l, &g->c, sc, L.c_rows, L.c_cols, L.ldc, batch, i[8], where, err, errlen))
    return 1;
  /* Per batch, every batch's pointer must be as aligned as the first: strides count either way. */
  uint64_t nb = (uint64_t)i[0] > 1 ? 1 : 0;
  uint32_t al_a = ptr_align(pb, nb * (uint64_t)i[7] * (uint64_t)cuda_storage_size(sb));
  uint32_t al_b = ptr_align(pa, nb * (uint64_t)i[6] * (uint64_t)cuda_storage_size(sa));
  uint32_t al_c = ptr_align(pc, nb * (uint64_t)i[8] * (uint64_t)cuda_storage_size(sc));
  uint64_t ws = cp->mem.workspace > 0 ? (uint64_t)cp->mem.workspace : 0;
  cublasLtMatmulPreference_t pref = NULL;
  int rc = LT(cublasLtMatmulPreferenceCreate, (&pref), where);
  if (!rc)
    rc = LT(cublasLtMatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), where);
  if (!rc)
    rc = LT(cublasLtMatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
            where);
  if (!rc)
    rc = LT(cublasLtMatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
            where);
  if (!rc)
    rc = LT(cublasLtMatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
            where);
  if (!rc)
    rc = LT(cublasLtMatmulPreferenceSetAttribute, (pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c),
            where);
  if (!rc) {
    cublasLtMatmulHeuristicResult_t res[LOOM_GEMM_CANDIDATES];
    int count = 0, want = cp->opt.gemm_tune ? LOOM_GEMM_CANDIDATES : 1;
    memset(res, 0, sizeof res);
    cublasStatus_t s = l->cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)cp->lt, g->desc, g->a, g->b, g->c, g->c, pref,
                                                         want, res, &count);
    /* NOT_SUPPORTED / no result: no algorithm for this shape (the caller may try per batch). */
    g->n_cand = 0;
    for (int k = 0; s == CUBLAS_STATUS_SUCCESS && k < count && k < want; k++)
      if (res[k].state == CUBLAS_STATUS_SUCCESS && res[k].workspaceSize <= ws) g->cand[g->n_cand++] = res[k].algo;
    if (g->n_cand > 0) {
      g->algo = g->cand[0];   /* the heuristic's first: what runs unless cuda_tune_gemms times a faster one */
      *found = true;
    } else if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
      rc = cuda_lt_fail(s, "cublasLtMatmulAlgoGetHeuristic", where, err, errlen);
    }
  }
  if (pref) l->cublasLtMatmulPreferenceDestroy(pref);
  return rc;
}

int cuda_plan_gemm(CudaProgram *cp, int f, int s, CudaGemmPlan **out, char *err, size_t errlen) {
  const RtStep *st = &cp->p->funcs[f].steps[s];
  const int64_t *i = st->i;
  char where[256];
  cuda_step_where(cp, f, s, where, sizeof where);
  CudaGemmPlan *g = calloc(1, sizeof *g);
  if (!g) return rt_fail(err, errlen, 1, "out of memory %s", where);
  *out = g;
  if (i[0] == 0 || i[1] == 0 || i[2] == 0) {
    g->empty = true;
    return 0;
  }
  if (i[3] == 0) {
    g->zero = true;
    return 0;
  }
  const CublasLtApi *l = cuda_cublaslt(err, errlen);
  if (!l) return 1;
  RtStorage sa = (RtStorage)st->bufs[0].storage;
  cublasComputeType_t ct = sa == RT_ST_F32 && cp->opt.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CudaGemmLayout L = cuda_gemm_layout(i[1], i[2], i[3], (int)i[4], (int)i[5]);
  int32_t ta = L.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = L.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (LT(cublasLtMatmulDescCreate, (&g->desc, ct, CUDA_R_32F), where) ||
      LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), where) ||
      LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), where))
    return 1;
  uint64_t pa = cuda_buf_addr(cp, f, &st->bufs[0]), pb = cuda_buf_addr(cp, f, &st->bufs[1]),
           pc = cuda_buf_addr(cp, f, &st->bufs[st->n_in]);
  /* the epilogue (program.h, RT_GEMM_EPI_INT): its pointers are fixed for the program's life.
     Our row-major C[M,N] is Lt's column-major D[N,M]: the bias runs along Lt's rows, our N. */
  int64_t epi = i[RT_GEMM_EPI_INT];
  if (epi & RT_GEMM_EPI_BIAS) {
    uint32_t e = epi & RT_GEMM_EPI_GELU ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    void *bias = (void *)(uintptr_t)cuda_buf_addr(cp, f, &st->bufs[2]);
    int32_t bt = lt_type((RtStorage)st->bufs[2].storage);
    if (LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), where) ||
        LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), where) ||
        LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), where))
      return 1;
    if (epi & RT_GEMM_EPI_GELU) {
      void *aux = (void *)(uintptr_t)cuda_buf_addr(cp, f, &st->bufs[st->n_in + 1]);
      int64_t ld = i[2];
      if (LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux), where) ||
          LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld), where))
        return 1;
    }
  }
  if (epi & RT_GEMM_EPI_DGELU) {   /* the pre-activation [M, N]: Lt's m x n, ld our N */
    void *aux = (void *)(uintptr_t)cuda_buf_addr(cp, f, &st->bufs[2]);
    int64_t ld = i[2];
    uint32_t e = epi & RT_GEMM_EPI_BGRAD ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    if (LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), where) ||
        LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux), where) ||
        LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld), where))
      return 1;
  }
  if (epi & RT_GEMM_EPI_BGRAD) {   /* BGRADA: our B's column sums, Lt's A's rows reduced over k;
                                      DGELU_BGRAD: the result's column sums, Lt's D's rows */
    uint32_t e = epi & RT_GEMM_EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_BGRADA;
    void *bias = (void *)(uintptr_t)cuda_buf_addr(cp, f, &st->bufs[st->n_in + 1]);
    int32_t bt = lt_type((RtStorage)st->bufs[st->n_in + 1].storage);
    if (LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), where) ||
        LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), where) ||
        LT(cublasLtMatmulDescSetAttribute, (g->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), where))
      return 1;
  }
  bool found = false;
  if (plan_try(cp, g, st, pa, pb, pc, i[0], &found, where, err, errlen)) return 1;
  if (!found && i[0] > 1) {
    g->per_batch = true;
    if (plan_try(cp, g, st, pa, pb, pc, 1, &found, where, err, errlen)) return 1;
  }
  if (!found)
    return rt_fail(err, errlen, 2, "cuBLASLt has no algorithm for GEMM %s: %s x %s -> %s, M %lld N %lld K %lld, ta %d tb %d, batch %lld",
                where, cuda_storage_name(sa), cuda_storage_name((RtStorage)st->bufs[1].storage),
                cuda_storage_name((RtStorage)st->bufs[st->n_in].storage), (long long)i[1], (long long)i[2], (long long)i[3],
                (int)i[4], (int)i[5], (long long)i[0]);
  return 0;
}

int cuda_run_gemm(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  const RtStep *st = &cp->p->funcs[f].steps[s];
  const CudaGemmPlan *g = cp->plans[f][s];
  const int64_t *i = st->i;
  if (g->empty) return 0;
  const RtBuf *out = &st->bufs[st->n_in];
  int esz_a = cuda_storage_size((RtStorage)st->bufs[0].storage), esz_b = cuda_storage_size((RtStorage)st->bufs[1].storage),
      esz_c = cuda_storage_size((RtStorage)out->storage);
  uint64_t pa = cuda_buf_addr(cp, f, &st->bufs[0]), pb = cuda_buf_addr(cp, f, &st->bufs[1]), pc = cuda_buf_addr(cp, f, out);
  /* a residual added in the epilogue: C is that matrix, D the result (beta = 1) */
  int64_t epi = i[RT_GEMM_EPI_INT];
  uint64_t pcin = epi & RT_GEMM_EPI_C ? cuda_buf_addr(cp, f, &st->bufs[st->n_in - 1]) : pc;
  CUstream stream = (CUstream)cp->stream;
  bool acc = i[RT_GEMM_BETA_INT] != 0;   /* C += op(A) op(B) */
  if (g->zero && epi) return rt_fail(err, errlen, 2, "GEMM %s: K = 0 with an epilogue is not supported", where);
  if (g->zero) {
    for (int64_t b = 0; !acc && b < i[0]; b++)
      if (CU(cuMemsetD8Async, ((CUdeviceptr)(pc + (uint64_t)(b * i[8] * esz_c)), 0, (size_t)(i[1] * i[2] * esz_c), stream),
             where))
        return 1;
    return 0;
  }
  const CublasLtApi *l = cuda_cublaslt(err, errlen);
  if (!l) return 1;
  float alpha = 1.0f, beta = acc || (epi & RT_GEMM_EPI_C) ? 1.0f : 0.0f;
  int64_t nb = g->per_batch ? i[0] : 1;
  for (int64_t b = 0; b < nb; b++) {
    const void *A = (const void *)(uintptr_t)(pb + (uint64_t)(b * i[7] * esz_b));   /* Lt's A: our B */
    const void *B = (const void *)(uintptr_t)(pa + (uint64_t)(b * i[6] * esz_a));   /* Lt's B: our A */
    void *C = (void *)(uintptr_t)(pc + (uint64_t)(b * i[8] * esz_c));
    const void *Cin = (const void *)(uintptr_t)(pcin + (uint64_t)(b * i[8] * esz_c));
    if (LT(cublasLtMatmul,
           ((cublasLtHandle_t)cp->lt, g->desc, &alpha, A, g->a, B, g->b, &beta, Cin, g->c, C, g->c, &g->algo,
            (void *)(uintptr_t)cp->workspace, (size_t)cp->mem.workspace, stream),
           where))
      return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ GEMM algorithms
   With LOOM_CUDA_GEMM_TUNE (on unless it is 0), every GEMM shape of the program times the
   cuBLASLt heuristic's candidates (up to LOOM_GEMM_CANDIDATES) once, on this device, and keeps
   the fastest; the choice is cached on disk (runtime/io/diskcache.h) under a key of the
   device, the cuBLASLt version, the GEMM's description and the candidates themselves, so a
   later run (or another rank of the node, which waits on the entry's lock) reads it instead
   of timing.  The timing runs at start-up on the program's own buffers, which hold only zeros
   then (dev_alloc zeroed them; nothing is loaded before cuda_program_init returns); they are
   zeroed again afterwards.  A candidate that fails to run is passed over.  Which algorithm
   runs changes the bits of a GEMM's result (another tiling or split-K), as the heuristic's own
   choice does from one cuBLASLt version to the next: LOOM_CUDA_GEMM_TUNE=0 runs the
   heuristic's first candidate, the same on every run; LOOM_CUDA_GEMM_TUNE=verbose prints each
   shape's times. */

static const char tune_magic[8] = {'L', 'O', 'O', 'M', 'G', 'T', 'U', '1'};

static void tune_key(const CudaProgram *cp, const CudaGemmPlan *g, const RtStep *st, unsigned char key[32]) {
  const CublasLtApi *l = cuda_cublaslt(NULL, 0);
  Sha256 h;
  sha_init(&h);
  char head[512];
  int n = snprintf(head, sizeof head, "loom gemm tune 1|%s|%s|lt %zu|ws %lld|tf32 %d|per_batch %d|cand %d|", cp->info.name,
                   cp->info.arch, l ? l->cublasLtGetVersion() : (size_t)0, (long long)cp->mem.workspace, (int)cp->opt.tf32,
                   (int)g->per_batch, g->n_cand);
  sha_update(&h, head, (size_t)n);
  sha_update(&h, st->i, sizeof st->i);   /* shape, transposes, strides, epilogue, beta, leading dims */
  for (int b = 0; b < st->n_in + st->n_out; b++) sha_update(&h, &st->bufs[b].storage, sizeof st->bufs[b].storage);
  /* the pointers' alignments decide which candidates exist: the candidates are in the key */
  sha_update(&h, g->cand, sizeof g->cand[0] * (size_t)g->n_cand);
  sha_final(&h, key);
}

/* Times candidate c of GEMM (f, s): one run to warm up, then `reps` between two events. */
static int time_candidate(CudaProgram *cp, int f, int s, int c, void *ev[2], int reps, float *ms) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  CudaGemmPlan *g = cp->plans[f][s];
  char where[256], e[512];
  cuda_step_where(cp, f, s, where, sizeof where);
  g->algo = g->cand[c];
  if (cuda_run_gemm(cp, f, s, where, e, sizeof e)) return 1;
  if (d->cuEventRecord((CUevent)ev[0], (CUstream)cp->stream) != CUDA_SUCCESS) return 1;
  for (int r = 0; r < reps; r++)
    if (cuda_run_gemm(cp, f, s, where, e, sizeof e)) return 1;
  if (d->cuEventRecord((CUevent)ev[1], (CUstream)cp->stream) != CUDA_SUCCESS ||
      d->cuStreamSynchronize((CUstream)cp->stream) != CUDA_SUCCESS ||
      d->cuEventElapsedTime(ms, (CUevent)ev[0], (CUevent)ev[1]) != CUDA_SUCCESS)
    return 1;
  return 0;
}

int cuda_tune_gemms(CudaProgram *cp, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  const RtProgram *p = cp->p;
  char dir[4096];
  dc_dir(dir, sizeof dir);
  if (dir[0]) dc_mkdirs(dir);
  void *ev[2] = {NULL, NULL};
  int shapes = 0, timed = 0, cached = 0, rc = 0;
  for (int f = 0; !rc && f < p->n_funcs; f++)
    for (int s = 0; !rc && s < p->funcs[f].n_steps; s++) {
      CudaGemmPlan *g = cp->plans[f][s];
      if (!g || g->empty || g->zero || g->n_cand < 2) continue;
      const RtStep *st = &p->funcs[f].steps[s];
      unsigned char *key = g->key;
      tune_key(cp, g, st, key);
      /* the same shape earlier in this program: its choice */
      const CudaGemmPlan *same = NULL;
      for (int f2 = 0; f2 <= f && !same; f2++)
        for (int s2 = 0; s2 < (f2 == f ? s : p->funcs[f2].n_steps) && !same; s2++) {
          const CudaGemmPlan *h = cp->plans[f2][s2];
          if (h && !h->empty && !h->zero && h->n_cand >= 2 && !memcmp(h->key, key, 32)) same = h;
        }
      if (same) {
        g->algo = same->algo;
        continue;
      }
      shapes++;
      char path[4200] = "";
      if (dir[0] && dc_path(dir, key, ".gemm", path, sizeof path)) path[0] = 0;
      int lock = path[0] ? dc_lock(dir, key) : -1;
      unsigned char *payload = NULL;
      size_t n = 0;
      unsigned flags = 0;
      int choice = -1;
      if (path[0] && !dc_read(path, tune_magic, key, &payload, &n, &flags) && n == sizeof(int32_t)) {
        int32_t c;
        memcpy(&c, payload, sizeof c);
        if (c >= 0 && c < g->n_cand) choice = c, cached++;
      }
      free(payload);
      if (choice < 0) {
        if (!ev[0]) {
          for (int k = 0; k < 2 && !rc; k++) rc = CU(cuEventCreate, ((CUevent *)&ev[k], CU_EVENT_DEFAULT), "(timing GEMM algorithms)");
          if (rc) {
            dc_unlock(lock);
            break;
          }
        }
        float best = 0;
        char line[1024];
        int at = snprintf(line, sizeof line, "cuda: GEMM @%s step %d (%s), M %lld N %lld K %lld batch %lld:",
                          p->funcs[f].name, s, st->label, (long long)st->i[1], (long long)st->i[2], (long long)st->i[3],
                          (long long)st->i[0]);
        for (int c = 0; c < g->n_cand; c++) {
          float ms = 0;
          bool ok = !time_candidate(cp, f, s, c, ev, 3, &ms);
          if (ok && (choice < 0 || ms < best)) choice = c, best = ms;
          if (at < (int)sizeof line - 24)
            at += ok ? snprintf(line + at, sizeof line - (size_t)at, " %.3f", ms / 3)
                     : snprintf(line + at, sizeof line - (size_t)at, " failed");
        }
        if (choice < 0) choice = 0;   /* none ran: the heuristic's first, whose failure the step will report */
        if (cp->opt.gemm_tune_verbose) fprintf(stderr, "%s ms; candidate %d\n", line, choice);
        int32_t c32 = choice;
        if (path[0]) dc_write(dir, path, tune_magic, key, (const unsigned char *)&c32, sizeof c32, 0);
        timed++;
      }
      dc_unlock(lock);
      g->algo = g->cand[choice];
    }
  for (int k = 0; k < 2; k++)
    if (ev[k]) d->cuEventDestroy((CUevent)ev[k]);
  if (!rc && timed) {   /* the runs wrote into the arena and the gradients: zeros again, as dev_alloc left them */
    for (int r = 1; !rc && r < RT_REGION_COUNT; r++)
      if (cp->regions[r] && p->region_bytes[r] > 0)
        rc = CU(cuMemsetD8Async, ((CUdeviceptr)cp->regions[r], 0, (size_t)p->region_bytes[r], (CUstream)cp->stream),
                "(after timing GEMM algorithms)");
    if (!rc && cp->arena && cp->mem.arenas > 0)
      rc = CU(cuMemsetD8Async, ((CUdeviceptr)cp->arena, 0, (size_t)cp->mem.arenas, (CUstream)cp->stream),
              "(after timing GEMM algorithms)");
  }
  cp->gemm_shapes = shapes, cp->gemm_timed = timed, cp->gemm_cached = cached;
  if (cp->opt.gemm_tune_verbose && shapes)
    fprintf(stderr, "cuda: GEMM algorithms: %d shapes, %d timed, %d from the cache\n", shapes, timed, cached);
  return rc;
}

#endif
