/* runtime/device.c — the rank executor over an RtDevice (runtime/device.h): one Executor for
   every backend that runs a lowered program on one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/fail.h"
#include "runtime/device.h"

int rt_device_find(const RtDevice *d, const char *name) {
  for (int f = 0; d->p && f < d->p->n_funcs; f++)
    if (!strcmp(d->p->funcs[f].name, name)) return f;
  return -1;
}

int rt_device_buf_alloc(RtDevice *d, int64_t bytes, uint64_t *addr, char *err, size_t errlen) {
  if (d->buf_alloc) return d->buf_alloc(d, bytes, addr, err, errlen);
  void *b = bytes >= 0 ? malloc((size_t)(bytes ? bytes : 1)) : NULL;
  *addr = (uint64_t)(uintptr_t)b;
  return b ? 0 : rt_fail(err, errlen, 1, "out of memory for %lld bytes on the %s device", (long long)bytes, d->kind);
}

void rt_device_buf_free(RtDevice *d, uint64_t addr) {
  if (d->buf_free) d->buf_free(d, addr);
  else free((void *)(uintptr_t)addr);
}

int rt_device_call_dev(RtDevice *d, int func, void *const *args, const uint64_t *dargs, void **rets,
                       const uint64_t *drets, char *err, size_t errlen) {
  if (d->call_dev) return d->call_dev(d, func, args, dargs, rets, drets, err, errlen);
  if (func < 0 || !d->p || func >= d->p->n_funcs) return rt_fail(err, errlen, 2, "no function #%d in the program", func);
  const RtFunc *fn = &d->p->funcs[func];   /* host blocks: their addresses are host pointers */
  void *a[RT_MAX_FUNC_IO] = {0}, *r[RT_MAX_FUNC_IO] = {0};
  for (int k = 0; k < fn->n_args; k++) a[k] = dargs && dargs[k] ? (void *)(uintptr_t)dargs[k] : args[k];
  for (int k = 0; k < fn->n_rets; k++) r[k] = drets && drets[k] ? (void *)(uintptr_t)drets[k] : rets[k];
  return d->call(d, func, a, r, err, errlen);
}

static int ex_grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err,
                        size_t errlen) {
  RtRankExec *re = self;
  void *args[2] = {(void *)inputs, (void *)targets}, *rets[RT_MAX_FUNC_IO] = {loss};
  return re->dev->call(re->dev, re->f_grad, args, rets, err, errlen);
}

static int ex_whole_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float lr, float t,
                         float *losses, float *grad_norm, char *err, size_t errlen) {
  RtRankExec *re = self;
  return re->dev->step(re->dev, re->f_grad, re->f_opt, n, inputs, targets, lr, t, losses, grad_norm, err, errlen);
}

static int ex_issue_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float lr, float t,
                         char *err, size_t errlen) {
  RtRankExec *re = self;
  return re->dev->step_issue(re->dev, re->f_grad, re->f_opt, n, inputs, targets, lr, t, err, errlen);
}

static int ex_finish_step(void *self, float *losses, float *grad_norm, char *err, size_t errlen) {
  RtRankExec *re = self;
  return re->dev->step_wait(re->dev, losses, grad_norm, err, errlen);
}

static int ex_optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  RtRankExec *re = self;
  void *args[2] = {&lr, &t}, *rets[RT_MAX_FUNC_IO] = {grad_norm};
  return re->dev->call(re->dev, re->f_opt, args, rets, err, errlen);
}

/* Validation: the program's @forward -> (logits, loss), only the loss copied out. */
static int ex_eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err,
                        size_t errlen) {
  RtRankExec *re = self;
  if (re->f_forward < 0 || re->dev->p->funcs[re->f_forward].n_rets != 2)
    return rt_fail(err, errlen, 2, "the program has no @forward(tokens, targets) -> (logits, loss) to validate with");
  void *args[2] = {(void *)inputs, (void *)targets}, *rets[RT_MAX_FUNC_IO] = {NULL, loss};
  return re->dev->call(re->dev, re->f_forward, args, rets, err, errlen);
}

static int ex_sync_out(void *self, char *err, size_t errlen) {
  RtRankExec *re = self;
  for (int h = 0; h < re->n_held; h++)
    if (re->dev->read(re->dev, re->held[h], re->host[h], err, errlen)) return 1;
  return 0;
}

static int ex_sync_in(void *self, char *err, size_t errlen) {
  RtRankExec *re = self;
  for (int h = 0; h < re->n_held; h++)
    if (re->dev->write(re->dev, re->held[h], re->host[h], err, errlen)) return 1;
  return 0;
}

/* The tensors of the globals of one region: views into the device's host storage, or into
   host copies made here. */
static bool add_views(RtRankExec *re, RtTensor *out, int *n, RtRegion region) {
  const RtProgram *p = re->dev->p;
  for (int k = 0; k < p->n_globals; k++) {
    const RtGlobal *gl = &p->globals[k];
    if (gl->region != region) continue;
    float *data = re->dev->host ? re->dev->host(re->dev, k) : NULL;
    if (!re->dev->host) {
      if (!(data = malloc(sizeof(float) * (size_t)(gl->n ? gl->n : 1)))) return false;
      re->held[re->n_held] = k;
      re->host[re->n_held++] = data;
    }
    if (rt_views_add(out, n, gl->name, gl->rank, gl->shape, data, gl->experts)) return false;
  }
  return true;
}

int rt_rank_exec_init(RtRankExec *re, RtDevice *dev, int64_t batch, int64_t seq, char *err, size_t errlen) {
  memset(re, 0, sizeof *re);
  re->dev = dev;
  if (!dev->p) return rt_fail(err, errlen, 2, "the %s program is not initialized", dev->kind);
  const RtProgram *p = dev->p;
  re->f_grad = rt_device_find(dev, "grad_step");
  re->f_opt = rt_device_find(dev, "optimizer_step");
  re->f_forward = rt_device_find(dev, "forward");
  const RtFunc *g = re->f_grad >= 0 ? &p->funcs[re->f_grad] : NULL;
  const RtFunc *o = re->f_opt >= 0 ? &p->funcs[re->f_opt] : NULL;
  if (!g || !o || g->n_args != 2 || !g->args[0].is_int || !g->args[1].is_int || g->args[0].n != g->args[1].n ||
      g->n_rets < 1 || g->rets[0].is_int || g->rets[0].n != 1 || o->n_args != 2 || o->args[0].is_int ||
      o->args[0].n != 1 || o->args[1].is_int || o->args[1].n != 1 || o->n_rets < 1 || o->rets[0].n != 1 ||
      o->rets[0].is_int)
    return rt_fail(err, errlen, 2, "the program has no @grad_step(tokens, targets) -> loss and "
                "@optimizer_step(lr, step) -> grad_norm");
  int64_t tokens = g->args[0].n;
  if (!batch && !seq) batch = 1, seq = tokens;
  if (batch <= 0 || seq <= 0 || batch * seq != tokens)
    return rt_fail(err, errlen, 2, "a batch of %lld tokens cannot be %lld x %lld", (long long)tokens, (long long)batch,
                (long long)seq);
  int ng = p->n_globals, nv = 0;
  for (int k = 0; k < ng; k++) {
    const RtGlobal *gl = &p->globals[k];
    if (gl->region == RT_REGION_PARAMS || gl->region == RT_REGION_OPTIM) nv += rt_views_of(gl->rank, gl->shape, gl->experts);
  }
  re->ex.params = calloc((size_t)nv + 1, sizeof(RtTensor));
  re->ex.state = calloc((size_t)nv + 1, sizeof(RtTensor));
  re->held = calloc((size_t)ng + 1, sizeof(int));
  re->host = calloc((size_t)ng + 1, sizeof(float *));
  bool ok = re->ex.params && re->ex.state && re->held && re->host && add_views(re, re->ex.params, &re->ex.n_params, RT_REGION_PARAMS) &&
            add_views(re, re->ex.state, &re->ex.n_state, RT_REGION_OPTIM);
  if (!ok) {
    rt_rank_exec_free(re);
    return rt_fail(err, errlen, 1, "out of memory");
  }
  re->ex.self = re;
  re->ex.batch = batch;
  re->ex.seq = seq;
  re->ex.grad_step = ex_grad_step;
  re->ex.optimizer_step = ex_optimizer_step;
  if (dev->step) re->ex.whole_step = ex_whole_step;   /* a step at once (one CUDA graph) */
  if (dev->step && dev->step_issue && dev->step_wait)   /* in two halves: step N+1 issued before step N's wait */
    re->ex.issue_step = ex_issue_step, re->ex.finish_step = ex_finish_step;
  if (re->f_forward >= 0) re->ex.eval_step = ex_eval_step;
  if (!dev->host) {   /* copies: they start as the device's values */
    re->ex.sync_out = ex_sync_out;
    re->ex.sync_in = ex_sync_in;
    int rc = ex_sync_out(re, err, errlen);
    if (rc) rt_rank_exec_free(re);
    return rc;
  }
  return 0;
}

void rt_rank_exec_free(RtRankExec *re) {
  for (int h = 0; re->host && h < re->n_held; h++) free(re->host[h]);   /* the copies' data */
  rt_views_free(re->ex.params, re->ex.n_params);
  rt_views_free(re->ex.state, re->ex.n_state);
  free(re->host);
  free(re->held);
  free(re->ex.params);
  free(re->ex.state);
  memset(re, 0, sizeof *re);
}
