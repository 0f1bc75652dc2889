/* ir/types.c — dtypes, shapes, shardings, and rounding to narrow float formats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static const struct { const char *name; int size; bool is_float; } dtypes[DT_COUNT] = {
  [DT_F32] = {"f32", 4, true},       [DT_BF16] = {"bf16", 2, true},
  [DT_F16] = {"f16", 2, true},       [DT_F8E4M3] = {"f8e4m3", 1, true},
  [DT_F8E5M2] = {"f8e5m2", 1, true}, [DT_I32] = {"i32", 4, false},
  [DT_I64] = {"i64", 8, false},      [DT_U16] = {"u16", 2, false},
  [DT_BOOL] = {"bool", 1, false},
};

const char *dtype_name(DType t) { return (unsigned)t < DT_COUNT ? dtypes[t].name : "?"; }
int dtype_size(DType t) { return dtypes[t].size; }
bool dtype_is_float(DType t) { return dtypes[t].is_float; }

int dtype_parse(const char *s, size_t n, DType *out) {
  for (int i = 0; i < DT_COUNT; i++)
    if (strlen(dtypes[i].name) == n && !memcmp(dtypes[i].name, s, n)) {
      *out = (DType)i;
      return 0;
    }
  return -1;
}

/* Round an f32 to a float format with `mbits` explicit mantissa bits and exponent bias
   `bias` (min normal exponent 1-bias), round-to-nearest-even, with subnormals.  `maxval`
   is the largest finite value; larger magnitudes become inf (or saturate when the format
   has no inf, as e4m3 does). */
static float round_to_format(float x, int mbits, int bias, float maxval, bool has_inf) {
  if (isnan(x) || isinf(x)) return has_inf || isnan(x) ? x : copysignf(maxval, x);
  if (x == 0) return x;
  int e;
  frexpf(fabsf(x), &e);               /* |x| = m * 2^e, m in [0.5,1) */
  int exp = e - 1;                    /* |x| = 1.f * 2^exp */
  int min_exp = 1 - bias;
  if (exp < min_exp) exp = min_exp;   /* subnormal: fixed quantum */
  float quantum = ldexpf(1.0f, exp - mbits);
  float r = nearbyintf(x / quantum) * quantum;   /* default rounding mode: to nearest even */
  if (fabsf(r) > maxval) return has_inf ? copysignf(INFINITY, x) : copysignf(maxval, x);
  return r;
}

float dtype_round(DType t, float x) {
  switch (t) {
  case DT_BF16: {
    /* Bit-exact round-to-nearest-even on the upper 16 bits, as GPUs convert. */
    if (isnan(x)) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    u &= 0xFFFF0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
  }
  case DT_F16: return round_to_format(x, 10, 15, 65504.0f, true);
  case DT_F8E4M3: return round_to_format(x, 3, 7, 448.0f, false);
  case DT_F8E5M2: return round_to_format(x, 2, 15, 57344.0f, true);
  default: return x;
  }
}

const char *const mesh_axis_names[AX_COUNT] = {"dp", "tp", "cp", "pp", "ep"};

int64_t mesh_world(const Mesh *m) {
  int64_t w = 1;
  for (int i = 0; i < AX_COUNT; i++) w *= m->size[i];
  return w;
}

void mesh_rank_coords(const Mesh *m, int64_t rank, int64_t coord[AX_COUNT]) {
  /* runtime/comm/comm.h's numbering: pp, dp, ep, cp, tp from outer to inner */
  static const int order[AX_COUNT] = {AX_PP, AX_DP, AX_EP, AX_CP, AX_TP};
  for (int k = AX_COUNT - 1; k >= 0; k--) {
    coord[order[k]] = rank % m->size[order[k]];
    rank /= m->size[order[k]];
  }
}

bool sharding_is_replicated(const Sharding *s) {
  for (int i = 0; i < AX_COUNT; i++)
    if (s->kind[i] != SH_R) return false;
  return true;
}

bool sharding_eq(const Sharding *a, const Sharding *b) {
  for (int i = 0; i < AX_COUNT; i++) {
    if (a->kind[i] != b->kind[i]) return false;
    if (a->kind[i] == SH_S && a->dim[i] != b->dim[i]) return false;
  }
  return true;
}

Type type_make(DType dt, int rank, const int64_t *dims) {
  Type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++) t.dims[i] = dims[i];
  return t;
}

Type type_scalar(DType dt) { return type_make(dt, 0, NULL); }

int64_t type_numel(const Type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++)
    if (__builtin_mul_overflow(n, t->dims[i], &n)) return INT64_MAX;   /* parse and verify refuse such shapes */
  return n;
}

bool type_shape_eq(const Type *a, const Type *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

bool type_eq(const Type *a, const Type *b) {
  return type_shape_eq(a, b) && sharding_eq(&a->sh, &b->sh);
}

char *shape_str(const Type *t, char *buf, size_t n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int i = 0; i < t->rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)t->dims[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

char *type_str(const Type *t, char *buf, size_t n) {
  char shape[256];
  size_t k = (size_t)snprintf(buf, n, "%s%s", dtype_name(t->dtype), shape_str(t, shape, sizeof shape));
  if (!sharding_is_replicated(&t->sh) && k < n) {
    const char *sep = "<";
    for (int a = 0; a < AX_COUNT && k < n; a++) {
      if (t->sh.kind[a] == SH_R) continue;
      if (t->sh.kind[a] == SH_S)
        k += (size_t)snprintf(buf + k, n - k, "%s%s:s%d", sep, mesh_axis_names[a], t->sh.dim[a]);
      else
        k += (size_t)snprintf(buf + k, n - k, "%s%s:p", sep, mesh_axis_names[a]);
      sep = ", ";
    }
    if (k < n) snprintf(buf + k, n - k, ">");
  }
  return buf;
}

void type_fprint(FILE *f, const Type *t) {
  char buf[512];
  fputs(type_str(t, buf, sizeof buf), f);
}

const char *const pipe_kind_names[PIPE_COUNT] = {"", "afab", "1f1b", "interleaved", "zb-h1", "dualpipev"};

int pipe_kind_parse(const char *s) {
  for (int k = 1; k < PIPE_COUNT; k++)
    if (s && !strcmp(s, pipe_kind_names[k])) return k;
  return -1;
}

const char *const recompute_mode_names[RECOMPUTE_COUNT] = {"none", "selective", "full", "auto"};
const char *const recompute_class_names[RC_N_CLASSES] = {"norm", "act", "eltwise", "rope", "attn"};

int recompute_parse(const char *s, int *mode, unsigned *classes, char *why, size_t n) {
  *classes = 0;
  if (!s) s = "";
  const char *colon = strchr(s, ':');
  size_t len = colon ? (size_t)(colon - s) : strlen(s);
  *mode = -1;
  for (int k = 0; k < RECOMPUTE_COUNT; k++)
    if (strlen(recompute_mode_names[k]) == len && !strncmp(s, recompute_mode_names[k], len)) *mode = k;
  if (*mode < 0) {
    snprintf(why, n, "'%s' is not a recomputation policy: use none, selective, selective:norm,act,... (classes: norm, "
             "act, eltwise, rope, attn), full or auto (with a memory budget)", s);
    return -1;
  }
  if (!colon) {
    if (*mode == RECOMPUTE_SELECTIVE) *classes = RC_DEFAULT_CLASSES;
    return 0;
  }
  if (*mode != RECOMPUTE_SELECTIVE) {
    snprintf(why, n, "'%s': only selective takes op classes (selective:norm,act)", s);
    return -1;
  }
  for (const char *p = colon + 1, *end; ; p = end + 1) {
    end = strchr(p, ',');
    size_t l = end ? (size_t)(end - p) : strlen(p);
    int c = -1;
    for (int k = 0; k < RC_N_CLASSES; k++)
      if (strlen(recompute_class_names[k]) == l && !strncmp(p, recompute_class_names[k], l)) c = k;
    if (c < 0) {
      snprintf(why, n, "'%s': unknown op class '%.*s' (classes: norm, act, eltwise, rope, attn)", s, (int)l, p);
      return -1;
    }
    *classes |= 1u << c;
    if (!end) break;
  }
  return 0;
}

int bytes_parse(const char *s, int64_t *out) {
  static const struct { const char *unit; double scale; } units[] = {
    {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0},
    {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"kB", 1e3}, {"B", 1}, {"", 1},
  };
  if (!s || !*s) return -1;
  char *end;
  double x = strtod(s, &end);
  if (end == s || !(x > 0) || x > 9e18) return -1;
  while (*end == ' ') end++;
  for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
    if (!strcmp(end, units[k].unit)) {
      double b = x * units[k].scale;
      if (b > 9e18 || b < 1) return -1;
      *out = (int64_t)b;
      return 0;
    }
  return -1;
}

int mesh_axis_parse(const char *name) {
  for (int a = 0; a < AX_COUNT; a++)
    if (name && !strcmp(name, mesh_axis_names[a])) return a;
  return -1;
}
