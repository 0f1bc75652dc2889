/* runtime/cpu/cpu_gemm.c — see cpu_gemm.h. */
#include "runtime/cpu/cpu_gemm.h"

#include <cblas.h>
#include <string.h>

enum {
  TILE_M = 512,           /* the starting tile: 512 rows... */
  TILE_N = 256,           /* ...by 256 columns */
  TILE_MIN = 64,          /* never halve a side below this */
  TILES_WANTED = 8,       /* halve while there are fewer tiles than this... */
  TILE_ALIGN = 16,        /* (halves rounded up to a multiple of 16: OpenBLAS's sgemm unroll) */
};
#define TILE_MIN_FLOP 2.0e6   /* ...and a tile holds more than this (so halves keep >= 1 MFLOP) */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

CpuGemmTiles cpu_gemm_tiles(int64_t M, int64_t N, int64_t K) {
  CpuGemmTiles t = {min64(M, TILE_M), min64(N, TILE_N), 0, 0};
  if (t.tm < 1) t.tm = 1;
  if (t.tn < 1) t.tn = 1;
  for (;;) {
    int64_t tiles = cdiv(M, t.tm) * cdiv(N, t.tn);
    if (tiles >= TILES_WANTED || 2.0 * (double)t.tm * (double)t.tn * (double)K <= TILE_MIN_FLOP) break;
    int64_t hm = cdiv(cdiv(t.tm, 2), TILE_ALIGN) * TILE_ALIGN, hn = cdiv(cdiv(t.tn, 2), TILE_ALIGN) * TILE_ALIGN;
    if (t.tm >= t.tn && hm >= TILE_MIN && hm < t.tm) t.tm = hm;
    else if (hn >= TILE_MIN && hn < t.tn) t.tn = hn;
    else if (hm >= TILE_MIN && hm < t.tm) t.tm = hm;
    else break;
  }
  t.ntm = cdiv(M, t.tm);
  t.ntn = cdiv(N, t.tn);
  return t;
}

void cpu_gemm_blas_single(void) {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

typedef struct {
  const float *A, *B;
  float *C;
  int64_t sa, sb, sc, M, N, K;
  bool ta, tb;
  CpuGemmTiles t;
} GemmCtx;

/* Tiles [b, e) of batch-major, then row-major order over the tile grid. */
static void tiles_run(void *ctx, int thread, int64_t b, int64_t e) {
  (void)thread;
  const GemmCtx *g = ctx;
  const int64_t per = g->t.ntm * g->t.ntn;
  for (int64_t w = b; w < e; w++) {
    const int64_t bat = w / per, ti = w % per / g->t.ntn, tj = w % g->t.ntn;
    const int64_t m0 = ti * g->t.tm, n0 = tj * g->t.tn;
    const int64_t m = min64(g->t.tm, g->M - m0), n = min64(g->t.tn, g->N - n0);
    /* op(A) rows m0.. are A's rows m0.. (A [M,K]) or its columns m0.. (A stored [K,M]);
       op(B) columns n0.. likewise. */
    const float *a = g->A + bat * g->sa + (g->ta ? m0 : m0 * g->K);
    const float *bb = g->B + bat * g->sb + (g->tb ? n0 * g->K : n0);
    float *c = g->C + bat * g->sc + m0 * g->N + n0;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)g->K, 1.0f, a, (int)(g->ta ? g->M : g->K), bb, (int)(g->tb ? g->K : g->N), 0.0f, c, (int)g->N);
  }
}

void cpu_gemm(ThreadPool *tp, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb, const float *A,
              int64_t sa, const float *B, int64_t sb, float *C, int64_t sc) {
  if (batch <= 0 || M == 0 || N == 0) return;
  if (K == 0) {   /* an empty sum; BLAS would reject the leading dimension 0 */
    for (int64_t b = 0; b < batch; b++) memset(C + b * sc, 0, sizeof(float) * (size_t)(M * N));
    return;
  }
  /* A batch against one shared B (stride 0: activations [B,T,K] times a weight) whose A and
     C batches are contiguous is one GEMM with batch*M rows: fewer, fuller tiles. */
  if (batch > 1 && sb == 0 && !ta && sa == M * K && sc == M * N && batch * M <= INT32_MAX) {
    M *= batch;
    batch = 1;
  }
  cpu_gemm_blas_single();
  GemmCtx g = {A, B, C, sa, sb, sc, M, N, K, ta, tb, cpu_gemm_tiles(M, N, K)};
  tp_run_dynamic(tp, batch * g.t.ntm * g.t.ntn, 1, tiles_run, &g);
}
