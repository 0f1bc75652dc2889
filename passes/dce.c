/* passes/dce.c — pass "dce": removes ops whose results are never used (ops with effects,
   such as optimizer updates, always stay). */
#include "passes.h"

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (int i = 0; i < m->funcs.n; i++) ctx->changed += remove_dead_ops(m->funcs.items[i]);
  return 0;
}

const Pass pass_dce = {"dce", "remove ops whose results are never used", run};
