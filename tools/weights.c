/* tools/weights.c — Hugging Face safetensors in and out of a module's globals. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/io/safetensors.h"
#include "tools/tools.h"

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0) {
    if (mant == 0) bits = sign;
    else {   /* subnormal: normalize */
      int e = -1;
      do { e++; mant <<= 1; } while (!(mant & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
    }
  } else if (exp == 31) bits = sign | 0x7F800000u | mant << 13;
  else bits = sign | (exp - 15 + 127) << 23 | mant << 13;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* The values of a safetensors tensor as f32 (F32, BF16 or F16 in the file). */
static int read_f32(const StTensor *st, float *dst, int64_t n, const char *path, char *err, size_t errlen) {
  const uint8_t *p = st->data;
  for (int64_t k = 0; k < n; k++) {
    float v;
    switch (st->dtype) {
    case ST_F32: memcpy(&v, p + 4 * k, 4); break;
    case ST_BF16: {
      uint32_t bits = (uint32_t)(p[2 * k] | p[2 * k + 1] << 8) << 16;
      memcpy(&v, &bits, 4);
      break;
    }
    case ST_F16: v = half_to_float((uint16_t)(p[2 * k] | p[2 * k + 1] << 8)); break;
    default:
      snprintf(err, errlen, "%s: tensor '%s' is %s; loom reads F32, BF16 and F16 weights", path, st->name,
               st_dtype_name(st->dtype));
      return EXIT_USAGE;
    }
    dst[k] = v;
  }
  return 0;
}

/* Reads the file's elements into t; elements past them (a padded vocabulary's rows) are 0. */
static int convert(const StTensor *st, Tensor *t, const char *path, char *err, size_t errlen) {
  int64_t n = st_numel(st->rank, st->shape);
  if (n > t->n) n = t->n;
  int rc = read_f32(st, t->f, n, path, err, errlen);
  for (int64_t k = 0; !rc && k < t->n; k++) t->f[k] = k < n ? dtype_round(t->type.dtype, t->f[k]) : 0.0f;
  return rc;
}

/* The tensor for parameter `name`: as named, or with GPT-2's "transformer." prefix. */
static const StTensor *find_param(const StFile *f, const char *name) {
  const StTensor *st = st_find(f, name);
  if (!st) {
    char alt[512];
    snprintf(alt, sizeof alt, "transformer.%s", name);
    st = st_find(f, alt);
  }
  return st;
}

static int shape_mismatch(const char *path, const StTensor *st, int rank, const int64_t *dims, char *err, size_t errlen) {
  bool same = st->rank == rank;
  for (int d = 0; same && d < rank; d++) same = st->shape[d] == dims[d];
  if (same) return 0;
  char want[256] = "[", got[256] = "[";
  for (int d = 0; d < st->rank; d++)
    snprintf(got + strlen(got), sizeof got - strlen(got), d ? ",%lld" : "%lld", (long long)st->shape[d]);
  for (int d = 0; d < rank; d++)
    snprintf(want + strlen(want), sizeof want - strlen(want), d ? ",%lld" : "%lld", (long long)dims[d]);
  strncat(got, "]", sizeof got - strlen(got) - 1);
  strncat(want, "]", sizeof want - strlen(want) - 1);
  snprintf(err, errlen, "%s: tensor '%s' is %s but the model needs %s; the config does not match the checkpoint", path,
           st->name, got, want);
  return EXIT_USAGE;
}

int load_weights_rt(const RtProgram *p, CpuProgram *cp, const char *path, char *err, size_t errlen) {
  StFile f;
  int rc = st_read(path, &f, err, errlen), used = 0, n_params = 0;
  if (rc) return rc;
  for (int i = 0; i < p->n_globals; i++) n_params += p->globals[i].region == RT_REGION_PARAMS;
  for (int i = 0; i < p->n_globals && !rc; i++) {
    const RtGlobal *g = &p->globals[i];
    if (g->region != RT_REGION_PARAMS) continue;
    const StTensor *st = find_param(&f, g->name);
    if (!st) {
      snprintf(err, errlen, "%s: has no tensor '%s' (the model needs %d parameters; is this checkpoint for another "
               "model or config?)", path, g->name, n_params);
      rc = EXIT_USAGE;
      break;
    }
    if ((rc = shape_mismatch(path, st, g->rank, g->shape, err, errlen))) break;
    float *dst = cpu_global(cp, i);
    int64_t n = st_numel(st->rank, st->shape);   /* the checkpoint's elements; padded rows stay 0 */
    if (n > g->n) n = g->n;
    if (!(rc = read_f32(st, dst, n, path, err, errlen)) && g->round) rt_round_buf(NULL, dst, n, (RtRound)g->round);
    for (int64_t k = n; k < g->n; k++) dst[k] = 0;
    used++;
  }
  if (!rc && used < f.n)
    fprintf(stderr, "loom: note: %s holds %d tensors the model does not use (ignored)\n", path, f.n - used);
  st_close(&f);
  return rc;
}

int load_weights_views(RtTensor *ts, int n, const char *path, char *err, size_t errlen) {
  StFile f;
  int rc = st_read(path, &f, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n && !rc; i++) {
    const StTensor *st = find_param(&f, ts[i].name);
    if (!st) {
      snprintf(err, errlen, "%s: has no tensor '%s' (the model needs %d parameters; is this checkpoint for another "
               "model or config?)", path, ts[i].name, n);
      rc = EXIT_USAGE;
      break;
    }
    if (!(rc = shape_mismatch(path, st, ts[i].rank, ts[i].shape, err, errlen)))
      rc = read_f32(st, ts[i].data, st_numel(st->rank, st->shape), path, err, errlen);
  }
  if (!rc && n < f.n) fprintf(stderr, "loom: note: %s holds %d tensors the model does not use (ignored)\n", path, f.n - n);
  st_close(&f);
  return rc;
}

int load_weights(const Module *m, GlobalStore *g, const char *path, char *err, size_t errlen) {
  StFile f;
  int rc = st_read(path, &f, err, errlen);
  if (rc) return rc;
  int used = 0;
  for (int i = 0; i < m->globals.n && !rc; i++) {
    const Global *gl = m->globals.items[i];
    if (gl->kind != GLOBAL_PARAM) continue;
    const StTensor *st = find_param(&f, gl->name);
    if (!st) {
      snprintf(err, errlen, "%s: has no tensor '%s' (the model needs %d parameters; is this checkpoint for another "
               "model or config?)", path, gl->name, m->globals.n);
      rc = EXIT_USAGE;
      break;
    }
    Tensor *t = g->t[i];
    if ((rc = shape_mismatch(path, st, gl->hf_rank ? gl->hf_rank : t->type.rank, gl->hf_rank ? gl->hf_dims : t->type.dims,
                             err, errlen)))
      break;
    rc = convert(st, t, path, err, errlen);
    used++;
  }
  if (!rc && used < f.n)
    fprintf(stderr, "loom: note: %s holds %d tensors the model does not use (ignored)\n", path, f.n - used);
  st_close(&f);
  return rc;
}

int write_tensors(const char *path, const char *const *names, Tensor *const *tensors, int n, char *err, size_t errlen) {
  StTensor *st = calloc((size_t)(n ? n : 1), sizeof *st);
  float **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    const Tensor *t = tensors[i];
    st[i].name = (char *)names[i];
    st[i].dtype = ST_F32;
    st[i].rank = t->type.rank;
    for (int d = 0; d < t->type.rank; d++) st[i].shape[d] = t->type.dims[d];
    st[i].nbytes = (uint64_t)t->n * 4;
    if (t->f) st[i].data = t->f;
    else {   /* integer tensors are written as f32 values */
      bufs[i] = malloc(sizeof(float) * (size_t)(t->n ? t->n : 1));
      if (!bufs[i]) { snprintf(err, errlen, "out of memory"); rc = EXIT_RUN; break; }
      for (int64_t k = 0; k < t->n; k++) bufs[i][k] = (float)t->i[k];
      st[i].data = bufs[i];
    }
  }
  if (!rc) rc = st_write(path, st, n, NULL, NULL, 0, err, errlen);
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
  free(st);
  return rc;
}
