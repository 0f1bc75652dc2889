/* tests/support/st_diff.c — compare the tensors of two safetensors files.
 *
 *   st_diff A.safetensors B.safetensors [--rtol 1e-5] [--only name1,name2] [--prefix P]
 *
 * B is the reference.  Every tensor of B (or only the --only ones) is looked up in A
 * (as "P<name>" with --prefix P), shapes must match, and the relative error
 *
 *     max|a - b| / max(max|b|, 1e-30)
 *
 * is printed with PASS or FAIL against rtol.  Data may be F32, F64, BF16 or F16 (read as
 * double).  Exit status: 0 all within rtol, 1 some tensor exceeds it (or holds a NaN
 * where the other does not), 2 bad usage or files (unreadable file, missing tensor,
 * shape mismatch, unsupported dtype).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/safetensors.h"

static const char usage[] =
  "usage: st_diff A.safetensors B.safetensors [--rtol 1e-5] [--only name1,name2] [--prefix P]\n"
  "Compares A's tensors against B's (the reference): relative error max|a-b| / max|b|.\n"
  "Exit status: 0 all within rtol, 1 some tensor exceeds it, 2 bad usage or files.\n";

static double half_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0) v = ldexp((double)mant, -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = ldexp((double)(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

/* Element k of t as a double; dtype already checked. */
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

static bool readable(StDType t) { return t == ST_F32 || t == ST_F64 || t == ST_BF16 || t == ST_F16; }

static void shape_text(const StTensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->rank && k < n; d++) k += (size_t)snprintf(buf + k, n - k, d ? ",%lld" : "%lld", (long long)t->shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* Compares one pair; returns 0 pass, 1 fail, 2 unusable. */
static int compare(const char *name, const StTensor *a, const StTensor *b, double rtol) {
  char sa[128], sb[128];
  shape_text(a, sa, sizeof sa);
  shape_text(b, sb, sizeof sb);
  bool same = a->rank == b->rank;
  for (int d = 0; same && d < a->rank; d++) same = a->shape[d] == b->shape[d];
  if (!same) {
    printf("ERROR %s: shape %s in A but %s in B\n", name, sa, sb);
    return 2;
  }
  if (!readable(a->dtype) || !readable(b->dtype)) {
    printf("ERROR %s: dtype %s / %s; st_diff reads F32, F64, BF16 and F16\n", name, st_dtype_name(a->dtype),
           st_dtype_name(b->dtype));
    return 2;
  }
  int64_t n = st_numel(b->rank, b->shape);
  double max_diff = 0, max_ref = 0;
  int64_t worst = -1;
  bool nan_mismatch = false;
  for (int64_t k = 0; k < n; k++) {
    double x = elem(a, k), y = elem(b, k);
    if (isnan(x) || isnan(y)) {
      if (!(isnan(x) && isnan(y))) {
        nan_mismatch = true;
        if (worst < 0) worst = k;
      }
      continue;
    }
    double d = x == y ? 0 : fabs(x - y);   /* equal infinities agree */
    if (d > max_diff || isnan(d)) {
      max_diff = isnan(d) ? INFINITY : d;
      worst = k;
    }
    if (fabs(y) > max_ref) max_ref = fabs(y);
  }
  double rel = nan_mismatch ? NAN : max_diff / fmax(max_ref, 1e-30);
  bool ok = rel <= rtol;   /* false for NaN */
  printf("%s %s %s rel_err %.3g (max|a-b| %.3g, max|b| %.3g)", ok ? "PASS" : "FAIL", name, sb, rel, max_diff, max_ref);
  if (!ok && worst >= 0) printf(" worst at element %lld: %.9g vs %.9g", (long long)worst, elem(a, worst), elem(b, worst));
  printf("\n");
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  const char *path_a = NULL, *path_b = NULL, *only = NULL, *prefix = "";
  double rtol = 1e-5;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = NULL;
    const char *opts[] = {"--rtol", "--only", "--prefix"};
    int which = -1;
    for (int o = 0; o < 3; o++) {
      size_t len = strlen(opts[o]);
      if (!strncmp(arg, opts[o], len) && (arg[len] == 0 || arg[len] == '=')) {
        which = o;
        if (arg[len] == '=') val = arg + len + 1;
        else if (i + 1 < argc) val = argv[++i];
        else {
          fprintf(stderr, "st_diff: %s needs a value\n%s", opts[o], usage);
          return 2;
        }
      }
    }
    if (which == 0) {
      char *end;
      rtol = strtod(val, &end);
      if (end == val || *end || !(rtol >= 0)) {
        fprintf(stderr, "st_diff: --rtol: '%s' is not a non-negative number\n", val);
        return 2;
      }
    } else if (which == 1) only = val;
    else if (which == 2) prefix = val;
    else if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      fputs(usage, stdout);
      return 0;
    } else if (arg[0] == '-' && arg[1]) {
      fprintf(stderr, "st_diff: unknown option '%s'\n%s", arg, usage);
      return 2;
    } else if (!path_a) path_a = arg;
    else if (!path_b) path_b = arg;
    else {
      fprintf(stderr, "st_diff: too many files ('%s')\n%s", arg, usage);
      return 2;
    }
  }
  if (!path_a || !path_b) {
    fprintf(stderr, "st_diff: two files are needed\n%s", usage);
    return 2;
  }

  StFile fa, fb;
  char err[2048];
  if (st_read(path_a, &fa, err, sizeof err)) {
    fprintf(stderr, "st_diff: %s\n", err);
    return 2;
  }
  if (st_read(path_b, &fb, err, sizeof err)) {
    fprintf(stderr, "st_diff: %s\n", err);
    st_close(&fa);
    return 2;
  }

  /* The names to compare: --only's list, else every tensor of B. */
  int n_names = 0;
  char **names = NULL;
  char *only_copy = NULL;
  if (only) {
    only_copy = strdup(only);
    names = calloc(strlen(only) + 1, sizeof *names);
    for (char *tok = strtok(only_copy, ","); tok; tok = strtok(NULL, ",")) names[n_names++] = tok;
  } else {
    names = calloc((size_t)fb.n + 1, sizeof *names);
    for (int i = 0; i < fb.n; i++) names[n_names++] = fb.tensors[i].name;
  }

  int worst = 0, n_pass = 0, n_fail = 0;
  if (n_names == 0) {
    fprintf(stderr, "st_diff: nothing to compare (%s holds no tensors and no --only names were given)\n", path_b);
    worst = 2;
  }
  for (int i = 0; i < n_names; i++) {
    const char *name = names[i];
    char full[1024];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const StTensor *b = st_find(&fb, name), *a = st_find(&fa, full);
    int rc;
    if (!b) {
      printf("ERROR %s: not in %s\n", name, path_b);
      rc = 2;
    } else if (!a) {
      printf("ERROR %s: %s has no tensor '%s'\n", name, path_a, full);
      rc = 2;
    } else {
      rc = compare(name, a, b, rtol);
    }
    if (rc == 0) n_pass++;
    else n_fail++;
    if (rc > worst) worst = rc;
  }
  printf("st_diff: %d tensors within rtol %g, %d not\n", n_pass, rtol, n_fail);
  free(names);
  free(only_copy);
  st_close(&fa);
  st_close(&fb);
  return worst;
}
