/* passes/verify.c — pass "verify": the IR verifier as a pipeline step. */
#include "passes.h"

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  (void)ctx;
  return verify_module(m, err, errlen);
}

const Pass pass_verify = {"verify", "check types, shapes, shardings and SSA order", run};
