/* tools/cmd_eval.c — `loom eval`: the mean loss of a model on a token shard (every whole
 * batch, or --batches N), and one batch's logits and gradients for golden checks.  The
 * command only: the driver (driver/eval.c) builds what runs, the execution layer
 * (runtime/exec/eval.c) runs it. */
#include <stdlib.h>
#include <string.h>

#include "tools/tools.h"

static const char help[] =
  "usage: loom eval SPEC.json --weights W --tokens T.bin [options]\n"
  "\n"
  "Runs the model's forward pass on every whole batch of an llm.c token shard (batch k:\n"
  "inputs tokens[k*B*T : (k+1)*B*T], targets one token further, both shaped [B,T]) and prints\n"
  "'loss <value>', the mean cross-entropy over all their positions, and on standard error the\n"
  "batches and tokens scored (a progress line every 2 s of a long run).\n"
  "\n"
  "options:\n"
  "  --weights=W       parameters under their Hugging Face names (F32, BF16 or F16; GPT-2 names\n"
  "                    may carry the 'transformer.' prefix): a safetensors file, a folder holding\n"
  "                    model.safetensors (loom train --out DIR/, loom export), or a --save-dir\n"
  "                    (its newest step)\n"
  "  --tokens=FILE     llm.c token shard (uint16 magic 20240520 or uint32 magic 20240801)\n"
  "  --batches=N       score the first N whole batches only (default: all of them)\n"
  "  --batch=B         batch size (default: the spec's)\n"
  "  --seq=T           sequence length (default: the spec's)\n"
  "  --out=FILE        also write 'logits' [B,T,V] and 'loss' (f32) of one batch, the first, to a\n"
  "                    safetensors file (a golden check's outputs): only that batch is scored\n"
  "  --mesh=dp=2,tp=2  run every rank of the device mesh (threads of this process; the cpu\n"
  "                    backend unless --backend ref) and write the gathered result\n"
  "  --backend=cpu|ref|cuda  cpu: fused kernels JIT-compiled with LLVM and OpenBLAS (default);\n"
  "                    ref: the reference executor, op by op; cuda: CUDA kernels compiled by\n"
  "                    NVRTC for GPU 0, cuBLASLt (needs a GPU)\n"
  "  --grads           also compute the gradient of the first batch's loss for every parameter\n"
  "                    and write it to --out as 'grad.<name>' (through the autodiff pass)\n"
  "the pass pipeline (as loom ir; --dump-dir also keeps a failing pass's reproducer):\n"
  PASS_HOOKS_HELP
  "  -h, --help        show this help\n"
  "\n"
  "example:\n"
  "  loom eval models/gpt2-tiny.json --weights tests/golden/gpt2-tiny/weights.safetensors \\\n"
  "            --tokens tests/golden/gpt2-tiny/tokens.bin\n";

/* The pass manager's hooks from the command line, and the reproducer's `loom ir` command. */
static PassOptions eval_hooks;
static char eval_repro[4096];

int cmd_eval(int argc, char **argv) {
  const char *spec = NULL, *weights = NULL, *tokens = NULL, *out = NULL, *backend = NULL, *v;
  bool grads = false;
  int64_t max_batches = 0;   /* 0: every whole batch */
  const char *batch = NULL, *seq = NULL, *mesh = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (arg_flag(a, "-h") || arg_flag(a, "--help")) { fputs(help, stdout); return EXIT_OK; }
    if (arg_flag(a, "--grads")) { grads = true; continue; }
    if ((r = pass_hook_arg(argc, argv, &i, &eval_hooks, "eval"))) {
      if (r < 0) return EXIT_USAGE;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--weights", &v))) { if (r < 0) goto missing; weights = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--tokens", &v))) { if (r < 0) goto missing; tokens = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--out", &v))) { if (r < 0) goto missing; out = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--backend", &v))) {
      if (r < 0) goto missing;
      if (strcmp(v, "cpu") && strcmp(v, "ref") && strcmp(v, "cuda"))
        return usage_error("eval", "--backend takes cpu, ref or cuda");
      backend = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--batch", &v))) { if (r < 0) goto missing; batch = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--seq", &v))) { if (r < 0) goto missing; seq = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--mesh", &v))) { if (r < 0) goto missing; mesh = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--batches", &v))) {
      if (r < 0) goto missing;
      char *end;
      long long x = strtoll(v, &end, 10);
      if (*end || end == v || x < 1)
        return usage_error("eval", "--batches takes a whole number of batches >= 1, not '%s'", v);
      max_batches = x;
      continue;
    }
    if (a[0] == '-') return unknown_option("eval", a, help);
    if (spec) return usage_error("eval", "more than one spec ('%s' and '%s')", spec, a);
    spec = a;
    continue;
  missing:
    return usage_error("eval", "%s needs a value", a);
  }
  if (!spec) return usage_error("eval", "no model spec given");
  if (!weights) return usage_error("eval", "--weights is required");
  if (!tokens) return usage_error("eval", "--tokens is required");
  if (ends_with(spec, ".ir")) return usage_error("eval", "eval takes a model spec (.json), not an IR file");
  repro_command(spec, argc, argv, backend && !strcmp(backend, "cuda") ? "--target=cuda" : NULL, eval_repro,
                sizeof eval_repro);
  if (grads && !out) return usage_error("eval", "--grads writes its results to --out; give --out=FILE");
  if (out && max_batches > 1)
    return usage_error("eval", "--out writes the logits of one batch; give --batches 1 (or drop --out to score %lld "
                       "batches)", (long long)max_batches);

  char err[IR_ERR_LEN] = "", override_buf[3][256];
  const char *overrides[3];
  int n_overrides = 0;
  if (batch) snprintf(override_buf[n_overrides], sizeof override_buf[0], "batch=%.100s", batch);
  if (batch) overrides[n_overrides] = override_buf[n_overrides], n_overrides++;
  if (seq) snprintf(override_buf[n_overrides], sizeof override_buf[0], "seq=%.100s", seq);
  if (seq) overrides[n_overrides] = override_buf[n_overrides], n_overrides++;
  if (mesh) {
    char json[200];
    if (mesh_flag_json(mesh, json, sizeof json))
      return usage_error("eval", "--mesh takes axis=size pairs such as dp=2,tp=2, not '%s'", mesh);
    snprintf(override_buf[n_overrides], sizeof override_buf[0], "mesh=%s", json);
    overrides[n_overrides] = override_buf[n_overrides];
    n_overrides++;
  }
  Input in;
  int rc = input_load(spec, overrides, n_overrides, &in, err, sizeof err);
  if (rc) return report(rc, err);
  char wpath[4096];   /* a safetensors file, a --out DIR/'s model.safetensors, a --save-dir's newest */
  if ((rc = sample_weights_path(weights, wpath, sizeof wpath, err, sizeof err))) {
    module_free(in.m);
    return report(rc, err);
  }
  Backend be = !backend || !strcmp(backend, "cpu") ? BACKEND_CPU : !strcmp(backend, "cuda") ? BACKEND_CUDA : BACKEND_REF;
  EvalPlan plan = {tokens, in.spec.batch, in.spec.seq, in.spec.model.vocab_size, max_batches, out, grads, stderr};
  EvalResult res;
  Evaluator e;
  rc = driver_eval_open(&in, be, grads, &eval_hooks, eval_repro, wpath, &e, err, sizeof err);
  if (!rc) rc = eval_run(&e, &plan, &res, err, sizeof err);
  if (!rc) {
    printf("loss %.6f\n", res.loss);
    char ranks[64] = "";
    if (e.world > 1) snprintf(ranks, sizeof ranks, " on %d ranks", e.world);
    fprintf(stderr, "loom: eval of %lld tokens (%lld batch%s of %lld x %lld)%s took %.3f s on %s\n",
            (long long)res.tokens, (long long)res.batches, res.batches == 1 ? "" : "es", (long long)plan.batch,
            (long long)plan.seq, ranks, res.seconds, e.where);
    if (max_batches > res.available)
      fprintf(stderr, "note: --batches %lld, but %s holds %lld whole batch%s of %lld x %lld: scored %lld\n",
              (long long)max_batches, tokens, (long long)res.available, res.available == 1 ? "" : "es",
              (long long)plan.batch, (long long)plan.seq, (long long)res.batches);
    if ((out || grads) && res.available > 1 && !max_batches)
      fprintf(stderr, "note: --out%s writes one batch: scored the first of the %lld whole batches in %s (drop --out "
              "to score them all)\n", grads ? " with --grads" : "", (long long)res.available, tokens);
  }
  eval_close(&e);
  module_free(in.m);
  return !err[0] && rc == EXIT_USAGE ? rc : report(rc, err);   /* usage errors printed themselves */
}
