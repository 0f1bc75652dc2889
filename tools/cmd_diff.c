/* tools/cmd_diff.c — `loom diff`: compare the tensors of two safetensors files.
 *
 * B is the reference.  Every tensor of B (or the NAMEs given) is looked up in A, shapes must
 * match, and a tensor passes when
 *
 *     max|a - b| <= atol + rtol * max|b|
 *
 * (a tensor-wide relative bound: one scale per tensor, so elements near zero do not fail a
 * computation that is right to the tensor's precision; NaN where the other file has none
 * fails).  The table gives, per tensor: shape, max|a-b|, max|b|, the relative error
 * max|a-b| / max|b|, the relative L2 error ||a-b|| / ||b||, and the worst element with its
 * index and both values.  Data may be F32, F64, BF16 or F16 (read as double).
 * Exit status: 0 all within the tolerances, 1 some tensor is not, 2 bad input (unreadable
 * file, missing tensor, shape mismatch, unsupported dtype: named).  The test suite runs it
 * under the name st_diff (a wrapper made by CMake), with the same options.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/safetensors.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom diff A.safetensors B.safetensors [NAME...] [options]\n"
  "\n"
  "Compares A's tensors with B's (the reference), the named ones or all of B's.  A tensor\n"
  "passes when max|a-b| <= atol + rtol * max|b|.  One row per tensor: shape, max|a-b|,\n"
  "max|b|, rel_err = max|a-b| / max|b|, rel_l2 = ||a-b|| / ||b||, and the worst element\n"
  "(its index and both values).  Reads F32, F64, BF16 and F16.\n"
  "\n"
  "options:\n"
  "  --rtol X          relative tolerance (default 1e-5)\n"
  "  --atol Y          absolute tolerance (default 0)\n"
  "  --only A,B        the names to compare, comma-separated (as NAME...)\n"
  "  --prefix P        look each name up in A as P<name> (e.g. transformer.)\n"
  "  --json            print the result as one JSON object instead of the table\n"
  "  -h, --help        show this help\n"
  "\n"
  "exit status: 0 everything within the tolerances, 1 some tensor is not, 2 bad input\n"
  "(a file that cannot be read, a tensor missing from either file, a shape mismatch)\n"
  "\n"
  "example:\n"
  "  loom eval models/gpt2-tiny.json --weights tests/golden/gpt2-tiny/weights.safetensors \\\n"
  "            --tokens tests/golden/gpt2-tiny/tokens.bin --out out.safetensors\n"
  "  loom diff out.safetensors tests/golden/gpt2-tiny/expected.safetensors logits loss\n";

static double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0) v = ldexp((double)mant, -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = ldexp((double)(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

static bool readable(StDType t) { return t == ST_F32 || t == ST_F64 || t == ST_BF16 || t == ST_F16; }

/* Element k of t as a double; the dtype is readable. */
static double elem(const StTensor *t, int64_t k) {
  const unsigned char *p = t->data;
  switch (t->dtype) {
  case ST_F32: {
    float f;
    memcpy(&f, p + 4 * k, 4);
    return f;
  }
  case ST_F64: {
    double d;
    memcpy(&d, p + 8 * k, 8);
    return d;
  }
  case ST_BF16: {
    uint32_t bits = (uint32_t)(p[2 * k] | p[2 * k + 1] << 8) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
  }
  case ST_F16: return half_to_double((uint16_t)(p[2 * k] | p[2 * k + 1] << 8));
  default: return NAN;
  }
}

static void shape_text(const StTensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->rank && k < n; d++) k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)t->shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* The multi-index of flat element k. */
static void index_text(const StTensor *t, int64_t k, char *buf, size_t n) {
  int64_t idx[ST_MAX_RANK];
  for (int d = t->rank - 1; d >= 0; d--) {
    idx[d] = t->shape[d] ? k % t->shape[d] : 0;
    k = t->shape[d] ? k / t->shape[d] : 0;
  }
  size_t w = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->rank && w < n; d++) w += (size_t)snprintf(buf + w, n - w, d ? ",%lld" : "%lld", (long long)idx[d]);
  if (w < n) snprintf(buf + w, n - w, "]");
}

typedef struct {
  const char *name;
  char shape[128], where[128], error[2048];
  int status;   /* 0 pass, 1 fail, 2 bad input */
  double max_abs, max_ref, rel, rel_l2, a, b;
  int64_t worst;
} Row;

static void compare(Row *r, const StTensor *a, const StTensor *b, double rtol, double atol) {
  char sa[128];
  shape_text(a, sa, sizeof sa);
  shape_text(b, r->shape, sizeof r->shape);
  bool same = a->rank == b->rank;
  for (int d = 0; same && d < a->rank; d++) same = a->shape[d] == b->shape[d];
  if (!same) {
    snprintf(r->error, sizeof r->error, "shape %s in A but %s in B", sa, r->shape);
    r->status = 2;
    return;
  }
  if (!readable(a->dtype) || !readable(b->dtype)) {
    snprintf(r->error, sizeof r->error, "dtype %s in A, %s in B; loom diff reads F32, F64, BF16 and F16",
             st_dtype_name(a->dtype), st_dtype_name(b->dtype));
    r->status = 2;
    return;
  }
  int64_t n = st_numel(b->rank, b->shape);
  double ss_diff = 0, ss_ref = 0;
  bool nan_mismatch = false;
  r->worst = -1;
  for (int64_t k = 0; k < n; k++) {
    double x = elem(a, k), y = elem(b, k);
    if (isnan(x) || isnan(y)) {
      if (!(isnan(x) && isnan(y))) {
        if (!nan_mismatch) r->worst = k;
        nan_mismatch = true;
      }
      continue;
    }
    double d = x == y ? 0 : fabs(x - y);   /* equal infinities agree */
    if (isnan(d)) d = INFINITY;
    if (d > r->max_abs || (r->worst < 0 && d > 0)) {
      r->max_abs = d;
      if (!nan_mismatch) r->worst = k;
    }
    if (fabs(y) > r->max_ref) r->max_ref = fabs(y);
    ss_diff += d * d;
    ss_ref += y * y;
  }
  r->rel = nan_mismatch ? NAN : r->max_abs / fmax(r->max_ref, 1e-30);
  r->rel_l2 = nan_mismatch ? NAN : sqrt(ss_diff) / fmax(sqrt(ss_ref), 1e-30);
  bool ok = !nan_mismatch && r->max_abs <= atol + rtol * r->max_ref;
  r->status = ok ? 0 : 1;
  if (r->worst < 0 && n > 0) r->worst = 0;
  if (r->worst >= 0) {
    index_text(b, r->worst, r->where, sizeof r->where);
    r->a = elem(a, r->worst);
    r->b = elem(b, r->worst);
  }
}

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_string(isnan(x) ? "nan" : x > 0 ? "inf" : "-inf"); }

int cmd_diff(int argc, char **argv) {
  const char *paths[2] = {NULL, NULL}, *prefix = "", *v;
  const char **names = calloc((size_t)argc + 1, sizeof *names);
  char *only_copy = NULL;
  int n_names = 0, n_paths = 0, rc = EXIT_OK;
  double rtol = 1e-5, atol = 0;
  bool json = false;
  if (!names) return report(EXIT_RUN, "out of memory");
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) {
      fputs(help, stdout);
      goto out;
    }
    if (arg_flag(argv[i], "--json")) {
      json = true;
      continue;
    }
    double *tol = NULL;
    const char *flag = NULL;
    if ((r = arg_value(argc, argv, &i, "--rtol", &v))) tol = &rtol, flag = "--rtol";
    else if ((r = arg_value(argc, argv, &i, "--atol", &v))) tol = &atol, flag = "--atol";
    if (tol) {
      char *end = NULL;
      double x = r > 0 ? strtod(v, &end) : NAN;
      if (r < 0 || end == v || *end || !(x >= 0) || !isfinite(x)) {
        rc = usage_error("diff", "%s needs a non-negative number%s%s", flag, r > 0 ? ", not " : "", r > 0 ? v : "");
        goto out;
      }
      *tol = x;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--only", &v))) {
      if (r < 0) {
        rc = usage_error("diff", "--only needs a comma-separated list of names");
        goto out;
      }
      free(only_copy);
      only_copy = strdup(v);
      const char **more = realloc(names, sizeof *names * ((size_t)argc + strlen(v) + 2));
      if (!only_copy || !more) {
        rc = report(EXIT_RUN, "out of memory");
        goto out;
      }
      names = more;
      for (char *tok = strtok(only_copy, ","); tok; tok = strtok(NULL, ",")) names[n_names++] = tok;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--prefix", &v))) {
      if (r < 0) {
        rc = usage_error("diff", "--prefix needs a value");
        goto out;
      }
      prefix = v;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1]) {
      rc = unknown_option("diff", argv[i], help);
      goto out;
    }
    if (n_paths < 2) paths[n_paths++] = argv[i];
    else names[n_names++] = argv[i];
  }
  if (n_paths < 2) {
    rc = usage_error("diff", "two safetensors files are needed: loom diff A.safetensors B.safetensors [NAME...]");
    goto out;
  }

  StFile fa, fb;
  char err[2048];
  if (st_read(paths[0], &fa, err, sizeof err)) {
    rc = report(EXIT_USAGE, err);
    goto out;
  }
  if (st_read(paths[1], &fb, err, sizeof err)) {
    st_close(&fa);
    rc = report(EXIT_USAGE, err);
    goto out;
  }
  if (n_names == 0) {
    const char **more = realloc(names, sizeof *names * ((size_t)fb.n + 1));
    if (!more) {
      st_close(&fa), st_close(&fb);
      rc = report(EXIT_RUN, "out of memory");
      goto out;
    }
    names = more;
    for (int i = 0; i < fb.n; i++) names[n_names++] = fb.tensors[i].name;
  }
  Row *rows = calloc((size_t)n_names + 1, sizeof *rows);
  if (!rows) {
    st_close(&fa), st_close(&fb);
    rc = report(EXIT_RUN, "out of memory");
    goto out;
  }
  int n_pass = 0, n_fail = 0, n_bad = 0;
  for (int i = 0; i < n_names; i++) {
    Row *r = &rows[i];
    r->name = names[i];
    char full[1024];
    snprintf(full, sizeof full, "%s%s", prefix, names[i]);
    const StTensor *b = st_find(&fb, names[i]), *a = st_find(&fa, full);
    if (!b) {
      snprintf(r->error, sizeof r->error, "not in %.1900s (B)", paths[1]);
      r->status = 2;
    } else if (!a) {
      snprintf(r->error, sizeof r->error, "%.900s (A) has no tensor '%.1000s'", paths[0], full);
      r->status = 2;
    } else {
      compare(r, a, b, rtol, atol);
    }
    n_pass += r->status == 0;
    n_fail += r->status == 1;
    n_bad += r->status == 2;
    if (r->status > rc) rc = r->status;
  }
  if (n_names == 0) {
    fprintf(stderr, "loom: error: nothing to compare: %s holds no tensors and no names were given\n", paths[1]);
    rc = EXIT_USAGE;
  }

  if (json) {
    json_t *root = json_pack("{s:s, s:s, s:o, s:o, s:[]}", "a", paths[0], "b", paths[1], "rtol", json_real(rtol),
                             "atol", json_real(atol), "tensors");
    json_t *arr = json_object_get(root, "tensors");
    for (int i = 0; i < n_names; i++) {
      const Row *r = &rows[i];
      json_t *o = json_pack("{s:s, s:s}", "name", r->name, "status", r->status == 0 ? "pass" : r->status == 1 ? "fail" : "error");
      if (r->status == 2) {
        json_object_set_new(o, "error", json_string(r->error));
      } else {
        json_object_set_new(o, "shape", json_string(r->shape));
        json_object_set_new(o, "max_abs", num(r->max_abs));
        json_object_set_new(o, "max_ref", num(r->max_ref));
        json_object_set_new(o, "rel_err", num(r->rel));
        json_object_set_new(o, "rel_l2", num(r->rel_l2));
        if (r->worst >= 0) {
          json_object_set_new(o, "worst_index", json_string(r->where));
          json_object_set_new(o, "worst_flat", json_integer(r->worst));
          json_object_set_new(o, "a", num(r->a));
          json_object_set_new(o, "b", num(r->b));
        }
      }
      json_array_append_new(arr, o);
    }
    json_object_set_new(root, "passed", json_integer(n_pass));
    json_object_set_new(root, "failed", json_integer(n_fail));
    json_object_set_new(root, "errors", json_integer(n_bad));
    json_object_set_new(root, "ok", json_boolean(rc == EXIT_OK));
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
    if (text) puts(text);
    free(text);
    json_decref(root);
  } else {
    printf("A: %s\nB: %s (the reference)\npass: max|a-b| <= atol + rtol * max|b|  (rtol %g, atol %g)\n\n", paths[0],
           paths[1], rtol, atol);
    int wn = 6, ws = 5, ww = 8;
    for (int i = 0; i < n_names; i++) {
      int l = (int)strlen(rows[i].name), s = (int)strlen(rows[i].shape), w = (int)strlen(rows[i].where);
      wn = l > wn ? (l < 60 ? l : 60) : wn;
      ws = s > ws ? s : ws;
      ww = w > ww ? w : ww;
    }
    printf("      %-*s  %-*s  %10s  %10s  %10s  %10s  %-*s  %-16s %s\n", wn, "tensor", ws, "shape", "max|a-b|", "max|b|",
           "rel_err", "rel_l2", ww, "worst at", "a", "b");
    for (int i = 0; i < n_names; i++) {
      const Row *r = &rows[i];
      if (r->status == 2) {
        printf("ERROR %-*s  %s\n", wn, r->name, r->error);
        continue;
      }
      printf("%-5s %-*s  %-*s  %10.3g  %10.3g  %10.3g  %10.3g  %-*s  %-16.9g %.9g\n", r->status ? "FAIL" : "PASS", wn,
             r->name, ws, r->shape, r->max_abs, r->max_ref, r->rel, r->rel_l2, ww, r->worst >= 0 ? r->where : "-",
             r->a, r->b);
    }
    printf("loom diff: %d tensors within rtol %g (atol %g), %d not%s\n", n_pass, rtol, atol, n_fail + n_bad,
           n_bad ? " (bad input: see ERROR)" : "");
  }
  free(rows);
  st_close(&fa);
  st_close(&fb);
out:
  free(names);
  free(only_copy);
  return rc;
}

double diff_rel_err(const StTensor *a, const StTensor *b, double *max_abs, double *max_ref, char *err, size_t errlen) {
  Row r;
  memset(&r, 0, sizeof r);
  compare(&r, a, b, 0, 0);
  if (r.status == 2) {
    snprintf(err, errlen, "%s", r.error);
    return -1;
  }
  if (max_abs) *max_abs = isnan(r.rel) ? INFINITY : r.max_abs;
  if (max_ref) *max_ref = r.max_ref;
  return isnan(r.rel) ? INFINITY : r.rel;
}
