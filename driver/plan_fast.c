/* driver/plan_fast.c — the fast screening of `loom plan` (driver/plan.h): its cost grows with
 * the distinct layer programs, not with the candidates.
 *
 * A candidate's step is a sum over a few kinds of program: its layers (one kind per tp, cp,
 * sequence parallelism and ep), the embedding and head, the optimizer step and the dp
 * collectives.  Each layer program is compiled once (a reference: dp = pp = 1, ZeRO 0, one
 * sequence a rank, nothing recomputed, 1 and 2 layers, lowered whole) and every candidate
 * estimated from its reference:
 *   - a layer's forward and backward per micro-batch: the reference's time a layer x the
 *     micro-batch, x 4/3 with full recomputation (the forward again), x 1.1 selective;
 *   - pp: the schedule (ir/schedule.c) simulated with those chunk costs (forward a third,
 *     backward two, split in halves for zb-h1 and dualpipev; the head on the last chunk):
 *     its makespan holds the bubble, no compile needed;
 *   - dp and ZeRO: the gradients' reduction over dp (ring, over the link dp spans), ZeRO-3's
 *     parameter gathers each micro-batch, the optimizer's state split over dp;
 *   - memory: the reference's state a layer (split as ZeRO splits it) and its activations a
 *     layer x the micro-batch x the micro-batches pp holds in flight.
 * The estimates order the candidates; they are never printed.  The candidates are then
 * screened (compiled with 1 and 2 layers a chunk, the exhaustive search's figures) in the
 * order of their estimates, until the next one's estimate, less a margin, is above the
 * 2 x top-th best screened step that fits; the rest stay "pruned" at that bound (and the
 * exact phase screens one if it reaches it after all, as the exhaustive search does).  So
 * the table is the exhaustive search's wherever the estimates are within the margins of the
 * screened figures; LOOM_PLAN_CHECK=1 runs both searches and compares their tables.
 *
 * Not yet the default (LOOM_PLAN_FAST=1 runs it): the estimates are not yet within the
 * margins.  GPT-2 124M on 8 H100s (0.5M tokens): LOOM_PLAN_CHECK=1 finds the fast table's
 * first row dp=8 mbs=1 ga=64 (209 ms) where the exhaustive search's is dp=8 zero=3 mbs=64
 * (145 ms): the estimates of every layout there are 0.6-0.7 of their screened steps, but not
 * alike (tp=2 layouts looked best), because the layer programs are compiled at dp = 1 and
 * miss what grows with dp: with dp > 1 the partitioned @grad_step holds shard_slice ops whose
 * operand is the whole batch's activation (bf16[512,1024,3072] sliced to [64,1024,3072],
 * 1.08 ms each in the time model; 60 of the 148 ms at dp=8, none at dp=1).  What is left:
 * key the layer programs by dp too (dp = gpus / (tp cp pp ep), so one per pp as well) or
 * derive that term, and calibrate the pipeline chunks' forward/backward split and the
 * recomputation factors against compiled chunks; then make it the default.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver/plan_internal.h"
#include "ir/schedule.h"

/* The margins: a candidate is screened when its estimated step x (1 - STEP_MARGIN) is not
   above the threshold, and set aside as far out of memory only when its estimated memory x
   MEM_MARGIN is above 1.5 x the device (as the exact phase judges "far"). */
#define STEP_MARGIN 0.3
#define MEM_MARGIN 0.4

typedef struct {
  int64_t tp, cp, ep;
  bool sp;
  bool ok;
  /* a: a call's fixed part, b: its part a sequence; layer: a layer's, base: the rest */
  double g_layer_a, g_layer_b, g_base_a, g_base_b;   /* @grad_step, one micro-batch */
  double o_layer, o_base;                            /* @optimizer_step */
  double state_layer, state_base;   /* bytes of state a layer, and the rest */
  double act_layer, act_base;       /* the arena: a layer's activations (one sequence), and the rest */
} LayerProg;

typedef struct {
  LayerProg *p;
  int n, cap;
} Programs;

static LayerProg *program_of(Programs *ps, const Cand *c) {
  for (int i = 0; i < ps->n; i++) {
    LayerProg *p = &ps->p[i];
    if (p->tp == c->tp && p->cp == c->cp && p->ep == c->ep && p->sp == c->sp) return p;
  }
  return NULL;
}

/* The reference compiles of program p: with 1 and 2 layers, each as one micro-batch of one
   sequence a rank, two such micro-batches (grad_accum 2: a micro-batch's time apart from
   the optimizer step's) and one of two sequences (a sequence's part apart from the fixed). */
static void compile_program(Ctx *x, LayerProg *p, int64_t L) {
  double g_a[2] = {0, 0}, g_b[2] = {0, 0}, o[2] = {0, 0}, state[2] = {0, 0}, arena[2] = {0, 0};
  int nl = L >= 2 ? 2 : 1;
  p->ok = true;
  for (int k = 0; k < nl && p->ok; k++) {
    double t[3];
    for (int v = 0; v < 3 && p->ok; v++) {
      Cand ref = {.dp = 1, .tp = p->tp, .cp = p->cp, .pp = 1, .v = 1, .ep = p->ep, .zero = 0, .sched = PIPE_NONE,
                  .rc = RECOMPUTE_NONE, .sp = p->sp, .batch = p->ep * (v == 2 ? 2 : 1), .ga = v == 1 ? 2 : 1};
      StepTime st;
      int64_t mem, s = 0, a = 0;
      Module *m = NULL;
      bool counted = false;
      char err[IR_ERR_LEN];
      p->ok = !compile_one(x, &ref, k + 1, &st, &mem, v ? NULL : &m, err, sizeof err, &counted);
      if (counted) count_compile(x);
      if (p->ok && !v) memory_planned_peak(m, x->target, &s, &a), state[k] = (double)s, arena[k] = (double)a;
      module_free(m);
      t[v] = st.step_s;
    }
    if (!p->ok) return;
    double g1 = t[1] - t[0], g2 = t[2] - (t[0] - g1);   /* a micro-batch of 1 and of 2 sequences */
    o[k] = t[0] - g1, g_b[k] = g2 - g1, g_a[k] = g1 - g_b[k];
  }
  if (nl == 1) {
    p->g_layer_a = g_a[0], p->g_layer_b = g_b[0], p->o_layer = o[0], p->state_layer = state[0], p->act_layer = arena[0];
    return;
  }
  p->g_layer_a = g_a[1] - g_a[0], p->g_base_a = g_a[0] - p->g_layer_a;
  p->g_layer_b = g_b[1] - g_b[0], p->g_base_b = g_b[0] - p->g_layer_b;
  p->o_layer = o[1] - o[0], p->o_base = o[0] - p->o_layer;
  p->state_layer = state[1] - state[0], p->state_base = state[0] - p->state_layer;
  p->act_layer = arena[1] - arena[0], p->act_base = arena[0] - p->act_layer;
}

/* The estimated step and memory of c from its layer program p. */
static void estimate(const Ctx *x, const PlanRequest *rq, const LayerProg *p, Cand *c) {
  const Hardware *hw = x->hw;
  int64_t L = rq->base->model.n_layer, mbs = c->batch / (c->dp * c->ep);
  double rcf = c->rc == RECOMPUTE_FULL ? 4.0 / 3.0 : c->rc == RECOMPUTE_SELECTIVE ? 1.1 : 1.0;
  double rcm = c->rc == RECOMPUTE_FULL ? 0.15 : c->rc == RECOMPUTE_SELECTIVE ? 0.7 : 1.0;
  double layer = (p->g_layer_a + p->g_layer_b * (double)mbs) * rcf, base = p->g_base_a + p->g_base_b * (double)mbs;
  double dp = (double)c->dp;
  double zshare = c->zero == 0 ? 1 : 1 / dp;   /* the optimizer's update: over the rank's share with ZeRO */
  double opt = (p->o_base + (double)L / (double)c->pp * p->o_layer) * zshare;
  double step;
  int64_t inflight = 1;
  if (c->pp > 1) {
    Schedule s;
    SimResult sim;
    char err[IR_ERR_LEN];
    int chunks = (int)(c->pp * c->v);
    double n = (double)L / chunks;
    step = INFINITY;
    if (chunks <= 256 && !schedule_build(c->sched, (int)c->pp, (int)c->v, (int)c->ga, &s, err, sizeof err)) {
      double (*cost)[3] = calloc((size_t)chunks, sizeof *cost);
      for (int k = 0; cost && k < chunks; k++) {
        double t = n * layer + (k == chunks - 1 ? base : 0);
        double f = t / 3 / rcf, b = t - f;
        cost[k][ACT_F] = f;
        cost[k][ACT_B] = s.split_bw ? b / 2 : b;
        cost[k][ACT_W] = s.split_bw ? b / 2 : 0;
      }
      if (cost && !schedule_simulate(&s, (const double (*)[3])cost, &sim, err, sizeof err)) {
        step = sim.makespan + opt;
        sim_result_free(&sim, s.p);
      }
      free(cost);
      schedule_free(&s);
    }
    inflight = c->pp;
  } else {
    step = (double)c->ga * (base + (double)L * layer) + opt;
  }
  /* dp: the gradients (4 bytes a parameter of the rank's share) reduced over dp each step,
     whatever the ZeRO stage (the overlap pass hides ZeRO-3's gathers behind compute) */
  double grads = (p->state_base + (double)L * p->state_layer) / 4 / (double)c->pp;   /* state: ~16 bytes a parameter */
  if (c->dp > 1) {
    Mesh mesh = {0};
    for (int a = 0; a < AX_COUNT; a++) mesh.size[a] = 1;
    mesh.size[AX_DP] = c->dp, mesh.size[AX_TP] = c->tp, mesh.size[AX_CP] = c->cp, mesh.size[AX_PP] = c->pp;
    mesh.size[AX_EP] = c->ep;
    int link = timing_axis_link(hw, &mesh, AX_DP);
    step += timing_collective(OP_ALL_REDUCE, c->dp, grads, hw->link_bw[link] * hw->eff_link, hw->link_lat[link]);
  }
  c->est_s = step;
  /* memory: state split by ZeRO (of 16 bytes a parameter: 4 the weights, 4 the gradients, 8
     the optimizer's moments), activations of the micro-batches in flight */
  double state = (p->state_base + (double)L * p->state_layer) / (double)c->pp;
  double share = c->zero == 0 ? 1 : c->zero == 1 ? (8 + 8 / dp) / 16 : c->zero == 2 ? (4 + 12 / dp) / 16 : 1 / dp;
  double act = (p->act_base + (double)L / (double)c->pp * p->act_layer * rcm) * (double)mbs * (double)inflight;
  c->est_mem = state * share + act;
}

/* ---- screening the candidates the estimates leave, in their order ---- */
typedef struct {
  Ctx *x;
  const PlanRequest *rq;
  Cand *cs;
  const int *order;   /* by estimated step */
  int n, next;
  bool *bad, *done;
  char (*why)[IR_ERR_LEN];
  pthread_mutex_t lock;
  /* the keep best screened candidates that fit, by screened step (ascending), and their
     estimates: the threshold is the largest of those estimates, so that a candidate is
     compared with the finalists in the estimates' own terms (the estimates leave out what
     the layer programs do not hold, alike for similar layouts) */
  double *best, *best_est;
  int keep, n_best, screened, pruned;
} Fast;

static double fast_threshold(const Fast *f) {
  if (f->n_best < f->keep) return INFINITY;
  double t = 0;
  for (int k = 0; k < f->n_best; k++) t = f->best_est[k] > t ? f->best_est[k] : t;
  return t;
}

/* One candidate screened as the exhaustive search screens it: its compiles of 1 and 2
   layers a chunk (the memo's shared lowering), extrapolated. */
static int screen_one(Ctx *x, Cand *c, int64_t L, RunSpec *sp, char *err) {
  int64_t ls[2], m[2] = {0, 0};
  int nl = screen_layers(c, L, ls);
  double st[2] = {0, 0};
  for (int j = 0; j < nl; j++) {
    *sp = *x->base;
    int rc = cand_spec(x, c, ls[j], sp, err, IR_ERR_LEN);
    if (rc) return rc;
    Module *mod = NULL;
    int pin = -1;
    rc = front_middle(x, sp, &mod, &pin, err, IR_ERR_LEN);
    if (!rc) rc = back_screen(x, c, sp, mod, &st[j], &m[j], err, IR_ERR_LEN);
    unpin(x, pin);
    count_compile(x);
    if (rc) return rc;
  }
  extrapolate(c, L, ls, nl, st, m);
  c->fits = c->mem <= x->hw->mem_bytes;
  return 0;
}

static void *fast_worker(void *arg) {
  Fast *f = arg;
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack */
  int64_t L = f->rq->base->model.n_layer;
  double far = 1.5 * f->x->hw->mem_bytes;
  for (;;) {
    pthread_mutex_lock(&f->lock);
    int k = f->next++;
    if (k >= f->n) {
      pthread_mutex_unlock(&f->lock);
      break;
    }
    int i = f->order[k];
    Cand *c = &f->cs[i];
    /* set aside: an estimate past the margins (its figures are bounds, as a pruned
       candidate's are in the exhaustive search) */
    bool set_aside = c->est_mem * MEM_MARGIN > far || c->est_s * (1 - STEP_MARGIN) > fast_threshold(f);
    if (set_aside) {
      c->pruned = true, c->fits = false;
      /* the bound it sorts by in the exact phase: the threshold's screened step where the
         estimate is what set it aside */
      c->step_s = c->est_mem * MEM_MARGIN > far ? c->est_s : f->best[f->keep - 1];
      c->mem = c->est_mem * MEM_MARGIN;
      f->pruned++;
    }
    pthread_mutex_unlock(&f->lock);
    if (set_aside) continue;
    if (!sp) {
      f->bad[i] = true, snprintf(f->why[i], IR_ERR_LEN, "out of memory");
      continue;
    }
    f->bad[i] = screen_one(f->x, c, L, sp, f->why[i]) != 0;
    pthread_mutex_lock(&f->lock);
    f->screened++;
    if (!f->bad[i] && c->fits && (f->n_best < f->keep || c->step_s < f->best[f->keep - 1])) {
      int at = f->n_best < f->keep ? f->n_best++ : f->keep - 1;
      while (at > 0 && f->best[at - 1] > c->step_s) f->best[at] = f->best[at - 1], f->best_est[at] = f->best_est[at - 1], at--;
      f->best[at] = c->step_s, f->best_est[at] = c->est_s;
    }
    pthread_mutex_unlock(&f->lock);
  }
  free(sp);
  return NULL;
}

static const Cand *sort_base;
static int by_estimate(const void *a, const void *b) {
  const Cand *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
  if (x->est_s != y->est_s) return x->est_s < y->est_s ? -1 : 1;
  return *(const int *)a - *(const int *)b;
}

int screen_fast(Ctx *x, const PlanRequest *rq, Cand *cs, int *n_io, int *refused_out, char *first_refusal,
                ScreenStats *st, int *programs, char *err, size_t errlen) {
  int n = *n_io;
  int64_t L = rq->base->model.n_layer;
  double t_start = now_s();
  Programs ps = {0};
  /* the layer programs, each compiled once */
  for (int i = 0; i < n; i++) {
    if (program_of(&ps, &cs[i])) continue;
    if (ps.n == ps.cap) {
      LayerProg *np = realloc(ps.p, sizeof *np * (size_t)(ps.cap = ps.cap ? 2 * ps.cap : 16));
      if (!np) {
        free(ps.p);
        snprintf(err, errlen, "out of memory");
        return IR_ERUN;
      }
      ps.p = np;
    }
    ps.p[ps.n++] = (LayerProg){.tp = cs[i].tp, .cp = cs[i].cp, .ep = cs[i].ep, .sp = cs[i].sp};
  }
  for (int k = 0; k < ps.n; k++) compile_program(x, &ps.p[k], L);
  /* estimates; a candidate whose program could not be compiled is screened first (its own
     compile gives the reason, as the exhaustive search's does) */
  for (int i = 0; i < n; i++) {
    const LayerProg *p = program_of(&ps, &cs[i]);
    if (p->ok) estimate(x, rq, p, &cs[i]);
    else cs[i].est_s = 0, cs[i].est_mem = 0;
    cs[i].pruned = false;
  }
  *programs = ps.n;
  free(ps.p);
  int *order = malloc(sizeof(int) * ((size_t)n + 1));
  Fast f = {.x = x, .rq = rq, .cs = cs, .order = order, .n = n, .bad = calloc((size_t)n + 1, 1),
            .why = calloc((size_t)n + 1, IR_ERR_LEN), .keep = 2 * rq->top, .best = malloc(sizeof(double) * 2 * (size_t)rq->top),
            .best_est = malloc(sizeof(double) * 2 * (size_t)rq->top)};
  pthread_mutex_init(&f.lock, NULL);
  if (!order || !f.bad || !f.why || !f.best || !f.best_est) {
    free(order), free(f.bad), free(f.why), free(f.best), free(f.best_est);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  for (int i = 0; i < n; i++) order[i] = i;
  sort_base = cs;
  qsort(order, (size_t)n, sizeof *order, by_estimate);
  int nt = threads_to_use();
  pthread_t th[64];
  int started = 0;
  for (int t = 1; t < nt && t < 64; t++)
    if (!pthread_create(&th[started], NULL, fast_worker, &f)) started++;
  fast_worker(&f);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  int kept = 0, refused = 0;
  for (int i = 0; i < n; i++) {
    if (f.bad[i]) {
      if (!refused++) snprintf(first_refusal, IR_ERR_LEN, "%s", f.why[i]);
      if (getenv("LOOM_PLAN_DEBUG")) {
        char lay[160];
        plan_layout_text(&cs[i], lay, sizeof lay);
        fprintf(stderr, "not buildable: %s: %s\n", lay, f.why[i]);
      }
      continue;
    }
    if (getenv("LOOM_PLAN_DEBUG") && !cs[i].pruned) {
      char lay[160];
      plan_layout_text(&cs[i], lay, sizeof lay);
      fprintf(stderr, "screened %s: step %.4g ms (estimated %.4g), memory %.3g GiB (estimated %.3g)\n", lay,
              cs[i].step_s * 1e3, cs[i].est_s * 1e3, cs[i].mem / 1073741824.0, cs[i].est_mem / 1073741824.0);
    }
    cs[kept++] = cs[i];
  }
  *st = (ScreenStats){.skipped = 0, .pruned = f.pruned, .threads = nt, .seconds = now_s() - t_start};
  free(order), free(f.bad), free(f.why), free(f.best), free(f.best_est);
  *n_io = kept, *refused_out += refused;
  return 0;
}
