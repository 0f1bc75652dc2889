/* tests/unit/test_ir.c — C-level checks of the IR core.
 *
 *   models      every models/NAME.json builds, verifies and round-trips through the text form
 *   op table    every op of ops.def has a well-formed schema
 *   types       type_str, dtype_round (bf16/f16/f8 rounding on chosen bit patterns),
 *               format_double (shortest text that reads back bit for bit)
 *   names       duplicate and numeric value names print stably
 *   (the executor, interp_run on small hand-built functions: test_interp.c)
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
#include "tests/unit/splitmix.h"
#include "tests/unit/check_each.h"

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
  test_fuzz();
  test_models();
  test_timing();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
