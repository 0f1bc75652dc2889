/* bench/attention_cpu.c — times loom's CPU attention kernels (runtime/cpu/cpu_attention.c) alone.
 *
 *   build/bench_attention_cpu [B T H Dh KV] [--threads N] [--reps R]
 *
 * Defaults are one layer of models/bench-gpt2-small.json: B 8, T 256, H 4, Dh 64, KV 4,
 * causal.  Prints the median forward and backward time over R repetitions and the GFLOP/s
 * of the matmul work actually done under the causal mask (forward: q·kᵀ and p·v, 2 matmuls;
 * backward: the recomputed q·kᵀ, dout·vᵀ, dsᵀ·q, pᵀ·dout, ds·k, 5 matmuls; each
 * 2·Dh FLOPs per (query, visible key) pair).  LOOM_CPU_NOFMA=1 times the baseline tiles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/threadpool.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static float *randf(size_t n, unsigned *seed) {
  float *p = malloc(sizeof(float) * n);
  if (!p) {
    fprintf(stderr, "bench_attention_cpu: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    p[i] = (float)((*seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  return p;
}

int main(int argc, char **argv) {
  long long dims[5] = {8, 256, 4, 64, 4};
  int nd = 0, threads = 0, reps = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: bench_attention_cpu [B T H Dh KV] [--threads N] [--reps R]\n");
      return 0;
    } else if (nd < 5 && atoll(argv[i]) > 0) dims[nd++] = atoll(argv[i]);
    else {
      fprintf(stderr, "bench_attention_cpu: unexpected argument '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  long long B = dims[0], T = dims[1], H = dims[2], Dh = dims[3], KV = dims[4];
  if (H % KV) {
    fprintf(stderr, "bench_attention_cpu: H %lld is not a multiple of KV %lld\n", H, KV);
    return 2;
  }
  ThreadPool *tp = tp_new(threads);
  unsigned seed = 1;
  size_t nq = (size_t)(B * T * H * Dh), nk = (size_t)(B * T * KV * Dh);
  float *q = randf(nq, &seed), *k = randf(nk, &seed), *v = randf(nk, &seed), *dout = randf(nq, &seed);
  float *out = malloc(sizeof(float) * nq), *dq = malloc(sizeof(float) * nq);
  float *dk = malloc(sizeof(float) * nk), *dv = malloc(sizeof(float) * nk);
  double *tf = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
  char err[256];
  float scale = 1.0f / 8.0f;
  for (int r = -2; r < reps; r++) {   /* two untimed warm-up runs */
    double t0 = now();
    if (cpu_attention(tp, q, k, v, out, B, T, H, Dh, T, KV, true, 0, scale, err, sizeof err)) {
      fprintf(stderr, "bench_attention_cpu: %s\n", err);
      return 1;
    }
    double t1 = now();
    if (cpu_attention_grad(tp, dout, q, k, v, dq, dk, dv, B, T, H, Dh, T, KV, true, 0, scale, err, sizeof err)) {
      fprintf(stderr, "bench_attention_cpu: %s\n", err);
      return 1;
    }
    double t2 = now();
    if (r >= 0) tf[r] = t1 - t0, tb[r] = t2 - t1;
  }
  qsort(tf, (size_t)reps, sizeof(double), cmp);
  qsort(tb, (size_t)reps, sizeof(double), cmp);
  double pairs = (double)B * (double)H * (double)T * (double)(T + 1) / 2.0;   /* causal (query, key) pairs */
  double ff = 2 * 2.0 * pairs * (double)Dh, fb = 5 * 2.0 * pairs * (double)Dh;
  double mf = tf[reps / 2], mb = tb[reps / 2];
  const char *nofma = getenv("LOOM_CPU_NOFMA");
  printf("attention B %lld T %lld H %lld Dh %lld KV %lld causal, %d threads, %d reps%s\n", B, T, H, Dh, KV,
         tp_size(tp), reps, nofma && *nofma && *nofma != '0' ? " (LOOM_CPU_NOFMA: baseline tiles)" : "");
  printf("forward:  median %.2f ms (min %.2f)  %.1f GFLOP/s\n", mf * 1e3, tf[0] * 1e3, ff / mf * 1e-9);
  printf("backward: median %.2f ms (min %.2f)  %.1f GFLOP/s\n", mb * 1e3, tb[0] * 1e3, fb / mb * 1e-9);
  double cs = 0;
  for (size_t i = 0; i < nq; i++) cs += (double)out[i] + (double)dq[i];
  for (size_t i = 0; i < nk; i++) cs += (double)dk[i] + (double)dv[i];
  printf("checksum %.9g\n", cs);
  free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv), free(tf), free(tb);
  tp_free(tp);
  return 0;
}
