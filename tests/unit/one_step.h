/* tests/unit/one_step.h — one training step of a module on the reference interpreter, the same
 * in every unit test that compares two modules' steps bit for bit (test_fuse: fused against
 * plain; test_recompute: recomputed against not). */
#ifndef LOOM_TESTS_UNIT_ONE_STEP_H
#define LOOM_TESTS_UNIT_ONE_STEP_H

#include "ir/ir.h"

/* One grad_step on fixed tokens ((i * 37 + k * 11) % 200 in argument k), then one
   optimizer_step (lr 1e-2, t 1) from globals seeded 7: the store, the loss and the
   gradient norm; NULL (*loss or *norm -1, err set) when a run fails. */
static __attribute__((unused)) GlobalStore *one_step(Module *m, float *loss, float *norm, char *err) {
  GlobalStore *g = globals_new(m);
  globals_init(m, g, 7);
  Func *gs = module_find_func(m, "grad_step"), *os = module_find_func(m, "optimizer_step");
  Tensor *a[2], *r = NULL;
  for (int k = 0; k < 2; k++) {
    a[k] = tensor_new(&((Value *)gs->args.items[k])->type);
    for (int64_t i = 0; i < a[k]->n; i++) a[k]->i[i] = (i * 37 + k * 11) % 200;
  }
  int rc = interp_run(gs, g, a, &r, err, IR_ERR_LEN);
  *loss = rc ? -1 : r->f[0];
  tensor_free(r);
  Type s = type_scalar(DT_F32);
  Tensor *lr = tensor_new(&s), *t = tensor_new(&s);
  lr->f[0] = 1e-2f;
  t->f[0] = 1;
  Tensor *oa[2] = {lr, t};
  r = NULL;
  if (!rc) rc = interp_run(os, g, oa, &r, err, IR_ERR_LEN);
  *norm = rc ? -1 : r->f[0];
  tensor_free(r), tensor_free(lr), tensor_free(t), tensor_free(a[0]), tensor_free(a[1]);
  if (rc) {
    globals_free(g);
    return NULL;
  }
  return g;
}

#endif
