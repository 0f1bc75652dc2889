/* driver/plan_compile.c — compiling a candidate of `loom plan` in parts that candidates share
 * (plan_internal.h, "compiling a candidate"), and the figures the searches take from it.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver/plan_internal.h"
#include "frontend/build.h"
#include "ir/schedule.h"
#include "driver/driver.h"   /* spec_train_settings */


/* OpenBLAS starts its worker threads when it is loaded, before main, and they spin for about
   0.1 s waiting for work that loom never gives them (runtime/cpu/cpu_gemm.c calls BLAS on one
   thread, and the planner not at all): on a 2-core machine a core taken from the planner's
   first tenth of a second, 5-10% of a small plan.  Stopped with OpenBLAS's own hook (the one
   it runs before a fork), looked up by name: with another BLAS nothing happens. */
void blas_threads_stop(void) {
  void *sym = dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
  int (*stop)(void) = NULL;
  memcpy(&stop, &sym, sizeof stop);
  if (stop) stop();
}

void unpin(Ctx *x, int pin) {
  if (pin < 0) return;
  pthread_mutex_lock(&x->lock);
  x->front[pin].users--;
  pthread_mutex_unlock(&x->lock);
}

void ctx_free(Ctx *x) {
  for (int i = 0; i < FRONT_CACHE; i++) module_free(x->front[i].m), x->front[i].m = NULL;
  lower_memo_free(x->memo), x->memo = NULL;   /* x->stash: the fast search's, freed by plan.c (its owner) */
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
int cand_spec(const Ctx *x, const Cand *c, int64_t layers, RunSpec *sp, char *err, size_t errlen) {
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
    return IR_ERUN;
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
int front_middle(Ctx *x, const RunSpec *sp, Module **out, int *pin, char *err, size_t errlen) {
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
/* The grad_step FLOPs of sp's trained module with `layers` layers, batch 1, one rank,
   nothing recomputed (as `loom ir --passes=train --flops` counts them); -1 when it cannot
   be built. */
static double grad_flops(Ctx *x, RunSpec *sp, int64_t layers) {
  *sp = *x->base;
  sp->model.n_layer = layers;
  for (int a = 0; a < MESH_AXES; a++) sp->mesh[a] = 1;
  sp->batch = 1, sp->grad_accum = 1, sp->zero = 0, sp->sequence_parallel = false;
  sp->recompute = RECOMPUTE_NONE, sp->pp_schedule = 0, sp->pp_virtual = 0, sp->n_pp_split = 0;
  char err[IR_ERR_LEN];
  Module *m = NULL;
  bool ok = !spec_validate(sp, err, sizeof err) && !frontend_build(sp, "plan", &m, err, sizeof err) &&
            !run_part(x, 0, sp, m, err, sizeof err);
  const Func *g = ok ? module_find_func(m, "grad_step") : NULL;
  double mm = 0, at = 0;
  if (g) flops_of(g, &mm, &at);
  module_free(m);
  return g ? mm + at : -1;
}

void layer_seconds(Ctx *x) {
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack */
  if (!sp) return;
  double f[2] = {grad_flops(x, sp, 1), grad_flops(x, sp, 2)};
  bool ok = f[0] >= 0 && f[1] >= 0;
  /* the model's own FLOPs (MFU's numerator): its whole trained module, which costs about
     as much as one screening compile and holds whatever differs between its layers */
  int64_t L = x->base->model.n_layer;
  x->seq_flops = L == 1 ? f[0] : L == 2 ? f[1] : grad_flops(x, sp, L);
  if (x->seq_flops < 0) x->seq_flops = 0;
  x->layer_flops = ok ? f[1] - f[0] : 0;
  free(sp);
  double peak = 0;
  for (int d = 0; d < DT_COUNT; d++)
    if (d != DT_F8E4M3 && d != DT_F8E5M2 && x->hw->peak_flops[d] > peak) peak = x->hw->peak_flops[d];
  double eff = x->hw->eff_matmul > x->hw->eff_attention ? x->hw->eff_matmul : x->hw->eff_attention;
  x->layer_s = ok && f[1] > f[0] && peak > 0 && eff > 0 ? (f[1] - f[0]) / (peak * eff) : 0;
}

/* The back part on m (taken: freed, or kept in *keep), then c's predicted step and memory. */
int back(Ctx *x, const Cand *c, const RunSpec *sp, Module *m, StepTime *t, int64_t *mem, Module **keep,
                char *err, size_t errlen) {
  int rc = run_part(x, 2, sp, m, err, errlen);
  if (!rc) rc = run_part(x, 3, sp, m, err, errlen);
  if (!rc) rc = timing_predict(m, x->hw, c->ga, t, err, errlen);
  if (!rc) *mem = memory_rank_peak(m, x->target);   /* passes/memory_rank.c */
  if (!rc && keep) *keep = m;
  else module_free(m);
  return rc;
}

/* 4 bytes an element of f's results from the skip-th on (ir/schedule.c's rets_bytes). */
static int64_t results_bytes(const Module *m, const char *pre, int c, int skip) {
  char name[64];
  snprintf(name, sizeof name, "%s.c%d", pre, c);
  const Func *f = module_find_func(m, name);
  int64_t b = 0;
  for (int i = skip; f && i < f->rets.n; i++) b += 4 * type_numel(&((const Value *)f->rets.items[i])->type);
  return b;
}

/* m's stash a chunk after the pipeline pass, as pipe_stash_peaks counts it. */
static void chunk_stash(const Module *m, ChunkStash *st) {
  *st = (ChunkStash){0};
  int C = m->pipe.kind ? (int)m->pipe.chunks : 0;
  if (C < 3) return;   /* no interior chunk: not one to learn from (plan_stash.c's bounds hold them equal) */
  bool split = m->pipe.kind == PIPE_ZBH1 || m->pipe.kind == PIPE_DUALPIPEV;
  st->ok = true;
  for (int c = 0; c < C; c++) {
    int k = c == 0 ? 0 : c == C - 1 ? 2 : 1;
    int64_t f = results_bytes(m, "fwd", c, c == C - 1), w = split ? results_bytes(m, "bwd_b", c, 0) : 0;
    if (k == 1 && c > 1 && (f != st->f[1] || w != st->w[1])) st->ok = false;
    st->f[k] = f, st->w[k] = w;
  }
}

/* back() for a screening compile: only its step and memory, each function lowered only
   when the memo does not know it (see "compiling a candidate").  m is freed. */
int back_screen(Ctx *x, const Cand *c, const RunSpec *sp, Module *m, double *step_s, int64_t *mem, ChunkStash *stash,
                char *err, size_t errlen) {
  int rc = run_part(x, 2, sp, m, err, errlen);
  if (rc) {
    module_free(m);
    return rc;
  }
  if (stash) chunk_stash(m, stash);
  TrainSettings ts;
  PassOptions opt;
  plan_options(x, sp, &ts, &opt);
  return lower_memo_predict(x->memo, m, x->passes[3], &opt, x->hw, c->ga, step_s, mem, err, errlen);
}

void count_compile(Ctx *x) {
  pthread_mutex_lock(&x->lock);
  x->compiles++;
  pthread_mutex_unlock(&x->lock);
}

/* Compiles c with `layers` layers; its predicted step and memory.  2 when the layout is
   not one loom can build (the message says why), 1 on a failure.  *counted: whether it
   is a compile the count has (the spec was valid); the caller counts it. */
int compile_one(Ctx *x, const Cand *c, int64_t layers, StepTime *t, int64_t *mem, Module **keep, char *err,
                       size_t errlen, bool *counted) {
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack; one per call (screening threads) */
  if (!sp) {
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
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
  if (!rc && keep && pin >= 0 && !(m = module_clone(shared, false))) rc = IR_ERUN, snprintf(err, errlen, "out of memory");
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

void resolve(Ctx *x, Cand *c, int64_t L, const Hardware *hw, bool stop_far, double m2_lb, int *refused,
             char *first_refusal) {
  int64_t ls[2], m[2] = {0, 0};
  int nl = screen_layers(c, L, ls), rc = 0;
  double st[2] = {0, 0}, lb_first = 0;
  char err[IR_ERR_LEN];
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack */
  if (!sp) rc = IR_ERUN, snprintf(err, sizeof err, "out of memory");
  /* the screening's own compiles: the memo's shared lowering (the same figures, bit for bit:
     LOOM_PLAN_CHECK checks it in the exhaustive search), not a whole lowering */
  for (int j = 0; j < nl && !rc; j++) {
    if (j == 0 && nl == 2 && c->has_first) {   /* its first compile's figures, kept when it was pruned */
      st[0] = c->first_s, m[0] = (int64_t)c->first_mem;
      continue;
    }
    *sp = *x->base;
    rc = cand_spec(x, c, ls[j], sp, err, sizeof err);
    if (rc) break;
    Module *mod = NULL;
    int pin = -1;
    rc = front_middle(x, sp, &mod, &pin, err, sizeof err);
    if (!rc) rc = back_screen(x, c, sp, mod, &st[j], &m[j], NULL, err, sizeof err);
    unpin(x, pin);
    count_compile(x);
    /* far out of memory at 1 layer a chunk already (memory grows with the layers: the
       exhaustive search prunes on the same figure, and LOOM_PLAN_CHECK holds it under the
       screened memory): the exact phase skips it, so the second compile is not made */
    /* or beyond with m2 at least m2_lb (the fast search's stash bound, screen_one's rule):
       m1 + k (m2 - m1), k >= 1 */
    double m1 = (double)m[0], k = (double)L / (double)(c->pp * c->v) - 1;
    double lb = !rc && j == 0 && nl == 2 && m2_lb > m1 ? m1 + k * (m2_lb - m1) : m1;
    if (!rc && j == 0) lb_first = lb;   /* (LOOM_PLAN_CHECK holds it to the screened memory below) */
    if (!rc && stop_far && j == 0 && nl == 2 && lb > 1.5 * hw->mem_bytes && !getenv("LOOM_PLAN_CHECK")) {
      c->pruned = true, c->has_first = true, c->first_s = st[0], c->first_mem = (double)m[0];
      c->mem = lb, c->fits = false;
      free(sp);
      return;
    }
  }
  free(sp);
  c->pruned = false, c->has_first = false;
  if (rc) {
    if (!(*refused)++) snprintf(first_refusal, IR_ERR_LEN, "%s", err);
    c->step_s = c->mem = INFINITY, c->fits = false;
    return;
  }
  double lb = lb_first;
  extrapolate(c, L, ls, nl, st, m);
  c->fits = c->mem <= hw->mem_bytes;
  if (getenv("LOOM_PLAN_CHECK") && nl == 2 && lb > c->mem * (1 + 1e-12)) {
    char lay[160];
    plan_layout_text(c, lay, sizeof lay);
    fprintf(stderr, "LOOM_PLAN_CHECK: %s: memory bound after the first compile %.17g over its screened memory %.17g\n", lay, lb,
            c->mem);
    abort();
  }
}

void *whole_worker(void *arg) {
  Whole *j = arg;
  j->rc = compile_one(j->x, j->c, j->L, &j->t, &j->mem, NULL, j->err, sizeof j->err, &j->counted);
  return NULL;
}

/* The layers of candidate c's screening compiles: 1 or 2 entries. */
int screen_layers(const Cand *c, int64_t L, int64_t out[2]) {
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
void extrapolate(Cand *c, int64_t L, const int64_t ls[2], int nl, const double st[2], const int64_t m[2]) {
  if (ls[nl - 1] == L) {
    c->step_s = st[nl - 1], c->mem = (double)m[nl - 1];
    return;
  }
  double kk = (double)L / (double)(c->pp * c->v) - 1;
  c->step_s = st[0] + kk * (st[1] - st[0]);
  c->mem = (double)m[0] + kk * (double)(m[1] - m[0]);
}
double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void plan_layout_text(const PlanCand *c, char *buf, size_t n) {
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


int ctx_init(Ctx *x, const PlanRequest *rq) {
  *x = (Ctx){.base = rq->base, .hw = rq->hw, .target = rq->target, .quiet = fopen("/dev/null", "w"), .memo = lower_memo_new()};
  pthread_mutex_init(&x->lock, NULL);
  split_passes(x);
  return x->memo && x->quiet ? 0 : IR_ERUN;
}

int plan_compile(const PlanRequest *rq, const PlanCand *c, Module **m, StepTime *t, int64_t *mem, char *err,
                 size_t errlen) {
  static Ctx x;   /* large (the cache): not on the stack */
  if (ctx_init(&x, rq)) {
    ctx_free(&x);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  bool counted;
  int rc = compile_one(&x, c, rq->base->model.n_layer, t, mem, m, err, errlen, &counted);
  ctx_free(&x);
  return rc;
}

int cmp_step(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  /* tokens per step are the same for all: the shorter step is the higher throughput */
  return x->step_s < y->step_s ? -1 : x->step_s > y->step_s;
}

int threads_to_use(void) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores;
  if (getenv("LOOM_THREADS")) nt = atoi(getenv("LOOM_THREADS")) > 0 ? atoi(getenv("LOOM_THREADS")) : nt;
  return nt;
}
