/* tests/unit/test_cpu_exec.c — the CPU program executor (runtime/cpu/cpu_exec.h) on hand-built
 * lowered programs.
 *
 *  1. A forward program: GEMM (x @ W), a hand-written "JIT" kernel (bias + gelu, its output
 *     rounded to bf16 by the runtime), layernorm, a batched GEMM with a shared transposed
 *     operand (stride 0), cross-entropy.  Checked against a direct computation in double:
 *     the kernel's output must be bf16-representable and within one bf16 step of
 *     bf16(gelu(x W + b)); everything after it is recomputed from the program's own bf16
 *     values, so the loss must agree to 1e-5 relative (f32 rounding of sums of 48-80
 *     terms is ~1e-6).  Runs with 1 and 2 threads must agree bitwise.
 *  2. Global initialization equals ir's globals_init bitwise (normal, ones, const, zeros,
 *     f32 and bf16, several shapes and seeds).
 *  3. A training program (embedding -> cross-entropy, its gradient, AdamW) through the
 *     Executor interface: the loss falls, parameters and optimizer state are exposed by
 *     name, a token outside the vocabulary is refused as bad input.
 *  4. Malformed programs are refused at init with status 2.
 *  5. The fuzz harness's payload seeds (tests/fuzz/corpus/payload/) are executables of
 *     today's format: each parses, has a layout the runner reads, and every lowered program
 *     in it loads (rt_program_load) and, on the cpu backend, passes cpu_program_init, so
 *     fuzz_payload reaches those checks; the seeds cover cpu, cpu mesh and cuda.  When the
 *     payload or program format changes, this fails until the seeds are remade
 *     (tests/fuzz/make_seeds.c says how).
 *  6. A pipelined program's schedule (RtProgram.pipe) and its globals' stages (RtGlobal.owner)
 *     survive rt_program_save/load (what a compiled pipeline runs from, with no IR); a stage
 *     outside the mesh's pp, a schedule past its limits and the previous format are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>

#include "ir/ir.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/fuzz/payload_layout.h"
#define SPLITMIX_SEED 7   /* this test's data since it was written */
#include "tests/unit/splitmix.h"

static int n_pass, n_fail;

static void check(bool ok, const char *name, const char *detail) {
  printf("%s %-40s %s\n", ok ? "ok  " : "FAIL", name, detail ? detail : "");
  if (ok) n_pass++;
  else n_fail++;
}

static double unif(void) { return urand(); }

/* ---------------------------------------------------------------- building programs */

typedef struct {
  int64_t next[RT_REGION_COUNT];
} Layout;

static RtBuf buf(Layout *l, RtRegion r, int64_t n, bool is_int, RtRound round) {
  RtBuf b = {(uint8_t)r, is_int, (uint8_t)round, is_int ? RT_ST_I32 : RT_ST_F32, l->next[r], n};
  l->next[r] += (4 * n + 63) / 64 * 64;
  return b;
}

static RtGlobal global(Layout *l, const char *name, RtRegion r, int rank, const int64_t *shape, RtInitKind init,
                       double v, RtRound round) {
  RtGlobal g;
  memset(&g, 0, sizeof g);
  snprintf(g.name, sizeof g.name, "%s", name);
  g.region = r;
  g.rank = rank;
  g.n = 1;
  for (int d = 0; d < rank; d++) g.n *= g.shape[d] = shape[d];
  g.offset = l->next[r];
  l->next[r] += (4 * g.n + 63) / 64 * 64;
  g.init = init;
  g.init_value = v;
  g.round = round;
  return g;
}

static RtBuf gbuf(const RtGlobal *g) { return (RtBuf){(uint8_t)g->region, 0, g->round, RT_ST_F32, g->offset, g->n}; }

static RtStep step(RtStepKind kind, int which, const char *label, int n_in, int n_out, const RtBuf *bufs,
                   const int64_t *ints, int n_ints, double f0) {
  RtStep s;
  memset(&s, 0, sizeof s);
  s.kind = kind;
  s.which = which;
  s.n_in = n_in;
  s.n_out = n_out;
  memcpy(s.bufs, bufs, sizeof(RtBuf) * (size_t)(n_in + n_out));
  memcpy(s.i, ints, sizeof(int64_t) * (size_t)n_ints);
  s.f[0] = f0;
  snprintf(s.label, sizeof s.label, "%s", label);
  return s;
}
#define S(kind, which, label, n_in, n_out, f0, bufs, ...)                                                    \
  step(kind, which, label, n_in, n_out, (const RtBuf[])bufs, (const int64_t[]){__VA_ARGS__},               \
       (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), f0)
#define B(...) {__VA_ARGS__}

/* ---------------------------------------------------------------- 1. forward program */

enum { M = 64, K = 48, N = 80, V = 40 };

static float gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); }

/* The hand-written "JIT" kernel: out[i] = gelu(h[i] + bias[i % N]). */
static void k_bias_gelu(char **args, int64_t begin, int64_t end) {
  const float *h = (const float *)args[0], *bias = (const float *)args[1];
  float *out = (float *)args[2];
  for (int64_t i = begin; i < end; i++) out[i] = gelu(h[i] + bias[i % N]);
}

static void test_forward(void) {
  Layout l = {{0}};
  RtGlobal gl[5] = {
    global(&l, "W", RT_REGION_PARAMS, 2, (int64_t[]){K, N}, RT_INIT_NORMAL, 0.3, RT_ROUND_NONE),
    global(&l, "bias", RT_REGION_PARAMS, 1, (int64_t[]){N}, RT_INIT_NORMAL, 0.5, RT_ROUND_NONE),
    global(&l, "ln.w", RT_REGION_PARAMS, 1, (int64_t[]){N}, RT_INIT_ONES, 0, RT_ROUND_NONE),
    global(&l, "ln.b", RT_REGION_PARAMS, 1, (int64_t[]){N}, RT_INIT_CONST, 0.1, RT_ROUND_NONE),
    global(&l, "W2", RT_REGION_PARAMS, 2, (int64_t[]){V, N}, RT_INIT_NORMAL, 0.2, RT_ROUND_NONE),
  };
  RtBuf x = buf(&l, RT_REGION_ARENA, M * K, 0, 0), tg = buf(&l, RT_REGION_ARENA, M, 1, 0);
  RtBuf h = buf(&l, RT_REGION_ARENA, M * N, 0, 0), g = buf(&l, RT_REGION_ARENA, M * N, 0, RT_ROUND_BF16);
  RtBuf z = buf(&l, RT_REGION_ARENA, M * N, 0, 0), lg = buf(&l, RT_REGION_ARENA, M * V, 0, 0);
  RtBuf loss = buf(&l, RT_REGION_ARENA, M, 0, 0);
  RtStep steps[5] = {
    S(RT_STEP_GEMM, 0, "h = x @ W", 2, 1, 0, B(x, gbuf(&gl[0]), h), 1, M, N, K, 0, 0, 0, 0, 0),
    S(RT_STEP_KERNEL, 0, "bias_gelu", 2, 1, 0, B(h, gbuf(&gl[1]), g), M * N),
    S(RT_STEP_BUILTIN, RT_B_LAYERNORM, "layernorm", 3, 1, 1e-5, B(g, gbuf(&gl[2]), gbuf(&gl[3]), z), M, N),
    S(RT_STEP_GEMM, 0, "logits = z @ W2^T", 2, 1, 0, B(z, gbuf(&gl[4]), lg), 2, M / 2, V, N, 0, 1, M / 2 * N, 0,
      M / 2 * V),
    S(RT_STEP_BUILTIN, RT_B_CROSS_ENTROPY, "cross_entropy", 2, 1, 0, B(lg, tg, loss), M, V),
  };
  RtFunc f;
  memset(&f, 0, sizeof f);
  snprintf(f.name, sizeof f.name, "forward");
  f.n_steps = 5;
  f.steps = steps;
  f.arena_bytes = l.next[RT_REGION_ARENA];
  f.n_args = 2;
  f.args[0] = x;
  f.args[1] = tg;
  f.n_rets = 2;
  f.rets[0] = loss;
  f.rets[1] = g;
  char names[1][32] = {"k_bias_gelu"};
  RtProgram p = {1, &f, 5, gl, {0, l.next[1], l.next[2], l.next[3]}, 1, names, {1, 1, 1, 1, 1}, {0, 0, 0}};

  float xs[M * K], out_loss[2][M], out_g[2][M * N];
  int32_t tgt[M];
  for (int i = 0; i < M * K; i++) xs[i] = (float)(unif() * 2 - 1);
  for (int i = 0; i < M; i++) tgt[i] = (int32_t)(unif() * V);
  void *kfn[1];
  CpuKernelFn kf = k_bias_gelu;
  memcpy(&kfn[0], &kf, sizeof kf);
  char err[1024];
  CpuProgram cp[2];
  for (int t = 0; t < 2; t++) {
    int rc = cpu_program_init(&cp[t], &p, kfn, t + 1, err, sizeof err);
    if (rc) {
      check(false, "forward program init", err);
      return;
    }
    cpu_globals_init(&cp[t], 3);
    void *args[2] = {xs, tgt}, *rets[2] = {out_loss[t], out_g[t]};
    rc = cpu_program_call(&cp[t], 0, args, rets, err, sizeof err);
    if (rc) {
      check(false, "forward program call", err);
      return;
    }
  }
  /* direct computation */
  const float *W = cpu_global(&cp[0], 0), *bias = cpu_global(&cp[0], 1), *lw = cpu_global(&cp[0], 2),
              *lb = cpu_global(&cp[0], 3), *W2 = cpu_global(&cp[0], 4);
  double gerr = 0, lerr = 0, lmax = 1;
  bool rounded = true;
  for (int m = 0; m < M; m++) {
    const float *gr = out_g[0] + m * N;
    for (int n = 0; n < N; n++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += (double)xs[m * K + k] * W[k * N + n];
      float want = rt_round(RT_ROUND_BF16, gelu((float)acc + bias[n]));
      uint32_t u;
      memcpy(&u, &gr[n], 4);
      if (u & 0xFFFF) rounded = false;
      gerr = fmax(gerr, fabs(gr[n] - want) / fmax(fabs(want), 1e-3));
    }
    double mean = 0, var = 0, z[N], lg[V], mx = -INFINITY, sum = 0;
    for (int n = 0; n < N; n++) mean += gr[n];
    mean /= N;
    for (int n = 0; n < N; n++) var += (gr[n] - mean) * (gr[n] - mean);
    var /= N;
    for (int n = 0; n < N; n++) z[n] = (gr[n] - mean) / sqrt(var + 1e-5) * lw[n] + lb[n];
    for (int v = 0; v < V; v++) {
      lg[v] = 0;
      for (int n = 0; n < N; n++) lg[v] += z[n] * W2[v * N + n];
      mx = fmax(mx, lg[v]);
    }
    for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
    double want = log(sum) + mx - lg[tgt[m]];
    lmax = fmax(lmax, fabs(want));
    lerr = fmax(lerr, fabs(out_loss[0][m] - want));
  }
  char msg[256];
  snprintf(msg, sizeof msg, "bf16 kernel output: max rel err %.2g (one bf16 step is 7.8e-3)", gerr);
  check(rounded && gerr <= 1.0 / 128, "forward: GEMM + kernel, rounded to bf16", msg);
  snprintf(msg, sizeof msg, "max err %.2g (bound %.2g)", lerr, 1e-5 * lmax);
  check(lerr <= 1e-5 * lmax, "forward: layernorm, batched GEMM, loss", msg);
  check(!memcmp(out_loss[0], out_loss[1], sizeof out_loss[0]) && !memcmp(out_g[0], out_g[1], sizeof out_g[0]),
        "forward: 1 and 2 threads bitwise equal", NULL);
  int top[3];
  int n = cpu_profile_top(&cp[1], 0, top, 3);
  bool sorted = n == 3;
  for (int k = 1; k < n; k++) sorted = sorted && cp[1].step_seconds[0][top[k - 1]] >= cp[1].step_seconds[0][top[k]];
  check(sorted && cp[1].step_runs[0][0] == 1, "profile: slowest steps first", NULL);
  cpu_program_free(&cp[0]);
  cpu_program_free(&cp[1]);
}

/* ---------------------------------------------------------------- 2. globals */

static void test_globals(void) {
  struct { const char *name; int rank; int64_t shape[3]; InitKind ik; RtInitKind rk; double v; DType dt; } gs[] = {
    {"transformer.wte.weight", 2, {37, 11}, INIT_NORMAL, RT_INIT_NORMAL, 0.02, DT_F32},
    {"h.0.ln_1.weight", 1, {11}, INIT_ONES, RT_INIT_ONES, 0, DT_F32},
    {"h.0.attn.c_attn.bias", 1, {33}, INIT_ZEROS, RT_INIT_ZEROS, 0, DT_F32},
    {"h.0.mlp.c_fc.weight", 3, {2, 3, 17}, INIT_NORMAL, RT_INIT_NORMAL, 0.5, DT_BF16},
    {"scale", 1, {5}, INIT_CONST, RT_INIT_CONST, 0.3, DT_BF16},
    {"odd", 1, {1}, INIT_NORMAL, RT_INIT_NORMAL, 1.0, DT_F32},
    /* 2.4M elements: drawn in parts on several cores (runtime/program.c), the same bits */
    {"big", 2, {1536, 1536}, INIT_NORMAL, RT_INIT_NORMAL, 0.02, DT_F32},
  };
  int ng = (int)(sizeof gs / sizeof *gs);
  Module *m = module_new("g");
  Layout l = {{0}};
  RtGlobal rg[8];
  for (int k = 0; k < ng; k++) {
    module_add_global(m, GLOBAL_PARAM, gs[k].name, type_make(gs[k].dt, gs[k].rank, gs[k].shape),
                      (Init){gs[k].ik, gs[k].v});
    rg[k] = global(&l, gs[k].name, RT_REGION_PARAMS, gs[k].rank, gs[k].shape, gs[k].rk, gs[k].v,
                   gs[k].dt == DT_BF16 ? RT_ROUND_BF16 : RT_ROUND_NONE);
  }
  RtProgram p = {0, NULL, ng, rg, {0, l.next[1], 0, 0}, 0, NULL, {1, 1, 1, 1, 1}, {0, 0, 0}};
  GlobalStore *st = globals_new(m);
  CpuProgram cp;
  char err[512];
  bool ok = st && !cpu_program_init(&cp, &p, NULL, 1, err, sizeof err);
  for (uint64_t seed = 0; ok && seed < 3; seed++) {
    globals_init(m, st, seed * 41);
    cpu_globals_init(&cp, seed * 41);
    for (int k = 0; k < ng; k++)
      if (memcmp(st->t[k]->f, cpu_global(&cp, k), 4 * (size_t)st->t[k]->n)) ok = false;
  }
  check(ok, "globals: bitwise equal to ir globals_init (a 2.4M-element one drawn in parts on every core)", NULL);
  if (st) cpu_program_free(&cp);
  globals_free(st);
  module_free(m);
}

/* ---------------------------------------------------------------- 3. executor */

enum { TB = 2, TT = 8, TV = 16 };

/* loss[0] = mean of per-token losses (extent 1) */
static void k_mean(char **args, int64_t begin, int64_t end) {
  const float *l = (const float *)args[0];
  float s = 0;
  for (int i = 0; i < TB * TT; i++) s += l[i];
  if (begin < end) ((float *)args[1])[0] = s / (TB * TT);
}

/* grad_norm = sqrt(sum g^2) (extent 1) */
static void k_norm(char **args, int64_t begin, int64_t end) {
  const float *g = (const float *)args[0];
  float s = 0;
  for (int i = 0; i < TV * TV; i++) s += g[i] * g[i];
  if (begin < end) ((float *)args[1])[0] = sqrtf(s);
}

static void test_executor(void) {
  Layout l = {{0}};
  RtGlobal gl[4] = {
    global(&l, "wte", RT_REGION_PARAMS, 2, (int64_t[]){TV, TV}, RT_INIT_NORMAL, 0.5, RT_ROUND_NONE),
    global(&l, "grad.wte", RT_REGION_GRADS, 2, (int64_t[]){TV, TV}, RT_INIT_ZEROS, 0, RT_ROUND_NONE),
    global(&l, "adam_m.wte", RT_REGION_OPTIM, 2, (int64_t[]){TV, TV}, RT_INIT_ZEROS, 0, RT_ROUND_NONE),
    global(&l, "adam_v.wte", RT_REGION_OPTIM, 2, (int64_t[]){TV, TV}, RT_INIT_ZEROS, 0, RT_ROUND_NONE),
  };
  int64_t n = TB * TT;
  Layout la = {{0}};
  RtBuf tok = buf(&la, RT_REGION_ARENA, n, 1, 0), tg = buf(&la, RT_REGION_ARENA, n, 1, 0);
  RtBuf lg = buf(&la, RT_REGION_ARENA, n * TV, 0, 0), losses = buf(&la, RT_REGION_ARENA, n, 0, 0);
  RtBuf loss = buf(&la, RT_REGION_ARENA, 1, 0, 0), dl = buf(&la, RT_REGION_ARENA, n, 0, 0);
  RtBuf dlg = buf(&la, RT_REGION_ARENA, n * TV, 0, 0), dw = buf(&la, RT_REGION_ARENA, TV * TV, 0, 0);
  RtBuf W = gbuf(&gl[0]), G = gbuf(&gl[1]), Mm = gbuf(&gl[2]), Vv = gbuf(&gl[3]);
  RtStep gs[7] = {
    S(RT_STEP_BUILTIN, RT_B_EMBEDDING, "embedding", 2, 1, 0, B(W, tok, lg), n, TV, TV),
    S(RT_STEP_BUILTIN, RT_B_CROSS_ENTROPY, "ce", 2, 1, 0, B(lg, tg, losses), n, TV),
    S(RT_STEP_KERNEL, 0, "mean", 1, 1, 0, B(losses, loss), 1),
    S(RT_STEP_BUILTIN, RT_B_FILL, "dloss", 0, 1, 1.0 / (double)n, B(dl), n),
    S(RT_STEP_BUILTIN, RT_B_CROSS_ENTROPY_GRAD, "ce_grad", 3, 1, 0, B(dl, lg, tg, dlg), n, TV),
    S(RT_STEP_BUILTIN, RT_B_EMBEDDING_GRAD, "emb_grad", 2, 1, 0, B(dlg, tok, dw), n, TV, TV),
    S(RT_STEP_BUILTIN, RT_B_ACCUMULATE, "acc", 2, 0, 0, B(G, dw), TV * TV),
  };
  Layout lo = {{0}};
  RtBuf lr = buf(&lo, RT_REGION_ARENA, 1, 0, 0), t = buf(&lo, RT_REGION_ARENA, 1, 0, 0);
  RtBuf one = buf(&lo, RT_REGION_ARENA, 1, 0, 0), gn = buf(&lo, RT_REGION_ARENA, 1, 0, 0);
  RtStep os[4] = {
    S(RT_STEP_KERNEL, 1, "norm", 1, 1, 0, B(G, gn), 1),
    S(RT_STEP_BUILTIN, RT_B_FILL, "one", 0, 1, 1.0, B(one), 1),
    S(RT_STEP_BUILTIN, RT_B_ADAMW, "adamw", 7, 0, 0.9, B(W, Mm, Vv, G, one, lr, t), TV * TV),
    S(RT_STEP_BUILTIN, RT_B_FILL, "zero grad", 0, 1, 0, B(G), TV * TV),
  };
  os[2].f[1] = 0.95;
  os[2].f[2] = 1e-8;
  os[2].f[3] = 0.0;
  RtFunc f[2];
  memset(f, 0, sizeof f);
  snprintf(f[0].name, sizeof f[0].name, "grad_step");
  f[0].n_steps = 7;
  f[0].steps = gs;
  f[0].arena_bytes = la.next[0];
  f[0].n_args = 2;
  f[0].args[0] = tok;
  f[0].args[1] = tg;
  f[0].n_rets = 1;
  f[0].rets[0] = loss;
  snprintf(f[1].name, sizeof f[1].name, "optimizer_step");
  f[1].n_steps = 4;
  f[1].steps = os;
  f[1].arena_bytes = lo.next[0];
  f[1].n_args = 2;
  f[1].args[0] = lr;
  f[1].args[1] = t;
  f[1].n_rets = 1;
  f[1].rets[0] = gn;
  char names[2][32] = {"k_mean", "k_norm"};
  RtProgram p = {2, f, 4, gl, {0, l.next[1], l.next[2], l.next[3]}, 2, names, {1, 1, 1, 1, 1}, {0, 0, 0}};
  void *kfn[2];
  CpuKernelFn k0 = k_mean, k1 = k_norm;
  memcpy(&kfn[0], &k0, sizeof k0);
  memcpy(&kfn[1], &k1, sizeof k1);
  CpuProgram cp;
  RtDevice dev;
  RtRankExec ce;
  char err[1024];
  if (cpu_program_init(&cp, &p, kfn, 2, err, sizeof err)) {
    check(false, "program init", err);
    return;
  }
  cpu_device(&dev, &cp);
  check(rt_rank_exec_init(&ce, &dev, TB + 1, TT, err, sizeof err) == 2 && strstr(err, "cannot be"),
        "executor: a batch shape that is not @grad_step's token count is refused", err);
  if (rt_rank_exec_init(&ce, &dev, TB, TT, err, sizeof err)) {
    check(false, "executor init", err);
    cpu_program_free(&cp);
    return;
  }
  cpu_globals_init(&cp, 1);
  Executor *ex = &ce.ex;
  int32_t in[TB * TT], out[TB * TT];
  for (int i = 0; i < n; i++) {   /* a fixed next-token map: learnable */
    in[i] = (int32_t)(unif() * TV);
    out[i] = (in[i] * 5 + 3) % TV;
  }
  float first = 0, last = 0, gnorm = 0;
  int rc = 0;
  for (int s = 1; s <= 60 && !rc; s++) {
    rc = ex->grad_step(ex->self, in, out, &last, err, sizeof err);
    if (!rc) rc = ex->optimizer_step(ex->self, 0.05f, (float)s, &gnorm, err, sizeof err);
    if (s == 1) first = last;
  }
  char msg[256];
  snprintf(msg, sizeof msg, "loss %.4f -> %.4f, last grad norm %.3g", first, last, gnorm);
  check(!rc && last < 0.5f * first && gnorm > 0, "executor: training lowers the loss", rc ? err : msg);
  check(ex->n_params == 1 && !strcmp(ex->params[0].name, "wte") && ex->params[0].rank == 2 &&
          ex->params[0].shape[1] == TV && ex->params[0].data == cpu_global(&cp, 0) && ex->n_state == 2 &&
          !strcmp(ex->state[1].name, "adam_v.wte") && ex->batch == TB && ex->seq == TT && !ex->sync_out &&
          !ex->sync_in,
        "executor: params and state by name", NULL);
  in[3] = TV;   /* outside the vocabulary */
  rc = ex->grad_step(ex->self, in, out, &last, err, sizeof err);
  check(rc == 2 && strstr(err, "outside the vocabulary") && strstr(err, "embedding"), "executor: bad token refused",
        err);
  rt_rank_exec_free(&ce);
  cpu_program_free(&cp);
}

/* ---------------------------------------------------------------- 4. malformed programs */

static void test_malformed(void) {
  Layout l = {{0}};
  RtBuf a = buf(&l, RT_REGION_ARENA, 64, 0, 0), b = buf(&l, RT_REGION_ARENA, 64, 0, 0);
  RtStep st[1] = {S(RT_STEP_BUILTIN, RT_B_SOFTMAX, "softmax", 1, 1, 0, B(a, b), 8, 8)};
  RtFunc f;
  memset(&f, 0, sizeof f);
  snprintf(f.name, sizeof f.name, "f");
  f.n_steps = 1;
  f.steps = st;
  f.arena_bytes = l.next[0];
  RtProgram p = {1, &f, 0, NULL, {0}, 0, NULL, {1, 1, 1, 1, 1}, {0, 0, 0}};
  CpuProgram cp;
  char err[512];
  int rc = cpu_program_init(&cp, &p, NULL, 1, err, sizeof err);
  check(rc == 0, "malformed: the well-formed base is accepted", err);
  if (!rc) cpu_program_free(&cp);
  struct { const char *name, *want; } cases[] = {
    {"buffer outside the arena", "outside its region"},
    {"builtin sizes disagree", "expected"},
    {"unknown kernel", "no kernel"},
    {"GEMM operand too small", "outside its buffer"},
  };
  for (int k = 0; k < 4; k++) {
    RtStep s = st[0];
    if (k == 0) s.bufs[1].offset = 1 << 20;
    if (k == 1) s.i[1] = 9;
    if (k == 2) s.kind = RT_STEP_KERNEL, s.which = 3;
    if (k == 3) s = S(RT_STEP_GEMM, 0, "gemm", 2, 1, 0, B(a, a, b), 1, 8, 8, 9, 0, 0, 0, 0, 0);
    f.steps = &s;
    rc = cpu_program_init(&cp, &p, NULL, 1, err, sizeof err);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", err);
    check(rc == 2 && strstr(err, cases[k].want), cases[k].name, msg);
    if (!rc) cpu_program_free(&cp);
  }
}

static void never_run(char **args, int64_t b, int64_t e) {
  (void)args, (void)b, (void)e;
  abort();
}

/* 5: every payload seed loads as the runner would load it. */
static void test_payload_seeds(void) {
  const char *dir = "tests/fuzz/corpus/payload";
  const char *remake = "the payload or program format changed: remake the seeds (tests/fuzz/make_seeds.c)";
  DIR *d = opendir(dir);
  check(d != NULL, "the payload seeds' folder tests/fuzz/corpus/payload exists", dir);
  bool seen_cpu = false, seen_mesh = false, seen_cuda = false;
  int n_seeds = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[1024], name[1200], msg[IR_ERR_LEN + 200], err[IR_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long len = -1;
    if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)len)) &&
        fread(buf, 1, (size_t)len, f) != (size_t)len)
      len = -1;
    if (f) fclose(f);
    n_seeds++;
    Payload p;
    memset(&p, 0, sizeof p);
    int rc = len > 0 ? payload_parse(&p, buf, (size_t)len, err, sizeof err) : 1;
    snprintf(name, sizeof name, "seed %s parses as a payload", path);
    snprintf(msg, sizeof msg, "%s; %s", err, remake);
    check(!rc, name, rc ? msg : NULL);
    PayloadLayout l = rc ? (PayloadLayout){NULL, -1, -1, false} : payload_layout(&p);
    snprintf(name, sizeof name, "seed %s (%d parts) has a layout the runner reads", path, p.n_parts);
    check(rc || l.kind, name, rc || l.kind ? NULL : remake);
    seen_cpu |= l.kind && !strcmp(l.kind, "cpu") && l.decode > 0;
    seen_mesh |= l.kind && !strcmp(l.kind, "cpu mesh") && l.decode > 0;
    seen_cuda |= l.kind && !strcmp(l.kind, "cuda");
    for (int k = 0; k < 2 && l.kind; k++) {
      int part = k ? l.decode : l.program;
      if (part < 0) continue;
      RtProgram prog;
      err[0] = 0;
      rc = rt_program_load(p.parts[part], p.sizes[part], &prog, err, sizeof err);
      snprintf(name, sizeof name, "seed %s: its %s program (part %d) loads", path, k ? "decode" : "lowered", part);
      snprintf(msg, sizeof msg, "%s; %s", err, remake);
      check(!rc, name, rc ? msg : NULL);
      if (rc) continue;
      if (l.cpu) {   /* what fuzz_payload runs next: cpu_program_init's checks */
        void **fns = calloc((size_t)prog.n_kernels + 1, sizeof *fns);
        CpuKernelFn kf = never_run;
        for (int i = 0; fns && i < prog.n_kernels; i++) memcpy(&fns[i], &kf, sizeof kf);
        CpuProgram cp;
        err[0] = 0;
        rc = fns ? cpu_program_init(&cp, &prog, fns, 1, err, sizeof err) : 1;
        snprintf(name, sizeof name, "seed %s: its %s program passes cpu_program_init", path, k ? "decode" : "lowered");
        check(!rc, name, rc ? err : NULL);
        if (!rc) cpu_program_free(&cp);
        free(fns);
      }
      rt_program_free(&prog);
    }
    free(buf);
  }
  if (d) closedir(d);
  bool covered = n_seeds >= 3 && seen_cpu && seen_mesh && seen_cuda;
  check(covered, "the payload seeds cover a cpu and a cpu mesh executable that sample, and a cuda one",
        covered ? NULL : remake);
  /* the regressions (remade by make_seeds.c from the cpu seed) reach the checks they were
     found in: their programs load, but for the one whose counts run past the input */
  static const char *const regs[] = {"step_buffer_count_overflow", "global_offset_overflow",
                                     "builtin_size_product_overflow", "harness_region_sum_overflow",
                                     "counts_past_the_input_oom"};
  for (size_t r = 0; r < sizeof regs / sizeof regs[0]; r++) {
    char path[256], name[400], err[IR_ERR_LEN] = "";
    snprintf(path, sizeof path, "tests/fuzz/regressions/payload/%s", regs[r]);
    FILE *f = fopen(path, "rb");
    long len = -1;
    uint8_t *buf = NULL;
    if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)len)) &&
        fread(buf, 1, (size_t)len, f) != (size_t)len)
      len = -1;
    if (f) fclose(f);
    Payload p;
    memset(&p, 0, sizeof p);
    PayloadLayout l = {NULL, -1, -1, false};
    if (len > 0 && !payload_parse(&p, buf, (size_t)len, err, sizeof err)) l = payload_layout(&p);
    RtProgram prog;
    bool past = strstr(regs[r], "past_the_input") != NULL;
    int rc = l.program > 0 ? rt_program_load(p.parts[l.program], p.sizes[l.program], &prog, err, sizeof err) : -1;
    snprintf(name, sizeof name, "regression %s: its program %s", path, past ? "is refused as damaged" : "loads");
    check(past ? rc == 2 && !strstr(err, "magic") : rc == 0, name, rc < 0 || (rc != 0) != past ? remake : NULL);
    if (rc == 0) rt_program_free(&prog);
    free(buf);
  }
}

static void test_program_pipe(void) {
  RtGlobal gl[3];
  memset(gl, 0, sizeof gl);
  for (int k = 0; k < 3; k++) {
    snprintf(gl[k].name, sizeof gl[k].name, "w%d", k);
    gl[k].region = RT_REGION_PARAMS, gl[k].offset = 64 * k, gl[k].n = 4, gl[k].rank = 1, gl[k].shape[0] = 4;
  }
  gl[0].owner = 0, gl[1].owner = 1, gl[2].owner = -1;
  RtProgram p = {0, NULL, 3, gl, {0, 192, 0, 0}, 0, NULL, {1, 1, 1, 2, 1}, {3, 2, 4}};   /* interleaved, v=2, 4 mbs */
  unsigned char *bytes = NULL;
  size_t n = 0;
  char err[512] = "";
  RtProgram q;
  int rc = rt_program_save(&p, &bytes, &n, err, sizeof err);
  if (!rc) rc = rt_program_load(bytes, n, &q, err, sizeof err);
  check(!rc && q.pipe.kind == 3 && q.pipe.virt == 2 && q.pipe.micro == 4 && q.mesh[3] == 2 && q.n_globals == 3 &&
            q.globals[0].owner == 0 && q.globals[1].owner == 1 && q.globals[2].owner == -1,
        "a pipelined program's schedule and stages survive save and load", rc ? err : NULL);
  if (!rc) rt_program_free(&q);
  free(bytes);
  /* damaged: a stage outside pp=2, an unknown schedule, no micro-batches */
  for (int c = 0; c < 3; c++) {
    RtProgram d = p;
    RtGlobal dg[3];
    memcpy(dg, gl, sizeof dg);
    d.globals = dg;
    if (c == 0) dg[1].owner = 2;
    if (c == 1) d.pipe.kind = 9;
    if (c == 2) d.pipe.micro = 0;
    bytes = NULL, err[0] = 0;
    rc = rt_program_save(&d, &bytes, &n, err, sizeof err);
    if (!rc) rc = rt_program_load(bytes, n, &q, err, sizeof err);
    char name[128];
    snprintf(name, sizeof name, "a program with %s is refused as damaged (2)",
             c == 0 ? "a stage outside the mesh's pp" : c == 1 ? "an unknown schedule" : "a schedule of 0 micro-batches");
    check(rc == 2 && strstr(err, "damaged"), name, err);
    if (!rc) rt_program_free(&q);
    free(bytes);
  }
  /* the previous format (LOOMPRG3: no schedule, no stages) is refused with the fix */
  bytes = NULL;
  rc = rt_program_save(&p, &bytes, &n, err, sizeof err);
  if (!rc) bytes[7] = '3', rc = rt_program_load(bytes, n, &q, err, sizeof err);
  check(rc == 2 && strstr(err, "recompile it"), "a LOOMPRG3 program is refused: recompile it", err);
  free(bytes);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_payload_seeds();
  test_program_pipe();
  test_forward();
  test_globals();
  test_executor();
  test_malformed();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
