/* tools/train_common.c — what `loom train` and compiled training executables share:
   parameters from a seed or a checkpoint, the executor, the loop, and --out. */
#include <stdlib.h>
#include <string.h>

#include "tools/exec_ref.h"
#include "tools/tools.h"

int run_training(Module *m, const RunPlan *plan, char *err, size_t errlen) {
  GlobalStore *g = globals_new(m);
  if (!g) {
    snprintf(err, errlen, "out of memory for the parameters and optimizer state");
    return EXIT_RUN;
  }
  globals_init(m, g, plan->seed);
  int rc = 0;
  if (plan->init) rc = load_weights(m, g, plan->init, err, errlen);
  RefExec rx;
  memset(&rx, 0, sizeof rx);
  TrainResult res;
  memset(&res, 0, sizeof res);
  if (!rc) rc = ref_exec_init(&rx, m, g, err, errlen);
  if (!rc) rc = train_run(&rx.ex, &plan->opt, &res, err, errlen);
  if (!rc && plan->out) {
    /* The final parameters under their HF names, and per step the loss, the gradient
       norm before clipping and the learning rate. */
    int n = rx.ex.n_params;
    const char **names = calloc((size_t)n + 3, sizeof *names);
    Tensor **ts = calloc((size_t)n + 3, sizeof *ts);
    Type lt = type_make(DT_F32, 1, &res.n);
    Tensor *losses = tensor_new(&lt), *norms = tensor_new(&lt), *lrs = tensor_new(&lt);
    int k = 0;
    for (int i = 0; i < m->globals.n; i++) {
      const Global *gl = m->globals.items[i];
      if (gl->kind == GLOBAL_PARAM && dtype_is_float(gl->value->type.dtype)) {
        names[k] = gl->name;
        ts[k++] = g->t[i];
      }
    }
    if (losses && norms && lrs) {
      memcpy(losses->f, res.losses, sizeof(float) * (size_t)res.n);
      memcpy(norms->f, res.grad_norms, sizeof(float) * (size_t)res.n);
      memcpy(lrs->f, res.lrs, sizeof(float) * (size_t)res.n);
      names[k] = "losses";
      ts[k++] = losses;
      names[k] = "grad_norms";
      ts[k++] = norms;
      names[k] = "lrs";
      ts[k++] = lrs;
      rc = write_tensors(plan->out, names, ts, k, err, errlen);
    } else {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
    }
    if (!rc && plan->opt.log)
      fprintf(plan->opt.log, "wrote %s (%d parameters, and losses, grad_norms and lrs [%lld])\n", plan->out, k - 3,
              (long long)res.n);
    tensor_free(norms);
    tensor_free(lrs);
    tensor_free(losses);
    free(names);
    free(ts);
  }
  train_result_free(&res);
  ref_exec_free(&rx);
  globals_free(g);
  return rc;
}
