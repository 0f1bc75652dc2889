/* runtime/cpu/cpu_moe.c — the mixture-of-experts ops on the CPU (ir/ops.def: topk,
 * gather_last, scatter_last, moe_sort, moe_count, moe_dispatch, moe_combine,
 * moe_weight_grad, grouped_matmul, grouped_matmul_wgrad; ir/interp_moe.c is the
 * definition).
 *
 * Routing and the row permutations are loops in which every output element is written by
 * one thread (the bits do not depend on the thread count); the grouped matmuls are one
 * cpu_gemm per group of rows (deterministic tiles, runtime/cpu/cpu_gemm.h).  Positions
 * and counts are int32; a position of -1 is an assignment dropped by the capacity.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_gemm.h"
#include "runtime/cpu/cpu_kernels.h"

static int moe_bad(char *err, size_t errlen, const char *what) {
  snprintf(err, errlen, "%s", what);
  return 2;
}

typedef struct {
  const float *x;
  int32_t *idx;
  int64_t E, k;
} Topk;

static void topk_rows(void *ctx, int64_t r0, int64_t r1) {
  const Topk *t = ctx;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = t->x + r * t->E;
    int32_t *o = t->idx + r * t->k;
    for (int64_t j = 0; j < t->k; j++) {   /* the j-th largest, ties to the lower index */
      int64_t best = -1;
      for (int64_t e = 0; e < t->E; e++) {
        bool taken = false;
        for (int64_t i = 0; i < j && !taken; i++) taken = o[i] == e;
        if (!taken && (best < 0 || x[e] > x[best])) best = e;
      }
      o[j] = (int32_t)best;
    }
  }
}

void cpu_topk(ThreadPool *tp, const float *x, int32_t *idx, int64_t rows, int64_t E, int64_t k) {
  Topk t = {x, idx, E, k};
  tp_run(tp, rows, topk_rows, &t);
}

int cpu_gather_last(const float *x, const int32_t *idx, float *y, int64_t rows, int64_t E, int64_t k, bool scatter,
                    char *err, size_t errlen) {
  if (scatter) memset(y, 0, sizeof(float) * (size_t)(rows * E));
  for (int64_t a = 0; a < rows * k; a++) {
    int64_t e = idx[a];
    if (e < 0 || e >= E) return moe_bad(err, errlen, "gather_last/scatter_last: an expert index is out of range");
    if (scatter) y[(a / k) * E + e] += x[a];
    else y[a] = x[(a / k) * E + e];
  }
  return 0;
}

int cpu_moe_sort(const int32_t *idx, int32_t *pos, int32_t *count, int64_t n, int64_t E, int64_t cap, char *err,
                 size_t errlen) {
  int64_t *seen = calloc((size_t)(2 * E + 1), sizeof *seen), *start = seen ? seen + E : NULL;
  if (!seen) return moe_bad(err, errlen, "out of memory in moe_sort");
  for (int64_t a = 0; a < n; a++) {
    if (idx[a] < 0 || idx[a] >= E) {
      free(seen);
      return moe_bad(err, errlen, "moe_sort: an expert index is out of range");
    }
    seen[idx[a]]++;
  }
  int64_t at = 0;
  for (int64_t e = 0; e < E; e++) {
    int64_t c = cap > 0 && seen[e] > cap ? cap : seen[e];
    if (count) count[e] = (int32_t)c;
    start[e] = at;
    at += c;
    seen[e] = 0;
  }
  for (int64_t a = 0; a < n && pos; a++) {
    int64_t e = idx[a], c = cap > 0 && seen[e] >= cap ? -1 : start[e] + seen[e];
    pos[a] = (int32_t)c;
    seen[e]++;
  }
  free(seen);
  return 0;
}

typedef struct {
  const float *x, *w;
  const int32_t *pos;
  float *y;
  int64_t k, D, R;
  int kind;   /* 0 dispatch, 1 combine, 2 weight grad */
} Perm;

static void perm_rows(void *ctx, int64_t t0, int64_t t1) {   /* t: a token (its k assignments) */
  const Perm *p = ctx;
  for (int64_t t = t0; t < t1; t++) {
    if (p->kind == 1) memset(p->y + t * p->D, 0, sizeof(float) * (size_t)p->D);
    for (int64_t j = 0; j < p->k; j++) {
      int64_t a = t * p->k + j, r = p->pos[a];
      if (p->kind == 2) {   /* y[a] = rows[pos[a]] . tokens[t] */
        float acc = 0;
        const float *row = p->x + r * p->D, *tok = p->w + t * p->D;
        for (int64_t d = 0; r >= 0 && d < p->D; d++) acc += row[d] * tok[d];
        p->y[a] = acc;
        continue;
      }
      if (r < 0) continue;
      float wa = p->w[a];
      if (p->kind == 0) {
        const float *src = p->x + t * p->D;
        float *dst = p->y + r * p->D;
        for (int64_t d = 0; d < p->D; d++) dst[d] = wa * src[d];
      } else {
        const float *src = p->x + r * p->D;
        float *dst = p->y + t * p->D;
        for (int64_t d = 0; d < p->D; d++) dst[d] += wa * src[d];
      }
    }
  }
}

/* kind 0 dispatch: x[N,D] pos w -> y[R,D];  1 combine: y[R,D] pos w -> out[N,D];
   2 weight grad: rows[R,D] x[N,D] pos -> out[N,k]. */
int cpu_moe_permute(ThreadPool *tp, int kind, const float *a, const float *b, const int32_t *pos, float *y, int64_t N,
                    int64_t k, int64_t D, int64_t R, char *err, size_t errlen) {
  for (int64_t i = 0; i < N * k; i++)
    if (pos[i] < -1 || pos[i] >= R) return moe_bad(err, errlen, "moe_dispatch/combine: a position is out of range");
  if (kind == 0) memset(y, 0, sizeof(float) * (size_t)(R * D));
  Perm p = {a, b, pos, y, k, D, R, kind};
  tp_run(tp, N, perm_rows, &p);
  return 0;
}

/* y[R,N] = rows of x[R,K] in groups of cnt[g], group g times w[g mod E] ([N,K] when tb, else
   [K,N]); rows past the groups 0.  wgrad: dw[E,N,K] = sum over g of e: dy_g^T x_g, with
   a = dy [R,N] and b = x [R,K]. */
int cpu_grouped_matmul(ThreadPool *tp, bool wgrad, const float *a, const float *b, const int32_t *cnt, float *y,
                       int64_t R, int64_t K, int64_t N, int64_t E, int64_t G, bool tb, char *err, size_t errlen) {
  int64_t total = 0;
  for (int64_t g = 0; g < G; g++) {
    if (cnt[g] < 0 || cnt[g] > R - total) return moe_bad(err, errlen, "grouped_matmul: the group counts exceed the rows");
    total += cnt[g];
  }
  if (!wgrad) {
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; g++) {
      if (cnt[g]) cpu_gemm(tp, 1, cnt[g], N, K, false, tb, a + r0 * K, 0, b + (g % E) * N * K, 0, y + r0 * N, 0);
      r0 += cnt[g];
    }
    memset(y + total * N, 0, sizeof(float) * (size_t)((R - total) * N));
    return 0;
  }
  /* a = dy [R,N], b = x [R,K]: dw[e] [N,K] */
  memset(y, 0, sizeof(float) * (size_t)(E * N * K));
  float *tmp = G > E ? malloc(sizeof(float) * (size_t)(N * K > 0 ? N * K : 1)) : NULL;
  if (G > E && !tmp) return moe_bad(err, errlen, "out of memory in grouped_matmul_wgrad");
  int64_t r0 = 0;
  for (int64_t g = 0; g < G; g++) {
    float *dw = y + (g % E) * N * K;
    if (cnt[g] && !tmp) cpu_gemm(tp, 1, N, K, cnt[g], true, false, a + r0 * N, 0, b + r0 * K, 0, dw, 0);
    else if (cnt[g]) {   /* several groups per expert: each group's product, added in group order */
      cpu_gemm(tp, 1, N, K, cnt[g], true, false, a + r0 * N, 0, b + r0 * K, 0, tmp, 0);
      for (int64_t i = 0; i < N * K; i++) dw[i] += tmp[i];
    }
    r0 += cnt[g];
  }
  free(tmp);
  return 0;
}
