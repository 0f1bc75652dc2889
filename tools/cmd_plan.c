/* tools/cmd_plan.c — `loom plan`: the layouts of a model on N devices, each compiled and
 * its step predicted by the time model (passes/timing.h), those that fit ranked by
 * throughput.
 *
 * The search: every dp x tp x cp x pp with product N (tp within a node; cp where the
 * sequence splits into 2cp zigzag half-chunks), ZeRO stage (0-3; 0-1 with pp), sequence
 * parallelism with tp, micro-batch size (sequences per dp rank; the
 * gradient accumulation follows from the global batch), pipeline schedule and virtual
 * stages, recomputation (none, selective, full).  Flags fix any of
 * them (--mesh, --zero, --batch, --pp-schedule, --pp-virtual, --recompute).  For a
 * mixture of experts, ep too (dividing the experts; the batch splits over dp x ep; no pp or
 * cp with experts yet, as loom trains them).
 *
 * Speed: a candidate is not compiled whole.  Layouts differ in their repeated layers, so
 * each is compiled with 1 and with 2 layers per pipeline chunk (equal chunks; the model
 * itself when that is as small), and its step time and memory are extrapolated linearly to
 * the model's layers per chunk.  The best 2 x --top that fit are then compiled whole and
 * ranked by those figures: every printed row is the whole program's (memory exactly
 * memory-plan's); the screening figures are never printed as results.  LOOM_PLAN_DEBUG=1 prints, to stderr, why a
 * layout is not buildable and each whole compile beside its screening figures.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ir/schedule.h"
#include "tools/exec_ref.h"
#include "tools/tools.h"

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
  "Qwen3-MoE: no pp or cp with experts yet, as loom trains them; --capacity-factor as training).\n"
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

typedef struct {
  int64_t dp, tp, cp, pp, v, ep;   /* ep: experts split (mixture of experts; the batch splits over dp x ep) */
  int zero, sched;    /* sched: PipeKind, PIPE_NONE without pp */
  int rc;             /* RecomputeMode: none, selective (the default classes), full */
  bool sp;
  int64_t batch, ga;  /* the spec's batch (mbs x dp) and grad_accum */
  double step_s, mem;
  StepTime t;
  bool exact, fits;
} Cand;


typedef struct {
  const RunSpec *base;
  const Hardware *hw;
  int target;
  int compiles;
  double compile_s;
  pthread_mutex_t lock;   /* the counters (screening runs on several threads) */
  FILE *quiet;            /* /dev/null: where the passes' reports go */
} Ctx;

static int compile_one(Ctx *x, const Cand *c, int64_t layers, StepTime *t, int64_t *mem, Module **keep, char *err,
                       size_t errlen);

/* Screening, one candidate: compiled with 1 and 2 layers a chunk (or whole when that is as
   small), its step and memory extrapolated to the model's layers a chunk. */
typedef struct {
  Ctx *x;
  Cand *cs;
  bool *bad;
  char (*why)[IR_ERR_LEN];
  const int *order;   /* the candidates of this round */
  int n, next, done;
  int64_t L;
  const Hardware *hw;
  pthread_mutex_t lock;
  /* the progress line (standard error, a terminal only): candidates screened of n_all */
  bool tty;
  int screened, n_all;
  double t0, shown;
} Screen;

static double now_s(void);

static void *screen_worker(void *arg) {
  Screen *w = arg;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    int k = w->next++;
    pthread_mutex_unlock(&w->lock);
    if (k >= w->n) return NULL;
    int i = w->order[k];
    Cand *c = &w->cs[i];
    int64_t chunks = c->pp * c->v, L = w->L;
    StepTime t1, t2;
    int64_t m1 = 0, m2 = 0;
    /* two layers a chunk or more already: the model itself is as cheap to compile */
    bool whole = 2 * chunks >= L;
    w->bad[i] = whole ? compile_one(w->x, c, L, &t1, &m1, NULL, w->why[i], IR_ERR_LEN)
                      : compile_one(w->x, c, chunks, &t1, &m1, NULL, w->why[i], IR_ERR_LEN) ||
                            compile_one(w->x, c, 2 * chunks, &t2, &m2, NULL, w->why[i], IR_ERR_LEN);
    if (!w->bad[i]) {
      double k = (double)L / (double)chunks - 1;
      c->step_s = whole ? t1.step_s : t1.step_s + k * (t2.step_s - t1.step_s);
      c->mem = whole ? (double)m1 : (double)m1 + k * (double)(m2 - m1);
      c->fits = c->mem <= w->hw->mem_bytes;
    }
    pthread_mutex_lock(&w->lock);
    w->done++;
    w->screened++;
    double t = now_s();
    if (w->tty && t - w->shown >= 0.5) {   /* the progress line, twice a second at most */
      w->shown = t;
      fprintf(stderr, "\rloom plan: screened %d of at most %d candidates (%d compiles, %.0f s)", w->screened, w->n_all,
              w->x->compiles, t - w->t0);
      fflush(stderr);
    }
    pthread_mutex_unlock(&w->lock);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Compiles c with `layers` layers; its predicted step and memory.  2 when the layout is
   not one loom can build (the message says why), 1 on a failure. */
/* The training and lowering pipelines without their verifier passes (verify,
   verify-collectives): a candidate's program is checked when it is compiled to run. */
static const char *plan_pipeline(void) {
  static char buf[1024];
  if (buf[0]) return buf;
  char all[1024];
  snprintf(all, sizeof all, "%s,%s", TRAIN_PIPELINE, LOWER_PIPELINE);
  for (char *tok = strtok(all, ","); tok; tok = strtok(NULL, ","))
    if (strcmp(tok, "verify") && strcmp(tok, "verify-collectives"))
      snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? "," : "", tok);
  return buf;
}

static int compile_one(Ctx *x, const Cand *c, int64_t layers, StepTime *t, int64_t *mem, Module **keep, char *err,
                       size_t errlen) {
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack; one per call (screening threads) */
  if (!sp) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  *sp = *x->base;
  sp->model.n_layer = layers;
  for (int k = 0; k < MESH_AXES; k++) sp->mesh[k] = 1;
  sp->mesh[MESH_DP] = c->dp, sp->mesh[MESH_TP] = c->tp, sp->mesh[MESH_CP] = c->cp, sp->mesh[MESH_PP] = c->pp;
  sp->mesh[MESH_EP] = c->ep;
  sp->zero = c->zero, sp->sequence_parallel = c->sp, sp->batch = c->batch, sp->grad_accum = c->ga;
  sp->recompute = c->rc, sp->recompute_classes = RC_DEFAULT_CLASSES;
  sp->pp_schedule = c->sched ? c->sched : 0, sp->pp_virtual = c->pp > 1 ? c->v : 0, sp->n_pp_split = 0;
  /* screening (fewer layers than the model): the same layers in every chunk, so the cost is
     linear in the layers a chunk holds; the whole model gets the pass's balanced split */
  int64_t chunks = c->pp * c->v;
  if (c->pp > 1 && layers < x->base->model.n_layer && layers % chunks == 0 && chunks <= 256) {
    sp->n_pp_split = (int)chunks;
    for (int64_t k = 0; k < chunks; k++) sp->pp_split[k] = k * (layers / chunks);
  }
  int rc = spec_validate(sp, err, errlen);
  if (rc) {
    free(sp);
    return rc;
  }
  Module *m = NULL;
  double t0 = now_s();
  rc = frontend_build(sp, "plan", &m, err, errlen);
  TrainSettings ts = spec_train_settings(sp);
  PassOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.train = &ts, opt.target = x->target;
  /* memory-plan's own overlap check is O(values^2): the plan's figures are the same without
     it, and `loom train` checks the program it runs */
  opt.no_self_checks = true;
  opt.print_to = x->quiet;   /* the recompute pass's report of every candidate: not shown */
  if (!rc) rc = pipeline_run(m, plan_pipeline(), &opt, err, errlen);
  if (!rc) rc = timing_predict(m, x->hw, c->ga, t, err, errlen);
  if (!rc) *mem = memory_rank_peak(m, x->target);   /* passes/memory_rank.c */
  pthread_mutex_lock(&x->lock);
  x->compiles++, x->compile_s += now_s() - t0;
  pthread_mutex_unlock(&x->lock);
  if (!rc && keep) *keep = m;
  else module_free(m);
  free(sp);
  return rc;
}

static void layout_text(const Cand *c, char *buf, size_t n) {
  int k = snprintf(buf, n, "dp=%lld tp=%lld%s", (long long)c->dp, (long long)c->tp, c->sp ? "+sp" : "");
  if (c->cp > 1) k += snprintf(buf + k, n - (size_t)k, " cp=%lld", (long long)c->cp);
  if (c->ep > 1) k += snprintf(buf + k, n - (size_t)k, " ep=%lld", (long long)c->ep);
  k += snprintf(buf + k, n - (size_t)k, " pp=%lld", (long long)c->pp);
  if (c->pp > 1) k += snprintf(buf + k, n - (size_t)k, " %s", pipe_kind_names[c->sched]);
  if (c->pp > 1 && c->v > 1) k += snprintf(buf + k, n - (size_t)k, " v=%lld", (long long)c->v);
  k += snprintf(buf + k, n - (size_t)k, " zero=%d mbs=%lld ga=%lld", c->zero, (long long)(c->batch / (c->dp * c->ep)),
                (long long)c->ga);
  if (c->rc) snprintf(buf + k, n - (size_t)k, " rc=%s", recompute_mode_names[c->rc]);
}

static const char *biggest_loss(const Cand *c, double *s) {
  double comm = c->t.exposed_comm_s, bub = c->t.bubble_s, opt = c->t.optimizer_s;
  const char *w = "exposed communication";
  *s = comm;
  if (bub > *s) *s = bub, w = "pipeline bubble";
  if (opt > *s) *s = opt, w = "optimizer step";
  return w;
}

/* The winner as a run spec: the input spec with the layout's keys set (a bare config.json
   becomes {"model": its path}); the model path made absolute so the file may go anywhere. */
static int emit_spec(const char *path, const char *spec_path, const RunSpec *base, const Cand *c, char *err, size_t errlen) {
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

static int cmp_step(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  /* tokens per step are the same for all: the shorter step is the higher throughput */
  return x->step_s < y->step_s ? -1 : x->step_s > y->step_s;
}

static bool divides(int64_t a, int64_t b) { return a > 0 && b % a == 0; }

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
    if (a[0] == '-') return usage_error("plan", "unknown option '%s' (see loom plan --help)", a);
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
  int64_t seqs = gbt / base.seq, L = base.model.n_layer;
  Hardware hw;
  if ((rc = hardware_load(hw_arg, &hw, err, sizeof err))) return report(rc, err);
  for (int a = 0; a < AX_COUNT; a++)
    if (fix_mesh[a] && gpus % fix_mesh[a]) {
      snprintf(err, sizeof err, "--mesh %s=%lld does not divide --gpus %lld", mesh_axis_names[a], (long long)fix_mesh[a],
               (long long)gpus);
      return report(EXIT_USAGE, err);
    }

  /* ---- candidates ---- */
  int n = 0, cap = 1024;
  Cand *cs = malloc(sizeof *cs * (size_t)cap);
  if (!cs) return report(EXIT_RUN, "out of memory");
  for (int64_t tp = 1; tp <= gpus; tp++) {
    if (!divides(tp, gpus) || (fix_mesh[AX_TP] && tp != fix_mesh[AX_TP]) || tp > hw.devices_per_node) continue;
    for (int64_t pp = 1; pp <= gpus / tp; pp++) {
      if (!divides(pp, gpus / tp) || (fix_mesh[AX_PP] && pp != fix_mesh[AX_PP]) || pp > L) continue;
      for (int64_t cp = 1; cp <= gpus / tp / pp; cp++) {
        /* cp: zigzag ring attention, the sequence in 2cp half-chunks of 64 tokens or more
           (shorter blocks leave the ring's transfers nothing to hide behind) */
        if (!divides(cp, gpus / tp / pp) || (fix_mesh[AX_CP] && cp != fix_mesh[AX_CP]) ||
            (cp > 1 && (base.seq % (2 * cp) || (!fix_mesh[AX_CP] && base.seq / (2 * cp) < 64))))
          continue;
        /* ep (a mixture of experts: it divides the experts; no pp or cp with experts yet) */
        int64_t E = base.model.n_experts;
        if (E && (pp > 1 || cp > 1)) continue;
        for (int64_t ep = 1; ep <= (E ? gpus / tp / pp / cp : 1); ep++) {
        if (!divides(ep, gpus / tp / pp / cp) || (E && E % ep) || (fix_mesh[AX_EP] && ep != fix_mesh[AX_EP])) continue;
        int64_t dp = gpus / tp / pp / cp / ep;
        if (fix_mesh[AX_DP] && dp != fix_mesh[AX_DP]) continue;
        for (int zero = 0; zero <= 3; zero++) {
          if ((fix_zero >= 0 && zero != fix_zero) || (dp == 1 && zero) || (pp > 1 && zero > 1)) continue;
          for (int sp = 0; sp <= (tp > 1); sp++)
            for (int64_t mbs = 1; mbs * dp * ep <= seqs; mbs *= 2) {
              int64_t batch = mbs * dp * ep;
              if ((fix_batch && batch != fix_batch) || seqs % batch) continue;
              int64_t ga = seqs / batch;
              for (int sched = pp > 1 ? PIPE_AFAB : PIPE_NONE; sched <= (pp > 1 ? PIPE_DUALPIPEV : PIPE_NONE); sched++) {
                if (fix_sched > 0 && pp > 1 && sched != fix_sched) continue;
                /* afab has 1f1b's bubble and holds every micro-batch: searched only when asked for */
                if (fix_sched <= 0 && sched == PIPE_AFAB) continue;
                int64_t vv = sched == PIPE_INTERLEAVED ? (fix_v ? fix_v : 2) : sched == PIPE_DUALPIPEV ? 2 : 1;
                if (pp > 1 && pp * vv > L) continue;
                if (sched == PIPE_INTERLEAVED && ga % pp) continue;
                for (int rcm = RECOMPUTE_NONE; rcm <= RECOMPUTE_FULL; rcm++) {
                  if (fix_rc >= 0 && rcm != fix_rc) continue;
                  if (n == cap) {
                    Cand *nc = realloc(cs, sizeof *cs * (size_t)(cap *= 2));
                    if (!nc) {
                      free(cs);
                      return report(EXIT_RUN, "out of memory");
                    }
                    cs = nc;
                  }
                  cs[n++] = (Cand){.dp = dp, .tp = tp, .cp = cp, .pp = pp, .v = pp > 1 ? vv : 1, .ep = ep, .zero = zero,
                                   .sched = sched, .rc = rcm, .sp = sp, .batch = batch, .ga = ga};
                }
              }
            }
        }
        }
      }
    }
  }
  if (!n) {
    free(cs);
    snprintf(err, sizeof err, "no layout of %lld devices reaches %lld sequences a step under the fixed choices; give "
             "a --global-batch-tokens that is a multiple of dp x seq, or fix fewer axes", (long long)gpus, (long long)seqs);
    return report(EXIT_USAGE, err);
  }

  /* ---- screening: 1 and 2 layers a chunk, extrapolated ---- */
  Ctx x = {&base, &hw, target, 0, 0, PTHREAD_MUTEX_INITIALIZER, fopen("/dev/null", "w")};
  double t_start = now_s();
  int kept = 0, refused = 0;
  char first_refusal[IR_ERR_LEN] = "";
  /* screening on every core: candidates are independent compiles */
  (void)plan_pipeline();   /* its text is built once, before the threads */
  /* Rounds, so that screened figures prune what cannot win:
     - recomputation never makes a step faster (it adds work to save memory), so a layout
       with it is screened only where the same layout without it was refused or does not fit
       (first every candidate without recomputation, or with the one --recompute fixes);
     - memory grows with the micro-batch, so a layout whose half micro-batch already needs
       more than 1.5 x the device (far out, as the exact phase judges) is not screened.
     Round r = phase x 64 + log2(micro-batch per rank). */
  int *order = malloc(sizeof(int) * (size_t)(n + 1)), *half = malloc(sizeof(int) * (size_t)(n + 1));
  int *none = malloc(sizeof(int) * (size_t)(n + 1));
  bool *skip = calloc((size_t)n + 1, 1), *far = calloc((size_t)n + 1, 1);
  Screen w = {&x, cs, calloc((size_t)n + 1, 1), calloc((size_t)n + 1, IR_ERR_LEN), order, 0, 0, 0, L, &hw,
              PTHREAD_MUTEX_INITIALIZER, isatty(STDERR_FILENO) == 1, 0, n, t_start, t_start};
  if (!w.bad || !w.why || !order || !skip || !far || !half || !none) {
    free(w.bad), free(w.why), free(cs), free(order), free(skip), free(far), free(half), free(none);
    if (x.quiet) fclose(x.quiet);
    return report(EXIT_RUN, "out of memory");
  }
  /* siblings: the same layout with half the micro-batch, and without recomputation */
  for (int i = 0; i < n; i++) {
    const Cand *c = &cs[i];
    half[i] = none[i] = -1;
    for (int j = 0; j < n; j++) {
      const Cand *b = &cs[j];
      if (b->dp != c->dp || b->tp != c->tp || b->cp != c->cp || b->pp != c->pp || b->v != c->v || b->ep != c->ep || b->zero != c->zero ||
          b->sched != c->sched || b->sp != c->sp)
        continue;
      if (b->rc == c->rc && 2 * b->batch == c->batch) half[i] = j;
      if (c->rc != RECOMPUTE_NONE && b->rc == RECOMPUTE_NONE && b->batch == c->batch) none[i] = j;
    }
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores, skipped = 0;
  if (getenv("LOOM_THREADS")) nt = atoi(getenv("LOOM_THREADS")) > 0 ? atoi(getenv("LOOM_THREADS")) : nt;
  for (int round = 0; round < 128; round++) {
    w.n = w.next = 0;
    for (int i = 0; i < n; i++) {
      const Cand *c = &cs[i];
      int phase = fix_rc >= 0 || c->rc == RECOMPUTE_NONE ? 0 : 1, level = 0;
      for (int64_t m = c->batch / (c->dp * c->ep); m > 1; m /= 2) level++;
      if (phase * 64 + level != round) continue;
      int h = half[i], o = none[i];
      if (h >= 0 && (far[h] || (!w.bad[h] && !skip[h] && cs[h].mem > 1.5 * hw.mem_bytes))) {
        skip[i] = far[i] = true;
        skipped++;
        continue;
      }
      if (o >= 0 && !skip[o] && !w.bad[o] && cs[o].fits) {
        skip[i] = true;
        skipped++;
        continue;
      }
      order[w.n++] = i;
    }
    if (!w.n) continue;
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < nt && t < 64 && t < w.n; t++)
      if (!pthread_create(&th[started], NULL, screen_worker, &w)) started++;
    screen_worker(&w);   /* this thread too */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  }
  for (int i = 0; i < n; i++) {
    Cand *c = &cs[i];
    if (skip[i]) continue;
    if (w.bad[i]) {
      if (!refused++) snprintf(first_refusal, sizeof first_refusal, "%s", w.why[i]);
      if (getenv("LOOM_PLAN_DEBUG")) {
        char lay[160];
        layout_text(c, lay, sizeof lay);
        fprintf(stderr, "not buildable: %s: %s\n", lay, w.why[i]);
      }
      continue;
    }
    cs[kept++] = *c;
  }
  if (w.tty && w.shown > w.t0) fprintf(stderr, "\r\033[K");   /* the progress line gives way to the summary */
  if (!json)
    fprintf(stderr, "screened %d candidates (%d compiles on %d threads, %.1f s); %d skipped: recomputation where the "
            "layout fits without it, or a micro-batch twice one far out of memory\n", n - skipped, x.compiles, nt,
            now_s() - t_start, skipped);
  free(w.bad), free(w.why), free(order), free(skip), free(far), free(half), free(none);
  if (!json) fprintf(stderr, "\n");
  n = kept;
  qsort(cs, (size_t)n, sizeof *cs, cmp_step);

  /* ---- exact: compile the best 2 x top whole (the screening's order is close, not exact),
     then rank those that fit by their exact step ---- */
  int shown = 0, closest = -1, exact_n = 0;
  Cand *best = malloc(sizeof *best * (size_t)(2 * top));
  for (int i = 0; i < n && exact_n < 2 * top; i++) {
    Cand *c = &cs[i];
    if (!c->fits && c->mem > 1.5 * hw.mem_bytes) continue;   /* screened far out of memory */
    int64_t mem = 0;
    if (compile_one(&x, c, L, &c->t, &mem, NULL, err, sizeof err)) {
      if (!refused++) snprintf(first_refusal, sizeof first_refusal, "%s", err);
      continue;
    }
    if (getenv("LOOM_PLAN_DEBUG")) {
      char lay[160];
      layout_text(c, lay, sizeof lay);
      fprintf(stderr, "exact %s: step %.2f ms (screened %.2f), memory %.2f GiB (screened %.2f)\n", lay, c->t.step_s * 1e3,
              c->step_s * 1e3, mem / 1073741824.0, c->mem / 1073741824.0);
    }
    c->step_s = c->t.step_s, c->mem = (double)mem, c->exact = true, c->fits = c->mem <= hw.mem_bytes;
    if (c->fits) best[exact_n++] = *c;
    else if (closest < 0 || c->mem < cs[closest].mem) closest = i;
  }
  qsort(best, (size_t)exact_n, sizeof *best, cmp_step);
  if (closest < 0)   /* nothing compiled whole: the screening's least memory */
    for (int i = 0; i < n; i++)
      if (!cs[i].exact && (closest < 0 || cs[i].mem < cs[closest].mem)) closest = i;
  shown = exact_n < top ? exact_n : top;
  double elapsed = now_s() - t_start;
  double tokens = (double)gbt;
  if (!shown) {
    if (closest >= 0) {
      char lay[160];
      layout_text(&cs[closest], lay, sizeof lay);
      snprintf(err, sizeof err, "no layout fits %s's %.1f GiB: the closest, %s, needs %.1f GiB a device%s; use more devices, "
               "a shorter --seq%s (recomputation is searched without pp only)", hw.name, hw.mem_bytes / 1073741824.0, lay, cs[closest].mem / 1073741824.0,
               cs[closest].exact ? "" : " (screened: extrapolated from 1 and 2 layers a chunk)",
               strcmp(base.precision, "bf16") ? " or --precision bf16" : "");
    } else {
      snprintf(err, sizeof err, "no layout of %lld devices could be built%s%s", (long long)gpus, refused ? ": " : "",
               first_refusal);
    }
    free(cs), free(best);
    if (x.quiet) fclose(x.quiet);
    return report(EXIT_USAGE, err);
  }
  if (json) {
    printf("[\n");
    for (int i = 0; i < shown; i++) {
      const Cand *c = &best[i];
      double loss_s;
      const char *loss = biggest_loss(c, &loss_s);
      printf("  {\"rank\": %d, \"dp\": %lld, \"tp\": %lld, \"pp\": %lld, \"cp\": %lld, \"ep\": %lld, \"sequence_parallel\": %s, "
             "\"zero\": %d, \"pp_schedule\": \"%s\", \"pp_virtual\": %lld, \"batch\": %lld, \"micro_batch_per_rank\": %lld, "
             "\"grad_accum\": %lld, \"recompute\": \"%s\", \"memory_bytes\": %.0f, \"step_s\": %.6g, \"tokens_per_s_per_gpu\": %.6g, \"mfu\": %.4f, "
             "\"biggest_loss\": \"%s\", \"biggest_loss_s\": %.6g}%s\n",
             i + 1, (long long)c->dp, (long long)c->tp, (long long)c->pp, (long long)c->cp, (long long)c->ep,
             c->sp ? "true" : "false", c->zero, c->pp > 1 ? pipe_kind_names[c->sched] : "", (long long)c->v, (long long)c->batch,
             (long long)(c->batch / (c->dp * c->ep)),
             (long long)c->ga, recompute_mode_names[c->rc], c->mem, c->step_s, tokens / c->step_s / (double)gpus, c->t.mfu, loss, loss_s,
             i + 1 < shown ? "," : "");
    }
    printf("]\n");
  } else {
    printf("%s, %lld devices of %s (%.0f GiB), %lld tokens a step (%lld x %lld), %s\n", spec_path, (long long)gpus,
           hw.name, hw.mem_bytes / 1073741824.0, (long long)gbt, (long long)seqs, (long long)base.seq, base.precision);
    printf("%d candidates, %d not buildable, %d compiles in %.2f s; the best %d, compiled whole:\n", n + refused, refused,
           x.compiles, elapsed, shown);
    printf("  %-3s %-52s %10s %10s %12s %6s  %s\n", "#", "layout", "mem GiB", "step ms", "tok/s/dev", "MFU", "biggest loss");
    for (int i = 0; i < shown; i++) {
      const Cand *c = &best[i];
      char lay[160];
      layout_text(c, lay, sizeof lay);
      double loss_s;
      const char *loss = biggest_loss(c, &loss_s);
      printf("  %-3d %-52s %10.2f %10.2f %12.0f %6.3f  %s %.2f ms\n", i + 1, lay, c->mem / 1073741824.0, c->step_s * 1e3,
             tokens / c->step_s / (double)gpus, c->t.mfu, loss, loss_s * 1e3);
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
      Cand *c = &best[explain - 1];
      rc = compile_one(&x, c, L, &t, &mem, &m, err, sizeof err);
      if (!rc) {
        char lay[160];
        layout_text(c, lay, sizeof lay);
        printf("\ncandidate %d: %s\n", explain, lay);
        timing_report(stdout, m, &hw, &t, tokens);
        module_free(m);
      }
    }
  }
  if (!rc && emit) rc = emit_spec(emit, spec_path, &base, &best[0], err, sizeof err);
  if (!rc && emit && !json) fprintf(stderr, "wrote %s (candidate 1)\n", emit);
  free(cs), free(best);
  if (x.quiet) fclose(x.quiet);
  return report(rc, err);
}
