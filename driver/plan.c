/* driver/plan.c — `loom plan`'s search (driver/plan.h): the candidates, a screening (fast
 * or exhaustive), then the exact phase, which compiles the best whole.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/plan_internal.h"
#include "ir/schedule.h"

static bool divides(int64_t a, int64_t b) { return a > 0 && b % a == 0; }

/* The candidates: every dp x tp x cp x pp (x ep) with product gpus (tp within a node; cp
   where the sequence splits into 2cp zigzag half-chunks), ZeRO stage (0-3; 0-1 with pp),
   sequence parallelism with tp, micro-batch size (sequences per dp rank; the gradient
   accumulation follows from the global batch), pipeline schedule and virtual stages,
   recomputation, less what the request fixes. */
static int candidates(const PlanRequest *rq, Cand **out, int *n_out, char *err, size_t errlen) {
  int64_t gpus = rq->gpus, seqs = rq->seqs, L = rq->base->model.n_layer, fix_batch = rq->fix_batch, fix_v = rq->fix_v;
  const int64_t *fix_mesh = rq->fix_mesh;
  int fix_zero = rq->fix_zero, fix_sched = rq->fix_sched, fix_rc = rq->fix_rc;
  int n = 0, cap = 1024;
  Cand *cs = malloc(sizeof *cs * (size_t)cap);
  if (!cs) {
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  for (int64_t tp = 1; tp <= gpus; tp++) {
    if (!divides(tp, gpus) || (fix_mesh[AX_TP] && tp != fix_mesh[AX_TP]) || tp > rq->hw->devices_per_node) continue;
    for (int64_t pp = 1; pp <= gpus / tp; pp++) {
      if (!divides(pp, gpus / tp) || (fix_mesh[AX_PP] && pp != fix_mesh[AX_PP]) || pp > L) continue;
      for (int64_t cp = 1; cp <= gpus / tp / pp; cp++) {
        /* cp: zigzag ring attention, the sequence in 2cp half-chunks of 64 tokens or more
           (shorter blocks leave the ring's transfers nothing to hide behind) */
        if (!divides(cp, gpus / tp / pp) || (fix_mesh[AX_CP] && cp != fix_mesh[AX_CP]) ||
            (cp > 1 && (rq->base->seq % (2 * cp) || (!fix_mesh[AX_CP] && rq->base->seq / (2 * cp) < 64))))
          continue;
        /* ep (a mixture of experts: it divides the experts) */
        int64_t E = rq->base->model.n_experts;
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
                      snprintf(err, errlen, "out of memory");
                      return IR_ERUN;
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
  *out = cs, *n_out = n;
  return 0;
}

/* A pruned candidate screened in full, on a thread of its own (resolve). */
typedef struct {
  Ctx *x;
  Cand *c;
  int64_t L;
  const Hardware *hw;
  double m2_lb;   /* the fast search's bound on its second compile's memory (resolve) */
  int refused;
  char why[IR_ERR_LEN];
} Resolving;

static void *resolve_worker(void *arg) {
  Resolving *r = arg;
  r->why[0] = 0;
  resolve(r->x, r->c, r->L, r->hw, true, r->m2_lb, &r->refused, r->why);
  if (getenv("LOOM_PLAN_DEBUG")) {
    char lay[160];
    plan_layout_text(r->c, lay, sizeof lay);
    fprintf(stderr, "resolved %s: step %.4g ms (estimated %.4g), memory %.3g GiB (estimated %.3g)\n", lay,
            r->c->step_s * 1e3, r->c->est_s * 1e3, r->c->mem / 1073741824.0, r->c->est_mem / 1073741824.0);
  }
  return NULL;
}

/* The exact phase: the best 2 x top screened compiled whole (the screening's order is
   close, not exact), those that fit ranked by their exact step into out->best. */
static int exact_phase(Ctx *x, const PlanRequest *rq, Cand *cs, int n, int *refused_io, char *first_refusal,
                       PlanResult *out, char *err, size_t errlen) {
  int top = rq->top, refused = *refused_io, nt = threads_to_use();
  int64_t L = rq->base->model.n_layer, gpus = rq->gpus;
  const Hardware *hw = rq->hw;
  /* ---- exact: compile the best 2 x top whole (the screening's order is close, not exact),
     then rank those that fit by their exact step ---- */
  int shown = 0, closest = -1, exact_n = 0, n_jobs = 0, next_job = 0;
  Cand *best = malloc(sizeof *best * (size_t)(2 * top));
  Whole *jobs = malloc(sizeof *jobs * (size_t)(nt < 16 ? nt : 16));
  if (!best || !jobs) {
    free(best), free(jobs);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  PlanProgress pg;
  plan_progress_init(&pg, rq->progress, isatty(STDERR_FILENO) == 1, now_s());
  for (int i = 0; i < n && exact_n < 2 * top; i++) {
    Cand *c = &cs[i];
    plan_progress_say(&pg, now_s(), "loom plan: compiling the best whole: %d of %d fit so far, %d compiles", exact_n, 2 * top,
                      x->compiles);
    /* the fast search's stash bound past "far": never taken (the exhaustive search would
       screen it, far out of memory) */
    double m2_lb = 0;
    if (c->pruned && c->mem <= 1.5 * hw->mem_bytes && x->stash) {
      double b = stash_far_bound(x, c, &m2_lb);
      if (b > 1.5 * hw->mem_bytes && getenv("LOOM_PLAN_CHECK")) {   /* the bound under its screened memory */
        Cand copy = *c;
        int bad = 0;
        char why[IR_ERR_LEN];
        resolve(x, &copy, L, hw, false, 0, &bad, why);
        if (!bad && b > copy.mem * (1 + 1e-12)) {
          char lay[160];
          plan_layout_text(c, lay, sizeof lay);
          fprintf(stderr, "LOOM_PLAN_CHECK: %s: stash bound %.17g over its screened memory %.17g\n", lay, b, copy.mem);
          abort();
        }
      }
      if (b > 1.5 * hw->mem_bytes) c->mem = b;
    }
    if (c->pruned && c->mem > 1.5 * hw->mem_bytes) continue;   /* far out of memory: its figure is a lower bound */
    if (c->pruned) {   /* reached after all: screened in full, then the rest sorted again */
      if (getenv("LOOM_PLAN_DEBUG")) {
        char lay[160];
        plan_layout_text(c, lay, sizeof lay);
        fprintf(stderr, "pruned, reached: %s (bound %.2f ms, memory %.4g GiB), screened in full\n", lay, c->step_s * 1e3,
                c->mem / 1073741824.0);
      }
      /* with the next few pruned ones near it, on every thread: resolving one the walk would
         not have reached only replaces its bound with its screened figures (the walk's
         order is the same) */
      Resolving rj[16];
      int nr = 0;
      for (int k = i; k < n && k < i + 8 * nt && nr < (nt < 16 ? nt : 16); k++) {
        m2_lb = 0;
        if (cs[k].pruned && cs[k].mem <= 1.5 * hw->mem_bytes && x->stash) {
          double b = stash_far_bound(x, &cs[k], &m2_lb);
          if (b > 1.5 * hw->mem_bytes) cs[k].mem = b;
        }
        if (cs[k].pruned && cs[k].mem <= 1.5 * hw->mem_bytes)
          rj[nr++] = (Resolving){.x = x, .c = &cs[k], .L = L, .hw = hw, .m2_lb = m2_lb};
      }
      pthread_t th[16];
      int started = 0;
      for (int k = 1; k < nr; k++)
        if (!pthread_create(&th[started], NULL, resolve_worker, &rj[k])) started++;
        else resolve_worker(&rj[k]);
      resolve_worker(&rj[0]);
      for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
      for (int k = 0; k < nr; k++)
        if (rj[k].refused && !refused++) snprintf(first_refusal, IR_ERR_LEN, "%s", rj[k].why);
      qsort(cs + i, (size_t)(n - i), sizeof *cs, cmp_step);
      i--;
      continue;
    }
    if (!c->fits && c->mem > 1.5 * hw->mem_bytes) continue;   /* screened far out of memory */
    if (next_job == n_jobs) {   /* the next few such candidates, compiled at once (up to a pruned one) */
      n_jobs = next_job = 0;
      for (int k = i; k < n && !(cs[k].pruned && cs[k].mem <= 1.5 * hw->mem_bytes) && n_jobs < (nt < 16 ? nt : 16) && n_jobs < 2 * top - exact_n; k++)
        if (cs[k].fits || cs[k].mem <= 1.5 * hw->mem_bytes) jobs[n_jobs++] = (Whole){.x = x, .c = &cs[k], .L = L};
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
    if (j->counted) x->compiles++;
    if (j->rc) {
      if (!refused++) snprintf(first_refusal, IR_ERR_LEN, "%s", j->err);
      continue;
    }
    if (getenv("LOOM_PLAN_DEBUG")) {
      char lay[160];
      plan_layout_text(c, lay, sizeof lay);
      fprintf(stderr, "exact %s: step %.2f ms (screened %.2f), memory %.2f GiB (screened %.2f)\n", lay, c->t.step_s * 1e3,
              c->step_s * 1e3, mem / 1073741824.0, c->mem / 1073741824.0);
      fprintf(stderr, "  compute %.2f memory %.2f overhead %.2f exposed %.2f bubble %.2f optimizer %.2f; comm dp %.2f tp %.2f "
              "cp %.2f pp %.2f ms\n", c->t.compute_s * 1e3, c->t.memory_s * 1e3, c->t.overhead_s * 1e3,
              c->t.exposed_comm_s * 1e3, c->t.bubble_s * 1e3, c->t.optimizer_s * 1e3, c->t.comm_s[AX_DP] * 1e3,
              c->t.comm_s[AX_TP] * 1e3, c->t.comm_s[AX_CP] * 1e3, c->t.comm_s[AX_PP] * 1e3);
    }
    c->step_s = c->t.step_s, c->mem = (double)mem, c->exact = true, c->fits = c->mem <= hw->mem_bytes;
    if (c->fits) best[exact_n++] = *c;
    else if (closest < 0 || c->mem < cs[closest].mem) closest = i;
  }
  plan_progress_end(&pg);
  qsort(best, (size_t)exact_n, sizeof *best, cmp_step);
  if (closest < 0 && !exact_n)   /* nothing compiled whole: the screening's least memory, every candidate's */
    for (int i = 0; i < n; i++)
      if (cs[i].pruned) resolve(x, &cs[i], L, hw, false, 0, &refused, first_refusal);
  if (closest < 0)
    for (int i = 0; i < n; i++)
      if (!cs[i].exact && (closest < 0 || cs[i].mem < cs[closest].mem)) closest = i;
  shown = exact_n < top ? exact_n : top;
  if (!shown) {
    if (closest >= 0) {
      char lay[160];
      plan_layout_text(&cs[closest], lay, sizeof lay);
      snprintf(err, errlen, "no layout fits %s's %.1f GiB: the closest, %s, needs %.1f GiB a device%s; use more devices, "
               "a shorter --seq%s%s%s", hw->name, hw->mem_bytes / 1073741824.0, lay, cs[closest].mem / 1073741824.0,
               cs[closest].exact ? "" : " (screened: extrapolated from 1 and 2 layers a chunk)",
               strcmp(rq->base->precision, "bf16") ? " or --precision bf16" : "",
               rq->fix_rc >= 0 && rq->fix_rc != RECOMPUTE_FULL ? ", or --recompute full (fixed here; searched otherwise)" : "",
               rq->base->model.n_experts > 0 && rq->base->capacity_factor == 0
                   ? ", or a capacity (--capacity-factor 1.25: dropless routing's expert-parallel buffers hold ep x a "
                     "rank's rows, docs/moe.md)"
                   : "");
    } else {
      snprintf(err, errlen, "no layout of %lld devices could be built%s%s", (long long)gpus, refused ? ": " : "",
               first_refusal);
    }
    free(best), free(jobs);
    *refused_io = refused;
    return IR_EINPUT;
  }
  free(jobs);
  *refused_io = refused;
  out->best = best, out->n_best = shown;
  return 0;
}

/* One search, fast or exhaustive, on its own compile caches. */
static int search(const PlanRequest *rq, bool exhaustive, PlanResult *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  Cand *cs = NULL;
  int n = 0;
  int rc = candidates(rq, &cs, &n, err, errlen);
  if (rc) return rc;
  if (!n) {
    free(cs);
    snprintf(err, errlen, "no layout of %lld devices reaches %lld sequence%s a step under the fixed choices; give a "
             "--global-batch-tokens that is a multiple of dp x seq (%lld: a sequence of %lld a device), or fix fewer axes",
             (long long)rq->gpus, (long long)rq->seqs, rq->seqs == 1 ? "" : "s", (long long)(rq->gpus * rq->base->seq),
             (long long)rq->base->seq);
    return IR_EINPUT;
  }
  static Ctx ctxs[2];   /* large (the cache): not on the stack; one per search (LOOM_PLAN_CHECK runs both) */
  Ctx *x = &ctxs[exhaustive];
  if (ctx_init(x, rq)) {
    free(cs);
    ctx_free(x);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  blas_threads_stop();
  double t_start = now_s();
  layer_seconds(x);
  int refused = 0, all = n;
  char first_refusal[IR_ERR_LEN] = "";
  ScreenStats st = {0};
  rc = exhaustive ? screen_exhaustive(x, rq, cs, &n, &refused, first_refusal, &st, err, errlen)
                  : screen_fast(x, rq, cs, &n, &refused, first_refusal, &st, &out->layer_programs, err, errlen);
  if (!rc && rq->progress)
    fprintf(stderr, "%s: screened %d candidates (%d compiles on %d threads, %.1f s%s); %d skipped: recomputation where "
            "the layout fits without it, or a micro-batch twice one far out of memory; %d of those screened stopped "
            "%s: a lower bound on their step over the slowest of the %d best\n\n", exhaustive ? "exhaustive" : "fast",
            all - st.skipped, x->compiles, st.threads, st.seconds, exhaustive ? "" : ", the rest estimated from layer programs",
            st.skipped, st.pruned, exhaustive ? "at 1 layer a chunk" : "at their estimate", 2 * rq->top);
  if (!rc) {
    qsort(cs, (size_t)n, sizeof *cs, cmp_step);
    rc = exact_phase(x, rq, cs, n, &refused, first_refusal, out, err, errlen);
  }
  out->n_cand = n + refused, out->n_refused = refused, out->compiles = x->compiles;
  for (int i = 0; i < n; i++) out->n_pruned += cs[i].pruned;
  out->elapsed_s = now_s() - t_start;
  out->flops_per_token = x->seq_flops / (double)rq->base->seq;
  out->peak_flops = out->n_best ? out->best[0].t.peak_flops : 0;
  free(cs);
  stash_free(x->stash), x->stash = NULL;   /* screen_fast's, kept for the exact phase */
  ctx_free(x);
  return rc;
}

/* LOOM_PLAN_CHECK: the fast table against the exhaustive one, row for row. */
static int same_tables(const PlanResult *a, const PlanResult *b, int rc_a, int rc_b, char *err, size_t errlen) {
  if (rc_a != rc_b) {
    snprintf(err, errlen, "LOOM_PLAN_CHECK: the fast search returned %d, the exhaustive one %d", rc_a, rc_b);
    return IR_ERUN;
  }
  if (rc_a) return 0;
  for (int i = 0; i < a->n_best || i < b->n_best; i++) {
    char la[160] = "(none)", lb[160] = "(none)";
    if (i < a->n_best) plan_layout_text(&a->best[i], la, sizeof la);
    if (i < b->n_best) plan_layout_text(&b->best[i], lb, sizeof lb);
    if (i >= a->n_best || i >= b->n_best || strcmp(la, lb) || a->best[i].step_s != b->best[i].step_s ||
        a->best[i].mem != b->best[i].mem || a->best[i].sched != b->best[i].sched) {
      snprintf(err, errlen, "LOOM_PLAN_CHECK: row %d differs: the fast search's %s (%.6g s, %.0f bytes), the exhaustive "
               "search's %s (%.6g s, %.0f bytes)", i + 1, la, i < a->n_best ? a->best[i].step_s : 0,
               i < a->n_best ? a->best[i].mem : 0, lb, i < b->n_best ? b->best[i].step_s : 0,
               i < b->n_best ? b->best[i].mem : 0);
      return IR_ERUN;
    }
  }
  return 0;
}

int plan_search(const PlanRequest *rq, PlanResult *out, char *err, size_t errlen) {
  int rc = search(rq, rq->exhaustive, out, err, errlen);
  if (rq->exhaustive || !getenv("LOOM_PLAN_CHECK")) return rc;
  PlanResult ex;
  char e2[IR_ERR_LEN];
  int rc2 = search(rq, true, &ex, e2, sizeof e2);
  int bad = same_tables(out, &ex, rc, rc2, err, errlen);
  if (!bad && rq->progress)
    fprintf(stderr, "LOOM_PLAN_CHECK: the exhaustive search (%d compiles, %.2f s) gives the same table\n", ex.compiles,
            ex.elapsed_s);
  plan_result_free(&ex);
  if (bad) plan_result_free(out);
  return bad ? bad : rc;
}

void plan_result_free(PlanResult *r) {
  free(r->best);
  r->best = NULL, r->n_best = 0;
}

double plan_mfu(const PlanResult *r, const PlanRequest *rq, const PlanCand *c) {
  double tokens_s_dev = (double)rq->seqs * (double)rq->base->seq / c->step_s / (double)rq->gpus;
  return r->peak_flops > 0 ? tokens_s_dev * r->flops_per_token / r->peak_flops : 0;
}
