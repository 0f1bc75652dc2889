/* OpenBLAS's own f32 GEMM throughput, with no Python or PyTorch in the way.
 *
 *   cc -O2 bench/sgemm_gflops.c $(pkg-config --cflags --libs openblas) -o sgemm_gflops
 *   ./sgemm_gflops [THREADS] [SECONDS]
 *
 * Times cblas_sgemm (row-major, no transposes, beta 0) at the shapes of one training step
 * of models/bench-gpt2-small.json (the same list as bench/blas_gflops.py) and prints
 * GFLOP/s = 2*M*N*K / (median seconds per call).  THREADS (default: OPENBLAS_NUM_THREADS's
 * choice) goes to openblas_set_num_threads.  The last line is machine-readable for
 * bench/cpu_step.sh. */
#define _POSIX_C_SOURCE 199309L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct shape { const char *name; int m, k, n; };

static const struct shape SHAPES[] = {
    {"qkv", 2048, 256, 768},        {"mlp_fc", 2048, 256, 1024},
    {"mlp_proj", 2048, 1024, 256},  {"lm_head", 2048, 256, 4096},
    {"lm_head_dW", 4096, 2048, 256}, {"square1024", 1024, 1024, 1024},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    double budget = argc > 2 ? atof(argv[2]) : 6.0;
    if (threads > 0) openblas_set_num_threads(threads);
    printf("OpenBLAS %s, core %s, %d threads\n", openblas_get_config(), openblas_get_corename(),
           openblas_get_num_threads());
    printf("%-12s %-24s %12s\n", "shape", "M x K x N", "cblas GF/s");
    double inv_sum = 0.0, square = 0.0;
    int nmodel = 0;
    unsigned seed = 12345u;
    for (int s = 0; s < NSHAPES; s++) {
        const struct shape *sh = &SHAPES[s];
        size_t na = (size_t)sh->m * sh->k, nb = (size_t)sh->k * sh->n, nc = (size_t)sh->m * sh->n;
        float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
        if (!a || !b || !c) { fprintf(stderr, "sgemm_gflops: out of memory\n"); return 1; }
        for (size_t i = 0; i < na; i++) { seed = seed * 1664525u + 1013904223u; a[i] = (float)(seed >> 8) / 16777216.0f - 0.5f; }
        for (size_t i = 0; i < nb; i++) { seed = seed * 1664525u + 1013904223u; b[i] = (float)(seed >> 8) / 16777216.0f - 0.5f; }
        memset(c, 0, nc * sizeof *c);
#define GEMM() cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, sh->m, sh->n, sh->k, 1.0f, \
                           a, sh->k, b, sh->n, 0.0f, c, sh->n)
        GEMM();
        double t0 = now();
        GEMM();
        double one = now() - t0;
        if (one < 1e-6) one = 1e-6;
        int reps = (int)(budget / NSHAPES / one);
        if (reps < 5) reps = 5;
        if (reps > 200) reps = 200;
        double *ts = malloc((size_t)reps * sizeof *ts);
        if (!ts) { fprintf(stderr, "sgemm_gflops: out of memory\n"); return 1; }
        for (int r = 0; r < reps; r++) {
            t0 = now();
            GEMM();
            ts[r] = now() - t0;
        }
        qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
        double gf = 2.0 * sh->m * sh->n * (double)sh->k / ts[reps / 2] / 1e9;
        char dims[64];
        snprintf(dims, sizeof dims, "%d x %d x %d", sh->m, sh->k, sh->n);
        printf("%-12s %-24s %12.1f\n", sh->name, dims, gf);
        if (strcmp(sh->name, "square1024") == 0) square = gf;
        else { inv_sum += 1.0 / gf; nmodel++; }
        free(ts); free(a); free(b); free(c);
    }
    printf("CBLAS_SUMMARY cblas_model_gflops=%.1f cblas_square_gflops=%.1f threads=%d\n",
           nmodel / inv_sum, square, openblas_get_num_threads());
    return 0;
}
