/* tools/cmd_plan.c — `loom plan`: the flags, the search (driver/plan.h) and its table.
 *
 * The search lives in driver/plan*.c; this file parses the request, prints the table (text or
 * JSON), --explain's breakdown of one candidate and --emit-spec's run spec.
 */
#include <stdlib.h>
#include <string.h>

#include "driver/plan.h"
#include "ir/schedule.h"
#include "tools/tools.h"

/* The search `loom plan` runs: LOOM_PLAN_FAST=1 and LOOM_PLAN_EXHAUSTIVE=1 choose (driver/plan.h). */
#define PLAN_DEFAULT_EXHAUSTIVE 0

static const char help[] =
  "usage: loom plan SPEC.json --gpus N [options]\n"
  "\n"
  "Searches the layouts of SPEC's model on N devices: dp x tp x cp x pp, ZeRO stage, sequence\n"
  "parallelism, micro-batch size and gradient accumulation (reaching the global batch),\n"
  "pipeline schedule and virtual stages, activation recomputation (none, selective, full).\n"
  "Each candidate is compiled, its memory per device\n"
  "taken from the memory plan and its step time predicted (`loom ir --time`); those that do\n"
  "not fit are dropped and the rest ranked by tokens/s.  Context parallelism (cp) is searched\n"
  "with zigzag ring attention; expert parallelism (ep) for a mixture of experts (Mixtral,\n"
  "Qwen3-MoE, with dp, tp, cp and pp; --capacity-factor as training).\n"
  "MFU counts the model's FLOPs (loom ir --flops), the same for every recomputation; HFU what\n"
  "the device executes.  The search estimates candidates from their layer programs and\n"
  "compiles those that could win; LOOM_PLAN_EXHAUSTIVE=1 compiles every one, LOOM_PLAN_CHECK=1\n"
  "runs both and fails unless their tables agree (docs/planning.md).\n"
  "\n"
  "options:\n"
  "  --gpus N                  devices (required)\n"
  "  --hw NAME|FILE.json       hardware description (default h100; see loom ir --help)\n"
  "  --global-batch-tokens X   tokens per optimizer step (default: the spec's batch x seq x grad_accum)\n"
  "  --seq T                   sequence length (default: the spec's)\n"
  "  --precision fp32|bf16     (default: the spec's)\n"
  "  --capacity-factor X       a mixture of experts' capacity (default: the spec's; 0: dropless, whose\n"
  "                            expert-parallel buffers hold ep x a rank's rows: docs/moe.md)\n"
  "  --mesh dp=2,tp=4,...      fix these axes; the others are searched\n"
  "  --zero S, --batch B, --pp-schedule S, --pp-virtual V, --recompute R   fix those choices (--batch: sequences\n"
  "                            per micro-batch over all dp ranks, as loom train's)\n"
  "  --target cuda|cpu         storage sizes of the memory plan (default cuda)\n"
  "  --top K                   print the K best (default 10)\n"
  "  --explain K               break candidate K's predicted step down (as loom ir --time)\n"
  "  --emit-spec FILE.json     write the best candidate as a run spec loom train accepts\n"
  "  --json                    the table as JSON: one object per candidate\n"
  "  -h, --help                show this help\n"
  "example:\n"
  "  loom plan models/llama-1B.json --gpus 8 --hw h100 --global-batch-tokens 1048576\n";

static const char *biggest_loss(const PlanCand *c, double *s) {
  double comm = c->t.exposed_comm_s, bub = c->t.bubble_s, opt = c->t.optimizer_s;
  const char *w = "exposed communication";
  *s = comm;
  if (bub > *s) *s = bub, w = "pipeline bubble";
  if (opt > *s) *s = opt, w = "optimizer step";
  return w;
}

/* The winner as a run spec: the input spec with the layout's keys set (a bare config.json
   becomes {"model": its path}); the model path made absolute so the file may go anywhere. */
static int emit_spec(const char *path, const char *spec_path, const RunSpec *base, const PlanCand *c, char *err, size_t errlen) {
  json_t *root;
  int rc = config_read_json_file(spec_path, &root, err, errlen);
  if (rc) return rc;
  char abs[4096];
  json_t *out;
  if (json_object_get(root, "model")) {
    out = root;
    if (json_is_string(json_object_get(root, "model")) && realpath(base->model_path, abs))
      json_object_set_new(out, "model", json_string(abs));
  } else {
    out = json_object();
    json_object_set_new(out, "model", json_string(realpath(spec_path, abs) ? abs : spec_path));
    json_decref(root);
  }
  json_t *mesh = json_object();
  json_object_set_new(mesh, "dp", json_integer(c->dp));
  json_object_set_new(mesh, "tp", json_integer(c->tp));
  if (c->cp > 1) json_object_set_new(mesh, "cp", json_integer(c->cp));
  if (c->ep > 1) json_object_set_new(mesh, "ep", json_integer(c->ep));
  json_object_set_new(mesh, "pp", json_integer(c->pp));
  json_object_set_new(out, "mesh", mesh);
  json_object_set_new(out, "batch", json_integer(c->batch));
  json_object_set_new(out, "seq", json_integer(base->seq));
  json_object_set_new(out, "grad_accum", json_integer(c->ga));
  json_object_set_new(out, "precision", json_string(base->precision));
  json_object_set_new(out, "zero", json_integer(c->zero));
  json_object_set_new(out, "sequence_parallel", json_boolean(c->sp));
  json_object_set_new(out, "recompute", json_string(recompute_mode_names[c->rc]));
  json_object_del(out, "memory_budget");
  json_object_del(out, "pp_schedule"), json_object_del(out, "pp_virtual"), json_object_del(out, "pp_split");
  if (c->pp > 1) {
    json_object_set_new(out, "pp_schedule", json_string(pipe_kind_names[c->sched]));
    json_object_set_new(out, "pp_virtual", json_integer(c->v));
  }
  rc = json_dump_file(out, path, JSON_INDENT(2)) ? EXIT_RUN : 0;
  json_decref(out);
  if (rc) snprintf(err, errlen, "cannot write %s", path);
  return rc;
}

/* Whether the spec file sets "precision" (a bare config.json never does). */
static bool spec_names_precision(const char *path) {
  json_t *root;
  char err[IR_ERR_LEN];
  if (config_read_json_file(path, &root, err, sizeof err)) return true;   /* spec_load has read it: not reached */
  bool named = json_object_get(root, "model") && json_object_get(root, "precision");
  json_decref(root);
  return named;
}

int cmd_plan(int argc, char **argv) {
  const char *spec_path = NULL, *hw_arg = "h100", *emit = NULL, *v;
  int64_t gpus = 0, gbt = 0, seq = 0, fix_batch = 0, fix_v = 0, fix_mesh[AX_COUNT] = {0, 0, 0, 0, 0};
  int fix_zero = -1, fix_sched = -1, fix_rc = -1, top = 10, explain = 0, target = TARGET_CUDA;
  const char *precision = NULL;
  double capacity = -1;   /* --capacity-factor (mixture of experts); -1: the spec's */
  bool json = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    char *end;
    if (arg_flag(a, "-h") || arg_flag(a, "--help")) {
      fputs(help, stdout);
      return EXIT_OK;
    }
    if (arg_flag(a, "--json")) { json = true; continue; }
#define NUM(flag, var, lo, what)                                                                    \
    if ((r = arg_value(argc, argv, &i, flag, &v))) {                                                \
      long long x_ = r < 0 ? 0 : strtoll(v, &end, 10);                                               \
      if (r < 0 || *end || x_ < (lo)) return usage_error("plan", "%s takes %s", flag, what);        \
      var = x_;                                                                                      \
      continue;                                                                                      \
    }
    NUM("--gpus", gpus, 1, "a number of devices (1 or more)")
    NUM("--global-batch-tokens", gbt, 1, "a number of tokens")
    NUM("--seq", seq, 1, "a sequence length")
    NUM("--batch", fix_batch, 1, "sequences per micro-batch (1 or more)")
    NUM("--pp-virtual", fix_v, 1, "chunks per pp rank (1 or more)")
    NUM("--zero", fix_zero, 0, "0, 1, 2 or 3")
    NUM("--top", top, 1, "a count (1 or more)")
    NUM("--explain", explain, 1, "a candidate's rank in the table (1 or more)")
#undef NUM
    if ((r = arg_value(argc, argv, &i, "--hw", &v))) {
      if (r < 0) return usage_error("plan", "--hw needs a hardware name or file");
      hw_arg = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--emit-spec", &v))) {
      if (r < 0) return usage_error("plan", "--emit-spec needs a file name");
      emit = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--precision", &v))) {
      if (r < 0 || (strcmp(v, "fp32") && strcmp(v, "bf16"))) return usage_error("plan", "--precision takes fp32 or bf16");
      precision = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--capacity-factor", &v))) {
      capacity = r < 0 ? -1 : strtod(v, &end);
      if (r < 0 || *end || !(capacity >= 0 && capacity < 1e6))
        return usage_error("plan", "--capacity-factor takes a number >= 0 (0: dropless)");
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--target", &v))) {
      if (r < 0 || (strcmp(v, "cpu") && strcmp(v, "cuda"))) return usage_error("plan", "--target takes cpu or cuda");
      target = strcmp(v, "cpu") ? TARGET_CUDA : TARGET_CPU;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--recompute", &v))) {
      fix_rc = -1;
      for (int k = 0; r >= 0 && k <= RECOMPUTE_FULL; k++)
        if (!strcmp(v, recompute_mode_names[k])) fix_rc = k;
      if (fix_rc < 0) return usage_error("plan", "--recompute takes none, selective or full (auto is what the search does)");
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--pp-schedule", &v))) {
      fix_sched = r < 0 ? -1 : pipe_kind_parse(v);
      if (fix_sched <= 0) return usage_error("plan", "--pp-schedule takes afab, 1f1b, interleaved, zb-h1 or dualpipev");
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--mesh", &v))) {
      /* axis=size pairs */
      char buf[256];
      snprintf(buf, sizeof buf, "%s", r < 0 ? "" : v);
      for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (eq) *eq = 0;
        int ax = mesh_axis_parse(tok);
        long long n = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (ax < 0 || !eq || *end || n < 1) return usage_error("plan", "--mesh takes axis=size pairs such as tp=8,pp=4");
        fix_mesh[ax] = n;
      }
      if (r < 0 || !buf[0]) return usage_error("plan", "--mesh takes axis=size pairs such as tp=8,pp=4");
      continue;
    }
    if (a[0] == '-') return unknown_option("plan", a, help);   /* with a did-you-mean, as every command */
    if (spec_path) return usage_error("plan", "more than one spec ('%s' and '%s')", spec_path, a);
    spec_path = a;
  }
  if (!spec_path) return usage_error("plan", "no model spec (loom plan SPEC.json --gpus N)");
  if (!gpus) return usage_error("plan", "--gpus N is required");

  char err[IR_ERR_LEN];
  static RunSpec base;
  int rc = spec_load(spec_path, &base, err, sizeof err);
  if (rc) return report(rc, err);
  if (seq) base.seq = seq;
  if (precision) snprintf(base.precision, sizeof base.precision, "%s", precision);
  if (capacity >= 0) base.capacity_factor = capacity;
  if (fix_mesh[AX_EP] > 1 && !base.model.n_experts) {
    snprintf(err, sizeof err, "--mesh ep=%lld: expert parallelism splits a mixture of experts' experts, and %s's %s "
             "model is dense; drop ep", (long long)fix_mesh[AX_EP], spec_path, arch_name(base.model.arch));
    return report(EXIT_USAGE, err);
  }
  if (!gbt) gbt = base.batch * base.seq * (base.grad_accum > 0 ? base.grad_accum : 1);
  if (gbt % base.seq) {
    snprintf(err, sizeof err, "--global-batch-tokens %lld is not a whole number of %lld-token sequences; use a multiple "
             "of %lld", (long long)gbt, (long long)base.seq, (long long)base.seq);
    return report(EXIT_USAGE, err);
  }
  int64_t seqs = gbt / base.seq;
  Hardware hw;
  if ((rc = hardware_load(hw_arg, &hw, err, sizeof err))) return report(rc, err);
  for (int a = 0; a < AX_COUNT; a++)
    if (fix_mesh[a] && gpus % fix_mesh[a]) {
      snprintf(err, sizeof err, "--mesh %s=%lld does not divide --gpus %lld", mesh_axis_names[a], (long long)fix_mesh[a],
               (long long)gpus);
      return report(EXIT_USAGE, err);
    }

  /* A GPU plan in fp32 because the spec names no precision: almost never what a GPU run
     trains in, and the table's header alone is easy to miss. */
  if (!precision && target == TARGET_CUDA && !strcmp(base.precision, "fp32") && !spec_names_precision(spec_path))
    fprintf(stderr, "loom plan: %s names no precision, so this plan is for fp32 on %s; GPU runs almost always train "
            "in bf16: add --precision bf16\n", spec_path, hw_arg);
  PlanRequest rq = {.base = &base, .hw = &hw, .target = target, .gpus = gpus, .seqs = seqs, .fix_batch = fix_batch,
                    .fix_v = fix_v, .fix_zero = fix_zero, .fix_sched = fix_sched, .fix_rc = fix_rc, .top = top,
                    .exhaustive = getenv("LOOM_PLAN_EXHAUSTIVE") || (!getenv("LOOM_PLAN_FAST") && PLAN_DEFAULT_EXHAUSTIVE),
                    .progress = !json};
  memcpy(rq.fix_mesh, fix_mesh, sizeof rq.fix_mesh);
  PlanResult res;
  rc = plan_search(&rq, &res, err, sizeof err);
  if (rc) return report(rc, err);
  const PlanCand *best = res.best;
  int shown = res.n_best;
  double tokens = (double)gbt, elapsed = res.elapsed_s;
  if (json) {
    printf("[\n");
    for (int i = 0; i < shown; i++) {
      const PlanCand *c = &best[i];
      double loss_s;
      const char *loss = biggest_loss(c, &loss_s);
      printf("  {\"rank\": %d, \"dp\": %lld, \"tp\": %lld, \"pp\": %lld, \"cp\": %lld, \"ep\": %lld, \"sequence_parallel\": %s, "
             "\"zero\": %d, \"pp_schedule\": \"%s\", \"pp_virtual\": %lld, \"batch\": %lld, \"micro_batch_per_rank\": %lld, "
             "\"grad_accum\": %lld, \"recompute\": \"%s\", \"memory_bytes\": %.0f, \"step_s\": %.9g, \"tokens_per_s_per_gpu\": %.9g, "
             "\"model_flops_per_token\": %.9g, \"peak_flops\": %.9g, \"mfu\": %.9g, \"hfu\": %.9g, "
             "\"biggest_loss\": \"%s\", \"biggest_loss_s\": %.6g}%s\n",
             i + 1, (long long)c->dp, (long long)c->tp, (long long)c->pp, (long long)c->cp, (long long)c->ep,
             c->sp ? "true" : "false", c->zero, c->pp > 1 ? pipe_kind_names[c->sched] : "", (long long)c->v, (long long)c->batch,
             (long long)(c->batch / (c->dp * c->ep)), (long long)c->ga, recompute_mode_names[c->rc], c->mem, c->step_s,
             tokens / c->step_s / (double)gpus, res.flops_per_token, res.peak_flops, plan_mfu(&res, &rq, c), c->t.mfu, loss,
             loss_s, i + 1 < shown ? "," : "");
    }
    printf("]\n");
  } else {
    printf("%s, %lld devices of %s (%.0f GiB), %lld tokens a step (%lld x %lld), %s\n", spec_path, (long long)gpus,
           hw.name, hw.mem_bytes / 1073741824.0, (long long)gbt, (long long)seqs, (long long)base.seq, base.precision);
    printf("%d candidates (%d stopped at a lower bound), %d not buildable, %d compiles", res.n_cand, res.n_pruned,
           res.n_refused, res.compiles);
    if (!rq.exhaustive) printf(" (the fast search: %d layer programs)", res.layer_programs);
    printf(" in %.2f s; the best %d, compiled whole:\n", elapsed, shown);
    if (hw.eff_matmul >= 1 && hw.eff_attention >= 1 && hw.eff_memory >= 1 && hw.eff_link >= 1)
      printf("MFU is an upper bound (and step time a lower one): %s's efficiencies are 1, its datasheet peaks (docs/time-model.md)\n",
             hw.name);
    /* MFU: the model's FLOPs a token (loom ir --flops), the same for every recomputation;
       HFU: what the time model has the device execute (recomputation and padding included) */
    printf("  %-3s %-52s %10s %10s %12s %6s %6s  %s\n", "#", "layout", "mem GiB", "step ms", "tok/s/dev", "MFU", "HFU",
           "biggest loss");
    for (int i = 0; i < shown; i++) {
      const PlanCand *c = &best[i];
      char lay[160];
      plan_layout_text(c, lay, sizeof lay);
      double loss_s;
      const char *loss = biggest_loss(c, &loss_s);
      printf("  %-3d %-52s %10.2f %10.2f %12.0f %6.3f %6.3f  %s %.2f ms\n", i + 1, lay, c->mem / 1073741824.0,
             c->step_s * 1e3, tokens / c->step_s / (double)gpus, plan_mfu(&res, &rq, c), c->t.mfu, loss, loss_s * 1e3);
    }
  }
  rc = 0;
  if (explain) {
    if (explain > shown) {
      snprintf(err, sizeof err, "--explain %d: the table has %d candidates", explain, shown);
      rc = EXIT_USAGE;
    } else {
      Module *m = NULL;
      StepTime t;
      int64_t mem;
      const PlanCand *c = &best[explain - 1];
      rc = plan_compile(&rq, c, &m, &t, &mem, err, sizeof err);
      if (!rc) {
        char lay[160];
        plan_layout_text(c, lay, sizeof lay);
        printf("\ncandidate %d: %s\n", explain, lay);
        timing_report(stdout, m, &hw, &t, tokens);
        module_free(m);
      }
    }
  }
  if (!rc && emit) rc = emit_spec(emit, spec_path, &base, &best[0], err, sizeof err);
  if (!rc && emit && !json) fprintf(stderr, "wrote %s (candidate 1)\n", emit);
  plan_result_free(&res);
  return report(rc, err);
}
