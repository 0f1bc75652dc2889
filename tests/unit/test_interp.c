/* tests/unit/test_interp.c — the reference interpreter (ir/interp.c, interp_run) on small
 * hand-built functions, against values computed by hand or by an independent double-precision
 * loop in this file: matmul (transposes, batches), softmax and the norms, attention (causal,
 * grouped heads, against attention_ref), RoPE, cross-entropy and the embedding, data movement,
 * reductions, elementwise ops and a whole function.  Split from test_ir.c (the IR core: models,
 * the op table, types, names, the text form's fuzzing): this file runs ops, that one builds,
 * prints and parses them.  Runs from the repository root; failures print, then "N passed, M
 * failed".
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/unit/check.h"
#include "tests/unit/splitmix.h"

typedef struct {
  Module *m;
  Func *f;
  Builder b;
} Ctx;

static void ctx_init(Ctx *c) {
  memset(c, 0, sizeof *c);
  c->m = module_new("t");
  c->f = module_add_func(c->m, "f");
  c->b.f = c->f;
}

static Type T(DType dt, int rank, ...) {
  int64_t dims[IR_MAX_RANK];
  va_list ap;
  va_start(ap, rank);
  for (int i = 0; i < rank; i++) dims[i] = va_arg(ap, int);
  va_end(ap);
  return type_make(dt, rank, dims);
}

static Tensor *tensor_of(Type t, const double *vals) {
  Tensor *x = tensor_new(&t);
  for (int64_t k = 0; k < x->n; k++) {
    if (x->f) x->f[k] = (float)vals[k];
    else x->i[k] = (int64_t)vals[k];
  }
  return x;
}

/* Verifies and runs c's function (one result `ret`), returns the result or NULL. */
static Tensor *run(Ctx *c, Value *ret, Tensor **args, const char *what, char *err, size_t errlen) {
  func_add_ret(c->f, ret);
  if (c->b.err[0]) {
    snprintf(err, errlen, "build: %.1000s", c->b.err);
    return NULL;
  }
  if (verify_module(c->m, err, errlen)) return NULL;
  GlobalStore *g = globals_new(c->m);
  Tensor *out[1] = {0};
  int rc = interp_run(c->f, g, args, out, err, errlen);
  globals_free(g);
  (void)what;
  return rc ? NULL : out[0];
}

/* Compares t to want[] (n values) within abs tol + rel tol; prints the first mismatch. */
static void expect_values(const char *what, Tensor *t, const char *err, const double *want, int64_t n, double tol) {
  if (!t) {
    check(false, "%s", what);
    printf("    %s\n", err);
    return;
  }
  bool ok = t->n == n;
  int64_t bad = -1;
  for (int64_t k = 0; ok && k < n; k++) {
    double got = t->f ? t->f[k] : (double)t->i[k];
    if (!(fabs(got - want[k]) <= tol * (1 + fabs(want[k])))) ok = false, bad = k;
  }
  check(ok, "%s", what);
  if (!ok) {
    if (t->n != n) printf("    %lld elements, want %lld\n", (long long)t->n, (long long)n);
    else printf("    element %lld: got %.9g want %.9g\n", (long long)bad, t->f ? t->f[bad] : (double)t->i[bad], want[bad]);
  }
}

static void free_all(Tensor **ts, int n) {
  for (int i = 0; i < n; i++) tensor_free(ts[i]);
}

/* One op on given args; attributes set by `set` (may be NULL). */
typedef void (*SetAttrs)(Module *m, Op *op);

static Tensor *run_op(OpKind k, Type *arg_types, Tensor **args, int n_args, SetAttrs set, const Type *typed,
                      char *err, size_t errlen, Ctx *c) {
  ctx_init(c);
  Value *vals[8];
  for (int i = 0; i < n_args; i++) vals[i] = func_add_arg(c->f, NULL, arg_types[i]);
  Value *r;
  if (typed) {
    Op *op = func_add_op(c->f, k, vals, n_args, typed);
    if (set) set(c->m, op);
    r = op->results[0];
  } else {
    Op *op = build_begin(&c->b, k, vals, n_args);
    if (set) set(c->m, op);
    r = build_end(&c->b, NULL);
  }
  return run(c, r, args, "", err, errlen);
}

static bool g_ta, g_tb;
static void set_tatb(Module *m, Op *op) {
  (void)m;
  op_set_bool(op, "ta", g_ta);
  op_set_bool(op, "tb", g_tb);
}

static void test_matmul(void) {
  const double A[] = {1, 2, 3, 4, 5, 6}, At[] = {1, 4, 2, 5, 3, 6};         /* [2,3] and its transpose [3,2] */
  const double B[] = {7, 8, 9, 10, 11, 12}, Bt[] = {7, 9, 11, 8, 10, 12};   /* [3,2] and [2,3] */
  const double C[] = {58, 64, 139, 154};                                    /* by hand */
  char err[IR_ERR_LEN], what[128];
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      Ctx c;
      Type ts[2] = {ta ? T(DT_F32, 2, 3, 2) : T(DT_F32, 2, 2, 3), tb ? T(DT_F32, 2, 2, 3) : T(DT_F32, 2, 3, 2)};
      Tensor *args[2] = {tensor_of(ts[0], ta ? At : A), tensor_of(ts[1], tb ? Bt : B)};
      g_ta = ta, g_tb = tb;
      Tensor *r = run_op(OP_MATMUL, ts, args, 2, set_tatb, NULL, err, sizeof err, &c);
      snprintf(what, sizeof what, "interp matmul [2,3]x[3,2] ta=%d tb=%d", ta, tb);
      expect_values(what, r, err, C, 4, 0);
      tensor_free(r);
      free_all(args, 2);
      module_free(c.m);
    }
  /* Batched a [2,2,3] = [A; A2]; A2 picks rows 0 and 2 of its b. */
  const double Ab[] = {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 0, 1};
  const double Abt[] = {1, 4, 2, 5, 3, 6, 1, 0, 0, 0, 0, 1};   /* each batch transposed: [2,3,2] */
  const double Bb[] = {7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6};  /* [B; B2] */
  const double Bbt[] = {7, 9, 11, 8, 10, 12, 1, 3, 5, 2, 4, 6};
  const double Cb[] = {58, 64, 139, 154, 1, 2, 5, 6};          /* A2*B2 = rows 0 and 2 of B2 */
  const double Cw[] = {58, 64, 139, 154, 7, 8, 11, 12};        /* A2*B = rows 0 and 2 of B */
  struct {
    int ta, tb;
    const double *a, *b;
    Type at, bt;
    const double *want;
    const char *what;
  } cases[] = {
    {0, 0, Ab, Bb, T(DT_F32, 3, 2, 2, 3), T(DT_F32, 3, 2, 3, 2), Cb, "interp matmul batched b [2,2,3]x[2,3,2]"},
    {0, 1, Ab, Bbt, T(DT_F32, 3, 2, 2, 3), T(DT_F32, 3, 2, 2, 3), Cb, "interp matmul batched b, tb"},
    {1, 0, Abt, Bb, T(DT_F32, 3, 2, 3, 2), T(DT_F32, 3, 2, 3, 2), Cb, "interp matmul batched b, ta"},
    {1, 1, Abt, Bbt, T(DT_F32, 3, 2, 3, 2), T(DT_F32, 3, 2, 2, 3), Cb, "interp matmul batched b, ta and tb"},
    {0, 0, Ab, B, T(DT_F32, 3, 2, 2, 3), T(DT_F32, 2, 3, 2), Cw, "interp matmul [2,2,3] x weight [3,2] (broadcast b)"},
    {0, 1, Ab, Bt, T(DT_F32, 3, 2, 2, 3), T(DT_F32, 2, 2, 3), Cw, "interp matmul [2,2,3] x weight [2,3] tb"},
    {1, 1, Abt, Bt, T(DT_F32, 3, 2, 3, 2), T(DT_F32, 2, 2, 3), Cw, "interp matmul ta with a broadcast weight, tb"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Ctx c;
    Type ts[2] = {cases[i].at, cases[i].bt};
    Tensor *args[2] = {tensor_of(ts[0], cases[i].a), tensor_of(ts[1], cases[i].b)};
    g_ta = cases[i].ta, g_tb = cases[i].tb;
    Tensor *r = run_op(OP_MATMUL, ts, args, 2, set_tatb, NULL, err, sizeof err, &c);
    expect_values(cases[i].what, r, err, cases[i].want, 8, 0);
    tensor_free(r);
    free_all(args, 2);
    module_free(c.m);
  }
}

static double g_eps;
static void set_eps(Module *m, Op *op) {
  (void)m;
  op_set_float(op, "eps", g_eps);
}

static void test_softmax_norms(void) {
  char err[IR_ERR_LEN];
  Ctx c;
  /* softmax of [0, ln2, ln3, ln4] = [1,2,3,4]/10; of equal huge values = uniform. */
  const double x[] = {0, log(2), log(3), log(4), 1000, 1000, 1000, 1000, -3, 0, 3, 1};
  double want[12] = {0.1, 0.2, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25};
  double s = exp(-3) + exp(0) + exp(3) + exp(1);
  want[8] = exp(-3) / s, want[9] = 1 / s, want[10] = exp(3) / s, want[11] = exp(1) / s;
  Type t = T(DT_F32, 2, 3, 4);
  Tensor *a[1] = {tensor_of(t, x)};
  Tensor *r = run_op(OP_SOFTMAX, &t, a, 1, NULL, NULL, err, sizeof err, &c);
  expect_values("interp softmax over the last dim (incl. a row of 1000s)", r, err, want, 12, 1e-6);
  tensor_free(r);
  free_all(a, 1);
  module_free(c.m);

  /* layernorm / rmsnorm over the last dim; reference in double. */
  const double xs[] = {1, 2, 3, 4, -1, 0, 0, 1}, w[] = {1, 2, 1, 0.5}, bias[] = {0, 0, 1, -1};
  double ln[8], rms[8];
  g_eps = 1e-5;
  for (int row = 0; row < 2; row++) {
    const double *xr = xs + 4 * row;
    double mean = (xr[0] + xr[1] + xr[2] + xr[3]) / 4, var = 0, ms = 0;
    for (int i = 0; i < 4; i++) var += (xr[i] - mean) * (xr[i] - mean) / 4, ms += xr[i] * xr[i] / 4;
    for (int i = 0; i < 4; i++) {
      ln[4 * row + i] = (xr[i] - mean) / sqrt(var + g_eps) * w[i] + bias[i];
      rms[4 * row + i] = xr[i] / sqrt(ms + g_eps) * w[i];
    }
  }
  /* Spot-check the reference by hand: row 0 has mean 2.5 and variance 1.25. */
  check(fabs(ln[0] - (-1.5 / sqrt(1.25 + 1e-5))) < 1e-12 && fabs(rms[3] - 4 / sqrt(7.5 + 1e-5) * 0.5) < 1e-12,
        "norm reference agrees with the hand values");
  Type ts[3] = {T(DT_F32, 2, 2, 4), T(DT_F32, 1, 4), T(DT_F32, 1, 4)};
  Tensor *args[3] = {tensor_of(ts[0], xs), tensor_of(ts[1], w), tensor_of(ts[2], bias)};
  r = run_op(OP_LAYERNORM, ts, args, 3, set_eps, NULL, err, sizeof err, &c);
  expect_values("interp layernorm (eps 1e-5, weight and bias)", r, err, ln, 8, 1e-6);
  tensor_free(r);
  module_free(c.m);
  r = run_op(OP_RMSNORM, ts, args, 2, set_eps, NULL, err, sizeof err, &c);
  expect_values("interp rmsnorm (eps 1e-5, weight)", r, err, rms, 8, 1e-6);
  tensor_free(r);
  free_all(args, 3);
  module_free(c.m);
}

static double g_scale;
static bool g_causal;
static void set_attn(Module *m, Op *op) {
  (void)m;
  op_set_float(op, "scale", g_scale);
  op_set_bool(op, "causal", g_causal);
}

/* Independent reference: plain loops in double, query head h reads kv head h / (H/KV). */
static void attention_ref(const double *q, const double *k, const double *v, double *out, int B, int T_, int S, int H,
                          int KV, int D, double scale, bool causal) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T_; t++)
      for (int h = 0; h < H; h++) {
        int kvh = h / (H / KV), n = causal ? t + 1 : S;
        double sc[64], mx = -INFINITY, sum = 0;
        for (int s = 0; s < n; s++) {
          double dot = 0;
          for (int d = 0; d < D; d++) dot += q[((b * T_ + t) * H + h) * D + d] * k[((b * S + s) * KV + kvh) * D + d];
          sc[s] = dot * scale;
          if (sc[s] > mx) mx = sc[s];
        }
        for (int s = 0; s < n; s++) sum += (sc[s] = exp(sc[s] - mx));
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int s = 0; s < n; s++) acc += sc[s] / sum * v[((b * S + s) * KV + kvh) * D + d];
          out[((b * T_ + t) * H + h) * D + d] = acc;
        }
      }
}

static void test_attention(void) {
  char err[IR_ERR_LEN];
  Ctx c;
  /* 1x3x2x2, one kv head (GQA 2 -> 1), by hand.  Keys: k_s = [ln(s+1), 0], so query
     [1, 0] (head 0) weighs position s by s+1 and query [0, 0] (head 1) weighs all
     allowed positions equally.  Values v_s = [1,2], [3,4], [5,6]. */
  const double q[] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
  const double k[] = {0, 0, log(2), 0, log(3), 0};
  const double v[] = {1, 2, 3, 4, 5, 6};
  const double want[] = {
    1, 2, 1, 2,                                     /* t=0: only v0 */
    7.0 / 3, 10.0 / 3, 2, 3,                        /* t=1: (1 v0 + 2 v1)/3; mean(v0, v1) */
    22.0 / 6, 28.0 / 6, 3, 4,                       /* t=2: (v0 + 2 v1 + 3 v2)/6; mean(v0..v2) */
  };
  Type ts[3] = {T(DT_F32, 4, 1, 3, 2, 2), T(DT_F32, 4, 1, 3, 1, 2), T(DT_F32, 4, 1, 3, 1, 2)};
  Tensor *args[3] = {tensor_of(ts[0], q), tensor_of(ts[1], k), tensor_of(ts[2], v)};
  g_scale = 1, g_causal = true;
  Tensor *r = run_op(OP_ATTENTION, ts, args, 3, set_attn, NULL, err, sizeof err, &c);
  expect_values("interp attention causal GQA 1x3x2x2 (hand-computed)", r, err, want, 12, 1e-6);
  double ref[12];
  attention_ref(q, k, v, ref, 1, 3, 3, 2, 1, 2, 1, true);
  expect_values("attention reference loop agrees with the hand values", r ? r : NULL, err, ref, 12, 1e-6);
  tensor_free(r);
  free_all(args, 3);
  module_free(c.m);

  /* Random GQA 4 -> 2, B=2, T=3, Dh=4, causal; and non-causal with S=5 keys. */
  for (int causal = 1; causal >= 0; causal--) {
    int B = 2, Tq = 3, S = causal ? 3 : 5, H = 4, KV = 2, D = 4;
    double qq[96], kk[80], vv[80], out[96];
    for (int i = 0; i < B * Tq * H * D; i++) qq[i] = urand() * 2 - 1;
    for (int i = 0; i < B * S * KV * D; i++) kk[i] = urand() * 2 - 1, vv[i] = urand() * 2 - 1;
    attention_ref(qq, kk, vv, out, B, Tq, S, H, KV, D, 0.5, causal);
    Type t3[3] = {T(DT_F32, 4, B, Tq, H, D), T(DT_F32, 4, B, S, KV, D), T(DT_F32, 4, B, S, KV, D)};
    Tensor *a3[3] = {tensor_of(t3[0], qq), tensor_of(t3[1], kk), tensor_of(t3[2], vv)};
    g_scale = 0.5, g_causal = causal;
    r = run_op(OP_ATTENTION, t3, a3, 3, set_attn, NULL, err, sizeof err, &c);
    expect_values(causal ? "interp attention causal GQA 4->2, B=2 T=3 Dh=4 vs reference loop"
                         : "interp attention non-causal GQA 4->2 with 5 keys for 3 queries vs reference loop",
                  r, err, out, B * Tq * H * D, 1e-5);
    tensor_free(r);
    free_all(a3, 3);
    module_free(c.m);
  }
}

static double g_theta;
static int g_offset;
static void set_rope(Module *m, Op *op) {
  (void)m;
  op_set_float(op, "theta", g_theta);
  op_set_int(op, "offset", g_offset);
}

static void test_rope(void) {
  char err[IR_ERR_LEN];
  /* x[1,2,1,4], theta 100: pair (0,2) turns by angle p, pair (1,3) by p/10 (100^(-2/4)). */
  const double x[] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int offset = 0; offset <= 3; offset += 3) {
    double want[8];
    for (int t = 0; t < 2; t++) {
      const double *xr = x + 4 * t;
      double p = t + offset;
      double a0 = p, a1 = p / 10;
      want[4 * t + 0] = xr[0] * cos(a0) - xr[2] * sin(a0);
      want[4 * t + 2] = xr[2] * cos(a0) + xr[0] * sin(a0);
      want[4 * t + 1] = xr[1] * cos(a1) - xr[3] * sin(a1);
      want[4 * t + 3] = xr[3] * cos(a1) + xr[1] * sin(a1);
    }
    if (offset == 0) check(want[0] == 1 && want[1] == 2 && want[2] == 3 && want[3] == 4, "rope at position 0 is the identity");
    Type t = T(DT_F32, 4, 1, 2, 1, 4);
    Tensor *a[1] = {tensor_of(t, x)};
    g_theta = 100, g_offset = offset;
    Ctx c;
    Tensor *r = run_op(OP_ROPE, &t, a, 1, set_rope, NULL, err, sizeof err, &c);
    char what[128];
    snprintf(what, sizeof what, "interp rope rotate-half, theta 100, offset %d", offset);
    expect_values(what, r, err, want, 8, 1e-6);
    tensor_free(r);
    free_all(a, 1);
    module_free(c.m);
  }
}

static void test_cross_entropy_embedding(void) {
  char err[IR_ERR_LEN];
  Ctx c;
  const double logits[] = {1, 2, 3, 0, 0, 0, 1000, 0, 0, 1000, 0, 0};
  const double targets[] = {0, 2, 0, 1};
  const double want[] = {log(exp(1) + exp(2) + exp(3)) - 1, log(3), 0, 1000};
  Type ts[2] = {T(DT_F32, 2, 4, 3), T(DT_I32, 1, 4)};
  Tensor *args[2] = {tensor_of(ts[0], logits), tensor_of(ts[1], targets)};
  Tensor *r = run_op(OP_CROSS_ENTROPY, ts, args, 2, NULL, NULL, err, sizeof err, &c);
  expect_values("interp cross_entropy (incl. logits of 1000)", r, err, want, 4, 1e-6);
  check(r && r->type.dtype == DT_F32 && r->type.rank == 1, "cross_entropy gives f32 per position");
  tensor_free(r);
  module_free(c.m);
  args[1]->i[2] = 3;   /* outside V = 3 */
  r = run_op(OP_CROSS_ENTROPY, ts, args, 2, NULL, NULL, err, sizeof err, &c);
  check(!r && strstr(err, "target 3 at position 2 is outside the vocabulary of 3"), "cross_entropy rejects a target >= V: %.*s",
        (int)strcspn(err, "\n"), err);
  tensor_free(r);
  free_all(args, 2);
  module_free(c.m);

  const double table[] = {1, 2, 3, 4, 5, 6};
  const double ids[] = {2, 0, 1, 2};
  const double emb[] = {5, 6, 1, 2, 3, 4, 5, 6};
  Type et[2] = {T(DT_F32, 2, 3, 2), T(DT_I32, 2, 2, 2)};
  Tensor *ea[2] = {tensor_of(et[0], table), tensor_of(et[1], ids)};
  r = run_op(OP_EMBEDDING, et, ea, 2, NULL, NULL, err, sizeof err, &c);
  expect_values("interp embedding [3,2] table, ids [2,2]", r, err, emb, 8, 0);
  check(r && r->type.rank == 3 && r->type.dims[2] == 2, "embedding result is [2,2,2]");
  tensor_free(r);
  module_free(c.m);
  ea[1]->i[3] = -1;
  r = run_op(OP_EMBEDDING, et, ea, 2, NULL, NULL, err, sizeof err, &c);
  check(!r && strstr(err, "token id -1 at position 3 is outside the vocabulary of 3"), "embedding rejects id -1: %.*s",
        (int)strcspn(err, "\n"), err);
  tensor_free(r);
  free_all(ea, 2);
  module_free(c.m);
}

static const int64_t *g_ints1, *g_ints2;
static int g_nints;
static void set_perm(Module *m, Op *op) { op_set_ints(m, op, "perm", g_ints1, g_nints); }
static void set_slice(Module *m, Op *op) {
  op_set_ints(m, op, "start", g_ints1, g_nints);
  op_set_ints(m, op, "end", g_ints2, g_nints);
}
static void set_dims(Module *m, Op *op) { op_set_ints(m, op, "dims", g_ints1, g_nints); }
static int64_t g_int;
static void set_dim(Module *m, Op *op) {
  (void)m;
  op_set_int(op, "dim", g_int);
}

static void test_data_movement(void) {
  char err[IR_ERR_LEN];
  Ctx c;
  Tensor *r;
  /* broadcast */
  {
    const double v3[] = {1, 2, 3}, col[] = {7, 9}, one[] = {5};
    const double w1[] = {1, 2, 3, 1, 2, 3}, w2[] = {7, 7, 7, 9, 9, 9}, w3[] = {5, 5, 5, 5};
    Type in1 = T(DT_F32, 1, 3), out1 = T(DT_F32, 2, 2, 3);
    Tensor *a = tensor_of(in1, v3);
    r = run_op(OP_BROADCAST, &in1, &a, 1, NULL, &out1, err, sizeof err, &c);
    expect_values("interp broadcast [3] -> [2,3]", r, err, w1, 6, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
    Type in2 = T(DT_F32, 2, 2, 1);
    a = tensor_of(in2, col);
    r = run_op(OP_BROADCAST, &in2, &a, 1, NULL, &out1, err, sizeof err, &c);
    expect_values("interp broadcast [2,1] -> [2,3]", r, err, w2, 6, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
    Type in3 = T(DT_F32, 0), out3 = T(DT_F32, 2, 2, 2);
    a = tensor_of(in3, one);
    r = run_op(OP_BROADCAST, &in3, &a, 1, NULL, &out3, err, sizeof err, &c);
    expect_values("interp broadcast scalar -> [2,2]", r, err, w3, 4, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
    /* [1,3] -> [2,2,3] */
    Type in4 = T(DT_I32, 2, 1, 3), out4 = T(DT_I32, 3, 2, 2, 3);
    a = tensor_of(in4, v3);
    const double w4[] = {1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3};
    r = run_op(OP_BROADCAST, &in4, &a, 1, NULL, &out4, err, sizeof err, &c);
    expect_values("interp broadcast i32 [1,3] -> [2,2,3]", r, err, w4, 12, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
  /* transpose */
  {
    const double x[] = {1, 2, 3, 4, 5, 6}, want[] = {1, 4, 2, 5, 3, 6};
    const int64_t perm[] = {1, 0};
    Type t = T(DT_F32, 2, 2, 3);
    Tensor *a = tensor_of(t, x);
    g_ints1 = perm, g_nints = 2;
    r = run_op(OP_TRANSPOSE, &t, &a, 1, set_perm, NULL, err, sizeof err, &c);
    expect_values("interp transpose [2,3] perm [1,0]", r, err, want, 6, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
    /* [2,3,4] perm [2,0,1]: y[i][j][k] = x[j][k][i], y is [4,2,3] */
    double x3[24], w3[24];
    for (int i = 0; i < 24; i++) x3[i] = i;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 2; j++)
        for (int k = 0; k < 3; k++) w3[(i * 2 + j) * 3 + k] = x3[(j * 3 + k) * 4 + i];
    const int64_t perm3[] = {2, 0, 1};
    Type t3 = T(DT_F32, 3, 2, 3, 4);
    a = tensor_of(t3, x3);
    g_ints1 = perm3, g_nints = 3;
    r = run_op(OP_TRANSPOSE, &t3, &a, 1, set_perm, NULL, err, sizeof err, &c);
    expect_values("interp transpose [2,3,4] perm [2,0,1]", r, err, w3, 24, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
  /* slice */
  {
    double x[12];
    for (int i = 0; i < 12; i++) x[i] = i;
    const double want[] = {5, 6, 9, 10};
    const int64_t st[] = {1, 1}, en[] = {3, 3};
    Type t = T(DT_F32, 2, 3, 4);
    Tensor *a = tensor_of(t, x);
    g_ints1 = st, g_ints2 = en, g_nints = 2;
    r = run_op(OP_SLICE, &t, &a, 1, set_slice, NULL, err, sizeof err, &c);
    expect_values("interp slice [3,4] [1:3, 1:3]", r, err, want, 4, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
  /* concat: 3 operands along dim 0 and dim 1 */
  {
    const double a0[] = {1, 2}, a1[] = {3, 4, 5, 6}, a2[] = {7, 8};
    Type ts[3] = {T(DT_F32, 2, 1, 2), T(DT_F32, 2, 2, 2), T(DT_F32, 2, 1, 2)};
    Tensor *args[3] = {tensor_of(ts[0], a0), tensor_of(ts[1], a1), tensor_of(ts[2], a2)};
    const double want0[] = {1, 2, 3, 4, 5, 6, 7, 8};
    g_int = 0;
    r = run_op(OP_CONCAT, ts, args, 3, set_dim, NULL, err, sizeof err, &c);
    expect_values("interp concat of 3 along dim 0", r, err, want0, 8, 0);
    tensor_free(r), free_all(args, 3), module_free(c.m);
    Type tc[3] = {T(DT_F32, 2, 2, 1), T(DT_F32, 2, 2, 2), T(DT_F32, 2, 2, 1)};
    Tensor *ac[3] = {tensor_of(tc[0], a0), tensor_of(tc[1], a1), tensor_of(tc[2], a2)};
    const double want1[] = {1, 3, 4, 7, 2, 5, 6, 8};
    g_int = 1;
    r = run_op(OP_CONCAT, tc, ac, 3, set_dim, NULL, err, sizeof err, &c);
    expect_values("interp concat of 3 along dim 1", r, err, want1, 8, 0);
    tensor_free(r), free_all(ac, 3), module_free(c.m);
  }
  /* iota, constant, reshape, cast */
  {
    const double d0[] = {0, 0, 0, 1, 1, 1}, d1[] = {0, 1, 2, 0, 1, 2}, f4[] = {0, 1, 2, 3};
    Type ti = T(DT_I32, 2, 2, 3), tf = T(DT_F32, 1, 4);
    g_int = 0;
    r = run_op(OP_IOTA, NULL, NULL, 0, set_dim, &ti, err, sizeof err, &c);
    expect_values("interp iota i32[2,3] dim 0", r, err, d0, 6, 0);
    tensor_free(r), module_free(c.m);
    g_int = 1;
    r = run_op(OP_IOTA, NULL, NULL, 0, set_dim, &ti, err, sizeof err, &c);
    expect_values("interp iota i32[2,3] dim 1", r, err, d1, 6, 0);
    tensor_free(r), module_free(c.m);
    g_int = 0;
    r = run_op(OP_IOTA, NULL, NULL, 0, set_dim, &tf, err, sizeof err, &c);
    expect_values("interp iota f32[4] dim 0", r, err, f4, 4, 0);
    tensor_free(r), module_free(c.m);
  }
}

static void test_reductions(void) {
  char err[IR_ERR_LEN];
  Ctx c;
  double x[24];
  for (int i = 0; i < 24; i++) x[i] = i;   /* x[i][j][k] = 12i + 4j + k, shape [2,3,4] */
  Type t = T(DT_F32, 3, 2, 3, 4);
  struct {
    OpKind k;
    int64_t dims[3];
    int nd;
    double want[12];
    int n;
    const char *what;
  } cases[] = {
    {OP_REDUCE_SUM, {0}, 1, {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34}, 12, "reduce_sum dims [0] = 12 + 8j + 2k"},
    {OP_REDUCE_SUM, {1}, 1, {12, 15, 18, 21, 48, 51, 54, 57}, 8, "reduce_sum dims [1] = 36i + 12 + 3k"},
    {OP_REDUCE_SUM, {2}, 1, {6, 22, 38, 54, 70, 86}, 6, "reduce_sum dims [2] = 48i + 16j + 6"},
    {OP_REDUCE_SUM, {0, 2}, 2, {60, 92, 124}, 3, "reduce_sum dims [0,2] = 60 + 32j"},
    {OP_REDUCE_SUM, {0, 1, 2}, 3, {276}, 1, "reduce_sum all dims = 276"},
    {OP_REDUCE_MAX, {1}, 1, {8, 9, 10, 11, 20, 21, 22, 23}, 8, "reduce_max dims [1] = 12i + 8 + k"},
    {OP_REDUCE_MAX, {0, 2}, 2, {15, 19, 23}, 3, "reduce_max dims [0,2] = 15 + 4j"},
    {OP_REDUCE_MEAN, {0, 1, 2}, 3, {11.5}, 1, "reduce_mean all dims = 11.5"},
    {OP_REDUCE_MEAN, {2}, 1, {1.5, 5.5, 9.5, 13.5, 17.5, 21.5}, 6, "reduce_mean dims [2] = 12i + 4j + 1.5"},
    {OP_REDUCE_MEAN, {0, 1}, 2, {10, 11, 12, 13}, 4, "reduce_mean dims [0,1] = 6 + 4 + k"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Tensor *a = tensor_of(t, x);
    g_ints1 = cases[i].dims, g_nints = cases[i].nd;
    Tensor *r = run_op(cases[i].k, &t, &a, 1, set_dims, NULL, err, sizeof err, &c);
    char what[160];
    snprintf(what, sizeof what, "interp %s", cases[i].what);
    expect_values(what, r, err, cases[i].want, cases[i].n, 1e-7);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
  /* max of all-negative values starts from -inf, not 0 */
  double neg[6] = {-5, -3, -9, -2, -8, -7};
  const double wmax[] = {-3, -2};
  Type t2 = T(DT_F32, 2, 2, 3);
  Tensor *a = tensor_of(t2, neg);
  const int64_t d1[] = {1};
  g_ints1 = d1, g_nints = 1;
  Tensor *r = run_op(OP_REDUCE_MAX, &t2, &a, 1, set_dims, NULL, err, sizeof err, &c);
  expect_values("interp reduce_max of negative values", r, err, wmax, 2, 0);
  tensor_free(r), tensor_free(a), module_free(c.m);
  /* integer sum */
  Type ti = T(DT_I32, 2, 2, 3);
  a = tensor_of(ti, neg);
  const double wsum[] = {-17, -17};
  r = run_op(OP_REDUCE_SUM, &ti, &a, 1, set_dims, NULL, err, sizeof err, &c);
  expect_values("interp reduce_sum on i32", r, err, wsum, 2, 0);
  tensor_free(r), tensor_free(a), module_free(c.m);
}

static double g_f;
static void set_by(Module *m, Op *op) { (void)m, op_set_float(op, "by", g_f); }
static void set_value(Module *m, Op *op) { (void)m, op_set_float(op, "value", g_f); }

static void test_elementwise(void) {
  char err[IR_ERR_LEN];
  const double x[] = {-1.5, -0.25, 0.5, 2};
  const double xp[] = {0.25, 0.5, 1, 4};   /* positive, for log/sqrt/rsqrt */
  struct {
    OpKind k;
    bool pos;
    double (*f)(double);
    const char *name;
  } un[] = {
    {OP_EXP, false, exp, "exp"}, {OP_LOG, true, log, "log"}, {OP_SQRT, true, sqrt, "sqrt"},
    {OP_TANH, false, tanh, "tanh"},
  };
  Ctx c;
  Type t = T(DT_F32, 1, 4);
  for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) {
    const double *in = un[i].pos ? xp : x;
    double want[4];
    for (int k = 0; k < 4; k++) want[k] = un[i].f(in[k]);
    Tensor *a = tensor_of(t, in);
    Tensor *r = run_op(un[i].k, &t, &a, 1, NULL, NULL, err, sizeof err, &c);
    char what[64];
    snprintf(what, sizeof what, "interp %s", un[i].name);
    expect_values(what, r, err, want, 4, 1e-6);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
  /* The formula ops, computed here from their definitions in ops.def. */
  double want[13][4];
  for (int k = 0; k < 4; k++) {
    double v = x[k];
    want[0][k] = -v;
    want[1][k] = 1 / sqrt(xp[k]);
    want[2][k] = 1 / v;
    want[3][k] = 1 / (1 + exp(-v));
    want[4][k] = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    want[5][k] = v / (1 + exp(-v));
    want[6][k] = v > 0 ? v : 0;
    want[7][k] = fabs(v);
    want[8][k] = v * v;
    want[9][k] = v * 2.5;
    want[10][k] = v - 0.75;
  }
  struct {
    OpKind k;
    int row;
    bool pos;
    SetAttrs set;
    double attr;
    const char *name;
  } fo[] = {
    {OP_NEG, 0, false, NULL, 0, "neg"},           {OP_RSQRT, 1, true, NULL, 0, "rsqrt"},
    {OP_RECIP, 2, false, NULL, 0, "recip"},       {OP_SIGMOID, 3, false, NULL, 0, "sigmoid"},
    {OP_GELU_TANH, 4, false, NULL, 0, "gelu_tanh"}, {OP_SILU, 5, false, NULL, 0, "silu"},
    {OP_RELU, 6, false, NULL, 0, "relu"},         {OP_ABS, 7, false, NULL, 0, "abs"},
    {OP_SQUARE, 8, false, NULL, 0, "square"},     {OP_SCALE, 9, false, set_by, 2.5, "scale by 2.5"},
    {OP_ADD_SCALAR, 10, false, set_value, -0.75, "add_scalar -0.75"},
  };
  for (size_t i = 0; i < sizeof fo / sizeof fo[0]; i++) {
    Tensor *a = tensor_of(t, fo[i].pos ? xp : x);
    g_f = fo[i].attr;
    Tensor *r = run_op(fo[i].k, &t, &a, 1, fo[i].set, NULL, err, sizeof err, &c);
    char what[64];
    snprintf(what, sizeof what, "interp %s", fo[i].name);
    expect_values(what, r, err, want[fo[i].row], 4, 1e-6);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
  /* binary ops */
  const double y[] = {2, -0.5, 0.5, 3};
  struct {
    OpKind k;
    const char *name;
  } bi[] = {{OP_ADD, "add"}, {OP_SUB, "sub"}, {OP_MUL, "mul"}, {OP_DIV, "div"},
            {OP_MAX, "max"}, {OP_MIN, "min"}, {OP_POW, "pow"}};
  for (size_t i = 0; i < sizeof bi / sizeof bi[0]; i++) {
    double w[4];
    const double *base = bi[i].k == OP_POW ? xp : x;
    for (int k = 0; k < 4; k++) {
      double p = base[k], q = y[k];
      switch (bi[i].k) {
      case OP_ADD: w[k] = p + q; break;
      case OP_SUB: w[k] = p - q; break;
      case OP_MUL: w[k] = p * q; break;
      case OP_DIV: w[k] = p / q; break;
      case OP_MAX: w[k] = p > q ? p : q; break;
      case OP_MIN: w[k] = p < q ? p : q; break;
      default: w[k] = pow(p, q); break;
      }
    }
    Type ts[2] = {t, t};
    Tensor *args[2] = {tensor_of(t, base), tensor_of(t, y)};
    Tensor *r = run_op(bi[i].k, ts, args, 2, NULL, NULL, err, sizeof err, &c);
    char what[64];
    snprintf(what, sizeof what, "interp %s", bi[i].name);
    expect_values(what, r, err, w, 4, 1e-6);
    tensor_free(r), free_all(args, 2), module_free(c.m);
  }
  /* bf16 results are rounded: 1 + 2^-8 is a tie that goes to 1.0; 1 + 3*2^-8 goes up. */
  {
    const double v[] = {1 + ldexp(1, -8), 1 + 3 * ldexp(1, -8)};
    const double w[] = {1.0, 1 + ldexp(1, -6)};
    Type in = T(DT_F32, 1, 2), out = T(DT_BF16, 1, 2);
    Tensor *a = tensor_of(in, v);
    Tensor *r = run_op(OP_CAST, &in, &a, 1, NULL, &out, err, sizeof err, &c);
    expect_values("interp cast f32 -> bf16 rounds to nearest even", r, err, w, 2, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
    const double f[] = {2.75, -2.75};
    const double wi[] = {2, -2};
    Type ti = T(DT_I32, 1, 2);
    a = tensor_of(in, f);
    r = run_op(OP_CAST, &in, &a, 1, NULL, &ti, err, sizeof err, &c);
    expect_values("interp cast f32 -> i32 truncates toward zero", r, err, wi, 2, 0);
    tensor_free(r), tensor_free(a), module_free(c.m);
  }
}

/* A whole small function through the executor, with globals: y = relu(x @ W + b). */
static void test_function(void) {
  Module *m = module_new("fn");
  Global *w = module_add_global(m, GLOBAL_PARAM, "w", T(DT_F32, 2, 2, 2), (Init){INIT_CONST, 2});
  Global *bias = module_add_global(m, GLOBAL_PARAM, "b", T(DT_F32, 1, 2), (Init){INIT_CONST, -5});
  Func *f = module_add_func(m, "f");
  Builder b = {.f = f};
  Value *x = func_add_arg(f, "x", T(DT_F32, 2, 2, 2));
  Value *y = build2(&b, OP_MATMUL, x, w->value, "y");
  Value *bb = build_typed(&b, OP_BROADCAST, bias->value, T(DT_F32, 2, 2, 2), NULL);
  Value *z = build1(&b, OP_RELU, build2(&b, OP_ADD, y, bb, NULL), "z");
  func_add_ret(f, z);
  func_add_ret(f, w->value);
  char err[IR_ERR_LEN];
  check(!b.err[0] && !verify_module(m, err, sizeof err), "small function with globals verifies");
  GlobalStore *g = globals_new(m);
  const double xv[] = {1, 2, 0, 1};
  Tensor *args[1] = {tensor_of(T(DT_F32, 2, 2, 2), xv)};
  Tensor *rets[2] = {0};
  int rc = interp_run(f, g, args, rets, err, sizeof err);
  /* x @ [[2,2],[2,2]] = [[6,6],[2,2]]; -5; relu -> [[1,1],[0,0]] */
  const double want[] = {1, 1, 0, 0}, wantw[] = {2, 2, 2, 2};
  expect_values("interp relu(x @ W + b) with const-initialized globals", rc ? NULL : rets[0], err, want, 4, 0);
  expect_values("interp returns a global's value", rc ? NULL : rets[1], err, wantw, 4, 0);
  free_all(rets, 2);
  /* Wrong argument shape is an input error, not a crash. */
  Tensor *bad[1] = {tensor_of(T(DT_F32, 2, 2, 3), (const double[]){1, 2, 3, 4, 5, 6})};
  rc = interp_run(f, g, bad, rets, err, sizeof err);
  check(rc == IR_EINPUT && strstr(err, "argument 0 is f32[2,3], expected f32[2,2]"), "interp_run rejects a wrong argument shape: %s", err);
  free_all(bad, 1);
  free_all(args, 1);
  globals_free(g);
  module_free(m);
}

int main(void) {
  test_matmul();
  test_softmax_norms();
  test_attention();
  test_rope();
  test_cross_entropy_embedding();
  test_data_movement();
  test_reductions();
  test_elementwise();
  test_function();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
