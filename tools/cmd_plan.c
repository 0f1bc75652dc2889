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
 * memory-plan's); the screening figures are never printed as results.  The compiles share
 * what they can ("compiling a candidate" below): the trained module before partitioning,
 * the partitioned one among a layout's schedules, and each distinct function's lowering.
 * And most candidates stop after their first compile: a lower bound on their step (that
 * compile's, plus the rest of the layers at peak FLOP/s) already exceeds the 2 x --top-th
 * best screened step ("pruning" below); the table is the unpruned search's.
 * LOOM_PLAN_DEBUG=1 prints, to stderr, why a layout is not buildable and each whole compile
 * beside its screening figures; LOOM_PLAN_CHECK=1 also lowers every screening compile whole
 * and stops at the first figure the shared lowering does not reproduce bit for bit, prunes
 * nothing, and stops at the first lower bound above its candidate's screened step.
 *
 * Over 1,000 lines on purpose: the search, its rounds and the compiles its candidates share
 * work on one Cand and one Ctx; split apart they would pass them all.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ir/schedule.h"
#include "passes/lower_memo.h"
#include "runtime/exec/exec_ref.h"
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
  bool pruned;        /* screened at 1 layer a chunk only: step_s is a lower bound (see "pruning") */
} Cand;


/* ---- compiling a candidate ----
   A compile is the training pipeline and lowering without their verifier passes (a
   candidate's program is checked when it is compiled to run), in three parts that
   candidates share:
   - front: the frontend and the passes up to `optimizer`, then @forward dropped (the
     evaluation, no part of a step: neither the time model nor the memory per rank reads
     it).  It depends on the layers, the batch, the gradient accumulation and tp (which pads
     the vocabulary), so it is kept for the run (Ctx.front) and each compile takes a copy;
   - middle: `shard` and `recompute`, which read the layout but not its pipeline schedule:
     the schedules of a family share it (screen_worker);
   - back: `pipeline` and `bucket`, then the lowering (canonicalize .. memory-plan, which work
     function by function), then the time model and the memory per rank.  A screening
     compile lowers only the functions it has not met before (Ctx.memo, by func_hash and the
     mesh): many are met again (an optimizer step does not change with the micro-batch or
     the recomputation, a forward chunk is 1f1b's and zb-h1's), and for those the figures
     lowering gave are reused: a call's time, the arena, the globals it reads. */
enum { FRONT_CACHE = 64 };
typedef struct {
  int64_t key[4];   /* layers, batch, grad_accum, tp */
  Module *m;        /* never changed: compiles take copies */
  int users;        /* copies being taken now */
} Front;

typedef struct {
  const RunSpec *base;
  const Hardware *hw;
  int target;
  int compiles;
  pthread_mutex_t lock;   /* the counters and the caches (screening runs on several threads) */
  FILE *quiet;            /* /dev/null: where the passes' reports go */
  char passes[4][512];    /* front, middle, pipeline + bucket, lowering */
  Front front[FRONT_CACHE];
  int front_next;
  LowerMemo *memo;        /* functions lowered before (passes/lower_memo.h) */
  double layer_s;         /* a layer's forward and backward for one sequence at peak FLOP/s (pruning) */
} Ctx;

static double now_s(void);

/* OpenBLAS starts its worker threads when it is loaded, before main, and they spin for about
   0.1 s waiting for work that loom never gives them (runtime/cpu/cpu_gemm.c calls BLAS on one
   thread, and the planner not at all): on a 2-core machine a core taken from the planner's
   first tenth of a second, 5-10% of a small plan.  Stopped with OpenBLAS's own hook (the one
   it runs before a fork), looked up by name: with another BLAS nothing happens. */
static void blas_threads_stop(void) {
  void *sym = dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
  int (*stop)(void) = NULL;
  memcpy(&stop, &sym, sizeof stop);
  if (stop) stop();
}

static void layout_text(const Cand *c, char *buf, size_t n);

static void unpin(Ctx *x, int pin) {
  if (pin < 0) return;
  pthread_mutex_lock(&x->lock);
  x->front[pin].users--;
  pthread_mutex_unlock(&x->lock);
}

static void ctx_free(Ctx *x) {
  for (int i = 0; i < FRONT_CACHE; i++) module_free(x->front[i].m), x->front[i].m = NULL;
  lower_memo_free(x->memo), x->memo = NULL;
  if (x->quiet) fclose(x->quiet);
  x->quiet = NULL;
}

/* The parts' pass lists, from the training and lowering pipelines: front, middle, and the
   back's two (pipeline .. bucket; the lowering, which works function by function). */
static void split_passes(Ctx *x) {
  char all[1024];
  snprintf(all, sizeof all, "%s,%s", TRAIN_PIPELINE, LOWER_PIPELINE);
  int part = 0;
  for (char *tok = strtok(all, ","); tok; tok = strtok(NULL, ",")) {
    if (!strcmp(tok, "verify") || !strcmp(tok, "verify-collectives")) continue;
    char *buf = x->passes[part];
    snprintf(buf + strlen(buf), sizeof x->passes[part] - strlen(buf), "%s%s", buf[0] ? "," : "", tok);
    if ((part == 0 && !strcmp(tok, "optimizer")) || (part == 1 && !strcmp(tok, "recompute")) ||
        (part == 2 && !strcmp(tok, "bucket")))
      part++;
  }
}

/* The run spec of candidate c with `layers` layers, checked: 0, or 2 with the reason.  sp
   holds the base spec (*x->base, copied once: it is large) but the fields set here. */
static int cand_spec(const Ctx *x, const Cand *c, int64_t layers, RunSpec *sp, char *err, size_t errlen) {
  sp->model.n_layer = layers;
  for (int k = 0; k < MESH_AXES; k++) sp->mesh[k] = 1;
  sp->mesh[MESH_DP] = c->dp, sp->mesh[MESH_TP] = c->tp, sp->mesh[MESH_CP] = c->cp, sp->mesh[MESH_PP] = c->pp;
  sp->mesh[MESH_EP] = c->ep;
  sp->zero = c->zero, sp->sequence_parallel = c->sp, sp->batch = c->batch, sp->grad_accum = c->ga;
  sp->recompute = c->rc, sp->recompute_classes = RC_DEFAULT_CLASSES;
  sp->pp_schedule = c->sched ? c->sched : 0, sp->pp_virtual = c->pp > 1 ? c->v : 0, sp->n_pp_split = 0;
  memcpy(sp->pp_split, x->base->pp_split, sizeof sp->pp_split);
  /* screening (fewer layers than the model): the same layers in every chunk, so the cost is
     linear in the layers a chunk holds; the whole model gets the pass's balanced split */
  int64_t chunks = c->pp * c->v;
  if (c->pp > 1 && layers < x->base->model.n_layer && layers % chunks == 0 && chunks <= 256) {
    sp->n_pp_split = (int)chunks;
    for (int64_t k = 0; k < chunks; k++) sp->pp_split[k] = k * (layers / chunks);
  }
  return spec_validate(sp, err, errlen);
}

/* The pass options of sp's compile (opt->train: ts). */
static void plan_options(const Ctx *x, const RunSpec *sp, TrainSettings *ts, PassOptions *opt) {
  *ts = spec_train_settings(sp);
  memset(opt, 0, sizeof *opt);
  opt->train = ts, opt->target = x->target;
  /* memory-plan's own overlap check is O(values^2): the plan's figures are the same without
     it, and `loom train` checks the program it runs */
  opt->no_self_checks = true;
  opt->print_to = x->quiet;   /* the recompute pass's report of every candidate: not shown */
}

/* Runs part `part` of the passes on m with sp's settings. */
static int run_part(Ctx *x, int part, const RunSpec *sp, Module *m, char *err, size_t errlen) {
  TrainSettings ts;
  PassOptions opt;
  plan_options(x, sp, &ts, &opt);
  return x->passes[part][0] ? pipeline_run(m, x->passes[part], &opt, err, errlen) : 0;
}

/* The front part of sp's program in *out: built (and a copy kept), or a copy of the kept
   one.  *pin: -1, or the kept entry the copy shares its names with (module_clone's
   share_strings), which is not dropped until unpin(x, *pin). */
static int front(Ctx *x, const RunSpec *sp, Module **out, int *pin, char *err, size_t errlen) {
  int64_t key[4] = {sp->model.n_layer, sp->batch, sp->grad_accum, sp->mesh[MESH_TP]};
  *out = NULL, *pin = -1;
  pthread_mutex_lock(&x->lock);
  for (int i = 0; i < FRONT_CACHE; i++) {
    Front *f = &x->front[i];
    if (!f->m || memcmp(f->key, key, sizeof key)) continue;
    f->users++;
    pthread_mutex_unlock(&x->lock);
    *out = module_clone(f->m, true), *pin = i;
    if (*out) return 0;
    unpin(x, i), *pin = -1;
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  pthread_mutex_unlock(&x->lock);
  Module *m = NULL;
  int rc = frontend_build(sp, "plan", &m, err, errlen);
  if (!rc) rc = run_part(x, 0, sp, m, err, errlen);
  if (rc) {
    module_free(m);
    return rc;
  }
  module_drop_func(m, "forward");
  Module *keep = module_clone(m, false), *old = NULL;
  pthread_mutex_lock(&x->lock);
  for (int k = 0; keep && k < FRONT_CACHE; k++) {   /* the next entry no copy of holds */
    Front *f = &x->front[(x->front_next + k) % FRONT_CACHE];
    if (f->users) continue;
    old = f->m;
    memcpy(f->key, key, sizeof key), f->m = keep, keep = NULL;
    x->front_next = (x->front_next + k + 1) % FRONT_CACHE;
  }
  pthread_mutex_unlock(&x->lock);
  module_free(old), module_free(keep);
  *out = m;
  return 0;
}

/* The front and middle parts of sp's program in *out (*pin: front's). */
static int front_middle(Ctx *x, const RunSpec *sp, Module **out, int *pin, char *err, size_t errlen) {
  int rc = front(x, sp, out, pin, err, errlen);
  for (int a = 0; a < MESH_AXES && !rc; a++) (*out)->mesh.size[a] = sp->mesh[a];   /* MESH_* follow AX_* order */
  if (!rc) rc = run_part(x, 1, sp, *out, err, errlen);
  if (rc) module_free(*out), *out = NULL, unpin(x, *pin), *pin = -1;
  return rc;
}

/* x->layer_s (pruning): one layer's forward and backward for one sequence, its matmul and
   attention FLOPs (the trained module of 2 layers less that of 1; batch 1, one rank, nothing
   recomputed) at the best peak any of the module's matmuls could run at (every dtype but
   fp8, which no pass makes) and the larger of the matmul and attention efficiencies.  0, and
   no pruning, when those modules cannot be built. */
static void layer_seconds(Ctx *x) {
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack */
  double f[2] = {0, 0};
  bool ok = sp != NULL;
  for (int k = 0; ok && k < 2; k++) {
    *sp = *x->base;
    sp->model.n_layer = k + 1;
    for (int a = 0; a < MESH_AXES; a++) sp->mesh[a] = 1;
    sp->batch = 1, sp->grad_accum = 1, sp->zero = 0, sp->sequence_parallel = false;
    sp->recompute = RECOMPUTE_NONE, sp->pp_schedule = 0, sp->pp_virtual = 0, sp->n_pp_split = 0;
    char err[IR_ERR_LEN];
    Module *m = NULL;
    ok = !spec_validate(sp, err, sizeof err) && !frontend_build(sp, "plan", &m, err, sizeof err) &&
         !run_part(x, 0, sp, m, err, sizeof err);
    const Func *g = ok ? module_find_func(m, "grad_step") : NULL;
    double mm = 0, at = 0;
    if (g) flops_of(g, &mm, &at);
    f[k] = mm + at;
    ok = g != NULL;
    module_free(m);
  }
  free(sp);
  double peak = 0;
  for (int d = 0; d < DT_COUNT; d++)
    if (d != DT_F8E4M3 && d != DT_F8E5M2 && x->hw->peak_flops[d] > peak) peak = x->hw->peak_flops[d];
  double eff = x->hw->eff_matmul > x->hw->eff_attention ? x->hw->eff_matmul : x->hw->eff_attention;
  x->layer_s = ok && f[1] > f[0] && peak > 0 && eff > 0 ? (f[1] - f[0]) / (peak * eff) : 0;
}

/* The back part on m (taken: freed, or kept in *keep), then c's predicted step and memory. */
static int back(Ctx *x, const Cand *c, const RunSpec *sp, Module *m, StepTime *t, int64_t *mem, Module **keep,
                char *err, size_t errlen) {
  int rc = run_part(x, 2, sp, m, err, errlen);
  if (!rc) rc = run_part(x, 3, sp, m, err, errlen);
  if (!rc) rc = timing_predict(m, x->hw, c->ga, t, err, errlen);
  if (!rc) *mem = memory_rank_peak(m, x->target);   /* passes/memory_rank.c */
  if (!rc && keep) *keep = m;
  else module_free(m);
  return rc;
}

/* back() for a screening compile: only its step and memory, each function lowered only
   when the memo does not know it (see "compiling a candidate").  m is freed. */
static int back_screen(Ctx *x, const Cand *c, const RunSpec *sp, Module *m, double *step_s, int64_t *mem, char *err,
                       size_t errlen) {
  int rc = run_part(x, 2, sp, m, err, errlen);
  if (rc) {
    module_free(m);
    return rc;
  }
  TrainSettings ts;
  PassOptions opt;
  plan_options(x, sp, &ts, &opt);
  return lower_memo_predict(x->memo, m, x->passes[3], &opt, x->hw, c->ga, step_s, mem, err, errlen);
}

static void count_compile(Ctx *x) {
  pthread_mutex_lock(&x->lock);
  x->compiles++;
  pthread_mutex_unlock(&x->lock);
}

/* Compiles c with `layers` layers; its predicted step and memory.  2 when the layout is
   not one loom can build (the message says why), 1 on a failure.  *counted: whether it
   is a compile the count has (the spec was valid); the caller counts it. */
static int compile_one(Ctx *x, const Cand *c, int64_t layers, StepTime *t, int64_t *mem, Module **keep, char *err,
                       size_t errlen, bool *counted) {
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack; one per call (screening threads) */
  if (!sp) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  *sp = *x->base;
  int rc = cand_spec(x, c, layers, sp, err, errlen);
  *counted = !rc;
  if (rc) {
    free(sp);
    return rc;
  }
  Module *m = NULL, *shared = NULL;
  int pin;
  rc = front_middle(x, sp, &shared, &pin, err, errlen);
  /* a module kept for the caller holds names of its own */
  if (!rc && keep && pin >= 0 && !(m = module_clone(shared, false))) rc = EXIT_RUN, snprintf(err, errlen, "out of memory");
  if (m) module_free(shared);
  else m = shared;
  if (!rc) rc = back(x, c, sp, m, t, mem, keep, err, errlen);
  unpin(x, pin);
  free(sp);
  return rc;
}

/* A pruned candidate that the exact phase reached after all: screened as the screening
   would have (the same compiles give the same figures; LOOM_PLAN_CHECK holds the screening's
   shared lowering to them).  A refusal makes it the last of all, never taken. */
static int screen_layers(const Cand *c, int64_t L, int64_t out[2]);
static void extrapolate(Cand *c, int64_t L, const int64_t ls[2], int nl, const double st[2], const int64_t m[2]);

static void resolve(Ctx *x, Cand *c, int64_t L, const Hardware *hw, int *refused, char *first_refusal) {
  int64_t ls[2], m[2] = {0, 0};
  int nl = screen_layers(c, L, ls), rc = 0;
  double st[2] = {0, 0};
  char err[IR_ERR_LEN];
  for (int j = 0; j < nl && !rc; j++) {
    StepTime t;
    bool counted = false;
    rc = compile_one(x, c, ls[j], &t, &m[j], NULL, err, sizeof err, &counted);
    if (counted) x->compiles++;
    st[j] = t.step_s;
  }
  c->pruned = false;
  if (rc) {
    if (!(*refused)++) snprintf(first_refusal, IR_ERR_LEN, "%s", err);
    c->step_s = c->mem = INFINITY, c->fits = false;
    return;
  }
  extrapolate(c, L, ls, nl, st, m);
  c->fits = c->mem <= hw->mem_bytes;
}

/* The exact phase's whole compiles, several at once (each thread takes the next): their
   results are looked at in order, and compiles after the last one looked at are dropped
   uncounted, so the table and the count are the one-at-a-time loop's. */
typedef struct {
  Ctx *x;
  const Cand *c;
  int64_t L;
  StepTime t;
  int64_t mem;
  int rc;
  bool counted;
  char err[IR_ERR_LEN];
} Whole;

static void *whole_worker(void *arg) {
  Whole *j = arg;
  j->rc = compile_one(j->x, j->c, j->L, &j->t, &j->mem, NULL, j->err, sizeof j->err, &j->counted);
  return NULL;
}

/* Screening: each candidate compiled with 1 and 2 layers a chunk (or whole when that is as
   small), its step and memory extrapolated to the model's layers a chunk.  A thread takes a
   family at a time: the candidates of a round that differ only in their pipeline schedule,
   which share the front and middle parts of every compile with the same layers. */
typedef struct {
  Ctx *x;
  Cand *cs;
  bool *bad;
  char (*why)[IR_ERR_LEN];
  int *order;         /* the candidates of this round, families consecutive */
  int *fam;           /* family f: order[fam[f] .. fam[f + 1]) */
  int *fam_run;       /* the families in the order threads take them: the costliest first */
  int n, n_fam, next;
  int64_t L;
  const Hardware *hw;
  pthread_mutex_t lock;
  /* the progress line (standard error, a terminal only): candidates screened of n_all */
  bool tty;
  int screened, n_all;
  double t0, shown;
  /* pruning: the keep best screened steps of candidates that fit, ascending; the exact
     phase stops once it has compiled keep that fit whole, so a candidate whose lower bound
     exceeds the last of them is not reached (unless those do not fit when compiled whole) */
  double *best;
  int keep, n_best, n_pruned;
  bool check;   /* LOOM_PLAN_CHECK: screen everything, and stop if a bound exceeds its step */
} Screen;

/* Does b belong to a's family (the same layout, batch and recomputation, any schedule)? */
static bool same_family(const Cand *a, const Cand *b) {
  return a->dp == b->dp && a->tp == b->tp && a->cp == b->cp && a->pp == b->pp && a->ep == b->ep && a->zero == b->zero &&
         a->sp == b->sp && a->batch == b->batch && a->ga == b->ga && a->rc == b->rc;
}

/* A family's compiles with the same layers: the front and middle parts, made once. */
typedef struct {
  int64_t layers;
  Module *m;        /* NULL once the last compile took it */
  int rc, left;     /* left: compiles still to use it */
  int pin;          /* the front entry m's names are (front) */
  char err[IR_ERR_LEN];
} Shared;

/* The layers of candidate c's screening compiles: 1 or 2 entries. */
static int screen_layers(const Cand *c, int64_t L, int64_t out[2]) {
  int64_t chunks = c->pp * c->v;
  /* Two layers a chunk or more already: the model itself is as cheap to compile.  (Not 1
     layer a chunk first for pruning: the model's chunks are balanced by the pipeline pass,
     the last one holding fewer layers beside the head, so the bound does not hold for it;
     LOOM_PLAN_CHECK found a pp=8 model 4% under it.) */
  if (2 * chunks >= L) {
    out[0] = L;
    return 1;
  }
  out[0] = chunks, out[1] = 2 * chunks;
  return 2;
}

/* A candidate's screened step and memory from its compiles' (screen_layers' layers): the
   model's own when its compile is the model, else extrapolated linearly in the layers a
   chunk holds. */
static void extrapolate(Cand *c, int64_t L, const int64_t ls[2], int nl, const double st[2], const int64_t m[2]) {
  if (ls[nl - 1] == L) {
    c->step_s = st[nl - 1], c->mem = (double)m[nl - 1];
    return;
  }
  double kk = (double)L / (double)(c->pp * c->v) - 1;
  c->step_s = st[0] + kk * (st[1] - st[0]);
  c->mem = (double)m[0] + kk * (double)(m[1] - m[0]);
}

/* ---- pruning ----
   A candidate of two screening compiles is first compiled with 1 layer a chunk (step T1).
   Each further layer a chunk adds v layers to every rank: at least their matmul and
   attention FLOPs at the device's best peak and efficiency (the time model runs a rank's
   compute on one clock and charges every matmul at least that), so its screened step
   T1 + k (T2 - T1), k = L / (pp v) - 1, is at least T1 + k v F / (peak eff), F a layer's
   FLOPs per rank per step: the layer's forward and backward for one sequence (layer_seconds)
   times the sequences of a step over the ranks that split a layer, dp x ep x tp x cp
   (recomputation only adds).  When that bound exceeds the keep-th best step screened so far
   among the candidates that fit, the candidate cannot be among the keep that the exact
   phase compiles whole: its second compile is skipped and the bound kept as its step, so that it
   sorts after them; should the exact phase reach it after all (those before it not fitting
   when compiled whole), it is screened in full then (resolve).  The table is the one the
   unpruned search prints.  LOOM_PLAN_CHECK=1 prunes nothing and stops if a bound exceeds
   its candidate's screened step. */
static double lower_bound(const Screen *w, const Cand *c, double t1) {
  double k = (double)w->L / (double)(c->pp * c->v) - 1;
  double seqs = (double)c->batch * (double)c->ga / (double)(c->dp * c->ep * c->tp * c->cp);
  return t1 + k * (double)c->v * seqs * w->x->layer_s;
}

static double threshold(const Screen *w) { return w->n_best < w->keep ? INFINITY : w->best[w->keep - 1]; }

/* Under w->lock: a screened candidate's step among the keep best. */
static void note_best(Screen *w, const Cand *c) {
  if (c->pruned || !c->fits || c->step_s >= threshold(w)) return;
  int at = w->n_best < w->keep ? w->n_best++ : w->keep - 1;
  while (at > 0 && w->best[at - 1] > c->step_s) w->best[at] = w->best[at - 1], at--;
  w->best[at] = c->step_s;
}

/* A compile a pruned candidate does not make: the family's shared module of those layers
   is freed when no other compile needs it. */
static void skip_shared(Shared *sh, int n_sh, int64_t layers) {
  for (int s = 0; s < n_sh; s++)
    if (sh[s].layers == layers && --sh[s].left == 0) module_free(sh[s].m), sh[s].m = NULL;
}

/* One screening compile of c with `layers` layers, its front and middle from the family's sh. */
static int screen_compile(Screen *w, const Cand *c, int64_t layers, Shared *sh, int n_sh, RunSpec *sp, double *step_s,
                          int64_t *mem, char *err) {
  Ctx *x = w->x;
  int rc = cand_spec(x, c, layers, sp, err, IR_ERR_LEN);
  if (rc) return rc;
  Shared *s = sh;
  while (s->layers != layers && s < sh + n_sh - 1) s++;
  if (!s->m && !s->rc) s->rc = front_middle(x, sp, &s->m, &s->pin, s->err, sizeof s->err);
  Module *m = NULL;
  if (s->rc) {
    snprintf(err, IR_ERR_LEN, "%s", s->err);
    rc = s->rc;
  } else if (--s->left == 0) {   /* the last compile takes it */
    m = s->m, s->m = NULL;
  } else if (!(m = module_clone(s->m, true))) {
    snprintf(err, IR_ERR_LEN, "out of memory");
    rc = EXIT_RUN;
  }
  if (!rc && getenv("LOOM_PLAN_CHECK")) {   /* developer check: the memo's figures are a whole lowering's */
    Module *copy = module_clone(m, true);
    StepTime t;
    int64_t mm = 0;
    char e2[IR_ERR_LEN];
    int r2 = copy ? back(x, c, sp, copy, &t, &mm, NULL, e2, sizeof e2) : EXIT_RUN;
    rc = back_screen(x, c, sp, m, step_s, mem, err, IR_ERR_LEN);
    if (r2 != rc || (!rc && (t.step_s != *step_s || mm != *mem))) {
      fprintf(stderr, "LOOM_PLAN_CHECK: rc %d/%d step %.17g/%.17g mem %lld/%lld\n", rc, r2, *step_s, t.step_s,
              (long long)*mem, (long long)mm);
      abort();
    }
  } else if (!rc) {
    rc = back_screen(x, c, sp, m, step_s, mem, err, IR_ERR_LEN);
  }
  count_compile(x);
  return rc;
}

static uint64_t cand_key(const Cand *c, int rc, int64_t batch);

/* A family's compile cost, roughly: its compiles' layers, each the heavier for cp's ring. */
static double family_cost(const Screen *w, int f) {
  double cost = 0;
  for (int k = w->fam[f]; k < w->fam[f + 1]; k++) {
    const Cand *c = &w->cs[w->order[k]];
    int64_t ls[2];
    int nl = screen_layers(c, w->L, ls);
    for (int j = 0; j < nl; j++) cost += (double)ls[j] * (double)(4 + c->cp);
  }
  return cost;
}

typedef struct {
  double cost;
  int f;
} Costed;

static int by_cost(const void *a, const void *b) {   /* costliest first; ties in family order */
  const Costed *x = a, *y = b;
  return x->cost != y->cost ? (x->cost < y->cost ? 1 : -1) : x->f - y->f;
}

/* The round's candidates rc[0..nr) in families (w->order, w->fam: in the order of their
   first candidates, members in candidate order) and the order threads take them (run):
   the costliest first, so that the last to finish is a small one. */
static int families(Screen *w, const Cand *cs, const int *rc, int nr, int *run) {
  int cap = 16;
  while (cap < 2 * nr) cap *= 2;
  int *slot = malloc(sizeof(int) * (size_t)cap), *fam_of = malloc(sizeof(int) * ((size_t)nr + 1));
  int *count = calloc((size_t)nr + 1, sizeof(int));
  Costed *cost = malloc(sizeof(Costed) * ((size_t)nr + 1));
  if (!slot || !fam_of || !count || !cost) {
    free(slot), free(fam_of), free(count), free(cost);
    return -1;
  }
  for (int k = 0; k < cap; k++) slot[k] = -1;
  int nf = 0, *first = run;   /* run holds each family's first candidate until the end */
  for (int a = 0; a < nr; a++) {   /* a family's key: the candidate without its schedule */
    const Cand *c = &cs[rc[a]];
    Cand k = *c;
    k.sched = 0, k.v = 0;
    int at = (int)(cand_key(&k, c->rc, c->batch) & (uint64_t)(cap - 1));
    while (slot[at] >= 0 && !same_family(&cs[rc[first[slot[at]]]], c)) at = (at + 1) & (cap - 1);
    if (slot[at] < 0) slot[at] = nf, first[nf++] = a;
    fam_of[a] = slot[at], count[slot[at]]++;
  }
  w->n_fam = nf, w->n = nr, w->next = 0;
  w->fam[0] = 0;
  for (int f = 0; f < nf; f++) w->fam[f + 1] = w->fam[f] + count[f], count[f] = w->fam[f];
  for (int a = 0; a < nr; a++) w->order[count[fam_of[a]]++] = rc[a];
  for (int f = 0; f < nf; f++) cost[f] = (Costed){family_cost(w, f), f};
  qsort(cost, (size_t)nf, sizeof *cost, by_cost);
  for (int f = 0; f < nf; f++) run[f] = cost[f].f;
  free(slot), free(fam_of), free(count), free(cost);
  return 0;
}

static void *screen_worker(void *arg) {
  Screen *w = arg;
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack; cand_spec sets a candidate's fields */
  if (sp) *sp = *w->x->base;
  for (;;) {
    pthread_mutex_lock(&w->lock);
    int f = w->next < w->n_fam ? w->fam_run[w->next] : w->n_fam;
    w->next++;
    pthread_mutex_unlock(&w->lock);
    if (f >= w->n_fam) break;
    Shared *sh = malloc(sizeof *sh * 2 * (size_t)(w->fam[f + 1] - w->fam[f]));
    if (!sh || !sp) {
      for (int k = w->fam[f]; k < w->fam[f + 1]; k++)
        w->bad[w->order[k]] = true, snprintf(w->why[w->order[k]], IR_ERR_LEN, "out of memory");
      free(sh);
      continue;
    }
    /* the family's layer counts, and how many compiles use each */
    int n_sh = 0;
    for (int k = w->fam[f]; k < w->fam[f + 1]; k++) {
      int64_t ls[2];
      int nl = screen_layers(&w->cs[w->order[k]], w->L, ls);
      for (int j = 0; j < nl; j++) {
        int s = 0;
        while (s < n_sh && sh[s].layers != ls[j]) s++;
        if (s == n_sh) sh[n_sh++] = (Shared){.layers = ls[j], .pin = -1};
        sh[s].left++;
      }
    }
    for (int k = w->fam[f]; k < w->fam[f + 1]; k++) {
      int i = w->order[k];
      Cand *c = &w->cs[i];
      int64_t ls[2];
      int nl = screen_layers(c, w->L, ls);
      double st[2];
      int64_t m[2] = {0, 0};
      double lb = 0;
      w->bad[i] = false;
      c->pruned = false;
      for (int j = 0; j < nl && !w->bad[i]; j++) {
        if (j == 1 && w->x->layer_s > 0) {
          lb = lower_bound(w, c, st[0]);
          pthread_mutex_lock(&w->lock);
          /* far out of memory at 1 layer a chunk already: the exact phase never takes it */
          bool prune = !w->check && (lb > threshold(w) || (double)m[0] > 1.5 * w->hw->mem_bytes);
          pthread_mutex_unlock(&w->lock);
          if (prune) {   /* memory grows with the layers: its 1-layer figure is a lower bound too */
            c->pruned = true, c->step_s = lb, c->mem = (double)m[0], c->fits = false;
            skip_shared(sh, n_sh, ls[1]);
            break;
          }
        }
        w->bad[i] = screen_compile(w, c, ls[j], sh, n_sh, sp, &st[j], &m[j], w->why[i]) != 0;
      }
      if (!w->bad[i] && !c->pruned) {
        extrapolate(c, w->L, ls, nl, st, m);
        c->fits = c->mem <= w->hw->mem_bytes;
        if (w->check && nl == 2 && (lb > c->step_s * (1 + 1e-9) || (double)m[0] > c->mem * (1 + 1e-9))) {
          char lay[160];
          layout_text(c, lay, sizeof lay);
          fprintf(stderr, "LOOM_PLAN_CHECK: %s: bound %.17g > step %.17g, or 1-layer memory %lld > %.17g\n", lay, lb,
                  c->step_s, (long long)m[0], c->mem);
          abort();
        }
      }
      pthread_mutex_lock(&w->lock);
      if (!w->bad[i]) note_best(w, c);
      w->n_pruned += c->pruned;
      w->screened++;
      double now = now_s();
      if (w->tty && now - w->shown >= 0.5) {   /* the progress line, twice a second at most */
        w->shown = now;
        fprintf(stderr, "\rloom plan: screened %d of at most %d candidates (%d compiles, %.0f s)", w->screened, w->n_all,
                w->x->compiles, now - w->t0);
        fflush(stderr);
      }
      pthread_mutex_unlock(&w->lock);
    }
    for (int s = 0; s < n_sh; s++) module_free(sh[s].m), unpin(w->x, sh[s].pin);   /* the copies of it are freed */
    free(sh);
  }
  free(sp);
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

/* A candidate's layout, recomputation and batch as a key (the candidates are unique by it). */
static uint64_t cand_key(const Cand *c, int rc, int64_t batch) {
  int64_t f[] = {c->dp, c->tp, c->cp, c->pp, c->v, c->ep, c->zero, c->sched, c->sp, rc, batch};
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) h = (h ^ (uint64_t)f[k]) * UINT64_C(0x100000001b3), h ^= h >> 29;
  return h;
}

static bool same_cand(const Cand *a, const Cand *b, int rc, int64_t batch) {
  return a->dp == b->dp && a->tp == b->tp && a->cp == b->cp && a->pp == b->pp && a->v == b->v && a->ep == b->ep &&
         a->zero == b->zero && a->sched == b->sched && a->sp == b->sp && a->rc == rc && a->batch == batch;
}

/* half[i]: the candidate like i with half its batch; none[i]: like i without recomputation
   (i recomputes); -1 where there is none.  A hash of the candidates by cand_key. */
static int siblings(const Cand *cs, int n, int *half, int *none) {
  int cap = 16;
  while (cap < 2 * n) cap *= 2;
  int *slot = malloc(sizeof(int) * (size_t)cap);
  if (!slot) return -1;
  for (int k = 0; k < cap; k++) slot[k] = -1;
  for (int j = 0; j < n; j++) {
    int at = (int)(cand_key(&cs[j], cs[j].rc, cs[j].batch) & (uint64_t)(cap - 1));
    while (slot[at] >= 0) at = (at + 1) & (cap - 1);
    slot[at] = j;
  }
  for (int i = 0; i < n; i++) {
    const Cand *c = &cs[i];
    half[i] = none[i] = -1;
    for (int q = 0; q < 2; q++) {   /* the last such candidate, as a scan in index order finds */
      int rc = q ? RECOMPUTE_NONE : c->rc;
      int64_t batch = q ? c->batch : c->batch / 2;
      if ((q && c->rc == RECOMPUTE_NONE) || (!q && c->batch % 2)) continue;
      int *out = q ? &none[i] : &half[i];
      for (int at = (int)(cand_key(c, rc, batch) & (uint64_t)(cap - 1)); slot[at] >= 0; at = (at + 1) & (cap - 1))
        if (same_cand(&cs[slot[at]], c, rc, batch) && slot[at] > *out) *out = slot[at];
    }
  }
  free(slot);
  return 0;
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
  static Ctx x;   /* large (the cache): not on the stack */
  x = (Ctx){.base = &base, .hw = &hw, .target = target, .lock = PTHREAD_MUTEX_INITIALIZER, .quiet = fopen("/dev/null", "w"),
            .memo = lower_memo_new()};
  if (!x.memo) {
    free(cs);
    ctx_free(&x);
    return report(EXIT_RUN, "out of memory");
  }
  split_passes(&x);
  blas_threads_stop();
  double t_start = now_s();
  layer_seconds(&x);
  int kept = 0, refused = 0;
  char first_refusal[IR_ERR_LEN] = "";
  /* screening on every core: candidates are independent compiles */
  /* Rounds, so that screened figures prune what cannot win:
     - recomputation never makes a step faster (it adds work to save memory), so a layout
       with it is screened only where the same layout without it was refused or does not fit
       (first every candidate without recomputation, or with the one --recompute fixes);
     - memory grows with the micro-batch, so a layout whose half micro-batch already needs
       more than 1.5 x the device (far out, as the exact phase judges) is not screened.
     A candidate without recomputation (phase 0) whose micro-batch per rank is 2^k is
     screened in round k, one with it (phase 1) in round k + 1: after those it depends on
     (the half micro-batch's in the round before, the same layout's without recomputation
     in the round before), beside the next phase-0 ones (fewer, fuller rounds). */
  int *order = malloc(sizeof(int) * (size_t)(n + 1)), *half = malloc(sizeof(int) * (size_t)(n + 1));
  int *none = malloc(sizeof(int) * (size_t)(n + 1)), *round_c = malloc(sizeof(int) * (size_t)(n + 1));
  int *fam = malloc(sizeof(int) * (size_t)(n + 1)), *fam_run = malloc(sizeof(int) * (size_t)(n + 1));
  bool *skip = calloc((size_t)n + 1, 1), *far = calloc((size_t)n + 1, 1);
  Screen w = {.x = &x, .cs = cs, .bad = calloc((size_t)n + 1, 1), .why = calloc((size_t)n + 1, IR_ERR_LEN), .order = order,
              .fam = fam, .fam_run = fam_run, .L = L, .hw = &hw, .lock = PTHREAD_MUTEX_INITIALIZER, .tty = isatty(STDERR_FILENO) == 1,
              .n_all = n, .t0 = t_start, .shown = t_start, .keep = 2 * top, .best = malloc(sizeof(double) * 2 * (size_t)top),
              .check = getenv("LOOM_PLAN_CHECK") != NULL};
  if (!w.bad || !w.why || !w.best || !order || !skip || !far || !half || !none || !round_c || !fam || !fam_run) {
    free(w.bad), free(w.why), free(w.best), free(cs), free(order), free(skip), free(far), free(half), free(none), free(round_c);
    free(fam), free(fam_run);
    ctx_free(&x);
    return report(EXIT_RUN, "out of memory");
  }
  /* siblings: the same layout with half the micro-batch, and without recomputation */
  if (siblings(cs, n, half, none)) {
    free(w.bad), free(w.why), free(w.best), free(cs), free(order), free(skip), free(far), free(half), free(none), free(round_c);
    free(fam), free(fam_run);
    ctx_free(&x);
    return report(EXIT_RUN, "out of memory");
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores, skipped = 0;
  if (getenv("LOOM_THREADS")) nt = atoi(getenv("LOOM_THREADS")) > 0 ? atoi(getenv("LOOM_THREADS")) : nt;
  /* Round -1 screens seeds first, so that pruning has a threshold from the start: the pure
     dp layouts without recomputation (no pipeline bubble, no tp or cp traffic: often among
     the fastest that fit).  In their own rounds the rules above still skip them (a seed so
     skipped is dropped, as if never screened); the others are not screened again. */
  bool *done = calloc((size_t)n + 1, 1);
  if (!done) {
    free(w.bad), free(w.why), free(w.best), free(cs), free(order), free(skip), free(far), free(half), free(none), free(round_c);
    free(fam), free(fam_run);
    ctx_free(&x);
    return report(EXIT_RUN, "out of memory");
  }
  for (int round = -1; round < 128; round++) {
    int nr = 0;
    for (int i = 0; i < n; i++) {
      const Cand *c = &cs[i];
      if (round < 0) {
        if (c->tp == 1 && c->cp == 1 && c->pp == 1 && c->ep == 1 && (fix_rc >= 0 || c->rc == RECOMPUTE_NONE))
          round_c[nr++] = i, done[i] = true;
        continue;
      }
      int phase = fix_rc >= 0 || c->rc == RECOMPUTE_NONE ? 0 : 1, level = 0;
      for (int64_t m = c->batch / (c->dp * c->ep); m > 1; m /= 2) level++;
      if (level + phase != round) continue;
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
      if (done[i]) continue;
      if (o >= 0 && !skip[o] && !w.bad[o] && cs[o].pruned) {   /* recomputation is no faster: o's bound is i's */
        cs[i].pruned = true, cs[i].step_s = cs[o].step_s, cs[i].mem = 0, cs[i].fits = false;
        w.n_pruned++;
        continue;
      }
      round_c[nr++] = i;
    }
    if (!nr) continue;
    if (families(&w, cs, round_c, nr, fam_run)) {
      free(done), free(w.bad), free(w.why), free(w.best), free(cs), free(order), free(skip), free(far), free(half), free(none), free(round_c);
      free(fam), free(fam_run);
      ctx_free(&x);
      return report(EXIT_RUN, "out of memory");
    }
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < nt && t < 64 && t < w.n_fam; t++)
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
            "layout fits without it, or a micro-batch twice one far out of memory; %d of those screened stopped at 1 layer a "
            "chunk: a lower bound on their step over the slowest of the %d best\n", n - skipped, x.compiles, nt, now_s() - t_start, skipped,
            w.n_pruned, 2 * top);
  free(w.bad), free(w.why), free(w.best), free(order), free(skip), free(far), free(half), free(none), free(round_c), free(fam),
      free(fam_run), free(done);
  if (!json) fprintf(stderr, "\n");
  n = kept;
  qsort(cs, (size_t)n, sizeof *cs, cmp_step);

  /* ---- exact: compile the best 2 x top whole (the screening's order is close, not exact),
     then rank those that fit by their exact step ---- */
  int shown = 0, closest = -1, exact_n = 0, n_jobs = 0, next_job = 0;
  Cand *best = malloc(sizeof *best * (size_t)(2 * top));
  Whole *jobs = malloc(sizeof *jobs * (size_t)(nt < 16 ? nt : 16));
  if (!best || !jobs) {
    free(cs), free(best), free(jobs);
    ctx_free(&x);
    return report(EXIT_RUN, "out of memory");
  }
  for (int i = 0; i < n && exact_n < 2 * top; i++) {
    Cand *c = &cs[i];
    if (c->pruned && c->mem > 1.5 * hw.mem_bytes) continue;   /* far out of memory: its figure is a lower bound */
    if (c->pruned) {   /* reached after all: screened in full, then the rest sorted again */
      if (getenv("LOOM_PLAN_DEBUG")) {
        char lay[160];
        layout_text(c, lay, sizeof lay);
        fprintf(stderr, "pruned, reached: %s (bound %.2f ms), screened in full\n", lay, c->step_s * 1e3);
      }
      resolve(&x, c, L, &hw, &refused, first_refusal);
      qsort(cs + i, (size_t)(n - i), sizeof *cs, cmp_step);
      i--;
      continue;
    }
    if (!c->fits && c->mem > 1.5 * hw.mem_bytes) continue;   /* screened far out of memory */
    if (next_job == n_jobs) {   /* the next few such candidates, compiled at once (up to a pruned one) */
      n_jobs = next_job = 0;
      for (int k = i; k < n && !(cs[k].pruned && cs[k].mem <= 1.5 * hw.mem_bytes) && n_jobs < (nt < 16 ? nt : 16) && n_jobs < 2 * top - exact_n; k++)
        if (cs[k].fits || cs[k].mem <= 1.5 * hw.mem_bytes) jobs[n_jobs++] = (Whole){.x = &x, .c = &cs[k], .L = L};
      pthread_t th[16];
      int started = 0;
      for (int k = 1; k < n_jobs; k++)
        if (!pthread_create(&th[started], NULL, whole_worker, &jobs[k])) started++;
        else whole_worker(&jobs[k]);
      whole_worker(&jobs[0]);
      for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    }
    Whole *j = &jobs[next_job++];
    int64_t mem = j->mem;
    c->t = j->t;
    if (j->counted) x.compiles++;
    if (j->rc) {
      if (!refused++) snprintf(first_refusal, sizeof first_refusal, "%s", j->err);
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
  if (closest < 0 && !exact_n)   /* nothing compiled whole: the screening's least memory, every candidate's */
    for (int i = 0; i < n; i++)
      if (cs[i].pruned) resolve(&x, &cs[i], L, &hw, &refused, first_refusal);
  if (closest < 0)
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
    free(cs), free(best), free(jobs);
    ctx_free(&x);
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
    int n_pruned = 0;
    for (int i = 0; i < n; i++) n_pruned += cs[i].pruned;
    printf("%d candidates (%d stopped at a lower bound), %d not buildable, %d compiles in %.2f s; the best %d, compiled "
           "whole:\n", n + refused, n_pruned, refused, x.compiles, elapsed, shown);
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
      bool counted;
      rc = compile_one(&x, c, L, &t, &mem, &m, err, sizeof err, &counted);
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
  free(cs), free(best), free(jobs);
  ctx_free(&x);
  return report(rc, err);
}
