/* runtime/exec/weights.c — Hugging Face safetensors in and out of a module's globals. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/io/safetensors.h"
#include "runtime/trainer.h"
#include "runtime/exec/exec.h"

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

/* One expert of transformers 5's fused expert tensors, for the per-expert name
   "<P>.experts.<e>.<X>.weight" (the hub's): the tensors sit under <Q>.experts with Q = P, or
   Mixtral's P ".block_sparse_moe" as ".mlp"; gate_up_proj [E,2F,D] holds the gate rows
   (w1, gate_proj) then the up rows (w3, up_proj) of each expert, down_proj [E,D,F] the down
   projections (w2, down_proj).  The slice is a view into the file (in *tmp), or NULL. */
static const StTensor *fused_expert(const StFile *f, const char *name, StTensor *tmp) {
  const char *at = strstr(name, ".experts.");
  char *end;
  if (!at) return NULL;
  long long e = strtoll(at + 9, &end, 10);
  if (end == at + 9 || *end != '.' || e < 0) return NULL;
  const char *x = end + 1;
  size_t xl = strlen(x), pl = (size_t)(at - name);
  if (xl < 8 || strcmp(x + xl - 7, ".weight")) return NULL;
  xl -= 7;
  int part;   /* 0 gate, 1 up, 2 down */
  if ((xl == 2 && !strncmp(x, "w1", 2)) || (xl == 9 && !strncmp(x, "gate_proj", 9))) part = 0;
  else if ((xl == 2 && !strncmp(x, "w3", 2)) || (xl == 7 && !strncmp(x, "up_proj", 7))) part = 1;
  else if ((xl == 2 && !strncmp(x, "w2", 2)) || (xl == 9 && !strncmp(x, "down_proj", 9))) part = 2;
  else return NULL;
  static const char moe[] = ".block_sparse_moe";
  if (pl >= sizeof moe - 1 && !strncmp(at - (sizeof moe - 1), moe, sizeof moe - 1)) pl -= sizeof moe - 1;
  char fused[600];
  snprintf(fused, sizeof fused, "%.*s%s.experts.%s", (int)pl, name, pl == (size_t)(at - name) ? "" : ".mlp",
           part == 2 ? "down_proj" : "gate_up_proj");
  const StTensor *t = st_find(f, fused);
  if (!t || t->rank != 3 || e >= t->shape[0] || (part < 2 && t->shape[1] % 2)) return NULL;
  int64_t rows = part < 2 ? t->shape[1] / 2 : t->shape[1], cols = t->shape[2], es = st_dtype_size(t->dtype);
  *tmp = *t;
  tmp->rank = 2;
  tmp->shape[0] = rows, tmp->shape[1] = cols;
  tmp->nbytes = (uint64_t)(rows * cols * es);
  tmp->data = (const uint8_t *)t->data + (e * t->shape[1] + (part == 1 ? rows : 0)) * cols * es;
  return tmp;
}

/* The tensor for checkpoint name `name`: as named, with GPT-2's "transformer." prefix,
   under transformers 5's Mixtral names (block_sparse_moe as mlp), or one expert's slice of
   the fused expert tensors (fused_expert, a view in *tmp). */
static const StTensor *find_param_or_expert(const StFile *f, const char *name, StTensor *tmp) {
  const StTensor *st = st_find(f, name);
  char alt[600];
  if (!st) {
    snprintf(alt, sizeof alt, "transformer.%s", name);
    st = st_find(f, alt);
  }
  const char *moe = strstr(name, ".block_sparse_moe.gate.");
  if (!st && moe) {
    snprintf(alt, sizeof alt, "%.*s.mlp.gate.%s", (int)(moe - name), name, moe + 23);
    st = st_find(f, alt);
  }
  return st ? st : fused_expert(f, name, tmp);
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

/* A parameter's tensors in file f: itself, or for a stack of experts each expert's (by its
   checkpoint name), read into dst (n floats: rank/dims as the file holds them, elements past
   the file's zero); rounding as `round`.  *used counts the file tensors read. */
static int load_param(const StFile *f, const char *path, const char *name, bool experts, int rank, const int64_t *dims,
                      float *dst, int64_t n, int round, int n_params, int *used, char *err, size_t errlen) {
  int k = rt_views_of(rank, dims, experts), rc = 0;
  int64_t per = n / (k ? k : 1);
  for (int e = 0; e < k && !rc; e++) {
    char ename[600];
    const char *want = name;
    if (experts && rank >= 2) {
      if (rt_expert_name(name, e, ename, sizeof ename)) return EXIT_USAGE;
      want = ename;
    }
    StTensor tmp;
    const StTensor *st = find_param_or_expert(f, want, &tmp);
    if (!st) {
      snprintf(err, errlen, "%s: has no tensor '%s' (the model needs %d parameters; is this checkpoint for another "
               "model or config?)", path, want, n_params);
      return EXIT_USAGE;
    }
    int r = experts && rank >= 2 ? rank - 1 : rank;
    if ((rc = shape_mismatch(path, st, r, experts && rank >= 2 ? dims + 1 : dims, err, errlen))) return rc;
    float *out = dst + e * per;
    int64_t m = st_numel(st->rank, st->shape);   /* the checkpoint's elements; padded rows stay 0 */
    if (m > per) m = per;
    if (!(rc = read_f32(st, out, m, path, err, errlen)) && round) rt_round_buf(NULL, out, m, (RtRound)round);
    for (int64_t j = m; j < per; j++) out[j] = 0;
    (*used)++;
  }
  return rc;
}

/* Tensors of f past the `used` ones the model read, less the training record loom's own --out
   writes beside the parameters (losses, grad_norms, lrs, val_losses: no model reads them). A
   note names what remains. */
static void note_unused(const StFile *f, const char *path, int used) {
  static const char *const record[] = {"losses", "grad_norms", "lrs", "val_losses"};
  int extra = f->n - used;
  for (int i = 0; i < f->n; i++)
    for (size_t k = 0; k < sizeof record / sizeof record[0]; k++)
      if (!strcmp(f->tensors[i].name, record[k])) extra--;
  if (extra > 0)
    fprintf(stderr, "loom: note: %s holds %d tensor%s the model does not use (ignored)\n", path, extra, extra == 1 ? "" : "s");
}

int load_weights_rt(const RtProgram *p, CpuProgram *cp, const char *path, char *err, size_t errlen) {
  StFile f;
  int rc = st_read(path, &f, err, errlen), used = 0, n_params = 0;
  if (rc) return rc;
  for (int i = 0; i < p->n_globals; i++) n_params += p->globals[i].region == RT_REGION_PARAMS;
  for (int i = 0; i < p->n_globals && !rc; i++) {
    const RtGlobal *g = &p->globals[i];
    if (g->region != RT_REGION_PARAMS) continue;
    rc = load_param(&f, path, g->name, g->experts, g->rank, g->shape, cpu_global(cp, i), g->n, g->round, n_params, &used,
                    err, errlen);
  }
  if (!rc) note_unused(&f, path, used);
  st_close(&f);
  return rc;
}

int load_weights_views(RtTensor *ts, int n, const char *path, char *err, size_t errlen) {
  StFile f;
  int rc = st_read(path, &f, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n && !rc; i++) {
    StTensor tmp;
    const StTensor *st = find_param_or_expert(&f, ts[i].name, &tmp);
    if (!st) {
      snprintf(err, errlen, "%s: has no tensor '%s' (the model needs %d parameters; is this checkpoint for another "
               "model or config?)", path, ts[i].name, n);
      rc = EXIT_USAGE;
      break;
    }
    if (!(rc = shape_mismatch(path, st, ts[i].rank, ts[i].shape, err, errlen)))
      rc = read_f32(st, ts[i].data, st_numel(st->rank, st->shape), path, err, errlen);
  }
  if (!rc) note_unused(&f, path, n);
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
    Tensor *t = g->t[i];
    rc = load_param(&f, path, gl->name, gl->hf_experts, gl->hf_rank ? gl->hf_rank : t->type.rank,
                    gl->hf_rank ? gl->hf_dims : t->type.dims, t->f, t->n, 0, m->globals.n, &used, err, errlen);
    for (int64_t k = 0; !rc && k < t->n; k++) t->f[k] = dtype_round(t->type.dtype, t->f[k]);
  }
  if (!rc) note_unused(&f, path, used);
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

/* ---- a rank's pieces, read from a memory-mapped file ---- */

typedef struct {
  const char *path;
  const StTensor *const *ts;   /* per view (expert): its tensor */
  const int64_t *saved;        /* per view: the file's elements */
  int64_t per;                 /* whole elements per view */
  float *out;
  int rc;
  char *err;
  size_t errlen;
} PieceLoad;

static void piece_run(int64_t w, int64_t p, int64_t n, void *arg) {
  PieceLoad *pl = arg;
  while (n > 0 && !pl->rc) {
    int64_t e = w / pl->per, off = w - e * pl->per, len = pl->per - off < n ? pl->per - off : n;
    int64_t have = pl->saved[e] > off ? pl->saved[e] - off : 0;
    if (have > len) have = len;
    if (have > 0) {
      StTensor sub = *pl->ts[e];
      sub.data = (const uint8_t *)sub.data + (size_t)off * (size_t)st_dtype_size(sub.dtype);
      pl->rc = read_f32(&sub, pl->out + p, have, pl->path, pl->err, pl->errlen);
    }
    for (int64_t k = have; k < len; k++) pl->out[p + k] = 0;   /* padded rows */
    w += len, p += len, n -= len;
  }
}

int load_weights_pieces(const RtProgram *prog, const int64_t mesh[5], const int coord[5], const char *path,
                        float **pieces, char *err, size_t errlen) {
  StFile f;
  int rc = st_map(path, &f, err, errlen), n_params = 0;
  if (rc) return rc;
  for (int g = 0; g < prog->n_globals; g++) n_params += prog->globals[g].region == RT_REGION_PARAMS;
  for (int g = 0; g < prog->n_globals && !rc; g++) {
    const RtGlobal *gl = &prog->globals[g];
    if (gl->region != RT_REGION_PARAMS || !pieces[g]) continue;
    bool stack = gl->experts && gl->rank >= 2;
    int E = rt_views_of(gl->rank, gl->shape, gl->experts);
    const StTensor **ts = calloc((size_t)E, sizeof *ts);
    StTensor *tmp = calloc((size_t)E, sizeof *tmp);
    int64_t *saved = calloc((size_t)E, sizeof *saved);
    if (!ts || !tmp || !saved) {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
    }
    for (int e = 0; e < E && !rc; e++) {
      char ename[600];
      const char *want = gl->name;
      if (stack) {
        if (rt_expert_name(gl->name, e, ename, sizeof ename)) {
          snprintf(err, errlen, "the expert name of %s is too long", gl->name);
          rc = EXIT_USAGE;
          break;
        }
        want = ename;
      }
      if (!(ts[e] = find_param_or_expert(&f, want, &tmp[e]))) {
        snprintf(err, errlen, "%s: has no tensor '%s' (the model needs %d parameters; is this checkpoint for another "
                 "model or config?)", path, want, n_params);
        rc = EXIT_USAGE;
        break;
      }
      rc = shape_mismatch(path, ts[e], stack ? gl->rank - 1 : gl->rank, stack ? gl->shape + 1 : gl->shape, err, errlen);
      saved[e] = st_numel(ts[e]->rank, ts[e]->shape);
    }
    if (!rc) {
      PieceLoad pl = {path, ts, saved, rt_global_whole_numel(gl, mesh) / E, pieces[g], 0, err, errlen};
      rt_piece_runs(gl, mesh, coord, piece_run, &pl);
      rc = pl.rc;
      if (!rc && gl->round) rt_round_buf(NULL, pieces[g], gl->n, (RtRound)gl->round);
    }
    free(ts);
    free(tmp);
    free(saved);
  }
  st_close(&f);
  return rc;
}
