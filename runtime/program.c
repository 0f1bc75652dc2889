/* runtime/program.c — a lowered program as bytes (compiled executables carry it).
 *
 * Layout, little-endian as the host writes it (a blob is only read on the kind of machine
 * that compiled it, so structs are written whole): "LOOMPRG1", u32 sizeof RtStep, then
 * n_funcs, n_globals, n_kernels, region_bytes[], kernel names, globals, and per function
 * its header and steps.  The reader checks every count against the bytes left.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/program.h"

static const char magic[8] = {'L', 'O', 'O', 'M', 'P', 'R', 'G', '1'};

typedef struct {
  unsigned char *p;
  size_t n, cap;
  bool oom;
} Out;

static void put(Out *o, const void *src, size_t n) {
  if (o->oom) return;
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

int rt_program_save(const RtProgram *p, unsigned char **bytes, size_t *n, char *err, size_t errlen) {
  Out o = {0};
  uint32_t step_size = sizeof(RtStep);
  int32_t counts[3] = {p->n_funcs, p->n_globals, p->n_kernels};
  put(&o, magic, 8);
  put(&o, &step_size, 4);
  put(&o, counts, sizeof counts);
  put(&o, p->region_bytes, sizeof p->region_bytes);
  put(&o, p->kernel_names, sizeof p->kernel_names[0] * (size_t)p->n_kernels);
  put(&o, p->globals, sizeof(RtGlobal) * (size_t)p->n_globals);
  for (int i = 0; i < p->n_funcs; i++) {
    RtFunc f = p->funcs[i];
    f.steps = NULL;
    put(&o, &f, sizeof f);
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
  if (!get(&in, counts, sizeof counts) || !get(&in, out->region_bytes, sizeof out->region_bytes)) goto bad;
  for (int i = 0; i < 3; i++)
    if (counts[i] < 0 || counts[i] > 1 << 20) goto bad;
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
  for (int i = 0; i < out->n_globals; i++) out->globals[i].name[sizeof out->globals[i].name - 1] = 0;
  for (int i = 0; i < out->n_funcs; i++) {
    RtFunc *f = &out->funcs[i];
    if (!get(&in, f, sizeof *f)) goto bad;
    f->steps = NULL;
    f->name[sizeof f->name - 1] = 0;
    if (f->n_steps < 0 || (size_t)f->n_steps > (in.n - in.at) / sizeof(RtStep) || f->n_args < 0 || f->n_args > 8 ||
        f->n_rets < 0 || f->n_rets > 8)
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
