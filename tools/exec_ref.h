/* tools/exec_ref.h — an Executor (runtime/trainer.h) that runs a trained module's
   @grad_step and @optimizer_step on the reference executor. */
#ifndef LOOM_TOOLS_EXEC_REF_H
#define LOOM_TOOLS_EXEC_REF_H

#include "ir/ir.h"
#include "runtime/trainer.h"

typedef struct {
  Executor ex;
  const Module *m;
  GlobalStore *g;
  Func *grad_step, *optimizer_step;
  Tensor *inputs, *targets, *lr, *step;
} RefExec;

/* The module must hold @grad_step(tokens, targets) -> loss and @optimizer_step(lr, step)
   -> grad_norm (passes autodiff and optimizer).  Parameters and the adam_* state are
   exposed by name; $grad.* accumulators are not saved (they are zero between steps). */
int ref_exec_init(RefExec *r, const Module *m, GlobalStore *g, char *err, size_t errlen);
void ref_exec_free(RefExec *r);

#endif
