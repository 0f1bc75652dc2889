/* tools/exec_ref.c — the reference executor behind the training loop. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "tools/exec_ref.h"

static int grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  RefExec *r = self;
  for (int64_t k = 0; k < r->inputs->n; k++) {
    r->inputs->i[k] = inputs[k];
    r->targets->i[k] = targets[k];
  }
  Tensor *args[2] = {r->inputs, r->targets}, *out = NULL;
  int rc = interp_run(r->grad_step, r->g, args, &out, err, errlen);
  if (!rc) *loss = out->f[0];
  tensor_free(out);
  return rc;
}

static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  RefExec *r = self;
  r->lr->f[0] = lr;
  r->step->f[0] = t;
  Tensor *args[2] = {r->lr, r->step}, *out = NULL;
  int rc = interp_run(r->optimizer_step, r->g, args, &out, err, errlen);
  if (!rc) *grad_norm = out->f[0];
  tensor_free(out);
  return rc;
}

static RtTensor view(const Global *gl, Tensor *t) {
  RtTensor v = {gl->name, t->type.rank, {0}, t->f};
  for (int d = 0; d < t->type.rank; d++) v.shape[d] = t->type.dims[d];
  return v;
}

int ref_exec_init(RefExec *r, const Module *m, GlobalStore *g, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  r->m = m;
  r->g = g;
  r->grad_step = module_find_func(m, "grad_step");
  r->optimizer_step = module_find_func(m, "optimizer_step");
  if (!r->grad_step || !r->optimizer_step || r->grad_step->args.n != 2 || r->optimizer_step->args.n != 2) {
    snprintf(err, errlen, "the module has no @grad_step(tokens, targets) and @optimizer_step(lr, step); "
             "run the autodiff and optimizer passes (loom ir --passes=" TRAIN_PIPELINE ")");
    return 2;
  }
  const Type *tt = &((Value *)r->grad_step->args.items[0])->type;
  Type scalar = type_scalar(DT_F32);
  r->inputs = tensor_new(tt);
  r->targets = tensor_new(tt);
  r->lr = tensor_new(&scalar);
  r->step = tensor_new(&scalar);
  r->ex.params = calloc((size_t)m->globals.n + 1, sizeof(RtTensor));
  r->ex.state = calloc((size_t)m->globals.n + 1, sizeof(RtTensor));
  if (!r->inputs || !r->targets || !r->lr || !r->step || !r->ex.params || !r->ex.state) {
    ref_exec_free(r);
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  for (int i = 0; i < m->globals.n; i++) {
    const Global *gl = m->globals.items[i];
    if (!dtype_is_float(gl->value->type.dtype)) continue;
    if (gl->kind == GLOBAL_PARAM) r->ex.params[r->ex.n_params++] = view(gl, g->t[i]);
    else if (strncmp(gl->name, GRAD_PREFIX, strlen(GRAD_PREFIX))) r->ex.state[r->ex.n_state++] = view(gl, g->t[i]);
  }
  r->ex.self = r;
  r->ex.batch = tt->dims[0];
  r->ex.seq = tt->dims[1];
  r->ex.grad_step = grad_step;
  r->ex.optimizer_step = optimizer_step;
  return 0;
}

void ref_exec_free(RefExec *r) {
  tensor_free(r->inputs);
  tensor_free(r->targets);
  tensor_free(r->lr);
  tensor_free(r->step);
  free(r->ex.params);
  free(r->ex.state);
  memset(r, 0, sizeof *r);
}
