/* tests/unit/test_cpu_gemm.c — runtime/cpu/cpu_gemm.h: the same bits for any thread count.
 *
 * For each shape (the ones that differed between 1 and 2 OpenBLAS threads on an AMD EPYC
 * with Debian's OpenBLAS 0.3.21 and its Zen kernels, the model's transposed weight-gradient
 * shapes, batched and odd sizes), cpu_gemm runs with pools of 1, 2, 3 and 4 threads on the
 * same operands, C pre-filled with NaN.  Pass criteria:
 *   - every element written, and bitwise equal across the four pools;
 *   - within f32 rounding of a double-precision product: |c - ref| <= 2^-20 * sum_k
 *     |a_ik b_kj| (OpenBLAS sums K terms in f32, an error of a few K-independent ulps of
 *     the sum of magnitudes in practice; a wrong tile offset, a wrong leading dimension or
 *     a missing tile is off by O(1) of it).  Large shapes check 4096 sampled elements.
 * Also the tiling itself: tiles cover C exactly, no side under 64 unless the dimension is,
 * and at least 8 tiles wherever the GEMM is big enough to be split that far.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_gemm.h"
#include "runtime/cpu/threadpool.h"
#define SPLITMIX_SEED 777   /* this test's data since it was written */
#include "tests/unit/splitmix.h"

static int n_pass, n_fail;

static float unif(void) { return (float)(urand() * 2.0 - 1.0); }   /* [-1,1) */

static void check(bool ok, const char *what) {
  if (ok) n_pass++;
  else {
    n_fail++;
    printf("FAIL %s\n", what);
  }
}

typedef struct {
  const char *name;
  int64_t batch, M, N, K;
  bool ta, tb;
  bool shared_b;   /* B's batch stride 0 */
} Case;

static const Case cases[] = {
    {"[64,64]x[64,256]^T (tiny models' lm_head)", 1, 64, 256, 64, false, true, false},
    {"128^3", 1, 128, 128, 128, false, false, false},
    {"512^3", 1, 512, 512, 512, false, false, false},
    {"[2048,256]x[256,768] (qkv)", 1, 2048, 768, 256, false, false, false},
    {"[2048,256]^T x [2048,768] (qkv weight gradient)", 1, 256, 768, 2048, true, false, false},
    {"[2048,1024]^T x [2048,256] (mlp proj weight gradient)", 1, 1024, 256, 2048, true, false, false},
    {"[2048,4096]^T x [2048,256] (lm_head weight gradient)", 1, 4096, 256, 2048, true, false, false},
    {"[2048,768]x[256,768]^T (qkv input gradient)", 1, 2048, 256, 768, false, true, false},
    {"M=32", 1, 32, 64, 64, false, false, false},
    {"odd sizes 1000x333x77", 1, 1000, 333, 77, false, false, false},
    {"odd sizes, both transposed", 1, 301, 517, 129, true, true, false},
    {"batched, shared B (merged into one GEMM)", 4, 256, 192, 96, false, false, true},
    {"batched, own B each", 3, 200, 300, 64, false, true, false},
    {"batched, transposed A, shared B", 3, 160, 96, 128, true, false, true},
    {"one row", 1, 1, 4096, 256, false, true, false},
    {"K = 0", 2, 17, 9, 0, false, false, false},
};

static void run_case(const Case *c, ThreadPool **pools, int n_pools) {
  const int64_t sa = c->M * c->K, sb = c->shared_b ? 0 : c->K * c->N, sc = c->M * c->N;
  const int64_t na = c->batch * sa, nb = (c->shared_b ? 1 : c->batch) * c->K * c->N, nc = c->batch * sc;
  float *A = malloc(sizeof(float) * (size_t)(na ? na : 1)), *B = malloc(sizeof(float) * (size_t)(nb ? nb : 1));
  float *C[4];
  for (int64_t i = 0; i < na; i++) A[i] = unif();
  for (int64_t i = 0; i < nb; i++) B[i] = unif();
  for (int p = 0; p < n_pools; p++) {
    C[p] = malloc(sizeof(float) * (size_t)nc);
    for (int64_t i = 0; i < nc; i++) C[p][i] = NAN;
    cpu_gemm(pools[p], c->batch, c->M, c->N, c->K, c->ta, c->tb, A, sa, B, sb, C[p], sc);
  }
  char what[256];
  int64_t unwritten = 0;
  for (int64_t i = 0; i < nc; i++) unwritten += isnan(C[0][i]);
  snprintf(what, sizeof what, "%s: every element written (%lld NaN left)", c->name, (long long)unwritten);
  check(unwritten == 0, what);
  for (int p = 1; p < n_pools; p++) {
    snprintf(what, sizeof what, "%s: %d threads give the bits of 1 thread", c->name, tp_size(pools[p]));
    check(!memcmp(C[0], C[p], sizeof(float) * (size_t)nc), what);
  }
  /* against double precision, on every element or a sample */
  const int64_t samples = nc <= 65536 ? nc : 4096;
  double worst = 0.0;
  for (int64_t s = 0; s < samples; s++) {
    int64_t e = samples == nc ? s : (int64_t)(rng() % (uint64_t)nc);
    int64_t b = e / sc, i = e % sc / c->N, j = e % c->N;
    const float *a = A + b * sa, *bb = B + b * sb;
    double ref = 0.0, mag = 0.0;
    for (int64_t k = 0; k < c->K; k++) {
      double x = c->ta ? a[k * c->M + i] : a[i * c->K + k], y = c->tb ? bb[j * c->K + k] : bb[k * c->N + j];
      ref += x * y;
      mag += fabs(x * y);
    }
    double err = fabs((double)C[0][e] - ref), bound = ldexp(mag, -20) + 1e-30;
    if (!(err <= bound)) worst = INFINITY;
    else if (err / bound > worst) worst = err / bound;
  }
  snprintf(what, sizeof what, "%s: within 2^-20 of sum|a*b| of a double product (worst %.3g of the bound)", c->name,
           worst);
  check(worst <= 1.0, what);
  for (int p = 0; p < n_pools; p++) free(C[p]);
  free(A);
  free(B);
}

static void check_tiling(void) {
  static const int64_t dims[] = {1, 7, 32, 63, 64, 65, 100, 128, 255, 256, 257, 333, 512, 768, 1000, 2048, 4096, 50304};
  static const int64_t ks[] = {1, 64, 256, 2048};
  const int nd = (int)(sizeof dims / sizeof dims[0]), nk = (int)(sizeof ks / sizeof ks[0]);
  int bad_cover = 0, bad_min = 0, bad_count = 0;
  for (int a = 0; a < nd; a++)
    for (int b = 0; b < nd; b++)
      for (int q = 0; q < nk; q++) {
        int64_t M = dims[a], N = dims[b], K = ks[q];
        CpuGemmTiles t = cpu_gemm_tiles(M, N, K);
        if (t.tm < 1 || t.tn < 1 || t.ntm * t.tm < M || (t.ntm - 1) * t.tm >= M || t.ntn * t.tn < N ||
            (t.ntn - 1) * t.tn >= N)
          bad_cover++;
        if (t.tm < (M < 64 ? M : 64) || t.tn < (N < 64 ? N : 64) || t.tm > 512 || t.tn > 256) bad_min++;
        /* big enough to split into 8 tiles of >= 1 MFLOP with sides >= 64: it must be */
        if (M >= 256 && N >= 256 && 2.0 * (double)M * (double)N * (double)K >= 16e6 && t.ntm * t.ntn < 8) bad_count++;
      }
  check(bad_cover == 0, "tiling: the tiles cover C exactly, for every shape tried");
  check(bad_min == 0, "tiling: tile sides between min(dim, 64) and 512 x 256");
  check(bad_count == 0, "tiling: at least 8 tiles wherever M, N >= 256 and the GEMM holds >= 16 MFLOP");
  CpuGemmTiles t = cpu_gemm_tiles(2048, 768, 256);
  char what[160];
  snprintf(what, sizeof what, "tiling: [2048,256]x[256,768] is cut into 512x256 tiles (got %lldx%lld, %lld tiles)",
           (long long)t.tm, (long long)t.tn, (long long)(t.ntm * t.ntn));
  check(t.tm == 512 && t.tn == 256 && t.ntm * t.ntn == 12, what);
  t = cpu_gemm_tiles(256, 768, 2048);   /* a weight gradient: 1 x 3 tiles would leave threads idle */
  snprintf(what, sizeof what, "tiling: [2048,256]^T x [2048,768] is cut into at least 8 tiles (got %lldx%lld, %lld)",
           (long long)t.tm, (long long)t.tn, (long long)(t.ntm * t.ntn));
  check(t.ntm * t.ntn >= 8, what);
}

int main(void) {
  ThreadPool *pools[4];
  for (int p = 0; p < 4; p++) {
    pools[p] = tp_new(p + 1);
    if (!pools[p]) {
      printf("FAIL could not start a pool of %d threads\n", p + 1);
      return 1;
    }
  }
  check_tiling();
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_case(&cases[c], pools, 4);
  for (int p = 0; p < 4; p++) tp_free(pools[p]);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
