/* runtime/exec/ref_device.c — the reference interpreter (ir/interp.c) as a device
 * (ref_device.h, runtime/device.h), so that `--backend ref` runs through the same rank
 * executor, mesh executor and pipeline walker as the lowered programs.
 *
 * Its program is a description of the module without steps (codegen's cg_describe_module,
 * made by the driver): the functions in module order with their arguments' and results'
 * element counts and kinds, the globals in module order with their placements.  A call runs
 * the IR function on the interpreter with the rank's globals (a GlobalStore) and, on a mesh,
 * its communicator; the arguments and results are copied between the caller's buffers (f32,
 * int32 for integers) and the interpreter's tensors (f32 values already rounded to their
 * dtype, int64).  The globals' float tensors are the device's host storage.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/exec.h"
#include "runtime/fail.h"
#include "runtime/exec/ref_device.h"

/* ---- the interpreter's communicator over a runtime one ---- */

typedef struct {
  IrComm ir;
  Comm *comm;
} RefComm;

static Comm *over(IrComm *c) { return ((RefComm *)c)->comm; }
static int rc_all_reduce(IrComm *c, int axis, float *buf, int64_t n, bool max) {
  return over(c)->all_reduce(over(c), axis, buf, n, max);
}
static int rc_all_gather(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  return over(c)->all_gather(over(c), axis, in, out, n);
}
static int rc_reduce_scatter(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  return over(c)->reduce_scatter(over(c), axis, in, out, n);
}
static int rc_all_to_all(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  return over(c)->all_to_all(over(c), axis, in, out, n);
}
static int rc_send(IrComm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n) {
  return over(c)->send(over(c), axis, peer, tag, buf, n);
}
static int rc_recv(IrComm *c, int axis, int peer, int64_t tag, float *buf, int64_t n) {
  return over(c)->recv(over(c), axis, peer, tag, buf, n);
}

static IrComm *ref_comm(RefComm *a, Comm *c) {
  *a = (RefComm){{NULL, {0}, rc_all_reduce, rc_all_gather, rc_reduce_scatter, rc_all_to_all, rc_send, rc_recv}, c};
  memcpy(a->ir.coord, c->coord, sizeof a->ir.coord);
  return &a->ir;
}

/* ---- the device ---- */

static int rd_call(RtDevice *d, int func, void *const *args, void **rets, char *err, size_t errlen) {
  RefRank *r = d->impl;
  if (func < 0 || func >= d->p->n_funcs) return rt_fail(err, errlen, EXIT_USAGE, "no such function in the module");
  const Func *f = r->m->funcs.items[func];
  const RtFunc *rf = &d->p->funcs[func];
  Tensor **a = calloc((size_t)f->args.n + 1, sizeof *a), **o = calloc((size_t)f->rets.n + 1, sizeof *o);
  int rc = a && o ? 0 : rt_fail(err, errlen, EXIT_RUN, "out of memory");
  for (int k = 0; !rc && k < f->args.n; k++) {
    if (!args[k]) {
      rc = rt_fail(err, errlen, EXIT_USAGE, "@%s: argument %d is missing", f->name, k);
      break;
    }
    if (!(a[k] = tensor_new(&((const Value *)f->args.items[k])->type))) {
      rc = rt_fail(err, errlen, EXIT_RUN, "out of memory");
      break;
    }
    if (rf->args[k].is_int)
      for (int64_t j = 0; j < a[k]->n; j++) a[k]->i[j] = ((const int32_t *)args[k])[j];
    else
      memcpy(a[k]->f, args[k], sizeof(float) * (size_t)a[k]->n);
  }
  RefComm ad;   /* collectives and point-to-point (cp's ring, a pipeline's transfers) */
  if (!rc) rc = interp_run_comm(f, r->g, a, o, r->comm ? ref_comm(&ad, r->comm) : NULL, err, errlen);
  for (int k = 0; !rc && k < f->rets.n; k++) {
    if (!rets[k] || !o[k]) continue;
    if (rf->rets[k].is_int)
      for (int64_t j = 0; j < o[k]->n; j++) ((int32_t *)rets[k])[j] = (int32_t)o[k]->i[j];
    else
      memcpy(rets[k], o[k]->f, sizeof(float) * (size_t)o[k]->n);
  }
  for (int k = 0; a && k < f->args.n; k++) tensor_free(a[k]);
  for (int k = 0; o && k < f->rets.n; k++) tensor_free(o[k]);
  free(a), free(o);
  return rc;
}

static int rd_read(RtDevice *d, int g, float *out, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const Tensor *t = ((RefRank *)d->impl)->g->t[g];
  memcpy(out, t->f, sizeof(float) * (size_t)t->n);
  return 0;
}

static int rd_write(RtDevice *d, int g, const float *in, char *err, size_t errlen) {
  (void)err, (void)errlen;
  Tensor *t = ((RefRank *)d->impl)->g->t[g];
  for (int64_t k = 0; k < t->n; k++) t->f[k] = dtype_round(t->type.dtype, in[k]);
  return 0;
}

static float *rd_host(RtDevice *d, int g) { return ((RefRank *)d->impl)->g->t[g]->f; }

static void rd_close(RtDevice *d) {
  RefRank *r = d->impl;
  if (r) globals_free(r->g);
  free(r);
  d->impl = NULL;
}

int ref_device_open(RtDevice *d, const Module *m, const RtProgram *desc, Comm *comm, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  if (desc->n_funcs != m->funcs.n || desc->n_globals != m->globals.n)
    return rt_fail(err, errlen, EXIT_USAGE, "the program's description is not the module's");
  for (int i = 0; i < m->globals.n; i++) {
    const Global *gl = m->globals.items[i];
    if (!dtype_is_float(gl->value->type.dtype)) {
      return rt_fail(err, errlen, EXIT_USAGE, "global $%.200s holds integers: the executors hold float globals only",
                     gl->name);
    }
  }
  RefRank *r = calloc(1, sizeof *r);
  GlobalStore *g = calloc(1, sizeof *g);
  if (g) g->t = calloc((size_t)m->globals.n + 1, sizeof *g->t);
  if (!r || !g || !g->t) {
    free(r), free(g ? g->t : NULL), free(g);
    return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  }
  *r = (RefRank){m, g, comm};
  *d = (RtDevice){.p = desc, .kind = "ref", .impl = r, .call = rd_call, .read = rd_read, .write = rd_write,
                  .host = rd_host, .close = rd_close};   /* stash blocks: host memory (rt_device_buf_alloc) */
  for (int i = 0; i < m->globals.n; i++, g->n++)   /* zeros: the caller fills them */
    if (!(g->t[i] = tensor_new(&((const Global *)m->globals.items[i])->value->type))) {
      rd_close(d);
      return rt_fail(err, errlen, EXIT_RUN, "out of memory for the parameters");
    }
  return 0;
}
