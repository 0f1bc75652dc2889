/* runtime/exec/pipe_walk.c — the pipeline walker (pipe_walk.h): the schedule walk, the
 * micro-batches, the stash slots, the losses and the measurements, once; the backends' part
 * is their transport (PipeOps). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/fail.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/pipe_walk.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* ---- the tagging communicator ---- */

static Comm *inner(Comm *c) { return ((TagComm *)c)->inner; }
static int64_t mb_tag(Comm *c, int64_t tag) { return ((((TagComm *)c)->mb + 1) << 32) | tag; }
static int tc_all_reduce(Comm *c, int axis, float *buf, int64_t n, bool max) {
  return inner(c)->all_reduce(inner(c), axis, buf, n, max);
}
static int tc_all_gather(Comm *c, int axis, const float *in, float *out, int64_t n) {
  return inner(c)->all_gather(inner(c), axis, in, out, n);
}
static int tc_reduce_scatter(Comm *c, int axis, const float *in, float *out, int64_t n) {
  return inner(c)->reduce_scatter(inner(c), axis, in, out, n);
}
static int tc_all_to_all(Comm *c, int axis, const float *in, float *out, int64_t n) {
  return inner(c)->all_to_all(inner(c), axis, in, out, n);
}
static int tc_barrier(Comm *c) { return inner(c)->barrier(inner(c)); }
static int tc_send(Comm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n) {
  return inner(c)->send(inner(c), axis, peer, mb_tag(c, tag), buf, n);
}
static int tc_recv(Comm *c, int axis, int peer, int64_t tag, float *buf, int64_t n) {
  double t = now_us();
  int rc = inner(c)->recv(inner(c), axis, peer, mb_tag(c, tag), buf, n);
  ((TagComm *)c)->waited_us += now_us() - t;
  return rc;
}

/* ---- setup ---- */

int pipe_walk_new(PipeWalk **out, int kind, int p, int v, int m, LocalWorld *lw, const int64_t mesh[COMM_AXES],
                  const int coord[COMM_AXES], const RtGlobal *place, int64_t whole_n, char *err, size_t errlen) {
  PipeWalk *w = *out = calloc(1, sizeof *w);
  if (!w) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  int rc = schedule_build(kind, p, v, m, &w->sched, err, errlen);
  if (rc) return rc;
  const Schedule *s = &w->sched;
  int n = w->n_local = lw ? local_world_rank(lw, 0)->world : 1, C = s->chunks;
  w->lw = lw;
  memcpy(w->mesh, mesh, sizeof w->mesh);
  w->place = *place;
  w->whole_n = whole_n;
  w->coord = calloc((size_t)n, sizeof *w->coord);
  w->tc = lw ? calloc((size_t)n, sizeof *w->tc) : NULL;
  w->f_fwd = calloc((size_t)C, sizeof(int)), w->f_bwd = calloc((size_t)C, sizeof(int)), w->f_bww = calloc((size_t)C, sizeof(int));
  w->f_opt = calloc((size_t)p, sizeof(int));
  w->tok = calloc((size_t)n, sizeof *w->tok), w->tgt = calloc((size_t)n, sizeof *w->tgt);
  w->act_start = calloc((size_t)n, sizeof(double *)), w->act_end = calloc((size_t)n, sizeof(double *));
  w->stash_peak = calloc((size_t)n, sizeof(int64_t));
  if (!w->coord || (lw && !w->tc) || !w->f_fwd || !w->f_bwd || !w->f_bww || !w->f_opt || !w->tok || !w->tgt ||
      !w->act_start || !w->act_end || !w->stash_peak)
    return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  for (int k = 0; k < n; k++) {
    memcpy(w->coord[k], lw ? local_world_rank(lw, k)->coord : coord, sizeof w->coord[k]);
    size_t acts = (size_t)s->n[w->coord[k][COMM_PP]] + 1, toks = (size_t)(s->m * place->n) + 1;
    w->act_start[k] = calloc(acts, sizeof(double)), w->act_end[k] = calloc(acts, sizeof(double));
    w->tok[k] = malloc(sizeof(int32_t) * toks), w->tgt[k] = malloc(sizeof(int32_t) * toks);
    if (!w->act_start[k] || !w->act_end[k] || !w->tok[k] || !w->tgt[k]) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
    if (lw) {
      TagComm *tc = &w->tc[k];
      tc->inner = local_world_rank(lw, k);
      tc->c = *tc->inner;
      tc->c.all_reduce = tc_all_reduce, tc->c.all_gather = tc_all_gather, tc->c.reduce_scatter = tc_reduce_scatter;
      tc->c.all_to_all = tc_all_to_all, tc->c.barrier = tc_barrier, tc->c.send = tc_send, tc->c.recv = tc_recv;
      tc->mb = -1;
    }
  }
  return 0;
}

static int find(PipeWalk *w, const char *pre, int k) {
  char name[64];
  snprintf(name, sizeof name, "%s%d", pre, k);
  return w->ops->find(w->ctx, name);
}

int pipe_walk_bind(PipeWalk *w, const PipeOps *ops, void *ctx, char *err, size_t errlen) {
  const Schedule *s = &w->sched;
  int C = s->chunks, rc = 0;
  w->ops = ops, w->ctx = ctx;
  for (int c = 0; !rc && c < C; c++) {
    w->f_fwd[c] = find(w, "fwd.c", c);
    w->f_bwd[c] = find(w, s->split_bw ? "bwd_b.c" : "bwd.c", c);
    w->f_bww[c] = s->split_bw ? find(w, "bwd_w.c", c) : -1;
    if (w->f_fwd[c] < 0 || w->f_bwd[c] < 0 || (s->split_bw && w->f_bww[c] < 0))
      return rt_fail(err, errlen, EXIT_USAGE, "the program has no @fwd.c%d and @%s.c%d%s: the module and its schedule (%s) "
                   "disagree", c, s->split_bw ? "bwd_b" : "bwd", c, s->split_bw ? " and @bwd_w" : "", pipe_kind_names[s->kind]);
    /* what F leaves for B (and B for W) must be what B (W) takes; the last chunk's F
       returns the loss first */
    rc = ops->takes(ctx, w->f_fwd[c], c == C - 1, w->f_bwd[c], err, errlen);
    if (!rc && s->split_bw) rc = ops->takes(ctx, w->f_bwd[c], 0, w->f_bww[c], err, errlen);
  }
  for (int q = 0; !rc && q < s->p; q++)
    if ((w->f_opt[q] = find(w, "optimizer_step.s", q)) < 0)
      rc = rt_fail(err, errlen, EXIT_USAGE, "the program has no @optimizer_step.s%d", q);
  return rc;
}

void pipe_walk_free(PipeWalk *w) {
  if (!w) return;
  for (int k = 0; k < w->n_local; k++) {
    if (w->act_start) free(w->act_start[k]), free(w->act_end[k]);
    if (w->tok) free(w->tok[k]), free(w->tgt[k]);
  }
  schedule_free(&w->sched);
  free(w->coord), free(w->tc), free(w->f_fwd), free(w->f_bwd), free(w->f_bww), free(w->f_opt), free(w->tok), free(w->tgt);
  free(w->act_start), free(w->act_end), free(w->stash_peak), free(w);
}

int pipe_walk_func(const PipeWalk *w, const Action *a) {
  return a->kind == ACT_F ? w->f_fwd[a->chunk] : a->kind == ACT_W ? w->f_bww[a->chunk] : w->f_bwd[a->chunk];
}

static bool speaks(const PipeWalk *w, int k) {
  bool yes = true;
  for (int a = 0; a < COMM_AXES; a++) yes &= a == COMM_PP || w->coord[k][a] == 0;
  return yes;
}

int pipe_walk_speaker(const PipeWalk *w, int q) {
  for (int k = 0; k < w->n_local; k++)
    if (speaks(w, k) && w->coord[k][COMM_PP] == q) return k;
  return -1;
}

/* ---- a rank's walk ---- */

typedef struct {
  void *h;
  int64_t bytes;
} Slot;

/* Rank k's actions of schedule s; record: the timeline and the stash peak (training). */
static int walk_rank(PipeWalk *w, int k, const Schedule *s, float *losses, bool record, double t0, char *err,
                     size_t errlen) {
  const PipeOps *o = w->ops;
  int q = w->coord[k][COMM_PP], C = s->chunks, n = s->n[q], rc = 0;
  Slot *stash = calloc((size_t)(2 * s->m * C) + 1, sizeof *stash), *wst = stash + s->m * C;   /* F's for B, B's for W */
  if (!stash) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  int64_t held = 0;
  float dummy;
  for (int i = 0; !rc && i < n; i++) {
    if (o->between && (rc = o->between(w->ctx, s, i, err, errlen))) break;
    const Action *a = &s->acts[q][i];
    int slot = a->mb * C + a->chunk;
    bool loss = a->kind == ACT_F && a->chunk == C - 1;
    Slot *in = a->kind == ACT_B ? &stash[slot] : a->kind == ACT_W ? &wst[slot] : NULL;
    Slot *out = a->kind == ACT_F ? &stash[slot] : a->kind == ACT_B && s->split_bw ? &wst[slot] : NULL;
    PipeCall c = {.rank = k, .action = i, .mb = a->mb, .func = pipe_walk_func(w, a), .skip = loss};
    c.tok = w->tok[k] + a->mb * w->place.n, c.tgt = w->tgt[k] + a->mb * w->place.n;
    if (in && !in->h) {
      rc = rt_fail(err, errlen, EXIT_USAGE, "pp rank %d: %c%d.%d runs before what it takes", q, "FBW"[a->kind], a->mb, a->chunk);
      break;
    }
    if (out && (rc = o->stash_alloc(w->ctx, k, c.func, loss, &out->h, &out->bytes, err, errlen))) break;
    c.in = in ? in->h : NULL, c.out = out ? out->h : NULL;
    c.loss = !loss ? NULL : speaks(w, k) || !w->lw ? &losses[a->mb] : &dummy;
    if (w->tc) w->tc[k].mb = a->mb, w->tc[k].waited_us = 0;
    double t = now_us();
    rc = o->call(w->ctx, &c, err, errlen);
    /* a chunk function receives first: its wait for the neighbour is idle time before the work */
    if (record) w->act_start[k][i] = t + (w->tc ? w->tc[k].waited_us : 0) - t0, w->act_end[k][i] = now_us() - t0;
    if (in) held -= in->bytes, o->stash_free(w->ctx, k, in->h), in->h = NULL;
    if (out) held += out->bytes;
    if (record && held > w->stash_peak[k]) w->stash_peak[k] = held;
  }
  if (!rc && o->between) rc = o->between(w->ctx, s, n, err, errlen);
  for (int j = 0; j < 2 * s->m * C; j++)
    if (stash[j].h) o->stash_free(w->ctx, k, stash[j].h);
  free(stash);
  return rc;
}

typedef struct {
  PipeWalk *w;
  int k;
  const Schedule *s;   /* NULL: the optimizer step */
  float *losses, lr, t, norm;
  bool record;
  double t0;
  int rc;
  char *err;
  size_t errlen;
  char buf[IR_ERR_LEN];
} Job;

static void *job_main(void *arg) {
  Job *j = arg;
  PipeWalk *w = j->w;
  if (j->s) {
    j->rc = walk_rank(w, j->k, j->s, j->losses, j->record, j->t0, j->err, j->errlen);
  } else {
    PipeCall c = {.rank = j->k, .action = -1, .mb = -1, .func = w->f_opt[w->coord[j->k][COMM_PP]], .lr = j->lr, .t = j->t,
                  .norm = &j->norm};
    if (w->tc) w->tc[j->k].mb = -1;
    j->rc = w->ops->call(w->ctx, &c, j->err, j->errlen);
  }
  if (j->rc && w->lw) local_world_abort(w->lw);   /* the others must not wait for this rank */
  return NULL;
}

/* Every rank of this process: threads, or the one rank here (its message unprefixed). */
static int run_ranks(PipeWalk *w, Job *jobs, char *err, size_t errlen) {
  for (int k = 0; k < w->n_local; k++) {
    jobs[k].w = w, jobs[k].k = k;
    jobs[k].err = w->n_local > 1 ? jobs[k].buf : err, jobs[k].errlen = w->n_local > 1 ? sizeof jobs[k].buf : errlen;
  }
  if (w->n_local <= 1) {
    job_main(&jobs[0]);
    return jobs[0].rc;
  }
  pthread_t *th = calloc((size_t)w->n_local, sizeof *th);
  if (!th) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  int started = 0, rc = 0;
  for (int k = 0; k < w->n_local; k++) {
    if (pthread_create(&th[k], NULL, job_main, &jobs[k])) {
      if (w->lw) local_world_abort(w->lw);
      rc = rt_fail(err, errlen, EXIT_RUN, "cannot start the thread of rank %d", k);
      break;
    }
    started++;
  }
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  free(th);
  for (int k = 0; k < started && !rc; k++)
    if (jobs[k].rc) rc = rt_fail(err, errlen, jobs[k].rc, "rank %d: %.2000s", k, jobs[k].buf);   /* the first says why */
  if (rc && w->lw && local_world_fault(w->lw))   /* the rank and collective that stopped the world */
    snprintf(err, errlen, "%.2000s", local_world_fault(w->lw));
  return rc;
}

/* Schedule s over the n micro-batches in the pieces, every rank of this process. */
static int walk(PipeWalk *w, const Schedule *s, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses,
                bool training, char *err, size_t errlen) {
  for (int64_t g = 0; g < n; g++)
    for (int k = 0; k < w->n_local; k++) {
      mesh_tokens_piece(&w->place, w->mesh, w->coord[k], inputs + g * w->whole_n, w->tok[k] + g * w->place.n);
      mesh_tokens_piece(&w->place, w->mesh, w->coord[k], targets + g * w->whole_n, w->tgt[k] + g * w->place.n);
    }
  for (int64_t g = 0; g < n; g++) losses[g] = 0;   /* the ranks of the last chunk write them */
  Job *jobs = calloc((size_t)w->n_local, sizeof *jobs);
  if (!jobs) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  int rc = w->ops->begin ? w->ops->begin(w->ctx, s, training, err, errlen) : 0;
  if (!rc) {
    double t0 = now_us();
    for (int k = 0; k < w->n_local; k++) jobs[k] = (Job){.s = s, .losses = losses, .record = training, .t0 = t0};
    rc = run_ranks(w, jobs, err, errlen);
    if (w->ops->end) rc = w->ops->end(w->ctx, rc, losses, n, err, errlen);
  }
  free(jobs);
  return rc;
}

int pipe_walk_step(PipeWalk *w, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                   size_t errlen) {
  const Schedule *s = &w->sched;
  if (n != s->m)
    return rt_fail(err, errlen, EXIT_USAGE, "the pipeline was built for %d micro-batches per step, not %lld", s->m, (long long)n);
  int rc = walk(w, s, n, inputs, targets, losses, true, err, errlen);
  if (rc) return rc;
  for (int q = 0; q < s->p && q < 64; q++) {   /* measured idle per pp rank: its first rank speaks for it */
    int k = pipe_walk_speaker(w, q);
    double busy = 0, end = 0;
    for (int i = 0; k >= 0 && i < s->n[q]; i++) {
      busy += w->act_end[k][i] - w->act_start[k][i];
      if (w->act_end[k][i] > end) end = w->act_end[k][i];
    }
    w->busy_us[q] += busy;
    w->span_us[q] += end;
  }
  w->steps++;
  return 0;
}

int pipe_walk_optimizer(PipeWalk *w, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  Job *jobs = calloc((size_t)w->n_local, sizeof *jobs);
  if (!jobs) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  for (int k = 0; k < w->n_local; k++) jobs[k] = (Job){.lr = lr, .t = t};
  int rc = run_ranks(w, jobs, err, errlen);
  if (!rc) *grad_norm = jobs[0].norm;
  free(jobs);
  return rc;
}

int pipe_forward_schedule(const Schedule *t, Schedule *ev) {
  memset(ev, 0, sizeof *ev);
  ev->kind = t->kind, ev->p = t->p, ev->v = t->v, ev->m = 1, ev->chunks = t->chunks, ev->split_bw = t->split_bw;
  ev->n = calloc((size_t)t->p, sizeof *ev->n);
  ev->acts = calloc((size_t)t->p, sizeof *ev->acts);
  if (!ev->n || !ev->acts) return -1;
  for (int q = 0; q < t->p; q++) {
    if (!(ev->acts[q] = calloc((size_t)t->chunks, sizeof(Action)))) return -1;
    for (int c = 0; c < t->chunks; c++)   /* chunk order: each receives what the one before sent */
      if (schedule_chunk_rank(t->kind, t->p, t->v, c) == q) ev->acts[q][ev->n[q]++] = (Action){ACT_F, 0, c};
  }
  return 0;
}

/* The loss of one micro-batch by every chunk's forward (the stash it leaves is dropped);
   the training steps' timeline and stash peaks are left as they were. */
int pipe_walk_eval(PipeWalk *w, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  Schedule ev;
  int rc = pipe_forward_schedule(&w->sched, &ev) ? rt_fail(err, errlen, EXIT_RUN, "out of memory") : 0;
  if (!rc) rc = walk(w, &ev, 1, inputs, targets, loss, false, err, errlen);
  schedule_free(&ev);
  return rc;
}

int pipe_walk_trace(const PipeWalk *w, const char *path, const char *backend, char *err, size_t errlen) {
  double *st[64], *en[64];   /* the last step's timeline of the first rank of every stage */
  for (int q = 0; q < w->sched.p && q < 64; q++) {
    int k = pipe_walk_speaker(w, q);
    if (k < 0) return rt_fail(err, errlen, EXIT_USAGE, "the timeline of pp rank %d is not in this process", q);
    st[q] = w->act_start[k], en[q] = w->act_end[k];
  }
  char what[128];
  snprintf(what, sizeof what, "measured: loom train, %s, the last step", backend);
  return schedule_write_trace(path, &w->sched, st, en, what, err, errlen);
}

int pipe_rt_takes(const RtProgram *p, int from, int skip, int to, char *err, size_t errlen) {
  const RtFunc *f = &p->funcs[from], *g = &p->funcs[to];
  bool ok = f->n_rets - skip == g->n_args - 2;
  for (int j = 0; ok && j < g->n_args - 2; j++)
    ok = f->rets[skip + j].n == g->args[2 + j].n && f->rets[skip + j].storage == g->args[2 + j].storage;
  return ok ? 0 : rt_fail(err, errlen, EXIT_USAGE, "@%s's results are not what @%s takes", f->name, g->name);
}

static int64_t rets_bytes(const RtProgram *p, int f, int skip) {
  int64_t b = 0;
  for (int k = skip; f >= 0 && k < p->funcs[f].n_rets; k++) b += 4 * p->funcs[f].rets[k].n;
  return b;
}

void pipe_rt_stash_peaks(const PipeWalk *w, const RtProgram *p, int64_t *peak) {
  const Schedule *s = &w->sched;
  int64_t *fb = calloc((size_t)s->chunks + 1, sizeof *fb), *wb = calloc((size_t)s->chunks + 1, sizeof *wb);
  for (int q = 0; q < s->p; q++) peak[q] = 0;
  for (int c = 0; fb && wb && c < s->chunks; c++) {
    fb[c] = rets_bytes(p, w->f_fwd[c], c == s->chunks - 1);
    wb[c] = s->split_bw ? rets_bytes(p, w->f_bwd[c], 0) : 0;
  }
  if (fb && wb) pipe_stash_walk(s, fb, wb, peak);
  free(fb), free(wb);
}
