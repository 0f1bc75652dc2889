/* tests/unit/test_fuse.c — the fuse pass changes where values live, never what they are:
   for every tiny model, in fp32 and bf16, one training step (grad_step + optimizer_step)
   of the fused module equals the unfused one bit for bit on the reference executor, and
   the fused module verifies (every kernel keeps its one-iteration-space promise).
   memory-plan: for every model in models/, both precisions and both storage targets, the
   plan passes its independent overlap check, and bf16 needs less arena on CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/build.h"
#include "passes/passes.h"
#include "tests/unit/check.h"
#include "tests/unit/one_step.h"

static void check_model(const char *path, bool bf16) {
  char err[IR_ERR_LEN];
  RunSpec spec;
  Module *plain = NULL, *fused = NULL;
  if (spec_load(path, &spec, err, sizeof err) || frontend_build(&spec, "m", &plain, err, sizeof err)) {
    CHECK(0, "%s: build: %s", path, err);
    return;
  }
  TrainSettings ts = train_defaults;
  ts.bf16 = bf16;
  PassOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.train = &ts;
  int rc = pipeline_run(plain, TRAIN_PIPELINE, &opt, err, sizeof err);
  char *text = module_to_string(plain);
  if (!rc) rc = parse_module("copy", text, &fused, err, sizeof err);
  free(text);
  if (!rc) rc = pipeline_run(fused, "fuse,verify", &opt, err, sizeof err);
  CHECK(!rc, "%s %s: fuse and verify: %s", path, bf16 ? "bf16" : "fp32", rc ? err : "ok");
  if (rc) goto out;
  int kernels = 0;
  for (int i = 0; i < fused->funcs.n; i++) kernels += ((Func *)fused->funcs.items[i])->is_kernel;
  float l1, n1, l2, n2;
  GlobalStore *g1 = one_step(plain, &l1, &n1, err), *g2 = one_step(fused, &l2, &n2, err);
  bool same = g1 && g2 && l1 == l2 && n1 == n2;
  for (int i = 0; same && i < plain->globals.n; i++)
    same = !memcmp(g1->t[i]->f, g2->t[i]->f, sizeof(float) * (size_t)g1->t[i]->n);
  CHECK(same, "%s %s: %d kernels; loss %.6f, grad norm %.6f, and every parameter and moment after one step are "
        "bitwise equal to the unfused program", path, bf16 ? "bf16" : "fp32", kernels, l1, n1);
  globals_free(g1);
  globals_free(g2);
  if (strstr(path, "llama")) {
    /* SwiGLU's gradient reads the gate's input and computes silu again (fuse.c's
       choose_remat): no function but the kernels holds the gate, so the forward writes
       only the product; and dS x gate, dS x up and silu_grad are one kernel (a sibling). */
    Func *gs = module_find_func(fused, "grad_step");
    int gates = 0, swiglu_grads = 0;
    for (int i = 0; gs && i < gs->ops.n; i++) {
      const Op *op = gs->ops.items[i];
      for (int r = 0; r < op->n_results; r++) {
        const char *nm = op->results[r]->name;
        gates += nm && strlen(nm) > 5 && !strcmp(nm + strlen(nm) - 5, ".gate");
      }
      if (op->kind != OP_CALL) continue;
      int muls = 0, sg = 0;
      for (int k = 0; k < op->callee->ops.n; k++) {
        OpKind kd = ((const Op *)op->callee->ops.items[k])->kind;
        muls += kd == OP_MUL, sg += kd == OP_SILU_GRAD;
      }
      swiglu_grads += sg == 1 && muls == 2;
    }
    CHECK(gates == 0 && swiglu_grads == spec.model.n_layer, "%s %s: the gate held by no step function (%d), %d of %d layers' "
          "SwiGLU gradients one kernel", path, bf16 ? "bf16" : "fp32", gates, swiglu_grads, (int)spec.model.n_layer);
  }
out:
  module_free(plain);
  module_free(fused);
}

static void check_plan(const char *path) {
  int64_t arena[2][2] = {{0}};   /* [bf16][cuda] */
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (int cuda = 0; cuda < 2; cuda++) {
      char err[IR_ERR_LEN];
      RunSpec spec;
      Module *m = NULL;
      int rc = spec_load(path, &spec, err, sizeof err);
      /* batch 2 keeps the big models' plans quick; the tiny ones get batch 8, where activations,
         not mixed precision's bf16 copies of the weights (held from the forward to the
         backward), fill the arena, so that bf16's 2-byte storage shows in it */
      if (!rc) spec.batch = config_param_count(&spec.model) < 1000000 ? 8 : 2;
      if (!rc) rc = frontend_build(&spec, "m", &m, err, sizeof err);
      TrainSettings ts = train_defaults;
      ts.bf16 = bf16;
      PassOptions opt;
      memset(&opt, 0, sizeof opt);
      opt.train = &ts;
      opt.target = cuda ? TARGET_CUDA : TARGET_CPU;
      if (!rc) rc = pipeline_run(m, "train,lower", &opt, err, sizeof err);
      Func *f = rc ? NULL : module_find_func(m, "grad_step");
      if (f) {
        arena[bf16][cuda] = f->arena_bytes;
        rc = memory_plan_check(f, opt.target, err, sizeof err);
      }
      CHECK(!rc && f && f->arena_bytes > 0, "%s %s %s: planned, arena %lld bytes, no overlapping live buffers%s%s", path,
            bf16 ? "bf16" : "fp32", cuda ? "cuda" : "cpu", f ? (long long)f->arena_bytes : -1LL, rc ? ": " : "",
            rc ? err : "");
      module_free(m);
    }
  CHECK(arena[1][1] < arena[0][1], "%s: bf16 shrinks the CUDA arena (%lld < %lld bytes)", path,
        (long long)arena[1][1], (long long)arena[0][1]);
}

int main(void) {
  const char *all[] = {"models/gpt2-124M.json", "models/gpt2-350M.json", "models/llama-1B.json",
                       "models/gpt2-tiny.json", "models/llama-tiny.json", "models/llama-tiny-tied.json"};
  for (int i = 0; i < 6; i++) check_plan(all[i]);
  const char *models[] = {"models/gpt2-tiny.json", "models/llama-tiny.json", "models/llama-tiny-tied.json"};
  for (int i = 0; i < 3; i++) {
    check_model(models[i], false);
    check_model(models[i], true);
  }
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
