/* tests/unit/test_cpu_kernels.c — every builtin of the CPU runtime (runtime/cpu/cpu_kernels.h)
 * against the reference executor (ir/interp.c), which defines what each op means.
 *
 * Each case builds a one-op module with the Builder API, fills its arguments (and the
 * globals an effect op writes) with random values, runs it on the reference executor, and
 * runs the matching RT_STEP_BUILTIN through cpu_builtin_check + cpu_builtin_run on the
 * same data, with outputs pre-filled with NaN (every output must be overwritten).
 *
 * Pass criteria, per written buffer:
 *   - bitwise equal between a 1-thread and a 3-thread pool (sizes are chosen so that every
 *     case really splits across threads: above the kernels' inline thresholds);
 *   - integers equal to the reference exactly;
 *   - floats: max|cpu - ref| <= 1e-5 * max(1, max|ref|).  The CPU kernels keep the
 *     reference's formulas but sum rows with 8 partial accumulators and use a polynomial
 *     exp (~1e-7 relative); for the sizes here (at most a few hundred O(1) terms) the f32
 *     rounding of either order is ~1e-7 relative per term, ~1e-6 for a whole row, so 1e-5
 *     leaves a decade of margin while any real mistake (a wrong index, a missing term, a
 *     wrong mask, a wrong kv head) is off by O(1e-2) or more.  Ops that do the
 *     reference's operations in its order (rope, adamw, embedding, data movement) report
 *     an error of 0.
 *   - outputs rounded to bf16: a last-bit difference before rounding may move a value by
 *     one bf16 step (2^-8 relative), so the bound is 2^-7 * max(1, max|ref|); and every
 *     value must be exactly representable in bf16 (rounding applied).
 * Also: rt_round equals ir's dtype_round bitwise for every format on random and special
 * values, and the thread pool calls every index exactly once for static and dynamic runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/threadpool.h"
#define SPLITMIX_SEED 12345   /* this test's data since it was written */
#include "tests/unit/splitmix.h"

static int n_pass, n_fail;
/* The cp coordinate the reference and the builtins run as (ring attention's blocks, rope over
   a split sequence); 0 elsewhere. */
static int cp_coord;
static ThreadPool *tp1, *tp3;

static double unif(void) { return urand(); }
static double normal(void) { return sqrt(-2.0 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif()); }

static RtRound round_of(DType t) {
  switch (t) {
  case DT_BF16: return RT_ROUND_BF16;
  case DT_F16: return RT_ROUND_F16;
  case DT_F8E4M3: return RT_ROUND_F8E4M3;
  case DT_F8E5M2: return RT_ROUND_F8E5M2;
  default: return RT_ROUND_NONE;
  }
}

/* ---------------------------------------------------------------- a case */

enum { SRC_ARG, SRC_GLOBAL, SRC_RET };
typedef struct {
  Module *m;
  Func *f;
  Builder b;
  GlobalStore *gs;
  int n_args, n_globals;
  Tensor *args[16];
  struct {
    int src, idx;
    Value *v;
    int expect;   /* an input updated in place: compare with result `expect - 1` (0: not) */
  } buf[RT_MAX_BUFS];
  int nb;
  double gfill[16][2];   /* global k: scale, nonneg */
  RtStep st;
} Case;

static Type ty(DType dt, int rank, const int64_t *dims) { return type_make(dt, rank, dims); }

static void begin(Case *c, RtBuiltin which) {
  memset(c, 0, sizeof *c);
  c->m = module_new("t");
  c->f = module_add_func(c->m, "f");
  c->b.f = c->f;
  c->st.kind = RT_STEP_BUILTIN;
  c->st.which = which;
}

static void fill_tensor(Tensor *t, double scale, int64_t int_hi, bool nonneg) {
  for (int64_t k = 0; k < t->n; k++) {
    if (t->f) {
      double v = normal() * scale;
      t->f[k] = dtype_round(t->type.dtype, (float)(nonneg ? fabs(v) : v));
    } else {
      t->i[k] = int_hi > 0 ? (int64_t)(rng() % (uint64_t)int_hi) : (int64_t)(rng() % 7) - 3;
    }
  }
}

/* An argument of the function and an input buffer of the builtin. */
static Value *arg(Case *c, DType dt, int rank, const int64_t *dims, double scale, int64_t int_hi) {
  Type t = ty(dt, rank, dims);
  Value *v = func_add_arg(c->f, NULL, t);
  Tensor *x = tensor_new(&t);
  fill_tensor(x, scale, int_hi, false);
  c->args[c->n_args] = x;
  c->buf[c->nb].src = SRC_ARG;
  c->buf[c->nb].idx = c->n_args++;
  c->buf[c->nb++].v = v;
  c->st.n_in++;
  return v;
}

/* A global written in place (an effect op's destination), an input buffer. */
static Value *global(Case *c, DType dt, int rank, const int64_t *dims, double scale, bool nonneg) {
  char name[32];
  snprintf(name, sizeof name, "g%d", c->n_globals);
  Global *g = module_add_global(c->m, GLOBAL_STATE, name, ty(dt, rank, dims), (Init){INIT_ZEROS, 0});
  c->gfill[c->n_globals][0] = scale;
  c->gfill[c->n_globals][1] = nonneg;
  c->buf[c->nb].src = SRC_GLOBAL;
  c->buf[c->nb].idx = c->n_globals++;
  c->buf[c->nb++].v = g->value;
  c->st.n_in++;
  return g->value;
}

/* A result of the function and an output buffer. */
static void ret(Case *c, Value *v) {
  func_add_ret(c->f, v);
  c->buf[c->nb].src = SRC_RET;
  c->buf[c->nb].idx = c->f->rets.n - 1;
  c->buf[c->nb++].v = v;
  c->st.n_out++;
}

static void ints(Case *c, const int64_t *v, int n) { memcpy(c->st.i, v, sizeof(int64_t) * (size_t)n); }

static void fail_case(const char *name, const char *msg) {
  printf("FAIL %-34s %s\n", name, msg);
  n_fail++;
}

/* Host copies of every buffer, inputs filled, outputs NaN; runs the builtin. */
static int run_cpu(Case *c, Tensor **g0, ThreadPool *tp, void **host, char *err, size_t errlen) {
  for (int k = 0; k < c->nb; k++) {
    const Type *t = &c->buf[k].v->type;
    int64_t n = type_numel(t);
    host[k] = malloc(4 * (size_t)(n ? n : 1));
    memset(host[k], 0xFF, 4 * (size_t)n);   /* NaN / -1: must be overwritten */
    const Tensor *src = c->buf[k].src == SRC_ARG ? c->args[c->buf[k].idx]
                        : c->buf[k].src == SRC_GLOBAL ? g0[c->buf[k].idx] : NULL;
    for (int64_t e = 0; src && e < n; e++) {
      if (src->f) ((float *)host[k])[e] = src->f[e];
      else ((int32_t *)host[k])[e] = (int32_t)src->i[e];
    }
  }
  Comm comm;
  memset(&comm, 0, sizeof comm);
  comm.coord[AX_CP] = cp_coord;
  return cpu_builtin_run(tp, &comm, &c->st, host, err, errlen);
}

/* tol: relative bound of float outputs (0: the default 1e-5). */
static void run(Case *c, const char *name, double tol) {
  char err[2048] = "";
  if (c->b.err[0] || verify_module(c->m, err, sizeof err)) {
    fail_case(name, c->b.err[0] ? c->b.err : err);
    for (int k = 0; k < c->n_args; k++) tensor_free(c->args[k]);
    module_free(c->m);
    return;
  }
  for (int k = 0; k < c->nb; k++) {
    const Type *t = &c->buf[k].v->type;
    c->st.bufs[k] = (RtBuf){0, !dtype_is_float(t->dtype), (uint8_t)round_of(t->dtype),
                             dtype_is_float(t->dtype) ? RT_ST_F32 : RT_ST_I32, 0, type_numel(t)};
  }
  snprintf(c->st.label, sizeof c->st.label, "%s", name);
  c->gs = globals_new(c->m);
  Tensor *g0[16] = {0}, *rets[16] = {0};
  for (int g = 0; g < c->n_globals; g++) {
    fill_tensor(c->gs->t[g], c->gfill[g][0], 0, c->gfill[g][1] != 0);
    g0[g] = tensor_clone(c->gs->t[g]);
  }
  void *h1[RT_MAX_BUFS] = {0}, *h3[RT_MAX_BUFS] = {0};
  char msg[512] = "";
  if (cpu_builtin_check(&c->st, err, sizeof err)) {
    snprintf(msg, sizeof msg, "check: %s", err);
  } else if (interp_run_comm(c->f, c->gs, c->args, rets, &(IrComm){.coord = {[AX_CP] = cp_coord}}, err, sizeof err)) {
    snprintf(msg, sizeof msg, "reference: %s", err);
  } else if (run_cpu(c, g0, tp1, h1, err, sizeof err) || run_cpu(c, g0, tp3, h3, err, sizeof err)) {
    snprintf(msg, sizeof msg, "cpu: %s", err);
  }
  double worst = 0;
  for (int k = 0; k < c->nb && !msg[0]; k++) {
    if (c->buf[k].src == SRC_ARG && !c->buf[k].expect) continue;
    const Tensor *ref = c->buf[k].expect         ? rets[c->buf[k].expect - 1]
                        : c->buf[k].src == SRC_RET ? rets[c->buf[k].idx]
                                                   : c->gs->t[c->buf[k].idx];
    int64_t n = ref->n;
    if (memcmp(h1[k], h3[k], 4 * (size_t)n)) {
      snprintf(msg, sizeof msg, "buffer %d differs between 1 and 3 threads", k);
      break;
    }
    if (!ref->f) {
      for (int64_t e = 0; e < n; e++)
        if (((int32_t *)h1[k])[e] != ref->i[e]) {
          snprintf(msg, sizeof msg, "buffer %d element %lld: %d, expected %lld", k, (long long)e,
                   ((int32_t *)h1[k])[e], (long long)ref->i[e]);
          break;
        }
      continue;
    }
    bool bf16 = ref->type.dtype == DT_BF16;
    double mx = 1, err_max = 0;
    for (int64_t e = 0; e < n; e++) mx = fmax(mx, fabs(ref->f[e]));
    for (int64_t e = 0; e < n && !msg[0]; e++) {
      float a = ((float *)h1[k])[e];
      uint32_t u;
      memcpy(&u, &a, 4);
      if (bf16 && (u & 0xFFFF)) snprintf(msg, sizeof msg, "buffer %d element %lld is not rounded to bf16", k, (long long)e);
      double d = isnan(a) && isnan(ref->f[e]) ? 0 : fabs((double)a - ref->f[e]);
      if (isnan(d)) d = INFINITY;
      err_max = fmax(err_max, d);
    }
    double bound = (bf16 ? 1.0 / 128 : tol > 0 ? tol : 1e-5) * mx;
    if (!msg[0] && err_max > bound)
      snprintf(msg, sizeof msg, "buffer %d: max error %.3g > %.3g", k, err_max, bound);
    worst = fmax(worst, err_max / mx);
  }
  if (msg[0]) fail_case(name, msg);
  else {
    printf("ok   %-34s max rel err %.2g\n", name, worst);
    n_pass++;
  }
  for (int k = 0; k < c->nb; k++) {
    free(h1[k]);
    free(h3[k]);
  }
  for (int k = 0; k < 16; k++) {
    tensor_free(rets[k]);
    tensor_free(g0[k]);
  }
  for (int k = 0; k < c->n_args; k++) tensor_free(c->args[k]);
  globals_free(c->gs);
  module_free(c->m);
}

/* ---------------------------------------------------------------- cases */

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define I(...) ints(&c, (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

static void norm_cases(void) {
  Case c;
  for (int k = 0; k < 3; k++) {   /* layernorm f32, layernorm bf16, rmsnorm */
    bool ln = k < 2;
    DType dt = k == 1 ? DT_BF16 : DT_F32;
    int64_t rows = 300, Dm = 72;
    begin(&c, ln ? RT_B_LAYERNORM : RT_B_RMSNORM);
    Value *ops[3] = {arg(&c, dt, 3, D(3, 100, Dm), 1.5, 0), arg(&c, dt, 1, D(Dm), 1, 0), NULL};
    if (ln) ops[2] = arg(&c, dt, 1, D(Dm), 1, 0);
    op_set_float(build_begin(&c.b, ln ? OP_LAYERNORM : OP_RMSNORM, ops, ln ? 3 : 2), "eps", 1e-5);
    ret(&c, build_end(&c.b, NULL));
    I(rows, Dm);
    c.st.f[0] = 1e-5;
    run(&c, k == 0 ? "layernorm" : k == 1 ? "layernorm bf16" : "rmsnorm", 0);
  }
  for (int k = 0; k < 2; k++) {
    bool ln = k == 0;
    int64_t Dm = 64;
    begin(&c, ln ? RT_B_LAYERNORM_GRAD : RT_B_RMSNORM_GRAD);
    Value *ops[3] = {arg(&c, DT_F32, 2, D(300, Dm), 1, 0), arg(&c, DT_F32, 2, D(300, Dm), 2, 0),
                     arg(&c, DT_F32, 1, D(Dm), 1, 0)};
    op_set_float(build_begin(&c.b, ln ? OP_LAYERNORM_GRAD : OP_RMSNORM_GRAD, ops, 3), "eps", 1e-5);
    build_end(&c.b, NULL);
    Op *op = c.f->ops.items[0];
    for (int r = 0; r < op->n_results; r++) ret(&c, op->results[r]);
    I(300, Dm);
    c.st.f[0] = 1e-5;
    run(&c, ln ? "layernorm_grad" : "rmsnorm_grad", 0);
  }
  begin(&c, RT_B_SOFTMAX);
  ret(&c, build1(&c.b, OP_SOFTMAX, arg(&c, DT_F32, 2, D(200, 100), 3, 0), NULL));
  I(200, 100);
  run(&c, "softmax", 0);
  begin(&c, RT_B_SOFTMAX_GRAD);
  Value *dy = arg(&c, DT_F32, 2, D(200, 100), 1, 0), *y = arg(&c, DT_F32, 2, D(200, 100), 0.1, 0);
  ret(&c, build2(&c.b, OP_SOFTMAX_GRAD, dy, y, NULL));
  I(200, 100);
  run(&c, "softmax_grad", 0);
}

static void attention_case(const char *name, bool grad, int64_t B, int64_t T, int64_t S, int64_t H, int64_t KV,
                           int64_t Dh, bool causal, int64_t window) {
  Case c;
  begin(&c, grad ? RT_B_ATTENTION_GRAD : RT_B_ATTENTION);
  Value *ops[4];
  int o = 0;
  if (grad) ops[o++] = arg(&c, DT_F32, 4, D(B, T, H, Dh), 1, 0);
  ops[o++] = arg(&c, DT_F32, 4, D(B, T, H, Dh), 1, 0);
  ops[o++] = arg(&c, DT_F32, 4, D(B, S, KV, Dh), 1, 0);
  ops[o++] = arg(&c, DT_F32, 4, D(B, S, KV, Dh), 1, 0);
  Op *op = build_begin(&c.b, grad ? OP_ATTENTION_GRAD : OP_ATTENTION, ops, o);
  op_set_float(op, "scale", 1.0 / sqrt((double)Dh));
  op_set_bool(op, "causal", causal);
  op_set_int(op, "window", window);
  build_end(&c.b, NULL);
  for (int r = 0; r < op->n_results; r++) ret(&c, op->results[r]);
  I(B, T, H, Dh, S, KV, causal, window);
  c.st.f[0] = 1.0 / sqrt((double)Dh);
  run(&c, name, 0);
}

/* The AVX-512 tiles (16 floats) and the AVX2 FMA tiles (8 floats) do the same operations in
   the same order for every element: their results must be the same bits.  Dh 48 and
   T 45 take the remainder paths (a last 8-key slice, dims past the last 32). */
static void attention_instances_case(void) {
  const char *name = "attention tiles avx512 == avx2";
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("fma") || getenv("LOOM_CPU_NOFMA")) {
    printf("skip %-34s this CPU (or LOOM_CPU_NOFMA) has no AVX-512F + FMA tiles to compare\n", name);
    return;
  }
  int64_t B = 2, T = 45, H = 4, KV = 2, Dh = 48;
  size_t nq = (size_t)(B * T * H * Dh), nk = (size_t)(B * T * KV * Dh);
  float *buf = calloc(4 * nq + 2 * nk + 2 * (2 * nq + 4 * nk), sizeof(float));
  if (!buf) {
    fail_case(name, "out of memory");
    return;
  }
  float *q = buf, *dout = q + nq, *k = dout + nq, *v = k + nk, *res[2];
  res[0] = v + nk + 2 * nq;
  res[1] = res[0] + 2 * nq + 4 * nk;
  unsigned seed = 7;
  for (size_t i = 0; i < 2 * nq + 2 * nk; i++) {
    seed = seed * 1664525u + 1013904223u;
    q[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  char err[256];
  bool ok = true;
  for (int inst = 0; inst < 2; inst++) {
    if (inst) setenv("LOOM_CPU_AVX512", "0", 1);
    float *o = res[inst], *dq = o + nq, *dk = dq + nq, *dv = dk + nk;
    for (int causal = 0; causal < 2; causal++) {
      if (cpu_attention(tp3, q, k, v, o, B, T, H, Dh, T, KV, causal, 0, 0.14f, err, sizeof err) ||
          cpu_attention_grad(tp3, dout, q, k, v, dq, dk, dv, B, T, H, Dh, T, KV, causal, 0, 0.14f, err, sizeof err))
        ok = false;
      if (causal == 0) memcpy(dv + nk, o, sizeof(float) * nk);   /* keep a piece of the non-causal output */
    }
  }
  unsetenv("LOOM_CPU_AVX512");
  if (ok && !memcmp(res[0], res[1], sizeof(float) * (2 * nq + 3 * nk))) {
    printf("ok   %-34s forward and gradients, bit for bit\n", name);
    n_pass++;
  } else {
    fail_case(name, ok ? "the two instances' results differ" : err);
  }
  free(buf);
}

/* attention_grad's one-pass form (P and dS kept per (b, kv head)) and its two-pass form
   (LOOM_CPU_ATTN_TWO_PASS=1) form every value the same way: the same bits. */
static void attention_paths_case(void) {
  const char *name = "attention_grad 1 pass == 2 passes";
  static const int64_t cases[][7] = {
      /* B, T, S, H, KV, Dh, causal */
      {2, 45, 45, 4, 2, 48, 1}, {2, 45, 45, 4, 2, 48, 0}, {2, 20, 45, 6, 3, 24, 0},
      {4, 33, 33, 4, 1, 8, 1},  {1, 70, 70, 4, 4, 64, 1}, {4, 40, 9, 4, 1, 8, 0},
  };
  bool ok = true;
  char err[256] = "";
  for (size_t c = 0; c < sizeof cases / sizeof cases[0] && ok; c++) {
    int64_t B = cases[c][0], T = cases[c][1], S = cases[c][2], H = cases[c][3], KV = cases[c][4], Dh = cases[c][5];
    bool causal = cases[c][6];
    size_t nq = (size_t)(B * T * H * Dh), nk = (size_t)(B * S * KV * Dh), nres = nq + 2 * nk;
    float *buf = calloc(2 * nq + 2 * nk + 2 * nres, sizeof(float));
    if (!buf) {
      fail_case(name, "out of memory");
      return;
    }
    float *q = buf, *dout = q + nq, *k = dout + nq, *v = k + nk, *res[2] = {v + nk, v + nk + nres};
    unsigned seed = 11 + (unsigned)c;
    for (size_t i = 0; i < 2 * nq + 2 * nk; i++) {
      seed = seed * 1664525u + 1013904223u;
      q[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    for (int form = 0; form < 2; form++) {
      if (form) setenv("LOOM_CPU_ATTN_TWO_PASS", "1", 1);
      float *dq = res[form], *dk = dq + nq, *dv = dk + nk;
      /* one thread: every case has B*KV >= 4 items, so the one-pass form is taken */
      if (cpu_attention_grad(tp1, dout, q, k, v, dq, dk, dv, B, T, H, Dh, S, KV, causal, 0, 0.2f, err, sizeof err))
        ok = false;
    }
    unsetenv("LOOM_CPU_ATTN_TWO_PASS");
    if (ok && memcmp(res[0], res[1], sizeof(float) * nres)) {
      snprintf(err, sizeof err, "case %zu (B %lld T %lld S %lld): the two forms' gradients differ", c, (long long)B,
               (long long)T, (long long)S);
      ok = false;
    }
    free(buf);
  }
  if (ok) {
    printf("ok   %-34s dq, dk, dv bit for bit (6 shapes)\n", name);
    n_pass++;
  } else {
    fail_case(name, err);
  }
}

static void rope_case(const char *name, int64_t offset, bool inverse) {
  Case c;
  begin(&c, RT_B_ROPE);
  Value *x = arg(&c, DT_F32, 4, D(2, 50, 3, 64), 1, 0);
  Op *op = build_begin(&c.b, OP_ROPE, &x, 1);
  op_set_float(op, "theta", 10000);
  op_set_int(op, "offset", offset);
  op_set_bool(op, "inverse", inverse);
  ret(&c, build_end(&c.b, NULL));
  I(2, 50, 3, 64, offset, inverse);
  c.st.f[0] = 10000;
  run(&c, name, 0);
}

/* Ring attention's blocks (attention_block, attention_block_grad) on rank c of n, against the
   reference: every kv_shift (-1: every rank's keys), both layouts, GQA. */
static void attn_block_case(bool grad, int64_t n, int c_, int64_t shift, bool zigzag, bool causal) {
  char name[96];
  snprintf(name, sizeof name, "attention_block%s n=%lld c=%d kv%+lld %s%s", grad ? "_grad" : "", (long long)n, c_,
           (long long)shift, zigzag ? "zigzag" : "contig", causal ? "" : " full");
  int64_t B = 2, T = 6, H = 4, KV = 2, Dh = 16, S = shift < 0 ? n * T : T;
  Case c;
  begin(&c, grad ? RT_B_ATTN_BLOCK_GRAD : RT_B_ATTN_BLOCK);
  Value *ops[6];
  int o = 0;
  if (grad) ops[o++] = arg(&c, DT_F32, 4, D(B, T, H, Dh), 1, 0);
  ops[o++] = arg(&c, DT_F32, 4, D(B, T, H, Dh), 1, 0);
  ops[o++] = arg(&c, DT_F32, 4, D(B, S, KV, Dh), 1, 0);
  ops[o++] = arg(&c, DT_F32, 4, D(B, S, KV, Dh), 1, 0);
  if (grad) {
    ops[o++] = arg(&c, DT_F32, 3, D(B, T, H), 1, 0);   /* lse */
    ops[o++] = arg(&c, DT_F32, 3, D(B, T, H), 0.3, 0); /* delta */
  }
  Op *op = build_begin(&c.b, grad ? OP_ATTENTION_BLOCK_GRAD : OP_ATTENTION_BLOCK, ops, o);
  op_set_float(op, "scale", 0.25);
  op_set_bool(op, "causal", causal);
  Attr *a = &op->attrs[op_attr_index(op->kind, "seq_axis")];
  a->s = "cp";
  a->set = true;
  op_set_int(op, "seq_n", n);
  op_set_bool(op, "zigzag", zigzag);
  op_set_int(op, "kv_shift", shift);
  build_end(&c.b, NULL);
  for (int r = 0; r < op->n_results; r++) ret(&c, op->results[r]);
  I(B, T, H, Dh, S, KV, causal, AX_CP + 1, n, zigzag, shift);
  c.st.f[0] = 0.25;
  cp_coord = c_;
  run(&c, name, 0);
  cp_coord = 0;
}

static void rope_split_case(void) {
  Case c;
  begin(&c, RT_B_ROPE);
  Value *x = arg(&c, DT_F32, 4, D(2, 8, 3, 16), 1, 0);
  Op *op = build_begin(&c.b, OP_ROPE, &x, 1);
  op_set_float(op, "theta", 10000);
  Attr *a = &op->attrs[op_attr_index(OP_ROPE, "seq_axis")];
  a->s = "cp";
  a->set = true;
  op_set_int(op, "seq_n", 3);
  op_set_bool(op, "zigzag", true);
  ret(&c, build_end(&c.b, NULL));
  I(2, 8, 3, 16, 0, 0, AX_CP + 1, 3, 1);
  c.st.f[0] = 10000;
  cp_coord = 2;
  run(&c, "rope zigzag cp rank 2 of 3", 0);
  cp_coord = 0;
}

/* Generation with a KV cache: rope_at, attention_cached, kv_write (positions drawn in range). */
static void decode_cases(void) {
  int64_t B = 2, C = 3, H = 4, KV = 2, Dh = 16, S = 40;
  Case c;
  begin(&c, RT_B_ROPE_AT);
  Value *x = arg(&c, DT_F32, 4, D(B, C, H, Dh), 1, 0), *pos = arg(&c, DT_I32, 2, D(B, C), 0, S);
  Value *ops[4] = {x, pos};
  op_set_float(build_begin(&c.b, OP_ROPE_AT, ops, 2), "theta", 10000);
  ret(&c, build_end(&c.b, NULL));
  I(B, C, H, Dh);
  c.st.f[0] = 10000;
  run(&c, "rope_at", 0);
  begin(&c, RT_B_ATTN_CACHED);
  ops[0] = arg(&c, DT_F32, 4, D(B, C, H, Dh), 1, 0);
  ops[1] = arg(&c, DT_F32, 4, D(B, S, KV, Dh), 1, 0);
  ops[2] = arg(&c, DT_F32, 4, D(B, S, KV, Dh), 1, 0);
  ops[3] = arg(&c, DT_I32, 2, D(B, C), 0, S);
  op_set_float(build_begin(&c.b, OP_ATTENTION_CACHED, ops, 4), "scale", 0.25);
  ret(&c, build_end(&c.b, NULL));
  I(B, C, H, Dh, S, KV);
  c.st.f[0] = 0.25;
  run(&c, "attention_cached GQA", 0);
  begin(&c, RT_B_KV_WRITE);
  Value *cache = global(&c, DT_F32, 4, D(B, S, KV, Dh), 1, false);
  ops[0] = cache;
  ops[1] = arg(&c, DT_F32, 4, D(B, C, KV, Dh), 1, 0);
  ops[2] = arg(&c, DT_I32, 2, D(B, C), 0, S);
  func_add_op(c.f, OP_KV_WRITE, ops, 3, NULL);
  I(B, C, S, KV * Dh);
  run(&c, "kv_write", 0);
}

static void loss_cases(void) {
  Case c;
  int64_t V = 300;
  begin(&c, RT_B_CROSS_ENTROPY);
  Value *l = arg(&c, DT_F32, 3, D(3, 40, V), 2, 0), *t = arg(&c, DT_I32, 2, D(3, 40), 0, V);
  ret(&c, build2(&c.b, OP_CROSS_ENTROPY, l, t, NULL));
  I(120, V);
  run(&c, "cross_entropy", 0);
  begin(&c, RT_B_CROSS_ENTROPY_GRAD);
  Value *ops[3] = {arg(&c, DT_F32, 2, D(3, 40), 1, 0), arg(&c, DT_F32, 3, D(3, 40, V), 2, 0),
                   arg(&c, DT_I32, 2, D(3, 40), 0, V)};
  ret(&c, build(&c.b, OP_CROSS_ENTROPY_GRAD, ops, 3, NULL));
  I(120, V);
  run(&c, "cross_entropy_grad", 0);

  /* A target outside the vocabulary is bad input (2), as in the reference. */
  float logits[6] = {0};
  int32_t bad[2] = {1, 3};
  float loss[2];
  char err[256] = "";
  int rc = cpu_cross_entropy(tp3, logits, bad, loss, 2, 3, err, sizeof err);
  if (rc == 2 && strstr(err, "outside the vocabulary")) {
    printf("ok   %-34s %s\n", "cross_entropy bad target", err);
    n_pass++;
  } else {
    fail_case("cross_entropy bad target", "not refused");
  }
}

static void embedding_cases(void) {
  Case c;
  begin(&c, RT_B_EMBEDDING);
  Value *tab = arg(&c, DT_F32, 2, D(50, 96), 1, 0), *ids = arg(&c, DT_I32, 2, D(4, 60), 0, 50);
  ret(&c, build2(&c.b, OP_EMBEDDING, tab, ids, NULL));
  I(240, 50, 96);
  run(&c, "embedding", 0);
  begin(&c, RT_B_EMBEDDING_GRAD);   /* 240 ids over 50 rows: many repeats */
  Value *ops[2] = {arg(&c, DT_F32, 3, D(4, 60, 96), 1, 0), arg(&c, DT_I32, 2, D(4, 60), 0, 50)};
  Type tt = ty(DT_F32, 2, D(50, 96));
  func_add_op(c.f, OP_EMBEDDING_GRAD, ops, 2, &tt);
  ret(&c, build_end(&c.b, NULL));
  I(240, 50, 96);
  run(&c, "embedding_grad (repeated ids)", 0);
}

static void data_cases(void) {
  Case c;
  const int64_t *perms[3] = {D(0, 2, 1, 3), D(3, 1, 0, 2), D(1, 0, 2, 3)};
  for (int k = 0; k < 3; k++) {
    DType dt = k == 2 ? DT_I32 : DT_F32;
    begin(&c, RT_B_TRANSPOSE);
    Value *x = arg(&c, dt, 4, D(10, 12, 16, 20), 1, 0);
    op_set_ints(c.m, build_begin(&c.b, OP_TRANSPOSE, &x, 1), "perm", perms[k], 4);
    ret(&c, build_end(&c.b, NULL));
    c.st.i[0] = 4;
    memcpy(c.st.i + 1, D(10, 12, 16, 20), 4 * sizeof(int64_t));
    memcpy(c.st.i + 5, perms[k], 4 * sizeof(int64_t));
    run(&c, k == 0 ? "transpose 0213" : k == 1 ? "transpose 3102" : "transpose i32 1023", 0);
  }
  begin(&c, RT_B_SLICE);
  Value *x = arg(&c, DT_F32, 3, D(30, 40, 20), 1, 0);
  Op *op = build_begin(&c.b, OP_SLICE, &x, 1);
  op_set_ints(c.m, op, "start", D(2, 5, 3), 3);
  op_set_ints(c.m, op, "end", D(28, 35, 19), 3);
  ret(&c, build_end(&c.b, NULL));
  I(3, 30, 40, 20, 2, 5, 3, 28, 35, 19);
  run(&c, "slice", 0);
  begin(&c, RT_B_PAD);
  x = arg(&c, DT_F32, 3, D(20, 30, 25), 1, 0);
  op = build_begin(&c.b, OP_PAD, &x, 1);
  op_set_ints(c.m, op, "low", D(1, 0, 2), 3);
  op_set_ints(c.m, op, "high", D(2, 3, 0), 3);
  ret(&c, build_end(&c.b, NULL));
  I(3, 20, 30, 25, 1, 0, 2, 2, 3, 0);
  run(&c, "pad", 0);
  begin(&c, RT_B_CONCAT);
  Value *xs[3] = {arg(&c, DT_F32, 3, D(10, 5, 400), 1, 0), arg(&c, DT_F32, 3, D(10, 7, 400), 1, 0),
                  arg(&c, DT_F32, 3, D(10, 1, 400), 1, 0)};
  op_set_int(build_begin(&c.b, OP_CONCAT, xs, 3), "dim", 1);
  ret(&c, build_end(&c.b, NULL));
  I(3, 10, 400, 5, 7, 1);
  run(&c, "concat", 0);
  /* broadcast [1,40,1] -> [30,40,20]: strides (0, 1, 0); and [20] -> [50,30,20] */
  begin(&c, RT_B_BROADCAST);
  x = arg(&c, DT_F32, 3, D(1, 40, 1), 1, 0);
  ret(&c, build_typed(&c.b, OP_BROADCAST, x, ty(DT_F32, 3, D(30, 40, 20)), NULL));
  I(3, 30, 40, 20, 0, 1, 0);
  run(&c, "broadcast [1,40,1]", 0);
  begin(&c, RT_B_BROADCAST);
  x = arg(&c, DT_I32, 1, D(20), 0, 0);
  ret(&c, build_typed(&c.b, OP_BROADCAST, x, ty(DT_I32, 3, D(50, 30, 20)), NULL));
  I(3, 50, 30, 20, 0, 0, 1);
  run(&c, "broadcast i32 [20]", 0);
  begin(&c, RT_B_COPY);   /* reshape */
  x = arg(&c, DT_F32, 2, D(100, 300), 1, 0);
  ret(&c, build_typed(&c.b, OP_RESHAPE, x, ty(DT_F32, 3, D(10, 10, 300)), NULL));
  I(30000);
  run(&c, "copy (reshape)", 0);
  begin(&c, RT_B_COPY);   /* a cast between floats: y's rounding */
  x = arg(&c, DT_F32, 2, D(100, 300), 1, 0);
  ret(&c, build_typed(&c.b, OP_CAST, x, ty(DT_BF16, 2, D(100, 300)), NULL));
  I(30000);
  run(&c, "copy f32 -> bf16", 0);
  const struct { DType from, to; const char *name; } casts[] = {
    {DT_I32, DT_F32, "cast i32 -> f32"}, {DT_F32, DT_I32, "cast f32 -> i32"},
    {DT_F32, DT_BOOL, "cast f32 -> bool"}, {DT_I32, DT_BOOL, "cast i32 -> bool"}};
  for (int k = 0; k < 4; k++) {
    begin(&c, RT_B_CAST);
    x = arg(&c, casts[k].from, 2, D(100, 300), 3, 0);
    if (casts[k].from == DT_F32)   /* some exact zeros, for bool */
      for (int e = 0; e < 30000; e += 7) c.args[0]->f[e] = 0;
    ret(&c, build_typed(&c.b, OP_CAST, x, ty(casts[k].to, 2, D(100, 300)), NULL));
    I(30000, casts[k].to == DT_BOOL);
    run(&c, casts[k].name, 0);
  }
  for (int k = 0; k < 2; k++) {
    begin(&c, RT_B_IOTA);
    Op *io = func_add_op(c.f, OP_IOTA, NULL, 0, (Type[]){ty(k ? DT_I32 : DT_F32, 3, D(20, 30, 40))});
    op_set_int(io, "dim", 1);
    ret(&c, build_end(&c.b, NULL));
    I(3, 20, 30, 40, 1);
    run(&c, k ? "iota i32" : "iota f32", 0);
  }
  begin(&c, RT_B_FILL);   /* constant */
  Op *co = func_add_op(c.f, OP_CONSTANT, NULL, 0, (Type[]){ty(DT_BF16, 2, D(100, 300))});
  op_set_float(co, "value", 0.3);
  ret(&c, build_end(&c.b, NULL));
  I(30000);
  c.st.f[0] = 0.3;
  run(&c, "fill (constant bf16)", 0);
}

static void effect_cases(void) {
  Case c;
  for (int k = 0; k < 4; k++) {   /* accumulate f32/bf16, assign, fill of a global */
    DType dt = k == 1 ? DT_BF16 : DT_F32;
    begin(&c, k == 3 ? RT_B_FILL : k == 2 ? RT_B_ASSIGN : RT_B_ACCUMULATE);
    Value *dst = global(&c, dt, 2, D(100, 200), 1, false);
    if (k == 3) {
      /* fill $g: the builtin's output is the global (listed as its only buffer) */
      c.buf[0].src = SRC_GLOBAL;
      c.st.n_in = 0;
      c.st.n_out = 1;
      op_set_float(func_add_op(c.f, OP_FILL, &dst, 1, NULL), "value", -1.25);
      I(20000);
      c.st.f[0] = -1.25;
      run(&c, "fill $global", 0);
      continue;
    }
    Value *ops[2] = {dst, arg(&c, dt, 2, D(100, 200), 1, 0)};
    func_add_op(c.f, k == 2 ? OP_ASSIGN : OP_ACCUMULATE, ops, 2, NULL);
    I(20000);
    run(&c, k == 0 ? "accumulate" : k == 1 ? "accumulate bf16" : "assign", 0);
  }
  /* adamw is a pure op in the IR (p2, m2, v2 = adamw p, m, v, ...); the builtin either
     updates p, m, v in place or writes three outputs, which must equal the op's results. */
  for (int k = 0; k < 3; k++) {
    DType dt = k == 1 ? DT_BF16 : DT_F32;
    begin(&c, RT_B_ADAMW);
    Value *ops[7] = {arg(&c, dt, 2, D(150, 130), 1, 0), arg(&c, DT_F32, 2, D(150, 130), 0.01, 0),
                     arg(&c, DT_F32, 2, D(150, 130), 1e-4, 0), arg(&c, DT_F32, 2, D(150, 130), 0.05, 0),
                     arg(&c, DT_F32, 0, NULL, 0, 0), arg(&c, DT_F32, 0, NULL, 0, 0), arg(&c, DT_F32, 0, NULL, 0, 0)};
    for (int64_t e = 0; e < c.args[2]->n; e++) c.args[2]->f[e] = fabsf(c.args[2]->f[e]);
    c.args[4]->f[0] = 0.7f;
    c.args[5]->f[0] = 3e-3f;
    c.args[6]->f[0] = 3;
    Op *op = build_begin(&c.b, OP_ADAMW, ops, 7);
    op_set_float(op, "beta1", 0.9);
    op_set_float(op, "beta2", 0.95);
    op_set_float(op, "eps", 1e-8);
    op_set_float(op, "weight_decay", 0.1);
    build_end(&c.b, NULL);
    for (int r = 0; r < 3; r++) {
      if (k == 2) {
        ret(&c, op->results[r]);
      } else {
        func_add_ret(c.f, op->results[r]);
        c.buf[r].expect = r + 1;
      }
    }
    I(150 * 130);
    c.st.f[0] = 0.9, c.st.f[1] = 0.95, c.st.f[2] = 1e-8, c.st.f[3] = 0.1;
    run(&c, k == 0 ? "adamw in place" : k == 1 ? "adamw in place, bf16 param" : "adamw -> p2 m2 v2", 0);
  }
}

/* ---------------------------------------------------------------- rounding, pool */

static void rounding_case(void) {
  const DType dts[4] = {DT_BF16, DT_F16, DT_F8E4M3, DT_F8E5M2};
  const RtRound rs[4] = {RT_ROUND_BF16, RT_ROUND_F16, RT_ROUND_F8E4M3, RT_ROUND_F8E5M2};
  float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 65504.0f, 65520.0f, 448.0f, 464.0f,
                     57344.0f, 3.4e38f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 512};
  int bad = 0;
  for (int d = 0; d < 4; d++)
    for (int k = 0; k < 200000 + (int)(sizeof special / sizeof *special); k++) {
      float x;
      if (k < (int)(sizeof special / sizeof *special)) x = special[k];
      else {
        uint32_t u = (uint32_t)rng();
        memcpy(&x, &u, 4);
      }
      float a = rt_round(rs[d], x), b = dtype_round(dts[d], x);
      if (memcmp(&a, &b, 4) && !(isnan(a) && isnan(b))) bad++;
    }
  if (bad) fail_case("rt_round == dtype_round", "differs");
  else {
    printf("ok   %-34s bitwise on 800k values\n", "rt_round == dtype_round");
    n_pass++;
  }
}

typedef struct {
  int *count;
  int threads;
  int bad_thread;
} PoolCtx;

static void pool_fn(void *c, int thread, int64_t b, int64_t e) {
  PoolCtx *p = c;
  if (thread < 0 || thread >= p->threads) p->bad_thread = 1;
  for (int64_t i = b; i < e; i++) __atomic_fetch_add(&p->count[i], 1, __ATOMIC_RELAXED);
}

static void pool_plain(void *c, int64_t b, int64_t e) { pool_fn(c, 0, b, e); }

static void pool_case(void) {
  int count[1000];
  bool ok = true;
  ThreadPool *pools[3] = {tp1, tp3, NULL};
  for (int pi = 0; pi < 3; pi++)
    for (int mode = 0; mode < 3; mode++)
      for (int64_t n = 0; n < 1000; n += 37) {
        memset(count, 0, sizeof count);
        PoolCtx p = {count, tp_size(pools[pi]), 0};
        if (mode == 0) tp_run(pools[pi], n, pool_plain, &p);
        else if (mode == 1) tp_run_static(pools[pi], n, pool_fn, &p);
        else tp_run_dynamic(pools[pi], n, 5, pool_fn, &p);
        for (int64_t i = 0; i < 1000; i++)
          if (count[i] != (i < n)) ok = false;
        if (p.bad_thread) ok = false;
      }
  if (ok) {
    printf("ok   %-34s every index once\n", "thread pool");
    n_pass++;
  } else {
    fail_case("thread pool", "an index was not run exactly once");
  }
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  tp1 = tp_new(1);
  tp3 = tp_new(3);
  if (!tp1 || !tp3) {
    printf("FAIL cannot start threads\n");
    return 1;
  }
  pool_case();
  rounding_case();
  norm_cases();
  attention_case("attention causal GQA", false, 2, 37, 37, 4, 2, 16, true, 0);
  attention_case("attention non-causal S!=T GQA", false, 2, 20, 45, 6, 3, 24, false, 0);
  attention_case("attention causal MHA T=70 Dh=64", false, 1, 70, 70, 2, 2, 64, true, 0);
  attention_case("attention causal MQA T=33 Dh=8", false, 2, 33, 33, 4, 1, 8, true, 0);
  attention_case("attention non-causal MQA S<T", false, 2, 40, 9, 4, 1, 8, false, 0);
  attention_case("attention_grad causal GQA", true, 2, 37, 37, 4, 2, 16, true, 0);
  attention_case("attention_grad non-causal S!=T", true, 2, 20, 45, 6, 3, 24, false, 0);
  attention_case("attention_grad causal MHA T=70", true, 1, 70, 70, 2, 2, 64, true, 0);
  attention_case("attention_grad causal MQA T=33", true, 2, 33, 33, 4, 1, 8, true, 0);
  /* sliding windows (Mistral): within a key block, across the 32-position items, of one
     key (each query sees only itself), and longer than the sequence (no effect) */
  attention_case("attention window 5 GQA", false, 2, 37, 37, 4, 2, 16, true, 5);
  attention_case("attention window 33 T=70", false, 1, 70, 70, 2, 2, 64, true, 33);
  attention_case("attention window 1", false, 2, 33, 33, 4, 1, 8, true, 1);
  attention_case("attention window 80 > T", false, 2, 37, 37, 4, 2, 16, true, 80);
  attention_case("attention_grad window 5 GQA", true, 2, 37, 37, 4, 2, 16, true, 5);
  attention_case("attention_grad window 33 T=70", true, 1, 70, 70, 2, 2, 64, true, 33);
  attention_case("attention_grad window 1", true, 2, 33, 33, 4, 1, 8, true, 1);
  attention_case("attention_grad non-causal MQA S<T", true, 2, 40, 9, 4, 1, 8, false, 0);
  attention_instances_case();
  attention_paths_case();
  rope_case("rope", 0, false);
  rope_case("rope inverse offset 5", 5, true);
  rope_split_case();
  for (int grad = 0; grad < 2; grad++)
    for (int zz = 0; zz < 2; zz++)
      for (int c_ = 0; c_ < 3; c_++)
        for (int64_t shift = -1; shift < 3; shift++) attn_block_case(grad, 3, c_, shift, zz, true);
  attn_block_case(false, 2, 1, 1, true, false);
  attn_block_case(true, 2, 1, -1, false, false);
  decode_cases();
  loss_cases();
  embedding_cases();
  data_cases();
  effect_cases();
  tp_free(tp1);
  tp_free(tp3);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
