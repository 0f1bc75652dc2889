/* tools/train_common.c — what `loom train` and compiled training executables share:
   parameters from a seed or a checkpoint, the executor, the loop, and --out. */
#include <stdlib.h>
#include <string.h>

#include "tools/exec_ref.h"
#include "tools/tools.h"

int run_training(Module *m, const RunPlan *plan, char *err, size_t errlen) {
  RefExec rx;
  TrainResult res;
  memset(&res, 0, sizeof res);
  int rc = ref_exec_init(&rx, m, plan->seed, plan->init, err, errlen);
  if (!rc && rx.world > 1 && plan->opt.log)
    fprintf(plan->opt.log, "running %d ranks as threads (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld)\n", rx.world,
            (long long)m->mesh.size[AX_DP], (long long)m->mesh.size[AX_TP], (long long)m->mesh.size[AX_CP],
            (long long)m->mesh.size[AX_PP], (long long)m->mesh.size[AX_EP]);
  if (!rc) rc = train_run(&rx.ex, &plan->opt, &res, err, errlen);
  if (!rc && plan->out) {
    /* The final parameters under their HF names (whole: gathered from the ranks), and per
       step the loss, the gradient norm before clipping and the learning rate. */
    int n = rx.ex.n_params;
    const char **names = calloc((size_t)n + 3, sizeof *names);
    Tensor **ts = calloc((size_t)n + 3, sizeof *ts);
    Type lt = type_make(DT_F32, 1, &res.n);
    Tensor *hist[3] = {tensor_new(&lt), tensor_new(&lt), tensor_new(&lt)};
    const float *src[3] = {res.losses, res.grad_norms, res.lrs};
    const char *hist_names[3] = {"losses", "grad_norms", "lrs"};
    int k = 0;
    for (int i = 0; i < m->globals.n; i++) {
      const Global *gl = m->globals.items[i];
      if (gl->kind == GLOBAL_PARAM && dtype_is_float(gl->value->type.dtype)) {
        names[k] = gl->name;
        ts[k++] = rx.full[i];
      }
    }
    bool ok = hist[0] && hist[1] && hist[2];
    for (int h = 0; h < 3 && ok; h++) {
      memcpy(hist[h]->f, src[h], sizeof(float) * (size_t)res.n);
      names[k] = hist_names[h];
      ts[k++] = hist[h];
    }
    if (ok) rc = write_tensors(plan->out, names, ts, k, err, errlen);
    else {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
    }
    if (!rc && plan->opt.log)
      fprintf(plan->opt.log, "wrote %s (%d parameters, and losses, grad_norms and lrs [%lld])\n", plan->out, k - 3,
              (long long)res.n);
    for (int h = 0; h < 3; h++) tensor_free(hist[h]);
    free(names);
    free(ts);
  }
  train_result_free(&res);
  ref_exec_free(&rx);
  return rc;
}
