/* tools/cmd_calibrate.c — `loom calibrate`: a hardware description of this CPU for the time
 * model (passes/timing.h), from microbenchmarks only.  A "device" is one rank of a CPU mesh:
 * `--threads T` threads (default 1), as `loom train --mesh ... --threads` gives each rank.
 *
 *   peak_tflops.fp32   f32 GEMM throughput of loom's GEMMs (runtime/cpu/cpu_gemm.c) on T
 *                      threads, over transformer-like shapes (2048 rows; K, N of 256 to 4096):
 *                      total FLOPs over total time, best of 3 runs each
 *   efficiency.attention  loom's causal attention forward and backward (cpu_attention*) on
 *                      2 x 512 tokens, 8 heads of 64: its model FLOPs (the whole square, as
 *                      flops.c counts them) per second over the GEMM peak
 *   memory_tb_s        a streaming triad (a = b + s c over 3 x 128 MB) on T threads
 *   intra_node         in-process all-reduces between 2 ranks as threads (runtime/comm), 4 KB
 *                      to 16 MB: t = 2 alpha + S / beta, alpha from one-float calls, beta
 *                      by least squares over 64 KB to 16 MB
 *   devices_per_node   the cores divided by T; memory_gb: physical memory divided by that
 * Op overhead is not measured (the dispatch of one op is microseconds against milliseconds
 * of work in the bench model's ops) and written as 0.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm/comm.h"
#include "runtime/cpu/cpu_gemm.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom calibrate [-o FILE.json] [--threads T]\n"
  "\n"
  "Measures this CPU with microbenchmarks (GEMM throughput, attention, memory bandwidth,\n"
  "in-process all-reduce latency and bandwidth) and writes a hardware description for\n"
  "`loom ir --time --hw FILE.json`: one device is one rank of a CPU mesh with T threads\n"
  "(default 1).  Takes about 20 s.  Nothing in it is fitted to a training run.\n"
  "\n"
  "options:\n"
  "  -o FILE.json     where to write it (default: standard output)\n"
  "  --threads T      threads per device (rank)\n"
  "  -h, --help       show this help\n";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fill(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
}

static double gemm_peak(ThreadPool *tp) {
  static const int64_t shapes[][3] = {{2048, 256, 768}, {2048, 768, 768}, {2048, 1024, 1024}, {2048, 4096, 1024},
                                      {2048, 1024, 4096}, {2048, 256, 4096}};
  double flops = 0, secs = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N)),
          *C = malloc(sizeof(float) * (size_t)(M * N));
    if (!A || !B || !C) {
      free(A), free(B), free(C);
      return 0;
    }
    fill(A, M * K), fill(B, K * N);
    cpu_gemm(tp, 1, M, N, K, false, false, A, 0, B, 0, C, 0);   /* warm */
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
      double t0 = now_s();
      cpu_gemm(tp, 1, M, N, K, false, false, A, 0, B, 0, C, 0);
      double t = now_s() - t0;
      if (t < best) best = t;
    }
    flops += 2.0 * (double)M * (double)N * (double)K, secs += best;
    free(A), free(B), free(C);
  }
  return flops / secs;
}

static double attention_rate(ThreadPool *tp) {
  const int64_t B = 2, T = 512, H = 8, Dh = 64;
  const int64_t n = B * T * H * Dh;
  float *buf = malloc(sizeof(float) * (size_t)(n * 8));
  if (!buf) return 0;
  float *q = buf, *k = buf + n, *v = buf + 2 * n, *o = buf + 3 * n, *d = buf + 4 * n, *dq = buf + 5 * n,
        *dk = buf + 6 * n, *dv = buf + 7 * n;
  fill(buf, n * 8);
  char err[256];
  double best = 1e30;
  for (int r = 0; r < 4; r++) {
    double t0 = now_s();
    if (cpu_attention(tp, q, k, v, o, B, T, H, Dh, T, H, true, 0, 0.125f, err, sizeof err) ||
        cpu_attention_grad(tp, d, q, k, v, dq, dk, dv, B, T, H, Dh, T, H, true, 0, 0.125f, err, sizeof err)) {
      free(buf);
      return 0;
    }
    double t = now_s() - t0;
    if (r && t < best) best = t;   /* the first run warms */
  }
  free(buf);
  /* flops.c: forward 4 B H T S Dh, backward 8 B H T S Dh */
  return 12.0 * (double)(B * H) * (double)T * (double)T * (double)Dh / best;
}

typedef struct {
  float *a, *b, *c;
  float s;
} Triad;

static void triad(void *ctx, int64_t begin, int64_t end) {
  Triad *t = ctx;
  for (int64_t i = begin; i < end; i++) t->a[i] = t->b[i] + t->s * t->c[i];
}

static double memory_bw(ThreadPool *tp) {
  const int64_t n = 32 << 20;   /* 128 MB an array */
  Triad t = {malloc(sizeof(float) * (size_t)n), malloc(sizeof(float) * (size_t)n), malloc(sizeof(float) * (size_t)n), 0.5f};
  if (!t.a || !t.b || !t.c) {
    free(t.a), free(t.b), free(t.c);
    return 0;
  }
  fill(t.b, n), fill(t.c, n), fill(t.a, n);
  double best = 1e30;
  for (int r = 0; r < 4; r++) {
    double t0 = now_s();
    tp_run(tp, n, triad, &t);
    double dt = now_s() - t0;
    if (dt < best) best = dt;
  }
  free(t.a), free(t.b), free(t.c);
  return 3.0 * 4.0 * (double)n / best;
}

typedef struct {
  Comm *c;
  float *buf;
  int64_t n;
  int reps;
  double secs;
} ArJob;

static void *ar_rank(void *p) {
  ArJob *j = p;
  j->c->barrier(j->c);
  double t0 = now_s();
  for (int r = 0; r < j->reps; r++) j->c->all_reduce(j->c, COMM_DP, j->buf, j->n, false);
  j->secs = (now_s() - t0) / j->reps;
  return NULL;
}

/* Two ranks all-reduce `bytes` `reps` times; the slower rank's seconds per call. */
static double ar_time(LocalWorld *w, int64_t bytes, int reps) {
  int64_t n = bytes / 4 > 0 ? bytes / 4 : 1;
  ArJob jobs[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    jobs[r] = (ArJob){local_world_rank(w, r), calloc((size_t)n, sizeof(float)), n, reps, 0};
    pthread_create(&th[r], NULL, ar_rank, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < 2; r++) free(jobs[r].buf);
  return jobs[0].secs > jobs[1].secs ? jobs[0].secs : jobs[1].secs;
}

/* For 2 ranks t(S) = 2 alpha + S / beta: alpha from one-float all-reduces, beta by least
   squares of t - 2 alpha on S over 64 KB to 16 MB. */
static int link_fit(double *alpha, double *beta, char *err, size_t errlen) {
  int64_t mesh[COMM_AXES] = {2, 1, 1, 1, 1};
  LocalWorld *w = local_world_new(mesh, err, errlen);
  if (!w) return 1;
  ar_time(w, 4, 100);   /* warm */
  double best = 1e30;
  for (int k = 0; k < 5; k++) {
    double t = ar_time(w, 4, 2000);
    if (t < best) best = t;
  }
  *alpha = best / 2;
  double sxx = 0, sxy = 0;
  for (int64_t bytes = 65536; bytes <= (16 << 20); bytes *= 4) {
    double t = ar_time(w, bytes, bytes < (1 << 20) ? 200 : 10) - 2 * *alpha;
    sxx += (double)bytes * (double)bytes, sxy += (double)bytes * t;
  }
  local_world_free(w);
  *beta = sxy > 0 ? sxx / sxy : 0;
  if (*beta <= 0) snprintf(err, errlen, "the all-reduce microbenchmark gave no bandwidth");
  return *beta > 0 ? 0 : 1;
}

int cmd_calibrate(int argc, char **argv) {
  const char *out_path = NULL, *v;
  long threads = 1;
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) {
      fputs(help, stdout);
      return EXIT_OK;
    }
    if ((r = arg_value(argc, argv, &i, "-o", &v))) {
      if (r < 0) return usage_error("calibrate", "-o needs a file name");
      out_path = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--threads", &v))) {
      char *end;
      threads = r < 0 ? 0 : strtol(v, &end, 10);
      if (r < 0 || *end || threads < 1 || threads > 1024) return usage_error("calibrate", "--threads takes 1 to 1024");
      continue;
    }
    return usage_error("calibrate", "unknown argument (see loom calibrate --help)");
  }
  cpu_gemm_blas_single();
  ThreadPool *tp = tp_new((int)threads);
  if (!tp) return report(EXIT_RUN, "cannot start the thread pool");
  char err[256] = "", model[256] = "this CPU";
  FILE *ci = fopen("/proc/cpuinfo", "r");
  if (ci) {
    char line[512];
    while (fgets(line, sizeof line, ci))
      if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
        snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
        model[strcspn(model, "\n")] = 0;
        break;
      }
    fclose(ci);
  }
  fprintf(stderr, "calibrating %s, %ld thread%s a device: gemm", model, threads, threads > 1 ? "s" : "");
  double peak = gemm_peak(tp);
  fprintf(stderr, " %.1f GFLOP/s, attention", peak * 1e-9);
  double att = attention_rate(tp);
  fprintf(stderr, " %.1f GFLOP/s, memory", att * 1e-9);
  double bw = memory_bw(tp);
  fprintf(stderr, " %.2f GB/s, all-reduce", bw * 1e-9);
  tp_free(tp);
  double alpha = 0, beta = 0;
  if (link_fit(&alpha, &beta, err, sizeof err) || peak <= 0 || att <= 0 || bw <= 0) {
    fprintf(stderr, "\n");
    return report(EXIT_RUN, err[0] ? err : "a microbenchmark failed (out of memory?)");
  }
  fprintf(stderr, " %.2f GB/s, %.1f us\n", beta * 1e-9, alpha * 1e6);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  long dpn = cores / threads > 0 ? cores / threads : 1;
  double eff_att = att / peak > 1 ? 1 : att / peak;
  time_t now = time(NULL);
  char date[32];
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  FILE *f = out_path ? fopen(out_path, "w") : stdout;
  if (!f) {
    snprintf(err, sizeof err, "cannot write %s", out_path);
    return report(EXIT_RUN, err);
  }
  fprintf(f,
          "{\n"
          "  \"name\": \"%s, %ld thread%s a device (loom calibrate)\",\n"
          "  \"sources\": [\"loom calibrate on %s, %ld cores, %s: microbenchmarks only (tools/cmd_calibrate.c)\"],\n"
          "  \"notes\": \"one device is one rank of a CPU mesh; op_overhead not measured\",\n"
          "  \"peak_tflops\": {\"fp32\": %.6g},\n"
          "  \"memory_gb\": %.4g,\n"
          "  \"memory_tb_s\": %.6g,\n"
          "  \"devices_per_node\": %ld,\n"
          "  \"intra_node\": {\"gb_s\": %.6g, \"latency_us\": %.4g},\n"
          "  \"inter_node\": {\"gb_s\": %.6g, \"latency_us\": %.4g},\n"
          "  \"efficiency\": {\"matmul\": 1, \"attention\": %.4f, \"memory\": 1, \"link\": 1},\n"
          "  \"op_overhead_us\": 0\n"
          "}\n",
          model, threads, threads > 1 ? "s" : "", model, cores, date, peak * 1e-12, mem / (double)dpn * 1e-9, bw * 1e-12,
          dpn, beta * 1e-9, alpha * 1e6, beta * 1e-9, alpha * 1e6, eff_att);
  if (out_path && fclose(f)) {
    snprintf(err, sizeof err, "cannot write %s", out_path);
    return report(EXIT_RUN, err);
  }
  if (out_path) fprintf(stderr, "wrote %s\n", out_path);
  return EXIT_OK;
}
