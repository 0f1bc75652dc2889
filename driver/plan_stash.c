/* driver/plan_stash.c — the fast search's lower bound on a candidate's screened memory from
 * the stash its pipeline schedule holds (driver/plan_stash.h), so that a candidate far out of
 * memory is set aside without a compile (plan_fast.c) and the exact phase bounds a pruned one
 * before screening it (plan.c, stash_far_bound).  Split off from plan_fast.c (2026-11-28); it
 * calls plan_compile.c (the compiles of a reference) and plan_sim.c (the schedules), never
 * back into plan_fast.c or plan.c.
 *
 * A screened candidate's memory is m1 + k (m2 - m1), k = L / chunks - 1 >= 1, m1 and m2 its
 * compiles' with 1 and 2 layers a chunk: at least m2 wherever m2 >= m1 (the exhaustive
 * search prunes on m1 being a lower bound, and LOOM_PLAN_CHECK holds it there).  Each
 * compile's memory is the most any pp rank holds (passes/memory_rank.c): its state, its
 * largest arena, and the stash its schedule holds at its peak (pipe_stash_peaks: what a
 * micro-batch's F hands its B, and B its W, 4 bytes an element), so at least that stash.
 * A chunk's stash is the shapes of its forward's (and B's) results: the layer program's
 * (tp, cp, sp, ep), the recomputation, whether the backward is split, the layers a chunk,
 * and the micro-batch decide them (at 405B dualpipev and zb-h1, ZeRO 0 and 1, dp 64 and
 * 128, pp 8 and 16 showed the same bytes; dp = 1 too, since the shard pass partitions a
 * batch of one as any batch); the first and last chunks (the embedding, the head)
 * hold their own, every interior one the same.  Each screening compile with pp shows them
 * for its own (Seen); an unscreened candidate with the same program, recomputation, split
 * and layers a chunk takes them, from a micro-batch of mbs' sequences scaled by
 * min(1, its own / mbs) (a result's elements are a fixed part plus a part per sequence,
 * both at least 0), and walks its own schedule (its SimPlan's actions, each rank's in
 * order) as pipe_stash_peaks does.  Where screened compiles of the same key disagree, no
 * bound.  LOOM_PLAN_CHECK screens every candidate so set aside and stops if its bound is
 * over either compile's memory.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/plan_stash.h"
#include "ir/schedule.h"

struct Seen {
  int64_t tp, cp, ep, mbs;
  int rc, layers, pos;   /* layers a chunk (1, 2); pos: the candidate's place in the order */
  bool sp, split;
  ChunkStash s;
};
/* What the bounds read: the schedules, and what the screening compiles showed.  Kept for
   the exact phase (Ctx.stash), which bounds a pruned candidate before screening it. */
struct Stash {
  SimPlans plans;
  Seen *seen;
  int n_seen, cap_seen;
  int64_t L;
  /* the references (stash_reference): one a key and micro-batch, made when a candidate
     about to be screened has no screened figures to go by; state 1 while one thread
     compiles it (the others wait on `made`), 2 once made (ok: it could be) */
  struct {
    Seen e[2];
    int state;
    bool ok;
  } *refs;
  int n_refs, cap_refs;
  pthread_mutex_t lock;
  pthread_cond_t made;
};

Stash *stash_new(int64_t L) {
  Stash *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->L = L;
  pthread_mutex_init(&st->lock, NULL), pthread_cond_init(&st->made, NULL);
  return st;
}

SimPlans *stash_plans(Stash *st) { return &st->plans; }

void stash_counts(const Stash *st, int *n_seen, int *n_refs) { *n_seen = st->n_seen, *n_refs = st->n_refs; }

static bool split_bw_of(int sched) { return sched == PIPE_ZBH1 || sched == PIPE_DUALPIPEV; }

static bool seen_key(const Seen *e, const Cand *c, int layers) {
  return e->tp == c->tp && e->cp == c->cp && e->ep == c->ep && e->sp == c->sp && e->rc == c->rc &&
         e->split == split_bw_of(c->sched) && e->layers == layers;
}

/* Under f->lock: what c's screening compiles (at position pos) showed. */
void stash_learn(Stash *f, const Cand *c, int pos, const ChunkStash st[2], int nl) {
  for (int j = 0; j < nl; j++) {
    if (!st[j].ok) continue;
    if (f->n_seen == f->cap_seen) {
      Seen *ns = realloc(f->seen, sizeof *ns * (size_t)(f->cap_seen = f->cap_seen ? 2 * f->cap_seen : 256));
      if (!ns) return;
      f->seen = ns;
    }
    f->seen[f->n_seen++] = (Seen){.tp = c->tp, .cp = c->cp, .ep = c->ep, .mbs = c->batch / (c->dp * c->ep), .rc = c->rc,
                                  .layers = j + 1, .pos = pos, .sp = c->sp, .split = split_bw_of(c->sched), .s = st[j]};
  }
}

/* Under f->lock: lower bounds on c's memory with 1 and 2 layers a chunk (m1, m2 in
   out[0], out[1]) from the stash of those screened before position lim (0 where nothing
   tells); their larger, a lower bound on its screened memory. */
double stash_bound(const Stash *f, const Cand *c, int lim, const Seen *ref, double out[2]) {
  int64_t L = f->L, ls[2];
  out[0] = out[1] = 0;
  /* screened as the model itself (2 layers a chunk or more): every chunk holds a layer at
     least (passes/pipeline_units.c, pipeline_split_units), and a chunk's stash grows with its layers, so
     the stash of 1 layer a chunk is a lower bound on its own */
  int nl = screen_layers(c, L, ls);
  if (c->pp <= 1) return 0;
  const SimPlan *sp = c->pp * c->v <= 256 ? sim_plan_find(&f->plans, c->sched, (int)c->pp, (int)c->v, (int)c->ga) : NULL;
  if (!sp || !sp->ok || sp->p > 64) return 0;
  double mbs = (double)(c->batch / (c->dp * c->ep));
  int C = (int)(c->pp * c->v);
  for (int layers = 1; layers <= nl; layers++) {
    double fb[3] = {0, 0, 0}, wb[3] = {0, 0, 0};
    const Seen *first[64];   /* one observation a micro-batch, the others held to it */
    int n_first = 0;
    bool any = false, agree = true;
    for (int e = 0; e < f->n_seen + 1 && agree; e++) {   /* the last: c's reference, if given */
      const Seen *o = e < f->n_seen ? &f->seen[e] : ref ? &ref[layers - 1] : NULL;
      if (!o || (e < f->n_seen && o->pos >= lim) || !seen_key(o, c, layers)) continue;
      int k = 0;
      while (k < n_first && first[k]->mbs != o->mbs) k++;
      if (k < n_first) {
        agree = !memcmp(first[k]->s.f, o->s.f, sizeof o->s.f) && !memcmp(first[k]->s.w, o->s.w, sizeof o->s.w);
        continue;
      }
      if (n_first < 64) first[n_first++] = o;
      double sc = mbs < (double)o->mbs ? mbs / (double)o->mbs : 1;
      for (int q = 0; q < 3; q++) {
        fb[q] = fmax(fb[q], (double)o->s.f[q] * sc), wb[q] = fmax(wb[q], (double)o->s.w[q] * sc);
      }
      any = true;
    }
    if (!any || !agree) continue;
    /* pipe_stash_walk over sp's actions (each rank's in its order) */
    double live[64] = {0}, peak[64] = {0};
    for (int i = 0; i < sp->n; i++) {
      int r = sp->rank[i], ch = sp->ci[i] >> 2, kind = sp->ci[i] & 3, q = ch == 0 ? 0 : ch == C - 1 ? 2 : 1;
      if (kind == ACT_F) live[r] += fb[q];
      else if (kind == ACT_B) live[r] += wb[q] - fb[q];
      else live[r] -= wb[q];
      if (live[r] > peak[r]) peak[r] = live[r];
    }
    for (int r = 0; r < sp->p; r++) out[layers - 1] = fmax(out[layers - 1], peak[r]);
  }
  return fmax(out[0], out[1]);
}

void stash_free(Stash *st) {
  if (!st) return;
  sim_plans_free(&st->plans), free(st->seen), free(st->refs);
  pthread_mutex_destroy(&st->lock), pthread_cond_destroy(&st->made);
  free(st);
}

/* Does the bound of c lack screened figures before lim (1 layer a chunk where it is screened
   as the model, else 2)? */
bool stash_lacks(const Stash *f, const Cand *c, int lim) {
  int64_t ls[2];
  int layers = screen_layers(c, f->L, ls);
  for (int e = 0; e < f->n_seen; e++)
    if (f->seen[e].pos < lim && seen_key(&f->seen[e], c, layers)) return false;
  return true;
}

/* c's reference: the stash of its layer program, recomputation, split and micro-batch,
   from a pipeline of 3 ranks (1f1b, or zb-h1 for a split backward; dp = 2, whatever the
   candidate's; ZeRO 0, 3 micro-batches) with 1 and 2 layers a chunk: first, interior and last chunks of the
   same kinds as the screening compiles'.  Made once, on the thread that first asks; NULL
   when it cannot be (or the model has 6 layers or fewer). */
const Seen *stash_reference(Ctx *x, Stash *st, const Cand *c) {
  if (st->L <= 6 || c->pp <= 1) return NULL;
  int64_t mbs = c->batch / (c->dp * c->ep);
  int64_t dp = 2;
  Cand ref = {.dp = dp, .tp = c->tp, .cp = c->cp, .pp = 3, .v = 1, .ep = c->ep, .zero = 0,
              .sched = split_bw_of(c->sched) ? PIPE_ZBH1 : PIPE_1F1B, .rc = c->rc, .sp = c->sp, .batch = mbs * dp * c->ep,
              .ga = 3};
  pthread_mutex_lock(&st->lock);
  int r = 0;
  for (; r < st->n_refs; r++) {
    const Seen *e = &st->refs[r].e[0];
    if (seen_key(e, &ref, 1) && e->mbs == mbs) break;
  }
  if (r == st->n_refs) {
    if (st->n_refs == st->cap_refs) {
      void *nr = realloc(st->refs, sizeof *st->refs * (size_t)(st->cap_refs = st->cap_refs ? 2 * st->cap_refs : 32));
      if (!nr) {
        pthread_mutex_unlock(&st->lock);
        return NULL;
      }
      st->refs = nr;
    }
    r = st->n_refs++;
    st->refs[r].state = 1, st->refs[r].ok = false;
    for (int j = 0; j < 2; j++)
      st->refs[r].e[j] = (Seen){.tp = c->tp, .cp = c->cp, .ep = c->ep, .mbs = mbs, .rc = c->rc, .layers = j + 1, .pos = -1,
                                .sp = c->sp, .split = split_bw_of(c->sched)};
    pthread_mutex_unlock(&st->lock);
    ChunkStash got[2] = {{0}, {0}};
    bool ok = true;
    RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack */
    char err[IR_ERR_LEN];
    ok = sp != NULL;
    for (int j = 0; j < 2 && ok; j++) {
      *sp = *x->base;
      ok = !cand_spec(x, &ref, 3 * (j + 1), sp, err, sizeof err);
      Module *mod = NULL;
      int pin = -1;
      double step;
      int64_t mem;
      if (ok) ok = !front_middle(x, sp, &mod, &pin, err, sizeof err);
      if (ok) ok = !back_screen(x, &ref, sp, mod, &step, &mem, &got[j], err, sizeof err) && got[j].ok;
      unpin(x, pin);
      count_compile(x);
    }
    free(sp);
    pthread_mutex_lock(&st->lock);
    for (int j = 0; j < 2; j++) st->refs[r].e[j].s = got[j];
    st->refs[r].ok = ok, st->refs[r].state = 2;
    pthread_cond_broadcast(&st->made);
  }
  while (st->refs[r].state != 2) pthread_cond_wait(&st->made, &st->lock);
  const Seen *out = st->refs[r].ok ? st->refs[r].e : NULL;
  pthread_mutex_unlock(&st->lock);
  return out;
}

/* The lower bound on pruned candidate c's screened memory from everything the screening
   saw (the exact phase's, before it screens c): the stash's, and with c's first compile
   kept (has_first) m1 + k (m2 bound - m1) as screen_one takes it. */
double stash_far_bound(Ctx *x, const Cand *c, double *m2_lb) {
  Stash *st = x->stash;
  const Seen *ref = st && stash_lacks(st, c, INT_MAX) && c->est_mem > x->hw->mem_bytes ? stash_reference(x, st, c) : NULL;
  double sbl[2] = {0, 0}, b = st ? stash_bound(st, c, INT_MAX, ref, sbl) : 0;
  *m2_lb = sbl[1];
  int64_t ls[2];
  if (st && c->has_first && screen_layers(c, st->L, ls) == 2 && sbl[1] > c->first_mem) {
    double k = (double)st->L / (double)(c->pp * c->v) - 1;
    b = fmax(b, c->first_mem + k * (sbl[1] - c->first_mem));
  }
  if (getenv("LOOM_PLAN_DEBUG") && atoi(getenv("LOOM_PLAN_DEBUG")) >= 4) {
    char lay[160];
    plan_layout_text(c, lay, sizeof lay);
    fprintf(stderr, "exact-phase stash bound %s: %.4g GiB (m1 %.4g m2 %.4g, first %.4g%s)\n", lay, b / 1073741824.0,
            sbl[0] / 1073741824.0, sbl[1] / 1073741824.0, c->has_first ? c->first_mem / 1073741824.0 : -1.0, ref ? ", reference" : "");
  }
  return b;
}
