/* driver/plan_sim.c — the pipeline schedules of the fast search's estimates (plan_fast.c),
 * each built and ordered once and then simulated many times.
 *
 * The estimates simulate a candidate's schedule (ir/schedule.c) twice, for tens of thousands
 * of candidates, but there are only a few hundred distinct schedules (kind, pp, virtual,
 * micro-batches): at Llama-3.1-405B on 16,384 GPUs the simulations were about a fifth of the
 * plan's CPU time, most of it rebuilding the lists and schedule_simulate's sweeps over the
 * ranks.  Here each schedule's actions are put once in an order where every action comes
 * after the one it waits for (the order schedule_simulate's sweep takes them in), with that
 * action's place; a simulation is then one pass:
 *   end(a) = max(end of the rank's action before a, end(the action a waits for)) + cost(a),
 * the same operations on the same operands as schedule_simulate's, so the same makespan to
 * the bit whatever the order.  A schedule schedule_simulate refuses (a deadlock, an action on
 * the wrong rank) is kept as refused, as the estimate treats a failed simulation. */
#include <stdlib.h>
#include <string.h>

#include "driver/plan_internal.h"
#include "ir/schedule.h"

static int cmp_key(const SimPlan *a, int kind, int p, int v, int m) {
  if (a->kind != kind) return a->kind < kind ? -1 : 1;
  if (a->p != p) return a->p < p ? -1 : 1;
  if (a->v != v) return a->v < v ? -1 : 1;
  if (a->m != m) return a->m < m ? -1 : 1;
  return 0;
}

static int by_key(const void *x, const void *y) {
  const SimPlan *b = y;
  return cmp_key(x, b->kind, b->p, b->v, b->m);
}

/* sp's order, dependencies and held activations from its schedule (sp->ok false when the
   schedule cannot be built or simulated). */
static void sim_plan_build(SimPlan *sp, const double rcm[3], const double w[3]) {
  Schedule s;
  char err[IR_ERR_LEN];
  sp->ok = false;
  if (schedule_build(sp->kind, sp->p, sp->v, sp->m, &s, err, sizeof err)) return;
  int p = s.p, C = s.chunks, m = s.m, total = 0;
  for (int r = 0; r < p; r++) total += s.n[r];
  int *place = malloc(sizeof(int) * (size_t)m * (size_t)C * 3), *pos = calloc((size_t)p, sizeof(int));
  sp->rank = malloc((size_t)total + 1), sp->dep = malloc(sizeof(int) * ((size_t)total + 1));
  sp->ci = malloc(sizeof(uint16_t) * ((size_t)total + 1));
  bool fine = place && pos && sp->rank && sp->dep && sp->ci && p <= 64;
  for (int i = 0; fine && i < m * C * 3; i++) place[i] = -1;
  /* schedule_simulate's sweep, without the times: each rank runs on until it must wait */
  int n = 0;
  while (fine) {
    bool progress = false, left = false;
    for (int r = 0; r < p && fine; r++) {
      while (pos[r] < s.n[r]) {
        const Action *a = &s.acts[r][pos[r]];
        left = true;
        if (a->mb < 0 || a->mb >= m || a->chunk < 0 || a->chunk >= C ||
            schedule_chunk_rank(s.kind, p, s.v, a->chunk) != r || place[(a->mb * C + a->chunk) * 3 + a->kind] >= 0) {
          fine = false;
          break;
        }
        int dep = -1;
        bool ready = true;
        if (a->kind == ACT_F) {
          if (a->chunk > 0) ready = (dep = place[(a->mb * C + a->chunk - 1) * 3 + ACT_F]) >= 0;
        } else if (a->kind == ACT_B) {
          ready = place[(a->mb * C + a->chunk) * 3 + ACT_F] >= 0;
          if (ready && a->chunk < C - 1) ready = (dep = place[(a->mb * C + a->chunk + 1) * 3 + ACT_B]) >= 0;
        } else {
          ready = s.split_bw && (dep = place[(a->mb * C + a->chunk) * 3 + ACT_B]) >= 0;
        }
        if (!ready) break;
        sp->rank[n] = (unsigned char)r, sp->dep[n] = dep;
        sp->ci[n] = (uint16_t)(a->chunk * 4 + a->kind);
        place[(a->mb * C + a->chunk) * 3 + a->kind] = n++;
        pos[r]++;
        progress = true;
      }
    }
    if (!left) break;
    if (!progress) fine = false;   /* a deadlock: schedule_simulate refuses it */
  }
  sp->n = n, sp->split_bw = s.split_bw, sp->ok = fine;
  /* the activations held at the peak, for each recomputation (plan_fast.c's held_chunks):
     rcm[k] a chunk between its F and B, w[k] between its B and W (split backward only) */
  for (int k = 0; fine && k < 3; k++) {
    double most = 0;
    for (int r = 0; r < s.p; r++) {
      int f = 0, wl = 0;
      for (int i = 0; i < s.n[r]; i++) {
        int kind = s.acts[r][i].kind;
        if (kind == ACT_F) f++;
        else if (kind == ACT_B) f--, wl += s.split_bw;
        else wl--;
        double h = rcm[k] * f + (s.split_bw ? w[k] * wl : 0);
        most = h > most ? h : most;
      }
    }
    sp->held[k] = most;
  }
  free(place), free(pos);
  schedule_free(&s);
}

typedef struct {
  SimPlans *all;
  const double *rcm, *w;
  int next;
  pthread_mutex_t lock;
} BuildJobs;

static void *build_worker(void *arg) {
  BuildJobs *b = arg;
  for (;;) {
    pthread_mutex_lock(&b->lock);
    int j = b->next++;
    pthread_mutex_unlock(&b->lock);
    if (j >= b->all->n) break;
    sim_plan_build(&b->all->p[j], b->rcm, b->w);
  }
  return NULL;
}

int sim_plans_build(SimPlans *all, const Cand *cs, int n, const double rcm[3], const double w[3]) {
  *all = (SimPlans){0};
  int cap = 0;
  for (int i = 0; i < n; i++) {
    const Cand *c = &cs[i];
    if (c->pp <= 1 || c->pp * c->v > 256) continue;
    if (all->n == cap) {
      SimPlan *np = realloc(all->p, sizeof *np * (size_t)(cap = cap ? 2 * cap : 256));
      if (!np) return IR_ERUN;
      all->p = np;
    }
    all->p[all->n++] = (SimPlan){.kind = c->sched, .p = (int)c->pp, .v = (int)c->v, .m = (int)c->ga};
  }
  if (all->n) qsort(all->p, (size_t)all->n, sizeof *all->p, by_key);
  int u = 0;
  for (int i = 0; i < all->n; i++)
    if (!u || by_key(&all->p[u - 1], &all->p[i])) all->p[u++] = all->p[i];
  all->n = u;
  BuildJobs b = {.all = all, .rcm = rcm, .w = w, .lock = PTHREAD_MUTEX_INITIALIZER};
  int nt = threads_to_use();
  pthread_t th[64];
  int started = 0;
  for (int t = 1; t < nt && t < 64 && t < all->n; t++)
    if (!pthread_create(&th[started], NULL, build_worker, &b)) started++;
  build_worker(&b);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  return 0;
}

void sim_plans_free(SimPlans *all) {
  for (int i = 0; i < all->n; i++) free(all->p[i].rank), free(all->p[i].dep), free(all->p[i].ci);
  free(all->p);
  *all = (SimPlans){0};
}

const SimPlan *sim_plan_find(const SimPlans *all, int kind, int p, int v, int m) {
  int lo = 0, hi = all->n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2, c = cmp_key(&all->p[mid], kind, p, v, m);
    if (!c) return &all->p[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

double sim_plan_makespan(const SimPlan *sp, const double (*cost)[3], double *end) {
  double t[64] = {0}, makespan = 0;
  for (int i = 0; i < sp->n; i++) {
    int r = sp->rank[i], chunk = sp->ci[i] >> 2, kind = sp->ci[i] & 3, d = sp->dep[i];
    double dep = d >= 0 ? end[d] : 0, st = t[r] > dep ? t[r] : dep;
    double c = cost[chunk][kind] + (kind == ACT_B && !sp->split_bw ? cost[chunk][ACT_W] : 0);
    end[i] = t[r] = st + c;
    /* schedule_simulate takes an end below 0 for "not run yet": what waits on it never
       runs, and it reports a deadlock (W and an unsplit B of chunk 0 have nothing waiting) */
    if (end[i] < 0 && (kind == ACT_F || (kind == ACT_B && (chunk > 0 || sp->split_bw)))) return -1;
  }
  for (int r = 0; r < sp->p; r++)
    if (t[r] > makespan) makespan = t[r];
  return makespan;
}
