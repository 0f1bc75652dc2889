/* driver/plan_screen.c — the exhaustive screening of `loom plan` (driver/plan.h): every
 * candidate compiled with 1 and 2 layers a pipeline chunk (or whole when that is as small),
 * its step and memory extrapolated to the model's layers a chunk, in rounds that prune what
 * cannot win.  The fast search (plan_fast.c) screens with the same compiles the candidates
 * its estimates leave; LOOM_PLAN_CHECK=1 runs this one beside it and compares the tables.
 *
 * Layouts differ in their repeated layers, so each candidate is compiled with 1 and with 2
 * layers per pipeline chunk (equal chunks; the model itself when that is as small), and its
 * step time and memory are extrapolated linearly to the model's layers per chunk.  The best
 * 2 x --top that fit are then compiled whole (plan.c, the exact phase): the screening
 * figures are never printed as results.  The compiles share what they can (plan_internal.h,
 * "compiling a candidate").  Most candidates stop after their first compile: a lower bound
 * on their step (that compile's, plus the rest of the layers at peak FLOP/s) already exceeds
 * the 2 x --top-th best screened step ("pruning" below); the table is the unpruned search's.
 * LOOM_PLAN_DEBUG=1 prints, to stderr, why a layout is not buildable and each whole compile
 * beside its screening figures; LOOM_PLAN_CHECK=1 (here) also lowers every screening compile
 * whole and stops at the first figure the shared lowering does not reproduce bit for bit,
 * prunes nothing, and stops at the first lower bound above its candidate's screened step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/plan_internal.h"
#include "ir/schedule.h"

/* Screening: a thread takes a family at a time: the candidates of a round that differ only
   in their pipeline schedule, which share the front and middle parts of every compile with
   the same layers. */
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
  /* the progress line (plan_internal.h): candidates screened of n_all */
  PlanProgress progress;
  int screened, n_all;
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
    rc = IR_ERUN;
  }
  if (!rc && getenv("LOOM_PLAN_CHECK")) {   /* developer check: the memo's figures are a whole lowering's */
    Module *copy = module_clone(m, true);
    StepTime t;
    int64_t mm = 0;
    char e2[IR_ERR_LEN];
    int r2 = copy ? back(x, c, sp, copy, &t, &mm, NULL, e2, sizeof e2) : IR_ERUN;
    rc = back_screen(x, c, sp, m, step_s, mem, NULL, err, IR_ERR_LEN);
    if (r2 != rc || (!rc && (t.step_s != *step_s || mm != *mem))) {
      fprintf(stderr, "LOOM_PLAN_CHECK: rc %d/%d step %.17g/%.17g mem %lld/%lld\n", rc, r2, *step_s, t.step_s,
              (long long)*mem, (long long)mm);
      abort();
    }
  } else if (!rc) {
    rc = back_screen(x, c, sp, m, step_s, mem, NULL, err, IR_ERR_LEN);
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
      c->pruned = false, c->has_first = false;
      for (int j = 0; j < nl && !w->bad[i]; j++) {
        if (j == 1 && w->x->layer_s > 0) {
          lb = lower_bound(w, c, st[0]);
          pthread_mutex_lock(&w->lock);
          /* far out of memory at 1 layer a chunk already: the exact phase never takes it */
          bool prune = !w->check && (lb > threshold(w) || (double)m[0] > 1.5 * w->hw->mem_bytes);
          pthread_mutex_unlock(&w->lock);
          if (prune) {   /* memory grows with the layers: its 1-layer figure is a lower bound too */
            c->pruned = true, c->step_s = lb, c->mem = (double)m[0], c->fits = false;
            c->has_first = true, c->first_s = st[0], c->first_mem = (double)m[0];
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
          plan_layout_text(c, lay, sizeof lay);
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
      plan_progress_say(&w->progress, now, "loom plan: screened %d of at most %d candidates (%d compiles)", w->screened,
                        w->n_all, w->x->compiles);
      pthread_mutex_unlock(&w->lock);
    }
    for (int s = 0; s < n_sh; s++) module_free(sh[s].m), unpin(w->x, sh[s].pin);   /* the copies of it are freed */
    free(sh);
  }
  free(sp);
  return NULL;
}


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
int siblings(const Cand *cs, int n, int *half, int *none) {
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

int screen_exhaustive(Ctx *x, const PlanRequest *rq, Cand *cs, int *n_io, int *refused_out, char *first_refusal,
                      ScreenStats *st, char *err, size_t errlen) {
  int n = *n_io, top = rq->top, fix_rc = rq->fix_rc;
  int64_t L = rq->base->model.n_layer;
  const Hardware *hw_ = rq->hw;
  double t_start = now_s();
  int kept = 0, refused = 0;
  int nt = threads_to_use(), skipped = 0;
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
  Screen w = {.x = x, .cs = cs, .bad = calloc((size_t)n + 1, 1), .why = calloc((size_t)n + 1, IR_ERR_LEN), .order = order,
              .fam = fam, .fam_run = fam_run, .L = L, .hw = hw_, .lock = PTHREAD_MUTEX_INITIALIZER,
              .n_all = n, .keep = 2 * top, .best = malloc(sizeof(double) * 2 * (size_t)top),
              .check = getenv("LOOM_PLAN_CHECK") != NULL};
  plan_progress_init(&w.progress, rq->progress, isatty(STDERR_FILENO) == 1, t_start);
  if (!w.bad || !w.why || !w.best || !order || !skip || !far || !half || !none || !round_c || !fam || !fam_run) {
    free(w.bad), free(w.why), free(w.best), free(order), free(skip), free(far), free(half), free(none), free(round_c);
    free(fam), free(fam_run);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  /* siblings: the same layout with half the micro-batch, and without recomputation */
  if (siblings(cs, n, half, none)) {
    free(w.bad), free(w.why), free(w.best), free(order), free(skip), free(far), free(half), free(none), free(round_c);
    free(fam), free(fam_run);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  /* Round -1 screens seeds first, so that pruning has a threshold from the start: the pure
     dp layouts without recomputation (no pipeline bubble, no tp or cp traffic: often among
     the fastest that fit).  In their own rounds the rules above still skip them (a seed so
     skipped is dropped, as if never screened); the others are not screened again. */
  bool *done = calloc((size_t)n + 1, 1);
  if (!done) {
    free(w.bad), free(w.why), free(w.best), free(order), free(skip), free(far), free(half), free(none), free(round_c);
    free(fam), free(fam_run);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
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
      if (h >= 0 && (far[h] || (!w.bad[h] && !skip[h] && cs[h].mem > 1.5 * hw_->mem_bytes))) {
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
      free(done), free(w.bad), free(w.why), free(w.best), free(order), free(skip), free(far), free(half), free(none), free(round_c);
      free(fam), free(fam_run);
      snprintf(err, errlen, "out of memory");
      return IR_ERUN;
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
      if (!refused++) snprintf(first_refusal, IR_ERR_LEN, "%s", w.why[i]);
      if (getenv("LOOM_PLAN_DEBUG")) {
        char lay[160];
        plan_layout_text(c, lay, sizeof lay);
        fprintf(stderr, "not buildable: %s: %s\n", lay, w.why[i]);
      }
      continue;
    }
    cs[kept++] = *c;
  }
  plan_progress_end(&w.progress);   /* the progress line gives way to the summary */
  free(w.bad), free(w.why), free(w.best), free(order), free(skip), free(far), free(half), free(none), free(round_c), free(fam),
      free(fam_run), free(done);
  *st = (ScreenStats){.skipped = skipped, .pruned = w.n_pruned, .threads = nt, .seconds = now_s() - t_start};
  *n_io = kept, *refused_out += refused;
  return 0;
}
