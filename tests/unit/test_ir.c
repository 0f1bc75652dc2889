/* tests/unit/test_ir.c — C-level checks of the IR core.
 *
 *   models      every models/NAME.json builds, verifies and round-trips through the text form
 *   op table    every op of ops.def has a well-formed schema
 *   types       type_str, dtype_round (bf16/f16/f8 rounding on chosen bit patterns),
 *               format_double (shortest text that reads back bit for bit)
 *   names       duplicate and numeric value names print stably
 *   executor    interp_run on small hand-built functions against values computed by hand
 *               or by an independent double-precision loop in this file
 *   timing      `loom ir` on gpt2-124M in-process (printed, not asserted)
 *
 * Runs from the repository root.  One line per check; ends with "N passed, M failed".
 */
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend/build.h"
#include "frontend/config.h"
#include "ir/ir.h"
#include "passes/passes.h"

static int n_pass, n_fail;

static bool check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool check(bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok) n_pass++;
  else n_fail++;
  return ok;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ================================================================ models */

/* print(parse(print(m))) == print(m); returns the failure detail or NULL. */
static bool round_trips(const Module *m, char *detail, size_t n) {
  char *p1 = module_to_string(m);
  Module *m2;
  char err[IR_ERR_LEN];
  if (parse_module("<printed>", p1, &m2, err, sizeof err)) {
    snprintf(detail, n, "the printed module does not parse: %s", err);
    free(p1);
    return false;
  }
  char *p2 = module_to_string(m2);
  bool same = !strcmp(p1, p2);
  if (!same) {
    size_t k = 0;
    while (p1[k] && p1[k] == p2[k]) k++;
    snprintf(detail, n, "texts differ at byte %zu: '%.40s' vs '%.40s'", k, p1 + k, p2 + k);
  }
  int vrc = verify_module(m2, err, sizeof err);
  if (same && vrc) snprintf(detail, n, "the reparsed module does not verify: %s", err);
  module_free(m2);
  free(p1);
  free(p2);
  return same && !vrc;
}

static Module *build_model(const char *path, char *err, size_t errlen) {
  RunSpec *spec = calloc(1, sizeof *spec);
  Module *m = NULL;
  int rc = spec_load(path, spec, err, errlen);
  if (!rc) rc = spec_validate(spec, err, errlen);
  char name[256];
  frontend_module_name(path, name, sizeof name);
  if (!rc) rc = frontend_build(spec, name, &m, err, errlen);
  free(spec);
  return rc ? NULL : m;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_models(void) {
  DIR *d = opendir("models");
  if (!check(d != NULL, "models/ is readable (run from the repository root)")) return;
  char *names[64];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 64) {
    size_t len = strlen(e->d_name);
    if (len > 5 && !strcmp(e->d_name + len - 5, ".json")) names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  check(n >= 6, "models/ holds the six model specs (found %d)", n);
  for (int i = 0; i < n; i++) {
    char path[512], err[IR_ERR_LEN], detail[IR_ERR_LEN + 128];
    snprintf(path, sizeof path, "models/%s", names[i]);
    Module *m = build_model(path, err, sizeof err);
    if (check(m != NULL, "%s builds", path) || (printf("    %s\n", err), 0)) {
      int rc = verify_module(m, err, sizeof err);
      if (!check(!rc, "%s verifies", path)) printf("    %s\n", err);
      Func *f = module_find_func(m, "forward");
      check(f && f->args.n == 2 && f->rets.n == 2, "%s has forward(tokens, targets) -> (logits, loss)", path);
      if (!check(round_trips(m, detail, sizeof detail), "%s round-trips print(parse(print(m))) == print(m)", path))
        printf("    %s\n", detail);
      /* Also after the default pipeline. */
      rc = pipeline_run(m, DEFAULT_PIPELINE, NULL, err, sizeof err);
      if (!check(!rc, "%s runs the default pipeline", path)) printf("    %s\n", err);
      if (!check(round_trips(m, detail, sizeof detail), "%s round-trips after the default pipeline", path))
        printf("    %s\n", detail);
      module_free(m);
    }
    free(names[i]);
  }
}

/* `loom ir models/gpt2-124M.json` in-process: build, default pipeline, print. */
static void test_timing(void) {
  char err[IR_ERR_LEN];
  double t0 = now_ms();
  Module *m = build_model("models/gpt2-124M.json", err, sizeof err);
  double t1 = now_ms();
  int rc = m ? pipeline_run(m, DEFAULT_PIPELINE, NULL, err, sizeof err) : 1;
  double t2 = now_ms();
  char *text = m && !rc ? module_to_string(m) : NULL;
  double t3 = now_ms();
  check(text != NULL, "loom ir gpt2-124M: build %.2f ms, pipeline %.2f ms, print %.2f ms, total %.2f ms (%zu bytes)",
        t1 - t0, t2 - t1, t3 - t2, t3 - t0, text ? strlen(text) : 0);
  free(text);
  module_free(m);
}

/* ================================================================ op table */

static void test_op_table(void) {
  int bad = 0;
  for (int k = 0; k < OP_COUNT; k++) {
    const OpInfo *info = op_info((OpKind)k);
    OpKind back;
    if (!info->name || op_lookup(info->name, strlen(info->name), &back) || back != (OpKind)k) {
      printf("    op %d: name lookup fails\n", k);
      bad++;
    }
    if (info->n_attrs > IR_MAX_ATTRS || info->n_results < -1 || info->n_operands < -1) {
      printf("    op %s: bad counts\n", info->name);
      bad++;
    }
    for (int i = 0; i < info->n_attrs; i++) {
      const AttrSpec *a = &info->attrs[i];
      bool name_ok = a->name && *a->name;
      for (const char *p = a->name; name_ok && *p; p++)
        name_ok = (*p >= 'a' && *p <= 'z') || *p == '_' || (p > a->name && *p >= '0' && *p <= '9');
      if (!name_ok || a->kind > ATTR_FUNC || op_attr_index((OpKind)k, a->name) != i) {
        printf("    op %s: attribute %d ('%s') is malformed\n", info->name, i, a->name ? a->name : "");
        bad++;
      }
      if (a->has_default && a->def.kind != a->kind) {
        printf("    op %s: default of '%s' has the wrong kind\n", info->name, a->name);
        bad++;
      }
    }
  }
  check(bad == 0, "all %d ops of ops.def have a name, counts and a well-formed attribute schema", OP_COUNT);
  check(op_attr_index(OP_MATMUL, "tb") == 1 && op_info(OP_MATMUL)->attrs[1].has_default &&
            op_info(OP_MATMUL)->attrs[1].def.i == 0,
        "matmul schema: ta, tb bools defaulting to false");
  check(op_info(OP_ATTENTION)->attrs[1].has_default && op_info(OP_ATTENTION)->attrs[1].def.i == 1,
        "attention schema: causal defaults to true");
  check((op_info(OP_ADD)->flags & OPF_COMMUTATIVE) && !(op_info(OP_SUB)->flags & OPF_COMMUTATIVE),
        "add commutes, sub does not");
  OpKind k;
  check(op_lookup("frobnicate", 10, &k) == -1, "op_lookup rejects an unknown name");
}

/* ================================================================ types */

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void test_type_str(void) {
  char buf[256];
  int64_t d3[] = {4, 64, 768};
  Type t = type_make(DT_F32, 3, d3);
  check(!strcmp(type_str(&t, buf, sizeof buf), "f32[4,64,768]"), "type_str plain: %s", buf);
  t.sh.kind[AX_DP] = SH_S;
  t.sh.dim[AX_DP] = 0;
  check(!strcmp(type_str(&t, buf, sizeof buf), "f32[4,64,768]<dp:s0>"), "type_str <dp:s0>: %s", buf);
  t.sh.kind[AX_TP] = SH_S;
  t.sh.dim[AX_TP] = 2;
  check(!strcmp(type_str(&t, buf, sizeof buf), "f32[4,64,768]<dp:s0, tp:s2>"), "type_str two axes: %s", buf);
  Type p = type_make(DT_BF16, 1, d3);
  p.sh.kind[AX_TP] = SH_P;
  check(!strcmp(type_str(&p, buf, sizeof buf), "bf16[4]<tp:p>"), "type_str partial: %s", buf);
  Type s = type_scalar(DT_I64);
  check(!strcmp(type_str(&s, buf, sizeof buf), "i64[]"), "type_str scalar: %s", buf);
  const char *names[] = {"f32", "bf16", "f16", "f8e4m3", "f8e5m2", "i32", "i64", "u16", "bool"};
  bool ok = true;
  for (int i = 0; i < DT_COUNT; i++) {
    DType back;
    ok &= !strcmp(dtype_name((DType)i), names[i]) && !dtype_parse(names[i], strlen(names[i]), &back) && back == (DType)i;
  }
  DType dummy;
  check(ok && dtype_parse("f64", 3, &dummy) == -1, "dtype names parse back; f64 is unknown");
  check(!strcmp(shape_str(&t, buf, sizeof buf), "[4,64,768]"), "shape_str: %s", buf);
  char small[8];
  type_str(&t, small, sizeof small);
  check(strlen(small) == 7, "type_str truncates safely into a small buffer ('%s')", small);
}

typedef struct {
  uint32_t in, want;
  const char *what;
} BitCase;

static void test_bf16(void) {
  static const BitCase cases[] = {
    {0x3F800000, 0x3F800000, "1.0 exact"},
    {0x3F808000, 0x3F800000, "1 + 2^-8: tie, to even (down)"},
    {0x3F818000, 0x3F820000, "tie above an odd mantissa: to even (up)"},
    {0x3F808001, 0x3F810000, "just above the tie: up"},
    {0x3F807FFF, 0x3F800000, "just below the tie: down"},
    {0xBF808000, 0xBF800000, "negative tie: to even"},
    {0xBF818000, 0xBF820000, "negative tie above odd: away from zero"},
    {0x7F7FFFFF, 0x7F800000, "FLT_MAX overflows to inf"},
    {0x7F7F7FFF, 0x7F7F0000, "largest value that stays finite"},
    {0x00018000, 0x00020000, "f32 subnormal tie: to even"},
    {0x00008000, 0x00000000, "tiny subnormal tie: to zero (even)"},
    {0x7F800000, 0x7F800000, "inf stays inf"},
    {0xFF800000, 0xFF800000, "-inf stays -inf"},
    {0x80000000, 0x80000000, "-0 stays -0"},
    {0x40490FDB, 0x40490000, "pi"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t got = to_bits(dtype_round(DT_BF16, from_bits(cases[i].in)));
    if (!check(got == cases[i].want, "bf16 round %08X -> %08X (%s)", cases[i].in, cases[i].want, cases[i].what))
      printf("    got %08X\n", got), bad++;
  }
  float nan_out = dtype_round(DT_BF16, NAN);
  check(isnan(nan_out), "bf16 keeps NaN a NaN");
  /* Exhaustive over the 16 low bits for one exponent: RNE by integer arithmetic. */
  int wrong = 0;
  for (uint32_t lo = 0; lo < 0x10000; lo++) {
    uint32_t u = 0x41230000 | lo, hi = u >> 16, rem = u & 0xFFFF;
    uint32_t want = (rem > 0x8000 || (rem == 0x8000 && (hi & 1))) ? hi + 1 : hi;
    if (to_bits(dtype_round(DT_BF16, from_bits(u))) != want << 16) wrong++;
  }
  check(wrong == 0, "bf16 round-to-nearest-even on all 65536 low-bit patterns of one binade (%d wrong)", wrong);
}

typedef struct {
  DType t;
  double in, want;
  const char *what;
} ValCase;

static void test_narrow_floats(void) {
  const double s24 = ldexp(1, -24);   /* smallest f16 subnormal */
  const double s9 = ldexp(1, -9);     /* smallest e4m3 subnormal */
  const ValCase cases[] = {
    {DT_F16, 1.0, 1.0, "f16 1.0"},
    {DT_F16, 1 + ldexp(1, -11), 1.0, "f16 1 + 2^-11: tie, to even"},
    {DT_F16, 1 + 3 * ldexp(1, -11), 1 + ldexp(1, -9), "f16 1 + 3*2^-11: tie, to even (up)"},
    {DT_F16, 65504, 65504, "f16 max"},
    {DT_F16, 65519, 65504, "f16 just below the overflow tie"},
    {DT_F16, 65520, INFINITY, "f16 overflow tie rounds to inf"},
    {DT_F16, -1e6, -INFINITY, "f16 large negative to -inf"},
    {DT_F16, s24, s24, "f16 smallest subnormal 2^-24"},
    {DT_F16, 0.5 * s24, 0, "f16 half the smallest subnormal: tie, to zero"},
    {DT_F16, 0.51 * s24, s24, "f16 just above half: up to 2^-24"},
    {DT_F16, 1.5 * s24, 2 * s24, "f16 1.5 quanta: tie, to even (2)"},
    {DT_F16, 2.5 * s24, 2 * s24, "f16 2.5 quanta: tie, to even (2)"},
    {DT_F16, 1023 * s24, 1023 * s24, "f16 largest subnormal"},
    {DT_F16, 1023.5 * s24, ldexp(1, -14), "f16 largest subnormal + half: to the smallest normal"},
    {DT_F16, ldexp(1, -14), ldexp(1, -14), "f16 smallest normal"},
    {DT_F16, 3.14159265, 3.140625, "f16 pi"},
    {DT_F8E4M3, 448, 448, "e4m3 max 448"},
    {DT_F8E4M3, 449, 448, "e4m3 449 -> 448"},
    {DT_F8E4M3, 464, 448, "e4m3 464 (tie toward 480, which is NaN in e4m3fn) saturates to 448"},
    {DT_F8E4M3, 480, 448, "e4m3 480 saturates to 448"},
    {DT_F8E4M3, 1e9, 448, "e4m3 1e9 saturates to 448"},
    {DT_F8E4M3, -1e9, -448, "e4m3 -1e9 saturates to -448"},
    {DT_F8E4M3, INFINITY, 448, "e4m3 inf saturates to 448"},
    {DT_F8E4M3, 1.0625, 1.0, "e4m3 1 + 2^-4: tie, to even"},
    {DT_F8E4M3, 1.1875, 1.25, "e4m3 1 + 3*2^-4: tie, to even (up)"},
    {DT_F8E4M3, s9, s9, "e4m3 smallest subnormal 2^-9"},
    {DT_F8E4M3, 0.5 * s9, 0, "e4m3 half the smallest subnormal: to zero"},
    {DT_F8E4M3, 1.5 * s9, 2 * s9, "e4m3 1.5 subnormal quanta: to even"},
    {DT_F8E5M2, 57344, 57344, "e5m2 max"},
    {DT_F8E5M2, 61440, INFINITY, "e5m2 overflow tie to inf"},
    {DT_F8E5M2, 1.125, 1.0, "e5m2 1 + 2^-3: tie, to even"},
    {DT_F32, 0.1, (float)0.1, "f32 is unchanged"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    float got = dtype_round(cases[i].t, (float)cases[i].in);
    bool ok = got == (float)cases[i].want;
    if (!check(ok, "%s", cases[i].what)) printf("    in %.9g want %.9g got %.9g\n", cases[i].in, cases[i].want, got);
  }
  check(isnan(dtype_round(DT_F8E4M3, NAN)) && isnan(dtype_round(DT_F16, NAN)), "f16 and e4m3 keep NaN");
  check(signbit(dtype_round(DT_F16, -0.0f)) && signbit(dtype_round(DT_F16, -1e-30f)),
        "f16 keeps the sign of zero and of underflow");
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double urand(void) { return (double)(rng() >> 11) / 9007199254740992.0; }   /* [0,1) */

static bool double_round_trips(double x, char *buf, size_t n) {
  format_double(buf, n, x);
  double back = strtod(buf, NULL);
  return memcmp(&back, &x, sizeof x) == 0;
}

static void test_format_double(void) {
  char buf[64];
  const struct { double x; const char *want; } fixed[] = {
    {0.1, "0.1"}, {1e-05, "1e-05"}, {0.5, "0.5"}, {2, "2"}, {-1.5, "-1.5"}, {1.0 / 3, "0.3333333333333333"},
    {0.1 + 0.2, "0.30000000000000004"}, {INFINITY, "inf"}, {-INFINITY, "-inf"}, {NAN, "nan"}, {-0.0, "-0"},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    format_double(buf, sizeof buf, fixed[i].x);
    check(!strcmp(buf, fixed[i].want), "format_double(%.17g) = \"%s\" (got \"%s\")", fixed[i].x, fixed[i].want, buf);
  }
  const double special[] = {DBL_MAX, -DBL_MAX, DBL_MIN, 4.9406564584124654e-324, 1e23, 5e-324, 9007199254740993.0,
                            123456789012345680.0, 0.3535533905932738, 1e-5, 500000.0};
  int bad = 0;
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
    if (!double_round_trips(special[i], buf, sizeof buf)) printf("    %.17g -> %s\n", special[i], buf), bad++;
  check(bad == 0, "format_double round-trips extreme doubles (max, min normal, min subnormal, 1e23)");
  bad = 0;
  int not_shortest = 0;
  for (int i = 0; i < 50000; i++) {
    double x;
    uint64_t u = rng();
    if (i % 3 == 0) x = (urand() - 0.5) * pow(10, (int)(urand() * 40) - 20);   /* everyday magnitudes */
    else if (i % 3 == 1) x = (float)((urand() - 0.5) * 1000);                  /* f32 values as doubles */
    else {
      memcpy(&x, &u, 8);                                                       /* any bit pattern */
      if (isnan(x)) continue;
    }
    if (!double_round_trips(x, buf, sizeof buf)) {
      if (bad++ < 5) printf("    %.17g -> %s\n", x, buf);
      continue;
    }
    /* Shortest: one digit fewer must not read back (checked on a sample, it is slower). */
    if (i % 97 == 0 && isfinite(x) && x != 0) {
      /* significant digits of the mantissa: leading zeros do not count */
      int digits = 0;
      bool started = false;
      for (const char *p = buf; *p && *p != 'e'; p++) {
        if (*p >= '1' && *p <= '9') started = true;
        if (started && *p >= '0' && *p <= '9') digits++;
      }
      char shorter[400];
      snprintf(shorter, sizeof shorter, "%.*g", digits > 1 ? digits - 1 : 1, x);
      if (digits > 1 && strtod(shorter, NULL) == x) not_shortest++;
    }
  }
  check(bad == 0, "format_double round-trips 50000 random doubles bit for bit (%d failed)", bad);
  check(not_shortest == 0, "format_double gives the shortest such text (%d longer than needed)", not_shortest);
}

/* ================================================================ names */

static void test_names(void) {
  Module *m = module_new("names");
  Func *f = module_add_func(m, "f");
  Builder b = {.f = f};
  int64_t d[] = {4};
  Value *x = func_add_arg(f, "x", type_make(DT_F32, 1, d));
  Value *a = build1(&b, OP_NEG, x, "x");      /* duplicate of the argument's name */
  Value *c = build1(&b, OP_EXP, a, "x");      /* and again */
  Value *e = build1(&b, OP_ABS, c, "x.1");    /* looks like a printer suffix */
  Value *g = build1(&b, OP_RELU, e, "12");    /* numeric */
  Value *h = build1(&b, OP_SQUARE, g, NULL);  /* unnamed */
  Value *i = build1(&b, OP_TANH, h, "a b");   /* a character the text form does not allow */
  func_add_ret(f, i);
  func_add_ret(f, a);
  char err[IR_ERR_LEN], detail[IR_ERR_LEN + 128];
  check(!b.err[0] && !verify_module(m, err, sizeof err), "module with duplicate names verifies");
  char *text = module_to_string(m);
  /* Every printed result name must be unique in the function. */
  char seen[16][64];
  int n_seen = 0;
  bool unique = true;
  for (const char *p = strstr(text, "\n    %"); p; p = strstr(p + 1, "\n    %")) {
    char name[64];
    sscanf(p + 6, "%63[^ ]", name);
    for (int k = 0; k < n_seen; k++) unique &= strcmp(seen[k], name) != 0;
    if (n_seen < 16) snprintf(seen[n_seen++], 64, "%s", name);
  }
  check(unique && n_seen == 6, "printed names are unique (%d ops)", n_seen);
  if (!check(round_trips(m, detail, sizeof detail), "duplicate/numeric/odd names round-trip")) printf("    %s\n%s", detail, text);
  check(strstr(text, "%a_b = tanh") != NULL, "a name with a space prints with '_'");
  check(strstr(text, "= relu") && strstr(text, "%0 = relu"), "a numeric name is renumbered");
  /* Printing twice gives the same text. */
  char *again = module_to_string(m);
  check(!strcmp(text, again), "printing is deterministic");
  free(again);
  free(text);
  module_free(m);
}

/* ================================================================ executor */

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
  if (!check(ok, "%s", what)) {
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


/* ================================================================ fuzzing the text form */

/* Mutated and truncated copies of the tests/ir inputs: parsing never crashes (the
   sanitizers watch), whatever parses also prints to text that parses back to the same
   text, and whatever verifies also survives the default pipeline and verifies after it. */
static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (b) b[n] = 0;
  fclose(f);
  return b;
}

typedef struct {
  int parsed, verified, bad_round_trip, bad_pipeline;
} FuzzStats;

static void fuzz_one(const char *text, FuzzStats *st) {
  Module *m;
  char err[IR_ERR_LEN];
  if (parse_module("<fuzz>", text, &m, err, sizeof err)) {
    if (!strstr(err, "error")) st->bad_round_trip++;   /* a failure must say so */
    return;
  }
  st->parsed++;
  char *p1 = module_to_string(m), *p2 = NULL;
  Module *m2;
  if (parse_module("<fuzz-printed>", p1, &m2, err, sizeof err) == 0) {
    p2 = module_to_string(m2);
    module_free(m2);
  }
  if (!p2 || strcmp(p1, p2)) {
    if (st->bad_round_trip++ < 3) printf("    does not round-trip:\n%s\n", text);
  }
  free(p1);
  free(p2);
  if (verify_module(m, err, sizeof err) == 0) {
    st->verified++;
    if (pipeline_run(m, DEFAULT_PIPELINE, NULL, err, sizeof err) || verify_module(m, err, sizeof err))
      if (st->bad_pipeline++ < 3) printf("    pipeline fails on a verified module: %s\n", err);
  }
  module_free(m);
}

static void test_fuzz(void) {
  DIR *d = opendir("tests/ir");
  if (!check(d != NULL, "tests/ir is readable")) return;
  char *texts[256];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 256) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".ir")) continue;
    char path[512];
    snprintf(path, sizeof path, "tests/ir/%s", e->d_name);
    char *t = read_all(path);
    if (!t) continue;
    char *cut = strstr(t, "\n# expect");   /* keep the input section */
    if (cut) cut[1] = 0;
    texts[n++] = t;
  }
  closedir(d);
  FuzzStats st = {0};
  int runs = 0;
  static const char alphabet[] = "%$@{}()[]<>,:=-.#\n 0123456789abcdefpsxtdr_";
  for (int i = 0; i < 20000 && n; i++) {
    const char *src = texts[rng() % (uint64_t)n];
    size_t len = strlen(src);
    char *t = malloc(len + 64);
    memcpy(t, src, len + 1);
    int edits = 1 + (int)(rng() % 3);
    for (int k = 0; k < edits && len; k++) {
      size_t at = rng() % len;
      switch (rng() % 4) {
      case 0: t[at] = alphabet[rng() % (sizeof alphabet - 1)]; break;                 /* replace */
      case 1: memmove(t + at, t + at + 1, len - at), len--; break;                     /* delete */
      case 2: memmove(t + at + 1, t + at, len - at + 1), t[at] = alphabet[rng() % (sizeof alphabet - 1)], len++; break;
      default: t[at] = 0, len = at; break;                                              /* truncate */
      }
    }
    fuzz_one(t, &st);
    free(t);
    runs++;
  }
  check(runs == 20000 && st.bad_round_trip == 0,
        "20000 mutated IR inputs: no crash; all %d that parse print back identically (%d do not)", st.parsed, st.bad_round_trip);
  check(st.bad_pipeline == 0, "the %d mutated inputs that verify survive the default pipeline and still verify (%d do not)",
        st.verified, st.bad_pipeline);
  for (int i = 0; i < n; i++) free(texts[i]);
}

int main(void) {
  test_op_table();
  test_type_str();
  test_bf16();
  test_narrow_floats();
  test_format_double();
  test_names();
  test_matmul();
  test_softmax_norms();
  test_attention();
  test_rope();
  test_cross_entropy_embedding();
  test_data_movement();
  test_reductions();
  test_elementwise();
  test_function();
  test_fuzz();
  test_models();
  test_timing();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
