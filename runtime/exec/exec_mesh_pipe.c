/* runtime/exec/exec_mesh_pipe.c — a pipelined module (pass "pipeline") on the cpu backend.
 *
 * The same driver as the reference executor's (exec_pipe.c), over the lowered program:
 * every rank is a thread with its own CpuProgram; a step walks the rank's action list of the
 * schedule (ir/schedule.h) — F runs @fwd.cK on the micro-batch and keeps its results (the
 * stash) in buffers of their own, B runs @bwd.cK (or @bwd_b.cK, whose results W takes) with
 * the stash as arguments, W runs @bwd_w.cK — and then every rank runs @optimizer_step.sR of
 * its pp coordinate.  Point-to-point transfers are the program's send/recv builtins; each
 * rank's TagComm adds the micro-batch to their tags.  The start and end of every action are
 * recorded in the RefExec (the measured timeline and idle time), and the stash held is
 * measured after every action, as the reference executor measures it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/exec.h"

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

/* ---- a rank's step ---- */

typedef struct {
  MeshCpu *mc;
  int rank;
  float *losses;       /* [n_micro]: written by one rank of the last chunk */
  bool opt;
  float lr, t, norm;
  double t0;
  int rc;
  char err[1024];
} PipeJob;

/* What one action leaves held: its results but the loss, in one block. */
typedef struct {
  float *block;
  void *ptr[RT_MAX_FUNC_IO];
  int n;
  int64_t bytes;
} Held;

static int hold(Held *h, const RtFunc *fn, int skip) {
  int64_t total = 0;
  for (int r = skip; r < fn->n_rets; r++) total += fn->rets[r].n;
  h->block = malloc(4 * (size_t)(total ? total : 1));
  if (!h->block) return 1;
  h->n = fn->n_rets - skip;
  h->bytes = 4 * total;
  int64_t at = 0;
  for (int r = skip; r < fn->n_rets; r++) {
    h->ptr[r - skip] = h->block + at;
    at += fn->rets[r].n;
  }
  return 0;
}

static void release(Held *h) {
  free(h->block);
  memset(h, 0, sizeof *h);
}

static void *pipe_rank(void *arg) {
  PipeJob *j = arg;
  MeshCpu *mc = j->mc;
  RefExec *r = &mc->rx;
  RtDevice *dev = &mc->dev[j->rank];
  TagComm *tc = &mc->tc[j->rank];
  int q = tc->c.coord[COMM_PP];
  if (j->opt) {
    tc->mb = -1;
    void *args[2] = {&j->lr, &j->t}, *rets[RT_MAX_FUNC_IO] = {&j->norm};
    j->rc = dev->call(dev, mc->f_stage_opt[q], args, rets, j->err, sizeof j->err);
    if (j->rc) local_world_abort(r->lw);
    return NULL;
  }
  const Schedule *s = r->sched;
  int C = s->chunks;
  /* one rank of the last stage's group reports the losses (the shard pass replicates them) */
  bool speaks = true;
  for (int a = 0; a < COMM_AXES; a++) speaks &= a == COMM_PP || tc->c.coord[a] == 0;
  Held *stash = calloc((size_t)(mc->n_micro * C), sizeof(Held)), *wst = calloc((size_t)(mc->n_micro * C), sizeof(Held));
  void **args = calloc(RT_MAX_FUNC_IO, sizeof(void *)), **rets = calloc(RT_MAX_FUNC_IO, sizeof(void *));
  if (!stash || !wst || !args || !rets) {
    snprintf(j->err, sizeof j->err, "out of memory");
    j->rc = EXIT_RUN;
  }
  int64_t held = 0;
  for (int i = 0; !j->rc && i < s->n[q]; i++) {
    const Action *a = &s->acts[q][i];
    int slot = a->mb * C + a->chunk;
    int fi = a->kind == ACT_F ? mc->f_fwd[a->chunk] : a->kind == ACT_W ? mc->f_bwd_w[a->chunk] : mc->f_bwd[a->chunk];
    if (fi < 0) {
      snprintf(j->err, sizeof j->err, "the program has no function for action %c%d.%d", "FBW"[a->kind], a->mb, a->chunk);
      j->rc = EXIT_USAGE;
      break;
    }
    const RtFunc *fn = &dev->p->funcs[fi];
    Held *in = a->kind == ACT_B ? &stash[slot] : a->kind == ACT_W ? &wst[slot] : NULL;
    int nin = in ? in->n : 0;
    if (fn->n_args != 2 + nin) {
      snprintf(j->err, sizeof j->err, "@%s takes %d arguments; the stash has %d", fn->name, fn->n_args, 2 + nin);
      j->rc = EXIT_USAGE;
      break;
    }
    args[0] = mc->mtok[j->rank] + a->mb * mc->piece;
    args[1] = mc->mtgt[j->rank] + a->mb * mc->piece;
    for (int k = 0; k < nin; k++) args[2 + k] = in->ptr[k];
    /* results: F keeps them (but the loss) for B; a split B keeps them for W */
    bool loss = a->kind == ACT_F && a->chunk == C - 1;
    float dummy;
    Held *out = a->kind == ACT_F ? &stash[slot] : a->kind == ACT_B && s->split_bw ? &wst[slot] : NULL;
    memset(rets, 0, RT_MAX_FUNC_IO * sizeof(void *));
    if (out && hold(out, fn, loss)) {
      snprintf(j->err, sizeof j->err, "out of memory for the stash of %c%d.%d", "FBW"[a->kind], a->mb, a->chunk);
      j->rc = EXIT_RUN;
      break;
    }
    if (loss) rets[0] = speaks ? &j->losses[a->mb] : &dummy;
    for (int k = 0; out && k < out->n; k++) rets[loss + k] = out->ptr[k];
    tc->mb = a->mb;
    tc->waited_us = 0;
    double t = now_us();
    j->rc = dev->call(dev, fi, args, rets, j->err, sizeof j->err);
    /* a chunk function receives first: its wait for the neighbour is idle time before the work */
    r->act_start[j->rank][i] = t + tc->waited_us - j->t0;
    r->act_end[j->rank][i] = now_us() - j->t0;
    if (in) held -= in->bytes, release(in);
    if (out) held += out->bytes;
    if (held > r->stash_peak[j->rank]) r->stash_peak[j->rank] = held;
  }
  for (int k = 0; stash && wst && k < mc->n_micro * C; k++) release(&stash[k]), release(&wst[k]);
  free(stash), free(wst), free(args), free(rets);
  if (j->rc) local_world_abort(r->lw);
  return NULL;
}

static int run_all(MeshCpu *mc, PipeJob *jobs, char *err, size_t errlen) {
  pthread_t *th = calloc((size_t)mc->world, sizeof *th);
  if (!th) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int started = 0, rc = 0;
  for (int k = 0; k < mc->world; k++) {
    if (pthread_create(&th[k], NULL, pipe_rank, &jobs[k])) {
      local_world_abort(mc->rx.lw);
      snprintf(err, errlen, "cannot start the thread of rank %d", k);
      rc = EXIT_RUN;
      break;
    }
    started++;
  }
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  free(th);
  for (int k = 0; k < started && !rc; k++)
    if (jobs[k].rc) {   /* the first rank that failed says why (the others were aborted) */
      rc = jobs[k].rc;
      snprintf(err, errlen, "rank %d: %.2000s", k, jobs[k].err);
    }
  if (rc && mc->rx.lw && local_world_fault(mc->rx.lw))   /* the rank and collective that stopped the world */
    snprintf(err, errlen, "%.2000s", local_world_fault(mc->rx.lw));
  return rc;
}

/* every rank's piece of each of n micro-batches */
static void fill_pieces(MeshCpu *mc, int64_t n, const int32_t *inputs, const int32_t *targets) {
  int64_t mesh[COMM_AXES], BT = mc->whole_n;
  for (int a = 0; a < COMM_AXES; a++) mesh[a] = mc->rx.m->mesh.size[a];
  for (int64_t g = 0; g < n; g++)
    for (int k = 0; k < mc->world; k++) {
      const int *coord = local_world_rank(mc->rx.lw, k)->coord;
      mesh_tokens_piece(&mc->tok_place, mesh, coord, inputs + g * BT, mc->mtok[k] + g * mc->piece);
      mesh_tokens_piece(&mc->tok_place, mesh, coord, targets + g * BT, mc->mtgt[k] + g * mc->piece);
    }
}

/* Validation: one micro-batch's forward through every chunk (exec_pipe.c's forward-only
   schedule); the last step's timeline and the stash peaks are kept. */
static int pipe_eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err,
                          size_t errlen) {
  MeshCpu *mc = self;
  RefExec *r = &mc->rx;
  Schedule ev, *train = r->sched;
  PipeSaved sv;
  memset(&ev, 0, sizeof ev);
  memset(&sv, 0, sizeof sv);
  PipeJob *jobs = calloc((size_t)mc->world, sizeof *jobs);
  int rc = 0;
  if (!jobs || pipe_forward_schedule(train, &ev) || pipe_save(r, &sv)) {
    snprintf(err, errlen, "out of memory");
    rc = EXIT_RUN;
  }
  if (!rc) {
    fill_pieces(mc, 1, inputs, targets);
    double t0 = now_us();
    for (int k = 0; k < mc->world; k++) jobs[k] = (PipeJob){.mc = mc, .rank = k, .losses = loss, .t0 = t0};
    r->sched = &ev;
    rc = run_all(mc, jobs, err, errlen);
    r->sched = train;
  }
  pipe_restore(r, &sv);
  schedule_free(&ev);
  free(jobs);
  return rc;
}

static int pipeline_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                         size_t errlen) {
  MeshCpu *mc = self;
  RefExec *r = &mc->rx;
  if (n != mc->n_micro) {
    snprintf(err, errlen, "the pipeline was built for %lld micro-batches per step, not %lld", (long long)mc->n_micro,
             (long long)n);
    return EXIT_USAGE;
  }
  fill_pieces(mc, n, inputs, targets);
  PipeJob *jobs = calloc((size_t)mc->world, sizeof *jobs);
  if (!jobs) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  double t0 = now_us();
  for (int k = 0; k < mc->world; k++) jobs[k] = (PipeJob){.mc = mc, .rank = k, .losses = losses, .t0 = t0};
  int rc = run_all(mc, jobs, err, errlen);
  free(jobs);
  if (!rc) {   /* measured idle per pp rank (the first rank of each stage's group speaks for it) */
    for (int q = 0; q < r->sched->p; q++) {
      int coord[COMM_AXES] = {0};
      coord[COMM_PP] = q;
      int k = mesh_rank_of(local_world_rank(r->lw, 0)->mesh, coord);
      double busy = 0, end = 0;
      for (int i = 0; i < r->sched->n[q]; i++) {
        busy += r->act_end[k][i] - r->act_start[k][i];
        if (r->act_end[k][i] > end) end = r->act_end[k][i];
      }
      r->busy_us[q] += busy;
      r->span_us[q] += end;
    }
    r->pipe_steps++;
  }
  return rc;
}

static int pipe_optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  MeshCpu *mc = self;
  PipeJob *jobs = calloc((size_t)mc->world, sizeof *jobs);
  if (!jobs) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int k = 0; k < mc->world; k++) jobs[k] = (PipeJob){.mc = mc, .rank = k, .opt = true, .lr = lr, .t = t};
  int rc = run_all(mc, jobs, err, errlen);
  if (!rc) *grad_norm = jobs[0].norm;
  free(jobs);
  return rc;
}

/* ---- setup ---- */

static int find(MeshCpu *mc, const char *pre, int k) {
  char name[64];
  snprintf(name, sizeof name, "%s%d", pre, k);
  return cpu_find_func(&mc->b.cp, name);
}

int pipe_cpu_setup(MeshCpu *mc, char *err, size_t errlen) {
  const Schedule *s = mc->rx.sched;
  int C = s->chunks, P = s->p;
  mc->n_micro = s->m;
  mc->piece = mc->tok_place.n;
  mc->tc = calloc((size_t)mc->world, sizeof *mc->tc);
  mc->f_fwd = calloc((size_t)C, sizeof(int));
  mc->f_bwd = calloc((size_t)C, sizeof(int));
  mc->f_bwd_w = calloc((size_t)C, sizeof(int));
  mc->f_stage_opt = calloc((size_t)P, sizeof(int));
  mc->mtok = calloc((size_t)mc->world, sizeof(int32_t *));
  mc->mtgt = calloc((size_t)mc->world, sizeof(int32_t *));
  if (!mc->tc || !mc->f_fwd || !mc->f_bwd || !mc->f_bwd_w || !mc->f_stage_opt || !mc->mtok || !mc->mtgt) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int c = 0; c < C; c++) {
    mc->f_fwd[c] = find(mc, "fwd.c", c);
    mc->f_bwd[c] = find(mc, s->split_bw ? "bwd_b.c" : "bwd.c", c);
    mc->f_bwd_w[c] = s->split_bw ? find(mc, "bwd_w.c", c) : -1;
    if (mc->f_fwd[c] < 0 || mc->f_bwd[c] < 0 || (s->split_bw && mc->f_bwd_w[c] < 0)) {
      snprintf(err, errlen, "the program has no @fwd.c%d and @%s.c%d%s: the module and its schedule (%s) disagree", c,
               s->split_bw ? "bwd_b" : "bwd", c, s->split_bw ? " and @bwd_w" : "", pipe_kind_names[s->kind]);
      return EXIT_USAGE;
    }
  }
  for (int q = 0; q < P; q++)
    if ((mc->f_stage_opt[q] = find(mc, "optimizer_step.s", q)) < 0) {
      snprintf(err, errlen, "the program has no @optimizer_step.s%d", q);
      return EXIT_USAGE;
    }
  for (int k = 0; k < mc->world; k++) {
    TagComm *tc = &mc->tc[k];
    tc->inner = mc->cpu[k].comm;
    tc->c = *tc->inner;
    tc->c.all_reduce = tc_all_reduce, tc->c.all_gather = tc_all_gather, tc->c.reduce_scatter = tc_reduce_scatter;
    tc->c.all_to_all = tc_all_to_all, tc->c.barrier = tc_barrier, tc->c.send = tc_send, tc->c.recv = tc_recv;
    mc->cpu[k].comm = &tc->c;
    mc->mtok[k] = malloc(sizeof(int32_t) * (size_t)(mc->n_micro * mc->piece));
    mc->mtgt[k] = malloc(sizeof(int32_t) * (size_t)(mc->n_micro * mc->piece));
    if (!mc->mtok[k] || !mc->mtgt[k]) {
      snprintf(err, errlen, "out of memory");
      return EXIT_RUN;
    }
  }
  mc->ex.grad_step = NULL;
  mc->ex.pipeline_step = pipeline_step;
  mc->ex.optimizer_step = pipe_optimizer_step;
  mc->ex.eval_step = pipe_eval_step;
  return 0;
}

void pipe_cpu_free(MeshCpu *mc) {
  for (int k = 0; k < mc->world && mc->tc; k++)
    if (mc->cpu && mc->tc[k].inner) mc->cpu[k].comm = mc->tc[k].inner;
  for (int k = 0; k < mc->world && mc->mtok; k++) free(mc->mtok[k]), free(mc->mtgt[k]);
  free(mc->tc), free(mc->f_fwd), free(mc->f_bwd), free(mc->f_bwd_w), free(mc->f_stage_opt), free(mc->mtok), free(mc->mtgt);
  mc->tc = NULL, mc->mtok = mc->mtgt = NULL;
}
