/* ir/schedule.c — the pipeline schedules (ir/schedule.h): building the action
   lists, simulating them against unit costs, the table and the trace. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ir/schedule.h"

int schedule_chunk_rank(int kind, int p, int v, int c) {
  (void)v;
  if (kind == PIPE_DUALPIPEV) return c < p ? c : 2 * p - 1 - c;
  return c % p;
}

int schedule_default_virtual(int kind) { return kind == PIPE_INTERLEAVED || kind == PIPE_DUALPIPEV ? 2 : 1; }

static void push(Schedule *s, int r, int kind, int mb, int chunk) {
  s->acts[r][s->n[r]++] = (Action){kind, mb, chunk};
}

/* Megatron's interleaved order: the k-th forward (or backward) of rank r. */
static void interleaved_unit(const Schedule *s, int r, int k, bool fwd, int *mb, int *chunk) {
  int p = s->p, v = s->v;
  int local = (k / p) % v;
  if (!fwd) local = v - 1 - local;
  *mb = (k / (p * v)) * p + k % p;
  *chunk = local * p + r;
}

/* The greedy list scheduler of dualpipev: whenever a rank is free it runs a ready B (input
   gradients are on the critical path), else a ready F while fewer than 2p micro-batch
   chunks have run F but not B on it, else a pending W; when nothing is ready it waits for
   the next action to finish anywhere.  Unit costs F = B = W = 1.
   The searches start where the scheduled actions leave off: a chunk's forwards run in
   micro-batch order (so they are a prefix, fcount), and per chunk bfirst/wfirst are the first
   micro-batch whose B/W has not run and bmax one past the last whose B has; what lies outside
   those bounds cannot be picked, so the choices are those of a scan over every micro-batch. */
static int greedy(Schedule *s, char *err, size_t errlen) {
  int p = s->p, C = s->chunks, m = s->m;
  /* done times per (mb, chunk, kind); -1 not yet scheduled */
  double *fin = malloc(sizeof(double) * (size_t)(m * C * 3));
  double *free_at = calloc((size_t)p, sizeof(double));
  int *inflight = calloc((size_t)p, sizeof(int)), *fnext = calloc((size_t)p * 2, sizeof(int));
  int *fcount = calloc((size_t)C * 4 + 1, sizeof(int)), *bfirst = fcount + C, *bmax = fcount + 2 * C, *wfirst = fcount + 3 * C;
  int *mine = malloc(sizeof(int) * (size_t)(C + 1)), *mine_at = calloc((size_t)p + 1, sizeof(int));   /* rank r's chunks, descending */
  if (!fin || !free_at || !inflight || !fnext || !fcount || !mine || !mine_at) {
    free(fin), free(free_at), free(inflight), free(fnext), free(fcount), free(mine), free(mine_at);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  for (int i = 0; i < m * C * 3; i++) fin[i] = -1;
  for (int c = 0; c < C; c++) mine_at[schedule_chunk_rank(s->kind, p, s->v, c) + 1]++;
  for (int r = 0; r < p; r++) mine_at[r + 1] += mine_at[r];
  int *fill = malloc(sizeof(int) * (size_t)(p + 1));
  if (!fill) {
    free(fin), free(free_at), free(inflight), free(fnext), free(fcount), free(mine), free(mine_at);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  memcpy(fill, mine_at, sizeof(int) * (size_t)p);
  for (int c = C - 1; c >= 0; c--) mine[fill[schedule_chunk_rank(s->kind, p, s->v, c)]++] = c;
  free(fill);
#define FIN(mb, c, k) fin[((mb) * C + (c)) * 3 + (k)]
  int total = 0, want = p * s->v * m * 3;
  while (total < want) {
    /* The free rank of earliest time; among equals one that has not yet found nothing to do
       at that time (fnext[q] = 1: rank q waited at free_at[q]). */
    int r = -1;
    for (int q = 0; q < p; q++)
      if (s->n[q] < s->v * m * 3 &&
          (r < 0 || free_at[q] < free_at[r] || (free_at[q] == free_at[r] && fnext[r] && !fnext[q])))
        r = q;
    double t = free_at[r];
    int cap = 2 * p;   /* dualpipev: two chunks per rank */
    int best_k = -1, best_mb = 0, best_c = 0;
    /* B: the ready one of the latest chunk, then the lowest micro-batch. */
    for (int j = mine_at[r]; j < mine_at[r + 1] && best_k < 0; j++) {
      int c = mine[j];
      for (int mb = bfirst[c]; mb < fcount[c]; mb++) {
        if (FIN(mb, c, ACT_B) >= 0 || FIN(mb, c, ACT_F) < 0 || FIN(mb, c, ACT_F) > t) continue;
        double dep = c == C - 1 ? FIN(mb, c, ACT_F) : FIN(mb, c + 1, ACT_B);
        if (dep < 0 || dep > t) continue;
        best_k = ACT_B, best_mb = mb, best_c = c;
        break;
      }
    }
    /* F: micro-batches in order; of the ready ones the latest chunk (finish what started). */
    if (best_k < 0 && inflight[r] < cap)
      for (int j = mine_at[r]; j < mine_at[r + 1] && best_k < 0; j++) {
        int c = mine[j], mb = fcount[c];
        if (mb >= m) continue;
        double dep = c == 0 ? 0 : FIN(mb, c - 1, ACT_F);
        if (dep >= 0 && dep <= t) best_k = ACT_F, best_mb = mb, best_c = c;
      }
    /* W: the oldest pending. */
    if (best_k < 0) {
      int lo = m, hi = 0;
      for (int j = mine_at[r]; j < mine_at[r + 1]; j++) {
        if (wfirst[mine[j]] < lo) lo = wfirst[mine[j]];
        if (bmax[mine[j]] > hi) hi = bmax[mine[j]];
      }
      for (int mb = lo; mb < hi && best_k < 0; mb++)
        for (int j = mine_at[r]; j < mine_at[r + 1]; j++) {
          int c = mine[j];
          if (FIN(mb, c, ACT_B) >= 0 && FIN(mb, c, ACT_B) <= t && FIN(mb, c, ACT_W) < 0) {
            best_k = ACT_W, best_mb = mb, best_c = c;
            break;
          }
        }
    }
    if (best_k < 0) {   /* wait for the next finish anywhere, or for a rank free at t to act */
      bool other = false;
      for (int q = 0; q < p; q++) other |= q != r && s->n[q] < s->v * m * 3 && free_at[q] == t && !fnext[q];
      fnext[r] = 1;
      if (other) continue;
      double next = INFINITY;
      for (int i = 0; i < m * C * 3; i++)
        if (fin[i] > t && fin[i] < next) next = fin[i];
      for (int q = 0; q < p; q++)
        if (s->n[q] < s->v * m * 3 && free_at[q] > t && free_at[q] < next) next = free_at[q];
      if (!isfinite(next)) {
        free(fin), free(free_at), free(inflight), free(fnext), free(fcount), free(mine), free(mine_at);
        snprintf(err, errlen, "internal error: the %s scheduler found no action for pp rank %d", pipe_kind_names[s->kind], r);
        return IR_ERUN;
      }
      for (int q = 0; q < p; q++)
        if (free_at[q] == t) free_at[q] = next, fnext[q] = 0;
      continue;
    }
    fnext[r] = 0;
    push(s, r, best_k, best_mb, best_c);
    FIN(best_mb, best_c, best_k) = t + 1;
    if (best_k == ACT_F) fcount[best_c]++;
    if (best_k == ACT_B && best_mb + 1 > bmax[best_c]) bmax[best_c] = best_mb + 1;
    while (bfirst[best_c] < m && FIN(bfirst[best_c], best_c, ACT_B) >= 0) bfirst[best_c]++;
    while (wfirst[best_c] < m && FIN(wfirst[best_c], best_c, ACT_W) >= 0) wfirst[best_c]++;
    free_at[r] = t + 1;
    inflight[r] += best_k == ACT_F ? 1 : best_k == ACT_B ? -1 : 0;
    total++;
  }
#undef FIN
  free(fin), free(free_at), free(inflight), free(fnext), free(fcount), free(mine), free(mine_at);
  return 0;
}

/* ---- dualpipev's schedules, memoized (see schedule_build) ---- */
#define SCHED_CACHE 64                 /* loom plan meets a few dozen (p, m) pairs */
#define SCHED_CACHE_MAX_ACTS (1 << 20)  /* larger schedules (12 MiB and up) are not kept */
static Schedule sched_cache[SCHED_CACHE];
static int sched_cache_next;
static pthread_mutex_t sched_cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* Deep copy of src's lists into dst (dst's kind, p, v, m already set); false when out of memory. */
static bool copy_lists(Schedule *dst, const Schedule *src) {
  for (int r = 0; r < src->p; r++) {
    dst->acts[r] = malloc(sizeof(Action) * (size_t)(src->n[r] ? src->n[r] : 1));
    if (!dst->acts[r]) return false;
    memcpy(dst->acts[r], src->acts[r], sizeof(Action) * (size_t)src->n[r]);
    dst->n[r] = src->n[r];
  }
  return true;
}

/* s has its kind, p, v, m and empty lists (the n and acts arrays allocated). */
static bool cache_get(Schedule *s) {
  bool hit = false;
  pthread_mutex_lock(&sched_cache_lock);
  for (int i = 0; i < SCHED_CACHE && !hit; i++) {
    const Schedule *c = &sched_cache[i];
    if (c->acts && c->kind == s->kind && c->p == s->p && c->v == s->v && c->m == s->m) {
      for (int r = 0; r < s->p; r++) free(s->acts[r]), s->acts[r] = NULL;
      hit = copy_lists(s, c);
    }
  }
  pthread_mutex_unlock(&sched_cache_lock);
  return hit;
}

static void cache_put(const Schedule *s) {
  if ((int64_t)s->p * s->v * s->m * 3 > SCHED_CACHE_MAX_ACTS) return;
  pthread_mutex_lock(&sched_cache_lock);
  Schedule *c = &sched_cache[sched_cache_next];
  schedule_free(c);
  *c = (Schedule){.kind = s->kind, .p = s->p, .v = s->v, .m = s->m, .chunks = s->chunks, .split_bw = s->split_bw};
  c->n = calloc((size_t)s->p, sizeof(int));
  c->acts = calloc((size_t)s->p, sizeof(Action *));
  if (!c->n || !c->acts || !copy_lists(c, s)) schedule_free(c);
  else sched_cache_next = (sched_cache_next + 1) % SCHED_CACHE;
  pthread_mutex_unlock(&sched_cache_lock);
}

int schedule_build(int kind, int p, int v, int m, Schedule *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (kind <= PIPE_NONE || kind >= PIPE_COUNT) {
    snprintf(err, errlen, "unknown pipeline schedule (afab, 1f1b, interleaved, zb-h1 or dualpipev)");
    return IR_EINPUT;
  }
  const char *name = pipe_kind_names[kind];
  if (p < 2 || p > 64) {
    snprintf(err, errlen, "a pipeline needs 2 to 64 pp ranks, not %d", p);
    return IR_EINPUT;
  }
  if (m < 1 || m > 4096) {
    snprintf(err, errlen, "a pipeline needs 1 to 4096 micro-batches (grad_accum), not %d", m);
    return IR_EINPUT;
  }
  if (kind == PIPE_INTERLEAVED) {
    if (v < 2) {
      snprintf(err, errlen, "the interleaved schedule needs --pp-virtual 2 or more (chunks per rank); with 1 it is 1f1b");
      return IR_EINPUT;
    }
    if (m % p) {
      snprintf(err, errlen, "the interleaved schedule runs micro-batches in groups of pp=%d, so grad_accum (%d) must be a "
               "multiple of %d: use --grad-accum %d or %d", p, m, p, m > p ? m / p * p : p, (m / p + 1) * p);
      return IR_EINPUT;
    }
  } else if (kind == PIPE_DUALPIPEV) {
    if (v != 2) {
      snprintf(err, errlen, "dualpipev holds exactly 2 chunks per rank (a V); drop --pp-virtual or give 2, not %d", v);
      return IR_EINPUT;
    }
  } else if (v != 1) {
    snprintf(err, errlen, "--pp-virtual %d needs the interleaved schedule (%s runs one chunk per rank): use "
             "--pp-schedule interleaved, or drop --pp-virtual", v, name);
    return IR_EINPUT;
  }
  s->kind = kind, s->p = p, s->v = v, s->m = m, s->chunks = p * v;
  s->split_bw = kind == PIPE_ZBH1 || kind == PIPE_DUALPIPEV;
  s->n = calloc((size_t)p, sizeof(int));
  s->acts = calloc((size_t)p, sizeof(Action *));
  if (!s->n || !s->acts) goto oom;
  for (int r = 0; r < p; r++)
    if (!(s->acts[r] = malloc(sizeof(Action) * (size_t)(v * m * 3)))) goto oom;
  for (int r = 0; r < p; r++) {
    if (kind == PIPE_AFAB) {
      for (int mb = 0; mb < m; mb++) push(s, r, ACT_F, mb, r);
      for (int mb = 0; mb < m; mb++) push(s, r, ACT_B, mb, r);
    } else if (kind == PIPE_1F1B) {
      int warm = p - 1 - r < m ? p - 1 - r : m;
      for (int i = 0; i < warm; i++) push(s, r, ACT_F, i, r);
      for (int i = 0; i < m - warm; i++) {
        push(s, r, ACT_F, warm + i, r);
        push(s, r, ACT_B, i, r);
      }
      for (int i = m - warm; i < m; i++) push(s, r, ACT_B, i, r);
    } else if (kind == PIPE_INTERLEAVED) {
      int total = m * v, warm = (p - r - 1) * 2 + (v - 1) * p, mb, c;
      if (warm > total) warm = total;
      for (int k = 0; k < warm; k++) interleaved_unit(s, r, k, true, &mb, &c), push(s, r, ACT_F, mb, c);
      for (int i = 0; i < total - warm; i++) {
        interleaved_unit(s, r, warm + i, true, &mb, &c), push(s, r, ACT_F, mb, c);
        interleaved_unit(s, r, i, false, &mb, &c), push(s, r, ACT_B, mb, c);
      }
      for (int k = total - warm; k < total; k++) interleaved_unit(s, r, k, false, &mb, &c), push(s, r, ACT_B, mb, c);
    } else if (kind == PIPE_ZBH1) {
      /* The zero-bubble paper's ZB-H1: p - r forwards, then B_k, W_(k-r), F_(k+p-r) for each
         k, then the Ws left.  Rank r defers its weight gradients by r micro-batches, so the
         last ranks pass input gradients upstream without waiting for their W and the first
         rank's drain is filled; a rank holds at most p micro-batches from F to W (1F1B's
         peak, on rank 0). */
      int warm = p - r < m ? p - r : m, wnext = 0;
      for (int i = 0; i < warm; i++) push(s, r, ACT_F, i, r);
      for (int k = 0; k < m; k++) {
        push(s, r, ACT_B, k, r);
        if (k - r >= 0) push(s, r, ACT_W, wnext++, r);
        if (k + warm < m) push(s, r, ACT_F, k + warm, r);
      }
      while (wnext < m) push(s, r, ACT_W, wnext++, r);
    }
  }
  if (kind == PIPE_DUALPIPEV) {
    /* The greedy scheduler is O(m^2) per rank and schedules are pure functions of (p, m):
       the last few are kept (loom plan builds the same one many times). */
    if (cache_get(s)) return 0;
    int rc = greedy(s, err, errlen);
    if (rc) {
      schedule_free(s);
      return rc;
    }
    cache_put(s);
  }
  return 0;
oom:
  schedule_free(s);
  snprintf(err, errlen, "out of memory");
  return IR_ERUN;
}

void schedule_free(Schedule *s) {
  if (s->acts)
    for (int r = 0; r < s->p; r++) free(s->acts[r]);
  free(s->acts);
  free(s->n);
  memset(s, 0, sizeof *s);
}

static const char *const act_letter = "FBW";

static void act_name(const Action *a, char *buf, size_t n) {
  snprintf(buf, n, "%c%d.%d", act_letter[a->kind], a->mb, a->chunk);
}

int schedule_simulate(const Schedule *s, const double (*cost)[3], SimResult *res, char *err, size_t errlen) {
  memset(res, 0, sizeof *res);
  int p = s->p, C = s->chunks, m = s->m;
  if (p > 64) {
    snprintf(err, errlen, "at most 64 pp ranks");
    return IR_EINPUT;
  }
  double *fin = malloc(sizeof(double) * (size_t)(m * C * 3));
  int *pos = calloc((size_t)p, sizeof(int)), *f_live = calloc((size_t)p, sizeof(int)), *w_live = calloc((size_t)p, sizeof(int));
  double *t = calloc((size_t)p, sizeof(double));
  int rc = 0;
  if (!fin || !pos || !f_live || !w_live || !t) {
    rc = IR_ERUN;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (int r = 0; r < p; r++) {
    res->start[r] = calloc((size_t)s->n[r] + 1, sizeof(double));
    res->end[r] = calloc((size_t)s->n[r] + 1, sizeof(double));
    if (!res->start[r] || !res->end[r]) {
      rc = IR_ERUN;
      snprintf(err, errlen, "out of memory");
      goto out;
    }
  }
  for (int i = 0; i < m * C * 3; i++) fin[i] = -1;
#define FIN(mb, c, k) fin[((mb) * C + (c)) * 3 + (k)]
  for (;;) {
    bool progress = false, left = false;
    for (int r = 0; r < p; r++) {
      while (pos[r] < s->n[r]) {
        const Action *a = &s->acts[r][pos[r]];
        left = true;
        if (a->mb < 0 || a->mb >= m || a->chunk < 0 || a->chunk >= C ||
            schedule_chunk_rank(s->kind, p, s->v, a->chunk) != r || FIN(a->mb, a->chunk, a->kind) >= 0) {
          char nm[32];
          act_name(a, nm, sizeof nm);
          snprintf(err, errlen, "pp rank %d, action %d (%s): not an action of this rank, or a repeat", r, pos[r], nm);
          rc = IR_EINPUT;
          goto out;
        }
        double dep = 0;
        bool ready = true;
        if (a->kind == ACT_F) {
          if (a->chunk > 0) ready = (dep = FIN(a->mb, a->chunk - 1, ACT_F)) >= 0;
        } else if (a->kind == ACT_B) {
          ready = FIN(a->mb, a->chunk, ACT_F) >= 0;
          if (ready && a->chunk < C - 1) ready = (dep = FIN(a->mb, a->chunk + 1, ACT_B)) >= 0;
        } else {
          ready = s->split_bw && (dep = FIN(a->mb, a->chunk, ACT_B)) >= 0;
        }
        if (!ready) break;
        double st = t[r] > dep ? t[r] : dep;
        double c = cost[a->chunk][a->kind] + (a->kind == ACT_B && !s->split_bw ? cost[a->chunk][ACT_W] : 0);
        res->start[r][pos[r]] = st;
        res->end[r][pos[r]] = t[r] = st + c;
        res->busy[r] += c;
        FIN(a->mb, a->chunk, a->kind) = st + c;
        if (a->kind == ACT_F) f_live[r]++;
        if (a->kind == ACT_B) f_live[r]--, w_live[r] += s->split_bw;
        if (a->kind == ACT_W) w_live[r]--;
        if (f_live[r] > res->peak_f[r]) res->peak_f[r] = f_live[r];
        if (w_live[r] > res->peak_w[r]) res->peak_w[r] = w_live[r];
        pos[r]++;
        progress = true;
      }
    }
    if (!left) break;
    if (!progress) {   /* every rank with actions left waits on one that cannot come */
      int k = snprintf(err, errlen, "the %s lists deadlock:", pipe_kind_names[s->kind]);
      for (int r = 0; r < p && k < (int)errlen; r++) {
        if (pos[r] >= s->n[r]) continue;
        const Action *a = &s->acts[r][pos[r]];
        char nm[32];
        act_name(a, nm, sizeof nm);
        const char *why = a->kind == ACT_F ? "the forward of the chunk before" : a->kind == ACT_B ? "the backward of the chunk after" : "its own B";
        k += snprintf(err + k, errlen - (size_t)k, " pp rank %d waits at action %d (%s) for %s;", r, pos[r], nm, why);
      }
      rc = IR_EINPUT;
      goto out;
    }
  }
#undef FIN
  for (int r = 0; r < p; r++)
    if (t[r] > res->makespan) res->makespan = t[r];
  double sum = 0;
  for (int r = 0; r < p; r++) {
    res->idle[r] = res->makespan - res->busy[r];
    sum += res->busy[r] > 0 ? res->idle[r] / res->busy[r] : 0;
  }
  res->bubble = sum / p;
out:
  free(fin), free(pos), free(f_live), free(w_live), free(t);
  if (rc) sim_result_free(res, p);
  return rc;
}

void sim_result_free(SimResult *r, int p) {
  for (int k = 0; k < p && k < 64; k++) {
    free(r->start[k]);
    free(r->end[k]);
    r->start[k] = r->end[k] = NULL;
  }
}

double schedule_bubble_formula(int kind, int p, int v, int m) {
  switch (kind) {
  case PIPE_AFAB:
  case PIPE_1F1B: return (double)(p - 1) / m;
  case PIPE_INTERLEAVED: return (double)(p - 1) / ((double)v * m);
  case PIPE_ZBH1: return (double)(p - 1) / (3.0 * m);
  default: return -1;
  }
}

void schedule_print(FILE *out, const Schedule *s, const SimResult *sim) {
  fprintf(out, "# pipeline schedule %s: pp=%d, %d chunk%s per rank, %d micro-batches (grad_accum)\n",
          pipe_kind_names[s->kind], s->p, s->v, s->v > 1 ? "s" : "", s->m);
  fprintf(out, "# F<mb>.<chunk>: forward, B: backward%s; transfers: F receives chunk-1's output and sends its own to "
          "chunk+1, B the other way\n", s->split_bw ? " (input gradients), W: weight gradients" : "");
  for (int r = 0; r < s->p; r++) {
    fprintf(out, "rank %-2d |", r);
    for (int i = 0; i < s->n[r]; i++) {
      char nm[32];
      act_name(&s->acts[r][i], nm, sizeof nm);
      fprintf(out, " %-7s", nm);
    }
    fputc('\n', out);
  }
  if (!sim) return;
  double f = schedule_bubble_formula(s->kind, s->p, s->v, s->m);
  fprintf(out, "# unit costs F=B=W=1 per chunk (B+W=2 where not split): makespan %.0f, bubble %.4f", sim->makespan, sim->bubble);
  if (f >= 0) fprintf(out, " (formula %.4f)", f);
  fputc('\n', out);
  fprintf(out, "# held activations (peak micro-batch chunks forwarded, not yet B):");
  for (int r = 0; r < s->p; r++) fprintf(out, " %d", sim->peak_f[r]);
  if (s->split_bw) {
    fprintf(out, "; waiting for W:");
    for (int r = 0; r < s->p; r++) fprintf(out, " %d", sim->peak_w[r]);
  }
  fputc('\n', out);
}

int schedule_write_trace(const char *path, const Schedule *s, double *const *start, double *const *end,
                         const char *what, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
    return IR_EINPUT;
  }
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":\"%s\",\"pp\":%d,\"virtual\":%d,\"micro\":%d,"
          "\"source\":\"%s\"},\"traceEvents\":[\n", pipe_kind_names[s->kind], s->p, s->v, s->m, what);
  for (int r = 0; r < s->p; r++)
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"pp rank %d\"}},\n", r, r);
  bool first = true;
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->n[r]; i++) {
      const Action *a = &s->acts[r][i];
      char nm[32];
      act_name(a, nm, sizeof nm);
      fprintf(f, "%s{\"name\":\"%s\",\"cat\":\"%c\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
              "\"args\":{\"mb\":%d,\"chunk\":%d,\"kind\":\"%c\"}}", first ? "" : ",\n", nm, act_letter[a->kind], r,
              start[r][i], end[r][i] - start[r][i], a->mb, a->chunk, act_letter[a->kind]);
      first = false;
    }
  fputs("\n]}\n", f);
  if (fclose(f)) {
    snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
    return IR_EINPUT;
  }
  return 0;
}

/* ---------------------------------------------------------------- a pipelined module's stash */

static Func *chunk_func(const Module *m, const char *pre, int c) {
  char name[64];
  snprintf(name, sizeof name, "%s.c%d", pre, c);
  return module_find_func(m, name);
}

/* 4 bytes an element, as the reference executor and the cpu backend hold them. */
static int64_t rets_bytes(const Func *f, int skip) {
  int64_t b = 0;
  for (int i = skip; f && i < f->rets.n; i++) b += 4 * type_numel(&((Value *)f->rets.items[i])->type);
  return b;
}

int pipe_stash_peaks(const Module *m, const Schedule *s, int64_t *peak, int64_t *f_bytes, int64_t *w_bytes) {
  for (int c = 0; c < s->chunks; c++) {
    f_bytes[c] = rets_bytes(chunk_func(m, "fwd", c), c == s->chunks - 1);
    w_bytes[c] = s->split_bw ? rets_bytes(chunk_func(m, "bwd_b", c), 0) : 0;
  }
  pipe_stash_walk(s, f_bytes, w_bytes, peak);
  return 0;
}

void pipe_stash_walk(const Schedule *s, const int64_t *f_bytes, const int64_t *w_bytes, int64_t *peak) {
  for (int q = 0; q < s->p; q++) {
    int64_t live = 0;
    peak[q] = 0;
    for (int i = 0; i < s->n[q]; i++) {
      const Action *a = &s->acts[q][i];
      if (a->kind == ACT_F) live += f_bytes[a->chunk];
      else if (a->kind == ACT_B) live += w_bytes[a->chunk] - f_bytes[a->chunk];
      else live -= w_bytes[a->chunk];
      if (live > peak[q]) peak[q] = live;
    }
  }
}

/* The chunk of a chunk function (@fwd.cK, @bwd.cK, @bwd_b.cK, @bwd_w.cK), or -1. */
static int func_chunk(const char *name) {
  int c = -1;
  char tail;
  if (sscanf(name, "fwd.c%d%c", &c, &tail) == 1 || sscanf(name, "bwd.c%d%c", &c, &tail) == 1 ||
      sscanf(name, "bwd_b.c%d%c", &c, &tail) == 1 || sscanf(name, "bwd_w.c%d%c", &c, &tail) == 1)
    return c;
  return -1;
}

int pipe_owner_of(const Module *m, const Global *gl) {
  const char *pre[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  const char *pname = gl->name;
  for (int k = 0; k < 3; k++)
    if (!strncmp(pname, pre[k], strlen(pre[k]))) pname += strlen(pre[k]);
  for (int q = 0; q < (int)m->mesh.size[AX_PP]; q++) {
    char name[64];
    snprintf(name, sizeof name, "optimizer_step.s%d", q);
    const Func *f = module_find_func(m, name);
    for (int i = 0; f && i < f->ops.n; i++) {
      const Op *op = f->ops.items[i];
      if (op->kind == OP_ASSIGN && !strcmp(op->operands[0]->global->name, pname)) return q;
    }
  }
  /* State a chunk counts into (a mixture of experts' load, moe_load.l<N>): the rank of the
     chunk that writes it; the other ranks hold zeros. */
  if (gl->kind == GLOBAL_STATE && pname == gl->name)
    for (int i = 0; i < m->funcs.n; i++) {
      const Func *f = m->funcs.items[i];
      int c = func_chunk(f->name);
      if (c < 0) continue;
      for (int k = 0; k < f->ops.n; k++) {
        const Op *op = f->ops.items[k];
        if ((op->kind == OP_ACCUMULATE || op->kind == OP_ASSIGN) && op->operands[0]->kind == VAL_GLOBAL &&
            op->operands[0]->global == gl)
          return schedule_chunk_rank(m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, c);
      }
    }
  return -1;
}

int pipe_func_rank(const Schedule *s, const char *name) {
  int r = -1;
  char tail;
  if (sscanf(name, "optimizer_step.s%d%c", &r, &tail) == 1) return r >= 0 && r < s->p ? r : -1;
  int c = func_chunk(name);
  return c >= 0 && c < s->chunks ? schedule_chunk_rank(s->kind, s->p, s->v, c) : -1;
}
