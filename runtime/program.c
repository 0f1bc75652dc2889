/* runtime/program.c — a lowered program as bytes (compiled executables carry it).
 *
 * Layout, little-endian as the host writes it (a blob is only read on the kind of machine
 * that compiled it, so structs are written whole): "LOOMPRG4", u32 sizeof RtStep, then
 * n_funcs, n_globals, n_kernels, region_bytes[], the mesh, the pipeline (RtPipe), kernel
 * names, globals, and per function its header, its arguments' placements and its steps.  The reader checks every count against the bytes left.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/program.h"

/* what lowering allocated in a program (also what rt_program_read allocates) */
void rt_program_free(RtProgram *p) {
  if (!p) return;
  for (int i = 0; i < p->n_funcs; i++) free(p->funcs[i].steps);
  free(p->funcs);
  free(p->globals);
  free(p->kernel_names);
  memset(p, 0, sizeof *p);
}

static const char magic[8] = {'L', 'O', 'O', 'M', 'P', 'R', 'G', '4'};

typedef struct {
  unsigned char *p;
  size_t n, cap;
  bool oom;
} Out;

static void put(Out *o, const void *src, size_t n) {
  if (o->oom || !n) return;   /* nothing (src may then be NULL: a program without kernels) */
  if (o->n + n > o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 4096;
    while (cap < o->n + n) cap *= 2;
    unsigned char *p = realloc(o->p, cap);
    if (!p) {
      o->oom = true;
      return;
    }
    o->p = p;
    o->cap = cap;
  }
  memcpy(o->p + o->n, src, n);
  o->n += n;
}

int rt_storage_size(RtStorage s) {
  switch (s) {
  case RT_ST_F32:
  case RT_ST_I32: return 4;
  case RT_ST_BF16:
  case RT_ST_F16: return 2;
  case RT_ST_F8E4M3:
  case RT_ST_F8E5M2:
  case RT_ST_BOOL: return 1;
  }
  return 0;
}

const char *rt_storage_name(RtStorage s) {
  switch (s) {
  case RT_ST_F32: return "f32";
  case RT_ST_I32: return "i32";
  case RT_ST_BF16: return "bf16";
  case RT_ST_F16: return "f16";
  case RT_ST_F8E4M3: return "f8e4m3";
  case RT_ST_F8E5M2: return "f8e5m2";
  case RT_ST_BOOL: return "bool";
  }
  return "unknown";
}

const RtBuiltinInfo rt_builtins[RT_B_COUNT] = {
#define RT_BUILTIN(e, name, n_in, n_out, ir_op) [RT_B_##e] = {name, n_in, n_out},
#include "runtime/builtins.def"
#undef RT_BUILTIN
};

const char *rt_builtin_name(int b) { return b >= 0 && b < RT_B_COUNT ? rt_builtins[b].name : "?"; }

/* An RtFunc as saved: all but the placements of the arguments it does not have. */
#define RT_FUNC_HEAD offsetof(RtFunc, arg_place)

int rt_program_save(const RtProgram *p, unsigned char **bytes, size_t *n, char *err, size_t errlen) {
  Out o = {0};
  uint32_t step_size = sizeof(RtStep);
  int32_t counts[3] = {p->n_funcs, p->n_globals, p->n_kernels};
  put(&o, magic, 8);
  put(&o, &step_size, 4);
  put(&o, counts, sizeof counts);
  put(&o, p->region_bytes, sizeof p->region_bytes);
  int64_t mesh[5];
  for (int a = 0; a < 5; a++) mesh[a] = p->mesh[a] > 1 ? p->mesh[a] : 1;
  put(&o, mesh, sizeof mesh);
  put(&o, &p->pipe, sizeof p->pipe);
  put(&o, p->kernel_names, sizeof p->kernel_names[0] * (size_t)p->n_kernels);
  put(&o, p->globals, sizeof(RtGlobal) * (size_t)p->n_globals);
  for (int i = 0; i < p->n_funcs; i++) {
    RtFunc f = p->funcs[i];
    f.steps = NULL;
    put(&o, &f, RT_FUNC_HEAD);   /* then only the arguments' placements */
    put(&o, f.arg_place, sizeof(RtPlace) * (size_t)(f.n_args > 0 && f.n_args <= RT_MAX_FUNC_IO ? f.n_args : 0));
    put(&o, p->funcs[i].steps, sizeof(RtStep) * (size_t)p->funcs[i].n_steps);
  }
  if (o.oom) {
    free(o.p);
    snprintf(err, errlen, "out of memory saving the program");
    return 1;
  }
  *bytes = o.p;
  *n = o.n;
  return 0;
}

typedef struct {
  const unsigned char *p;
  size_t n, at;
} In;

static bool get(In *in, void *dst, size_t n) {
  if (n > in->n - in->at) return false;
  memcpy(dst, in->p + in->at, n);
  in->at += n;
  return true;
}

int rt_program_load(const unsigned char *bytes, size_t n, RtProgram *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  In in = {bytes, n, 0};
  char m[8];
  uint32_t step_size = 0;
  int32_t counts[3];
  if (!get(&in, m, 8) || memcmp(m, magic, 8) || !get(&in, &step_size, 4) || step_size != sizeof(RtStep)) {
    snprintf(err, errlen, "the compiled program is not one this build of loom reads (magic or layout differs); recompile it");
    return 2;
  }
  if (!get(&in, counts, sizeof counts) || !get(&in, out->region_bytes, sizeof out->region_bytes) ||
      !get(&in, out->mesh, sizeof out->mesh) || !get(&in, &out->pipe, sizeof out->pipe))
    goto bad;
  for (int a = 0; a < 5; a++)   /* sizes a damaged file would not give */
    if (out->mesh[a] < 1 || rt_program_world(out) > 1 << 20) goto bad;
  /* the schedule's own limits (ir/schedule.c's schedule_build refuses the rest with its reason) */
  const RtPipe *pp = &out->pipe;
  if (pp->kind < 0 || pp->kind > 5 || (pp->kind && (pp->virt < 1 || pp->virt > 64 || pp->micro < 1 || pp->micro > 4096)) ||
      (!pp->kind && (pp->virt || pp->micro)))
    goto bad;
  for (int i = 0; i < 3; i++)
    if (counts[i] < 0 || counts[i] > 1 << 20) goto bad;
  /* every counted item must be in the bytes left (an RtFunc is kilobytes: a damaged count
     would otherwise ask for gigabytes before the short read is noticed) */
  size_t left = in.n - in.at;
  if ((size_t)counts[2] > left / sizeof out->kernel_names[0] || (size_t)counts[1] > left / sizeof(RtGlobal) ||
      (size_t)counts[0] > left / RT_FUNC_HEAD)
    goto bad;
  out->n_funcs = counts[0];
  out->n_globals = counts[1];
  out->n_kernels = counts[2];
  out->kernel_names = calloc((size_t)out->n_kernels + 1, sizeof out->kernel_names[0]);
  out->globals = calloc((size_t)out->n_globals + 1, sizeof(RtGlobal));
  out->funcs = calloc((size_t)out->n_funcs + 1, sizeof(RtFunc));
  if (!out->kernel_names || !out->globals || !out->funcs) goto oom;
  if (!get(&in, out->kernel_names, sizeof out->kernel_names[0] * (size_t)out->n_kernels) ||
      !get(&in, out->globals, sizeof(RtGlobal) * (size_t)out->n_globals))
    goto bad;
  for (int i = 0; i < out->n_kernels; i++) out->kernel_names[i][31] = 0;
  for (int i = 0; i < out->n_globals; i++) {
    out->globals[i].name[sizeof out->globals[i].name - 1] = 0;
    if (out->globals[i].owner < -1 || out->globals[i].owner >= out->mesh[3]) goto bad;   /* a pp coordinate, or -1 */
  }
  for (int i = 0; i < out->n_funcs; i++) {
    RtFunc *f = &out->funcs[i];
    if (!get(&in, f, RT_FUNC_HEAD)) goto bad;
    f->steps = NULL;
    f->name[sizeof f->name - 1] = 0;
    if (f->n_steps < 0 || (size_t)f->n_steps > (in.n - in.at) / sizeof(RtStep) || f->n_args < 0 ||
        f->n_args > RT_MAX_FUNC_IO || f->n_rets < 0 || f->n_rets > RT_MAX_FUNC_IO ||
        !get(&in, f->arg_place, sizeof(RtPlace) * (size_t)f->n_args))
      goto bad;
    f->steps = calloc((size_t)f->n_steps + 1, sizeof(RtStep));
    if (!f->steps) goto oom;
    if (!get(&in, f->steps, sizeof(RtStep) * (size_t)f->n_steps)) goto bad;
    for (int k = 0; k < f->n_steps; k++) f->steps[k].label[sizeof f->steps[k].label - 1] = 0;
  }
  if (in.at != in.n) goto bad;
  return 0;   /* buffer bounds and step fields are checked by cpu_program_init */
bad:
  rt_program_free(out);
  snprintf(err, errlen, "the compiled program is damaged (counts and sizes do not add up); recompile it");
  return 2;
oom:
  rt_program_free(out);
  snprintf(err, errlen, "out of memory loading the compiled program");
  return 1;
}

/* ---------------------------------------------------------------- initial values */

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* The reference executor's generator (ir/interp.c), copied: runtime/ may not include ir/. */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return ((splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static uint64_t name_seed(uint64_t seed, const char *name) {
  uint64_t h = seed ^ 0x5851F42D4C957F2Dull;
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
  return h;
}

/* Values [k0, k1) of a global into dst[0 .. k1 - k0). splitmix64 is a counter: the k-th
   normal draws from states s0 + (2k+1)G and s0 + (2k+2)G, so any range starts where the
   sequential walk would be and every split of the work gives the same bits. */
static void init_range(const RtGlobal *gl, uint64_t s0, float *dst, int64_t k0, int64_t k1) {
  float *t = dst;
  uint64_t s = s0 + (uint64_t)k0 * 2u * 0x9E3779B97F4A7C15ull;
  for (int64_t k = k0; k < k1; k++) {
    double v = 0;
    switch (gl->init) {
    case RT_INIT_ZEROS: v = 0; break;
    case RT_INIT_ONES: v = 1; break;
    case RT_INIT_CONST: v = gl->init_value; break;
    case RT_INIT_NORMAL: {
      double u1 = uniform01(&s), u2 = uniform01(&s);
      v = gl->init_value * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
      break;
    }
    }
    t[k - k0] = rt_round((RtRound)gl->round, (float)v);
  }
}

typedef struct {
  const RtGlobal *gl;
  uint64_t s0;
  float *t;
  int64_t k0, k1;
} InitPart;

static void *init_part(void *arg) {
  InitPart *p = arg;
  init_range(p->gl, p->s0, p->t + p->k0, p->k0, p->k1);
  return NULL;
}

void rt_global_init_values(const RtGlobal *gl, uint64_t seed, float *t) {
  uint64_t s0 = name_seed(seed, gl->name);
  /* A billion-parameter model draws billions of normals (a minute on one core): large
     globals are split over the machine's cores. */
  enum { MAX_PARTS = 32, MIN_PART = 1 << 20 };
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int parts = (int)(gl->n / MIN_PART);
  if (parts > cores) parts = (int)cores;
  if (parts > MAX_PARTS) parts = MAX_PARTS;
  if (parts < 2) parts = 1;
  InitPart part[MAX_PARTS];
  pthread_t tid[MAX_PARTS];
  bool started[MAX_PARTS] = {false};
  for (int i = 0; i < parts; i++) {
    part[i] = (InitPart){gl, s0, t, gl->n * i / parts, gl->n * (i + 1) / parts};
    started[i] = i > 0 && pthread_create(&tid[i], NULL, init_part, &part[i]) == 0;
  }
  for (int i = 0; i < parts; i++) {   /* part 0 here, and any part whose thread did not start */
    if (started[i]) pthread_join(tid[i], NULL);
    else init_part(&part[i]);
  }
  /* Rows past the checkpoint shape (a padded vocabulary) are zero. */
  int64_t saved = 1;
  for (int d = 0; d < gl->rank; d++) saved *= gl->shape[d];
  for (int64_t k = saved; k < gl->n; k++) t[k] = 0;
}

/* ---------------------------------------------------------------- a rank's piece */

/* Saturating: a negative piece dim or mesh size counts as 0 elements (rt_piece_runs gives no
   runs then), a product past int64 as INT64_MAX (so that an allocation of it fails). */
typedef struct {
  float *whole, *piece;
  bool to_piece;
} PieceCopy;

static void copy_run(int64_t w, int64_t p, int64_t n, void *arg) {
  PieceCopy *c = arg;
  if (c->to_piece) memcpy(c->piece + p, c->whole + w, sizeof(float) * (size_t)n);
  else memcpy(c->whole + w, c->piece + p, sizeof(float) * (size_t)n);
}

void rt_piece_copy(const RtGlobal *gl, const int64_t mesh[5], const int coord[5], float *whole, float *piece, bool to_piece) {
  PieceCopy c = {whole, piece, to_piece};
  rt_piece_runs(gl, mesh, coord, copy_run, &c);
}

int64_t rt_global_whole_numel(const RtGlobal *gl, const int64_t mesh[5]) {
  if (!gl->ir_rank) return gl->n;
  int64_t n = 1;
  bool over = false;
  for (int d = 0; d < gl->ir_rank && d < 8; d++) {
    if (gl->piece_dims[d] <= 0) return 0;
    over |= __builtin_mul_overflow(n, gl->piece_dims[d], &n);
  }
  for (int a = 0; a < 5; a++)
    if (gl->split[a]) {
      if (mesh[a] <= 0) return 0;
      over |= __builtin_mul_overflow(n, mesh[a], &n);
    }
  return over ? INT64_MAX : n;
}

void rt_piece_runs(const RtGlobal *gl, const int64_t mesh[5], const int coord[5],
                   void (*fn)(int64_t w, int64_t p, int64_t n, void *arg), void *arg) {
  int rank = gl->ir_rank;
  if (rank <= 0 || rank > 8) {   /* a scalar, or no placement recorded: the whole */
    if (gl->n > 0) fn(0, 0, gl->n, arg);
    return;
  }
  for (int d = 0; d < rank; d++)   /* an empty piece has no runs (a 0 before the innermost split dim too) */
    if (gl->piece_dims[d] <= 0) return;
  for (int a = 0; a < 5; a++)   /* a placement outside the dims: nothing (the callers count what they got) */
    if (gl->split[a] < 0 || gl->split[a] > rank) return;
  /* the piece's offset and the whole extent along every dim (move_piece's rule: along a dim
     split by several axes the larger axis index is the outer split) */
  int64_t off[8] = {0}, whole[8], *dims = (int64_t *)gl->piece_dims;
  for (int d = 0; d < rank; d++) whole[d] = dims[d];
  int inner = -1;   /* the innermost split dim */
  for (int a = 0; a < 5; a++)
    if (gl->split[a]) {
      int d = gl->split[a] - 1;
      off[d] += coord[a] * whole[d];
      whole[d] *= mesh[a];
      if (d > inner) inner = d;
    }
  if (inner < 0) {
    if (gl->n > 0) fn(0, 0, gl->n, arg);
    return;
  }
  /* a run: dims [inner, rank) of the piece (contiguous in the whole too: the dims after
     `inner` are whole) */
  int64_t run = 1, stride[8];
  for (int d = inner; d < rank; d++) run *= dims[d];
  stride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; d--) stride[d] = stride[d + 1] * whole[d + 1];
  int64_t idx[8] = {0}, p = 0;
  if (!run) return;
  for (;;) {
    int64_t w = off[inner] * stride[inner];
    for (int d = 0; d < inner; d++) w += (idx[d] + off[d]) * stride[d];
    fn(w, p, run, arg);
    p += run;
    int d = inner - 1;
    for (; d >= 0 && ++idx[d] == dims[d]; d--) idx[d] = 0;
    if (d < 0) return;
  }
}

typedef struct {
  const RtGlobal *whole;
  uint64_t s0;
  float *out;
  int64_t saved;
} InitPiece;

static void init_run(int64_t w, int64_t p, int64_t n, void *arg) {
  InitPiece *ip = arg;
  float *dst = ip->out + p;
  init_range(ip->whole, ip->s0, dst, w, w + n);
  for (int64_t k = w < ip->saved ? ip->saved - w : 0; k < n; k++) dst[k] = 0;   /* padded rows */
}

void rt_global_init_piece(const RtGlobal *gl, const int64_t mesh[5], const int coord[5], uint64_t seed, float *out) {
  for (int a = 0; a < 5; a++)
    if ((gl->partial >> a & 1) && coord[a] != 0) {   /* a summand other than the first: zero */
      memset(out, 0, sizeof(float) * (size_t)gl->n);
      return;
    }
  RtGlobal whole = *gl;
  whole.n = rt_global_whole_numel(gl, mesh);
  int64_t saved = 1;
  for (int d = 0; d < gl->rank; d++) saved *= gl->shape[d];
  InitPiece ip = {&whole, name_seed(seed, gl->name), out, saved < whole.n ? saved : whole.n};
  rt_piece_runs(gl, mesh, coord, init_run, &ip);
}

int rt_program_check(const RtProgram *p, const RtChecker *c, char *err, size_t errlen) {
  if (p->n_funcs < 0 || p->n_globals < 0 || p->n_kernels < 0 || (p->n_funcs && !p->funcs) ||
      (p->n_globals && !p->globals) || (p->n_kernels && !p->kernel_names)) {
    snprintf(err, errlen, "malformed program");
    return 2;
  }
  for (int r = 1; r < RT_REGION_COUNT; r++)
    if (p->region_bytes[r] < 0) {
      snprintf(err, errlen, "region %d has a negative size", r);
      return 2;
    }
  int rc;
  for (int g = 0; g < p->n_globals; g++)
    if ((rc = c->global(c->ctx, p, g, err, errlen))) return rc;
  for (int f = 0; f < p->n_funcs; f++) {
    const RtFunc *fn = &p->funcs[f];
    if (fn->arena_bytes < 0 || fn->n_args < 0 || fn->n_args > RT_MAX_FUNC_IO || fn->n_rets < 0 ||
        fn->n_rets > RT_MAX_FUNC_IO || fn->n_steps < 0 || (fn->n_steps > 0 && !fn->steps)) {
      snprintf(err, errlen, "@%s: malformed function header", fn->name);
      return 2;
    }
    for (int a = 0; a < fn->n_args; a++) {
      if ((rc = c->buf(c->ctx, p, f, &fn->args[a], "argument", err, errlen))) return rc;
      const RtPlace *pl = &fn->arg_place[a];   /* a piece of n elements, each split dim among its dims */
      int64_t n = 1;
      bool ok = pl->ir_rank >= 0 && pl->ir_rank <= 8;
      for (int d = 0; ok && d < pl->ir_rank; d++) ok = pl->piece_dims[d] > 0, n = rt_smul(n, pl->piece_dims[d]);
      for (int x = 0; ok && x < 5; x++) ok = pl->split[x] >= 0 && pl->split[x] <= pl->ir_rank;
      if (!ok || (pl->ir_rank && n != fn->args[a].n)) {
        snprintf(err, errlen, "@%s: argument %d has a malformed placement", fn->name, a);
        return 2;
      }
    }
    for (int a = 0; a < fn->n_rets; a++)
      if ((rc = c->buf(c->ctx, p, f, &fn->rets[a], "result", err, errlen))) return rc;
    for (int s = 0; s < fn->n_steps; s++) {
      const RtStep *st = &fn->steps[s];
      if (st->n_in < 0 || st->n_out < 0 || st->n_in > RT_MAX_BUFS || st->n_out > RT_MAX_BUFS - st->n_in) {
        snprintf(err, errlen, "@%s: step %d has too many buffers", fn->name, s);
        return 2;
      }
      for (int b = 0; b < st->n_in + st->n_out; b++)
        if ((rc = c->buf(c->ctx, p, f, &st->bufs[b], st->label, err, errlen))) return rc;
      if (st->kind != RT_STEP_KERNEL && st->kind != RT_STEP_GEMM && st->kind != RT_STEP_BUILTIN) {
        snprintf(err, errlen, "@%s: step %d has an unknown kind", fn->name, s);
        return 2;
      }
      char msg[512] = "";
      if ((rc = c->step(c->ctx, p, st, msg, sizeof msg))) {
        snprintf(err, errlen, "@%s: step %d (%s): %s", fn->name, s, st->label, msg);
        return rc;
      }
    }
  }
  return 0;
}
