/* tests/unit/test_recompute.c — the recompute pass (passes/recompute.c) at the IR level.
 *   - the policy and size parsers (ir/types.c): what they accept and refuse;
 *   - for the tiny models, in fp32 and bf16, every policy: the clones are in @grad_step
 *     (named %rc.*), one step on the reference executor gives bitwise the loss, gradient
 *     norm, parameters and moments of the program without recomputation, the module
 *     round-trips through its text, cse keeps every clone, and the plan passes its overlap
 *     check;
 *   - what the forward keeps for the backward (memory-plan's activations) falls from none
 *     to selective to full, and full keeps exactly the layers' inputs beside the head's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/build.h"
#include "passes/passes.h"
#include "tests/unit/check.h"
#include "tests/unit/one_step.h"

static void check_parsers(void) {
  int mode;
  unsigned cls;
  char why[300];
  CHECK(!recompute_parse("none", &mode, &cls, why, sizeof why) && mode == RECOMPUTE_NONE, "none");
  CHECK(!recompute_parse("selective", &mode, &cls, why, sizeof why) && mode == RECOMPUTE_SELECTIVE &&
        cls == RC_DEFAULT_CLASSES, "selective: the default classes norm,act,eltwise");
  CHECK(!recompute_parse("selective:norm,rope,attn", &mode, &cls, why, sizeof why) &&
        cls == (RC_NORM | RC_ROPE | RC_ATTN), "selective:norm,rope,attn");
  CHECK(!recompute_parse("full", &mode, &cls, why, sizeof why) && mode == RECOMPUTE_FULL, "full");
  CHECK(!recompute_parse("auto", &mode, &cls, why, sizeof why) && mode == RECOMPUTE_AUTO, "auto");
  const char *bad[] = {"", "some", "selective:", "selective:norm,,act", "selective:mlp", "full:norm", "fulll"};
  for (int i = 0; i < 7; i++)
    CHECK(recompute_parse(bad[i], &mode, &cls, why, sizeof why) < 0 && why[0], "'%s' refused: %s", bad[i], why);
  struct { const char *s; int64_t want; } sizes[] = {
    {"40GiB", INT64_C(42949672960)}, {"512MB", 512000000}, {"1.5KiB", 1536}, {"1e9", 1000000000},
    {"123B", 123}, {"2 GB", 2000000000}, {"64", 64}, {"3MiB", 3145728},
  };
  for (int i = 0; i < 8; i++) {
    int64_t b = -1;
    CHECK(!bytes_parse(sizes[i].s, &b) && b == sizes[i].want, "size '%s' = %lld bytes", sizes[i].s, (long long)b);
  }
  const char *bad_sizes[] = {"", "GB", "40parsecs", "-1GB", "0", "0.1B", "40 GiBs"};
  for (int i = 0; i < 7; i++) {
    int64_t b;
    CHECK(bytes_parse(bad_sizes[i], &b) < 0, "size '%s' refused", bad_sizes[i]);
  }
}

static int count_clones(const Module *m) {
  const Func *f = module_find_func(m, "grad_step");
  int n = 0;
  for (int i = 0; f && i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    n += op->n_results && op->results[0]->name && !strncmp(op->results[0]->name, "rc.", 3);
  }
  return n;
}

/* Builds the model's training step under `mode` (classes for selective); NULL on error. */
static Module *build_step(const char *path, bool bf16, int mode, int64_t budget, char *err) {
  RunSpec spec;
  Module *m = NULL;
  if (spec_load(path, &spec, err, IR_ERR_LEN) || frontend_build(&spec, "m", &m, err, IR_ERR_LEN)) return NULL;
  TrainSettings ts = train_defaults;
  ts.bf16 = bf16;
  ts.recompute = mode;
  ts.recompute_classes = RC_DEFAULT_CLASSES;
  ts.memory_budget = budget;
  PassOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.train = &ts;
  FILE *quiet = fopen("/dev/null", "w");
  opt.print_to = quiet;
  int rc = pipeline_run(m, TRAIN_PIPELINE, &opt, err, IR_ERR_LEN);
  if (quiet) fclose(quiet);
  if (rc) {
    module_free(m);
    return NULL;
  }
  return m;
}

static void check_model(const char *path, bool bf16) {
  char err[IR_ERR_LEN];
  const char *prec = bf16 ? "bf16" : "fp32";
  Module *base = build_step(path, bf16, RECOMPUTE_NONE, 0, err);
  if (!base) {
    CHECK(0, "%s %s: build: %s", path, prec, err);
    return;
  }
  float l0, n0;
  GlobalStore *g0 = one_step(base, &l0, &n0, err);
  int64_t act[RECOMPUTE_COUNT] = {0};
  for (int mode = RECOMPUTE_NONE; mode <= RECOMPUTE_AUTO; mode++) {
    /* auto: a budget just under none's planned peak, so something must be recomputed */
    int64_t budget = 0;
    if (mode == RECOMPUTE_AUTO) {
      Module *c = NULL;
      char *text = module_to_string(base);
      PassOptions po;
      memset(&po, 0, sizeof po);
      if (!parse_module("copy", text, &c, err, sizeof err) && !pipeline_run(c, "fuse,memory-plan", &po, err, sizeof err))
        budget = memory_planned_peak(c, TARGET_CPU, NULL, NULL) - 64;
      free(text);
      module_free(c);
    }
    Module *m = build_step(path, bf16, mode, budget, err);
    if (!m) {
      CHECK(0, "%s %s %s: build: %s", path, prec, recompute_mode_names[mode], err);
      continue;
    }
    int clones = count_clones(m);
    float l, n;
    GlobalStore *g = one_step(m, &l, &n, err);
    bool same = g && g0 && l == l0 && n == n0;
    for (int i = 0; same && i < m->globals.n; i++)
      same = !memcmp(g->t[i]->f, g0->t[i]->f, sizeof(float) * (size_t)g->t[i]->n);
    CHECK(same && (mode == RECOMPUTE_NONE) == (clones == 0),
          "%s %s %s: %d clones; loss %.6f, grad norm %.6f, every parameter and moment after one step bitwise those of "
          "none", path, prec, recompute_mode_names[mode], clones, l, n);
    globals_free(g);
    /* text round trip, and cse keeps the clones */
    char *text = module_to_string(m);
    Module *c = NULL;
    int rc = parse_module("copy", text, &c, err, sizeof err);
    char *text2 = rc ? NULL : module_to_string(c);
    CHECK(!rc && !strcmp(text, text2), "%s %s %s: the module with its clones round-trips", path, prec,
          recompute_mode_names[mode]);
    if (!rc) rc = pipeline_run(c, "cse,dce", NULL, err, sizeof err);
    CHECK(!rc && count_clones(c) == clones, "%s %s %s: cse,dce keep the %d clones (%d after)", path, prec,
          recompute_mode_names[mode], clones, c ? count_clones(c) : -1);
    free(text), free(text2);
    module_free(c);
    /* the plan */
    rc = pipeline_run(m, "fuse,memory-plan", NULL, err, sizeof err);
    Func *f = module_find_func(m, "grad_step");
    if (!rc) rc = memory_plan_check(f, TARGET_CPU, err, sizeof err);
    act[mode] = rc ? -1 : memory_activations(f, TARGET_CPU);
    CHECK(!rc, "%s %s %s: planned (arena %lld bytes, activations %lld), no overlapping live buffers%s%s", path, prec,
          recompute_mode_names[mode], (long long)f->arena_bytes, (long long)act[mode], rc ? ": " : "", rc ? err : "");
    if (mode == RECOMPUTE_AUTO)
      CHECK(memory_planned_peak(m, TARGET_CPU, NULL, NULL) <= budget, "%s %s auto: planned peak %lld <= budget %lld",
            path, prec, (long long)memory_planned_peak(m, TARGET_CPU, NULL, NULL), (long long)budget);
    module_free(m);
  }
  CHECK(act[RECOMPUTE_FULL] < act[RECOMPUTE_SELECTIVE] && act[RECOMPUTE_SELECTIVE] < act[RECOMPUTE_NONE],
        "%s %s: activations kept for the backward: none %lld > selective %lld > full %lld bytes", path, prec,
        (long long)act[RECOMPUTE_NONE], (long long)act[RECOMPUTE_SELECTIVE], (long long)act[RECOMPUTE_FULL]);
  globals_free(g0);
  module_free(base);
}

int main(void) {
  check_parsers();
  const char *models[] = {"models/gpt2-tiny.json", "models/llama-tiny.json", "models/llama-tiny-tied.json"};
  for (int i = 0; i < 3; i++) {
    check_model(models[i], false);
    check_model(models[i], true);
  }
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
