/* runtime/cpu/cpu_exec.c — see cpu_exec.h. */
#include "runtime/fail.h"
#include "runtime/cpu/cpu_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cpu/cpu_gemm.h"
#include "runtime/cpu/cpu_kernels.h"


static char *alloc_region(int64_t bytes) {
  size_t n = ((size_t)(bytes > 0 ? bytes : 0) + 63) / 64 * 64;
  char *r = aligned_alloc(64, n ? n : 64);
  if (r) memset(r, 0, n ? n : 64);
  return r;
}

static void *buf_addr(const CpuProgram *cp, int func, const RtBuf *b) {
  char *base = b->region == RT_REGION_ARENA ? cp->arenas[func] : cp->regions[b->region];
  return base + b->offset;
}

/* ---------------------------------------------------------------- checking the program */

static int check_buf(void *ctx, const RtProgram *p, int func, const RtBuf *b, const char *what, char *err,
                     size_t errlen) {
  const char *fn = p->funcs[func].name;
  if (b->region >= RT_REGION_COUNT || b->round > RT_ROUND_F8E5M2 || b->offset % 4 ||
      !rt_fits(b->offset, b->n, 4, rt_region_size(p, func, b->region))) {
    snprintf(err, errlen, "@%s: %s: buffer (region %d, offset %lld, %lld elements) is outside its region", fn, what,
             b->region, (long long)b->offset, (long long)b->n);
    return 2;
  }
  return 0;
}

static int check_gemm(const RtStep *st, char *err, size_t errlen) {
  const int64_t *i = st->i;
  if (st->n_in != 2 || st->n_out != 1) return rt_fail(err, errlen, 2, "GEMM %s: needs buffers A B -> C", st->label);
  for (int k = 0; k < 9; k++)
    if (i[k] < 0) return rt_fail(err, errlen, 2, "GEMM %s: negative size or stride (i[%d])", st->label, k);
  if (i[4] > 1 || i[5] > 1) return rt_fail(err, errlen, 2, "GEMM %s: ta and tb must be 0 or 1", st->label);
  if (i[1] > INT32_MAX || i[2] > INT32_MAX || i[3] > INT32_MAX)   /* CBLAS takes int sizes */
    return rt_fail(err, errlen, 2, "GEMM %s: a dimension exceeds the BLAS's int range", st->label);
  int64_t batch = i[0], M = i[1], N = i[2], K = i[3];
  int64_t need[3] = {M * K, K * N, M * N}, stride[3] = {i[6], i[7], i[8]};
  for (int k = 0; k < 3; k++) {
    if (st->bufs[k].is_int) return rt_fail(err, errlen, 2, "GEMM %s: buffer %d is not f32", st->label, k);
    /* (batch - 1) * stride + need <= n, without overflow */
    if (batch > 0 && need[k] > 0 &&
        (need[k] > st->bufs[k].n || (stride[k] > 0 && batch - 1 > (st->bufs[k].n - need[k]) / stride[k])))
      return rt_fail(err, errlen, 2, "GEMM %s: operand %d reaches outside its buffer", st->label, k);
  }
  return 0;
}

/* Every element on the CPU is 4 bytes (runtime/program.h's rt_program_check walks the rest). */
static int check_global(void *ctx, const RtProgram *p, int g, char *err, size_t errlen) {
  const RtGlobal *gl = &p->globals[g];
  if (gl->region <= RT_REGION_ARENA || gl->region >= RT_REGION_COUNT || gl->offset < 0 || gl->offset % 4 ||
      !rt_fits(gl->offset, gl->n, 4, p->region_bytes[gl->region]) || gl->rank < 0 || gl->rank > 8)
    return rt_fail(err, errlen, 2, "global $%s (%d) is outside its region", gl->name, g);
  return 0;
}

static int check_step(void *ctx, const RtProgram *p, const RtStep *st, char *msg, size_t n) {
  switch (st->kind) {
  case RT_STEP_KERNEL:
    if (st->which < 0 || st->which >= p->n_kernels || st->i[0] < 0)
      return rt_fail(msg, n, 2, "names no kernel or has a negative extent");
    return 0;
  case RT_STEP_GEMM: return check_gemm(st, msg, n);
  case RT_STEP_BUILTIN: return cpu_builtin_check(st, msg, n);
  }
  return rt_fail(msg, n, 2, "an unknown kind");
}

static int check_program(const CpuProgram *cp, void *const *kernel_fns, char *err, size_t errlen) {
  const RtProgram *p = cp->p;
  RtChecker ck = {NULL, check_global, check_buf, check_step};
  int rc = rt_program_check(p, &ck, err, errlen);
  for (int k = 0; !rc && k < p->n_kernels; k++)
    if (!kernel_fns || !kernel_fns[k])
      rc = rt_fail(err, errlen, 2, "kernel %s (%d) has no compiled function", p->kernel_names[k], k);
  return rc;
}

/* ---------------------------------------------------------------- init and free */

int cpu_program_init(CpuProgram *cp, const RtProgram *p, void *const *kernel_fns, int n_threads, char *err,
                     size_t errlen) {
  memset(cp, 0, sizeof *cp);
  cp->p = p;
  if (p->n_funcs < 0 || p->n_globals < 0 || p->n_kernels < 0 || (p->n_funcs && !p->funcs) ||
      (p->n_globals && !p->globals))
    return rt_fail(err, errlen, 2, "malformed program");
  int rc = check_program(cp, kernel_fns, err, errlen);
  if (rc) return rc;
  cp->tp = tp_new(n_threads);
  if (!cp->tp) cp->tp = tp_new(1);   /* no threads to be had: run on the caller's */
  size_t nf = (size_t)(p->n_funcs ? p->n_funcs : 1), nk = (size_t)(p->n_kernels ? p->n_kernels : 1);
  cp->kernels = calloc(nk, sizeof(CpuKernelFn));
  cp->arenas = calloc(nf, sizeof(char *));
  cp->step_seconds = calloc(nf, sizeof(double *));
  cp->step_runs = calloc(nf, sizeof(int64_t *));
  cp->arena_touched = malloc(nf * sizeof(int64_t));
  for (size_t f = 0; cp->arena_touched && f < nf; f++) cp->arena_touched[f] = -1;
  bool ok = cp->tp && cp->kernels && cp->arenas && cp->step_seconds && cp->step_runs && cp->arena_touched;
  for (int r = 1; ok && r < RT_REGION_COUNT; r++) ok = (cp->regions[r] = alloc_region(p->region_bytes[r])) != NULL;
  for (int f = 0; ok && f < p->n_funcs; f++) {
    size_t ns = (size_t)(p->funcs[f].n_steps ? p->funcs[f].n_steps : 1);
    cp->arenas[f] = alloc_region(p->funcs[f].arena_bytes);
    if (cp->arenas[f])   /* the sentinel the first call's measurement looks for */
      for (int64_t w = 0; w < (p->funcs[f].arena_bytes + 63) / 64 * 16; w++) ((uint32_t *)cp->arenas[f])[w] = ARENA_SENTINEL;
    cp->step_seconds[f] = calloc(ns, sizeof(double));
    cp->step_runs[f] = calloc(ns, sizeof(int64_t));
    ok = cp->arenas[f] && cp->step_seconds[f] && cp->step_runs[f];
  }
  if (!ok) {
    cpu_program_free(cp);
    return rt_fail(err, errlen, 1, "out of memory allocating the program's buffers");
  }
  for (int k = 0; k < p->n_kernels; k++) {
    /* A JIT'd symbol address arrives as void*; converting it to a function pointer is what
       dlsym users do (POSIX guarantees it works). */
    CpuKernelFn fnp;
    memcpy(&fnp, &kernel_fns[k], sizeof fnp);
    cp->kernels[k] = fnp;
  }
  cpu_gemm_blas_single();
  return 0;
}

void cpu_program_free(CpuProgram *cp) {
  if (!cp->p) return;
  for (int f = 0; f < cp->p->n_funcs; f++) {
    if (cp->arenas) free(cp->arenas[f]);
    if (cp->step_seconds) free(cp->step_seconds[f]);
    if (cp->step_runs) free(cp->step_runs[f]);
  }
  for (int r = 0; r < RT_REGION_COUNT; r++) free(cp->regions[r]);
  free(cp->arenas);
  free(cp->step_seconds);
  free(cp->step_runs);
  free(cp->arena_touched);
  free(cp->kernels);
  free(cp->async);
  free(cp->trace);
  tp_free(cp->tp);
  memset(cp, 0, sizeof *cp);
}

int cpu_find_func(const CpuProgram *cp, const char *name) {
  for (int f = 0; f < cp->p->n_funcs; f++)
    if (!strcmp(cp->p->funcs[f].name, name)) return f;
  return -1;
}

/* ---------------------------------------------------------------- running */

typedef struct {
  CpuKernelFn fn;
  char **args;
} KernelCtx;

static void kernel_chunk(void *c, int64_t b, int64_t e) {
  const KernelCtx *k = c;
  k->fn(k->args, b, e);
}

static void gemm(ThreadPool *tp, const RtStep *st, float *A, float *B, float *C) {
  const int64_t *i = st->i;
  cpu_gemm(tp, i[0], i[1], i[2], i[3], i[4], i[5], A, i[6], B, i[7], C, i[8]);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cpu_program_call(CpuProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen) {
  if (func < 0 || func >= cp->p->n_funcs) return rt_fail(err, errlen, 2, "no function #%d in the program", func);
  const RtFunc *fn = &cp->p->funcs[func];
  for (int a = 0; a < fn->n_args; a++)
    memcpy(buf_addr(cp, func, &fn->args[a]), args[a], 4 * (size_t)fn->args[a].n);
  for (int s = 0; s < fn->n_steps; s++) {
    const RtStep *st = &fn->steps[s];
    char *ptrs[RT_MAX_BUFS];
    int nb = st->n_in + st->n_out, rc = 0;
    for (int b = 0; b < nb; b++) ptrs[b] = buf_addr(cp, func, &st->bufs[b]);
    double t0 = now_s();
    char msg[1024] = "";
    bool comm_step = false;
    rc = cpu_async_step(cp, st, (void *const *)ptrs, &comm_step, msg, sizeof msg);
    if (!comm_step) switch (st->kind) {
    case RT_STEP_KERNEL: {
      KernelCtx kc = {cp->kernels[st->which], ptrs};
      tp_run(cp->tp, st->i[0], kernel_chunk, &kc);
      break;
    }
    case RT_STEP_GEMM: gemm(cp->tp, st, (float *)ptrs[0], (float *)ptrs[1], (float *)ptrs[2]); break;
    case RT_STEP_BUILTIN: rc = cpu_builtin_run(cp->tp, cp->comm, st, (void *const *)ptrs, msg, sizeof msg); break;
    }
    if (rc) {
      snprintf(err, errlen, "@%s: step %d (%s): %s", fn->name, s, st->label, msg);
      return rc;
    }
    if (st->kind != RT_STEP_BUILTIN)   /* builtins round what they write themselves */
      for (int b = st->n_in; b < nb; b++)
        if (!st->bufs[b].is_int && st->bufs[b].round != RT_ROUND_NONE)
          rt_round_buf(cp->tp, (float *)ptrs[b], st->bufs[b].n, (RtRound)st->bufs[b].round);
    double t1 = now_s();
    if (!comm_step || st->which == RT_B_COLL_WAIT) cpu_trace_add(cp, st->label, t0, t1, 0);
    cp->step_seconds[func][s] += t1 - t0;
    cp->step_runs[func][s]++;
  }
  if (cp->arena_touched[func] < 0) {   /* the first call: how high in the arena did it write? */
    const uint32_t *w = (const uint32_t *)cp->arenas[func];
    int64_t n = fn->arena_bytes / 4;
    while (n > 0 && w[n - 1] == ARENA_SENTINEL) n--;
    cp->arena_touched[func] = 4 * n;
  }
  for (int r = 0; r < fn->n_rets; r++)
    if (rets[r]) memcpy(rets[r], buf_addr(cp, func, &fn->rets[r]), 4 * (size_t)fn->rets[r].n);
  return 0;
}

int64_t cpu_arena_touched(const CpuProgram *cp, int func) {
  return func >= 0 && func < cp->p->n_funcs && cp->arena_touched ? cp->arena_touched[func] : -1;
}

/* ---------------------------------------------------------------- globals */

float *cpu_global(CpuProgram *cp, int g) {
  if (g < 0 || g >= cp->p->n_globals) return NULL;
  const RtGlobal *gl = &cp->p->globals[g];
  return (float *)(cp->regions[gl->region] + gl->offset);
}

void cpu_globals_init(CpuProgram *cp, uint64_t seed) {
  for (int g = 0; g < cp->p->n_globals; g++) rt_global_init_values(&cp->p->globals[g], seed, cpu_global(cp, g));
}

/* ---------------------------------------------------------------- profile */

int cpu_profile_top(const CpuProgram *cp, int func, int *steps, int max) {
  if (func < 0 || func >= cp->p->n_funcs) return 0;
  int n = 0, ns = cp->p->funcs[func].n_steps;
  const double *sec = cp->step_seconds[func];
  for (int s = 0; s < ns; s++) {   /* insertion into the sorted top list */
    int k = n < max ? n++ : max;
    if (k == max && (max == 0 || sec[s] <= sec[steps[max - 1]])) continue;
    if (k == max) k = max - 1;
    while (k > 0 && sec[steps[k - 1]] < sec[s]) {
      steps[k] = steps[k - 1];
      k--;
    }
    steps[k] = s;
  }
  return n;
}

void cpu_profile_reset(CpuProgram *cp) {
  for (int f = 0; f < cp->p->n_funcs; f++) {
    memset(cp->step_seconds[f], 0, sizeof(double) * (size_t)cp->p->funcs[f].n_steps);
    memset(cp->step_runs[f], 0, sizeof(int64_t) * (size_t)cp->p->funcs[f].n_steps);
  }
}

/* ---------------------------------------------------------------- the device (runtime/device.h) */

static int dev_call(RtDevice *d, int func, void *const *args, void **rets, char *err, size_t errlen) {
  return cpu_program_call(d->impl, func, args, rets, err, errlen);
}

static float *dev_host(RtDevice *d, int g) { return cpu_global(d->impl, g); }

static int dev_read(RtDevice *d, int g, float *out, char *err, size_t errlen) {
  const float *x = cpu_global(d->impl, g);
  if (!x) return rt_fail(err, errlen, 2, "no global %d in the program", g);
  memcpy(out, x, sizeof(float) * (size_t)d->p->globals[g].n);
  return 0;
}

static int dev_write(RtDevice *d, int g, const float *in, char *err, size_t errlen) {
  float *x = cpu_global(d->impl, g);
  if (!x) return rt_fail(err, errlen, 2, "no global %d in the program", g);
  const RtGlobal *gl = &d->p->globals[g];
  memcpy(x, in, sizeof(float) * (size_t)gl->n);
  if (gl->round) rt_round_buf(NULL, x, gl->n, (RtRound)gl->round);
  return 0;
}

void cpu_device(RtDevice *d, CpuProgram *cp) {
  *d = (RtDevice){.p = cp->p, .kind = "cpu", .impl = cp, .call = dev_call, .read = dev_read, .write = dev_write,
                  .host = dev_host, .close = NULL};
}
