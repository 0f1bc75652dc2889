/* runtime/exec/exec_pipe.c — a pipelined module (pass "pipeline") on the reference executor.
 *
 * Every rank is a thread.  A step: each rank walks its pp coordinate's action list (the
 * schedule, ir/schedule.h) — F calls @fwd.cK on the micro-batch and keeps the stash it
 * returns, B calls @bwd.cK (or @bwd_b.cK, keeping what W needs), W calls @bwd_w.cK — with
 * point-to-point transfers through the in-process communicator (tags: the micro-batch and
 * the op's tag).  Then every rank runs its @optimizer_step.sR.  The start and end of every
 * action are recorded: the measured timeline (--trace-out) and each rank's idle time.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir/schedule.h"
#include "runtime/exec/exec_ref.h"
#include "runtime/exec/exec.h"

typedef struct {
  IrComm ir;
  Comm *comm;
  int64_t mb;   /* the current micro-batch (-1: the optimizer step) */
  double waited_us;   /* time spent in recv during the current action (idle, not work) */
} PipeComm;

static int64_t full_tag(PipeComm *pc, int64_t tag) { return ((pc->mb + 1) << 32) | tag; }
static int pc_all_reduce(IrComm *c, int axis, float *buf, int64_t n, bool max) {
  Comm *k = ((PipeComm *)c)->comm;
  return k->all_reduce(k, axis, buf, n, max);
}
static int pc_all_gather(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  Comm *k = ((PipeComm *)c)->comm;
  return k->all_gather(k, axis, in, out, n);
}
static int pc_reduce_scatter(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  Comm *k = ((PipeComm *)c)->comm;
  return k->reduce_scatter(k, axis, in, out, n);
}
static int pc_all_to_all(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  Comm *k = ((PipeComm *)c)->comm;
  return k->all_to_all(k, axis, in, out, n);
}
static int pc_send(IrComm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n) {
  PipeComm *pc = (PipeComm *)c;
  return pc->comm->send(pc->comm, axis, peer, full_tag(pc, tag), buf, n);
}
static double now_us(void);
static int pc_recv(IrComm *c, int axis, int peer, int64_t tag, float *buf, int64_t n) {
  PipeComm *pc = (PipeComm *)c;
  double t = now_us();
  int rc = pc->comm->recv(pc->comm, axis, peer, full_tag(pc, tag), buf, n);
  pc->waited_us += now_us() - t;
  return rc;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

typedef struct {
  RefExec *r;
  int rank;
  int64_t n_micro;
  Tensor **tok, **tgt;   /* per micro-batch: this rank's pieces */
  float *losses;         /* [n_micro], written by the ranks of the last chunk */
  bool opt;              /* run the optimizer step instead */
  float norm;
  double t0;
  int rc;
  char err[IR_ERR_LEN];
} PipeJob;

static Func *chunk_func(const Module *m, const char *pre, int c) {
  char name[64];
  snprintf(name, sizeof name, "%s.c%d", pre, c);
  return module_find_func(m, name);
}

static void free_list(Tensor **t, int n) {
  for (int i = 0; i < n; i++) tensor_free(t[i]);
  free(t);
}

static void *pipe_rank(void *arg) {
  PipeJob *j = arg;
  RefExec *r = j->r;
  const Module *m = r->m;
  PipeComm pc = {{NULL, {0}, pc_all_reduce, pc_all_gather, pc_reduce_scatter, pc_all_to_all, pc_send, pc_recv}, NULL, -1, 0};
  pc.comm = local_world_rank(r->lw, j->rank);
  memcpy(pc.ir.coord, pc.comm->coord, sizeof pc.ir.coord);
  int q = pc.comm->coord[COMM_PP];
  if (j->opt) {
    char name[64];
    snprintf(name, sizeof name, "optimizer_step.s%d", q);
    Func *f = module_find_func(m, name);
    Tensor *args[2] = {r->lr, r->step}, *ret = NULL;
    if (!f) {
      snprintf(j->err, sizeof j->err, "the module has no @%s", name);
      j->rc = EXIT_USAGE;
    } else {
      j->rc = interp_run_comm(f, r->g[j->rank], args, &ret, &pc.ir, j->err, sizeof j->err);
    }
    if (!j->rc) j->norm = ret->f[0];
    tensor_free(ret);
    if (j->rc) local_world_abort(r->lw);
    return NULL;
  }
  const Schedule *s = r->sched;
  int C = s->chunks;
  /* stash[mb * C + c]: what the forward left for B; wst: what B left for W */
  Tensor ***stash = calloc((size_t)(j->n_micro * C), sizeof(Tensor **)), ***wst = calloc((size_t)(j->n_micro * C), sizeof(Tensor **));
  int *nst = calloc((size_t)(j->n_micro * C), sizeof(int)), *nwst = calloc((size_t)(j->n_micro * C), sizeof(int));
  for (int i = 0; i < s->n[q] && !j->rc; i++) {
    const Action *a = &s->acts[q][i];
    int slot = a->mb * C + a->chunk;
    pc.mb = a->mb;
    Func *f = chunk_func(m, a->kind == ACT_F ? "fwd" : a->kind == ACT_W ? "bwd_w" : s->split_bw ? "bwd_b" : "bwd", a->chunk);
    if (!f) {
      snprintf(j->err, sizeof j->err, "the module has no function for action %c%d.%d", "FBW"[a->kind], a->mb, a->chunk);
      j->rc = EXIT_USAGE;
      break;
    }
    Tensor *args[IR_MAX_RESULTS + 2] = {j->tok[a->mb], j->tgt[a->mb]};
    int na = 2;
    Tensor **in = a->kind == ACT_B ? stash[slot] : a->kind == ACT_W ? wst[slot] : NULL;
    int nin = a->kind == ACT_B ? nst[slot] : a->kind == ACT_W ? nwst[slot] : 0;
    if (f->args.n != 2 + nin || f->rets.n > IR_MAX_RESULTS) {
      snprintf(j->err, sizeof j->err, "@%s takes %d arguments; the stash has %d", f->name, f->args.n, 2 + nin);
      j->rc = EXIT_USAGE;
      break;
    }
    for (int k = 0; k < nin; k++) args[na++] = in[k];
    Tensor **rets = calloc((size_t)f->rets.n + 1, sizeof(Tensor *));
    double t = now_us();
    pc.waited_us = 0;
    j->rc = interp_run_comm(f, r->g[j->rank], args, rets, &pc.ir, j->err, sizeof j->err);
    /* a chunk function receives first: its wait for the neighbour is idle time before the work */
    r->act_start[j->rank][i] = t + pc.waited_us - j->t0;
    r->act_end[j->rank][i] = now_us() - j->t0;
    if (in) {
      free_list(in, nin);
      if (a->kind == ACT_B) stash[slot] = NULL;
      else wst[slot] = NULL;
    }
    if (j->rc) {
      free_list(rets, f->rets.n);
      break;
    }
    int first = 0;
    if (a->kind == ACT_F && a->chunk == C - 1) {   /* the loss comes first */
      j->losses[a->mb] = rets[0]->f[0];
      tensor_free(rets[0]);
      first = 1;
    }
    int nout = f->rets.n - first;
    if (first) memmove(rets, rets + 1, sizeof(Tensor *) * (size_t)nout);
    if (a->kind == ACT_F) stash[slot] = rets, nst[slot] = nout;
    else if (a->kind == ACT_B && s->split_bw) wst[slot] = rets, nwst[slot] = nout;
    else free_list(rets, f->rets.n);
    /* the stash this rank holds now, measured from the tensors themselves */
    int64_t held = 0;
    for (int k = 0; k < j->n_micro * C; k++) {
      for (int t = 0; stash[k] && t < nst[k]; t++) held += 4 * stash[k][t]->n;
      for (int t = 0; wst[k] && t < nwst[k]; t++) held += 4 * wst[k][t]->n;
    }
    if (held > r->stash_peak[j->rank]) r->stash_peak[j->rank] = held;
  }
  for (int k = 0; k < j->n_micro * C; k++) {
    if (stash[k]) free_list(stash[k], nst[k]);
    if (wst[k]) free_list(wst[k], nwst[k]);
  }
  free(stash), free(wst), free(nst), free(nwst);
  if (j->rc) local_world_abort(r->lw);
  return NULL;
}

static int run_all(RefExec *r, PipeJob *jobs, char *err, size_t errlen) {
  pthread_t *th = calloc((size_t)r->world, sizeof *th);
  for (int k = 0; k < r->world; k++) pthread_create(&th[k], NULL, pipe_rank, &jobs[k]);
  for (int k = 0; k < r->world; k++) pthread_join(th[k], NULL);
  free(th);
  int rc = 0;
  for (int k = 0; k < r->world && !rc; k++)
    if (jobs[k].rc) {
      rc = jobs[k].rc;
      snprintf(err, errlen, "rank %d: %.2000s", k, jobs[k].err);
    }
  if (rc && r->lw && local_world_fault(r->lw))   /* the rank and collective that stopped the world */
    snprintf(err, errlen, "%.2000s", local_world_fault(r->lw));
  if (rc) {   /* a failed world cannot be reused */
    int64_t mesh[COMM_AXES];
    for (int a = 0; a < COMM_AXES; a++) mesh[a] = r->m->mesh.size[a];
    local_world_free(r->lw);
    char e2[256];
    r->lw = local_world_new(mesh, e2, sizeof e2);
  }
  return rc;
}

/* Runs the current schedule (r->sched) over n micro-batches: every rank a thread. */
static int run_micro_batches(RefExec *r, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses,
                             char *err, size_t errlen) {
  int64_t BT = r->inputs->n;
  PipeJob *jobs = calloc((size_t)r->world, sizeof *jobs);
  const Type *lt = &((Value *)module_find_func(r->m, "fwd.c0")->args.items[0])->type;
  double t0 = now_us();
  for (int k = 0; k < r->world; k++) {
    PipeJob *j = &jobs[k];
    *j = (PipeJob){.r = r, .rank = k, .n_micro = n, .losses = losses, .t0 = t0};
    j->tok = calloc((size_t)n, sizeof(Tensor *));
    j->tgt = calloc((size_t)n, sizeof(Tensor *));
    const int *coord = local_world_rank(r->lw, k)->coord;
    for (int64_t g = 0; g < n; g++) {
      for (int64_t e = 0; e < BT; e++) r->inputs->i[e] = inputs[g * BT + e], r->targets->i[e] = targets[g * BT + e];
      j->tok[g] = tensor_new(lt);
      j->tgt[g] = tensor_new(lt);
      move_piece(&r->m->mesh, r->inputs, j->tok[g], coord, true);
      move_piece(&r->m->mesh, r->targets, j->tgt[g], coord, true);
    }
  }
  int rc = run_all(r, jobs, err, errlen);
  for (int k = 0; k < r->world; k++) {
    for (int64_t g = 0; g < n; g++) tensor_free(jobs[k].tok[g]), tensor_free(jobs[k].tgt[g]);
    free(jobs[k].tok), free(jobs[k].tgt);
  }
  free(jobs);
  return rc;
}

static int pipeline_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                         size_t errlen) {
  RefExec *r = self;
  if (n != r->sched->m) {
    snprintf(err, errlen, "the pipeline was built for %d micro-batches per step, not %lld", r->sched->m, (long long)n);
    return EXIT_USAGE;
  }
  int rc = run_micro_batches(r, n, inputs, targets, losses, err, errlen);
  if (!rc) {   /* measured idle per pp rank (rank 0 of each stage's group speaks for it) */
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
  RefExec *r = self;
  r->lr->f[0] = lr;
  r->step->f[0] = t;
  PipeJob *jobs = calloc((size_t)r->world, sizeof *jobs);
  for (int k = 0; k < r->world; k++) jobs[k] = (PipeJob){.r = r, .rank = k, .opt = true};
  int rc = run_all(r, jobs, err, errlen);
  if (!rc) *grad_norm = jobs[0].norm;
  free(jobs);
  return rc;
}

/* The pp coordinate whose optimizer step assigns the global's parameter (its owner; the
   first when tied copies are kept on two), or -1. */
int pipe_owner_of(const Module *m, const Global *gl) {
  const char *pre[] = {GRAD_PREFIX, ADAM_M_PREFIX, ADAM_V_PREFIX};
  const char *pname = gl->name;
  for (int k = 0; k < 3; k++)
    if (!strncmp(pname, pre[k], strlen(pre[k]))) pname += strlen(pre[k]);
  char want[600];
  snprintf(want, sizeof want, "%s", pname);
  for (int q = 0; q < (int)m->mesh.size[AX_PP]; q++) {
    char name[64];
    snprintf(name, sizeof name, "optimizer_step.s%d", q);
    const Func *f = module_find_func(m, name);
    for (int i = 0; f && i < f->ops.n; i++) {
      const Op *op = f->ops.items[i];
      if (op->kind == OP_ASSIGN && !strcmp(op->operands[0]->global->name, want)) return q;
    }
  }
  return -1;
}

/* ---- validation: one micro-batch's forward through every chunk ---- */

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

int pipe_save(RefExec *r, PipeSaved *sv) {
  memset(sv, 0, sizeof *sv);
  sv->start = calloc((size_t)r->world, sizeof(double *));
  sv->end = calloc((size_t)r->world, sizeof(double *));
  sv->peak = malloc(sizeof(int64_t) * (size_t)r->world);
  if (!sv->start || !sv->end || !sv->peak) return -1;
  memcpy(sv->peak, r->stash_peak, sizeof(int64_t) * (size_t)r->world);
  for (int k = 0; k < r->world; k++) {
    size_t n = (size_t)r->sched->n[local_world_rank(r->lw, k)->coord[COMM_PP]] + 1;
    if (!(sv->start[k] = malloc(n * sizeof(double))) || !(sv->end[k] = malloc(n * sizeof(double)))) return -1;
    memcpy(sv->start[k], r->act_start[k], n * sizeof(double));
    memcpy(sv->end[k], r->act_end[k], n * sizeof(double));
  }
  return 0;
}

void pipe_restore(RefExec *r, PipeSaved *sv) {
  for (int k = 0; k < r->world; k++) {
    size_t n = (size_t)r->sched->n[local_world_rank(r->lw, k)->coord[COMM_PP]] + 1;
    if (sv->start && sv->start[k]) memcpy(r->act_start[k], sv->start[k], n * sizeof(double));
    if (sv->end && sv->end[k]) memcpy(r->act_end[k], sv->end[k], n * sizeof(double));
    if (sv->start) free(sv->start[k]);
    if (sv->end) free(sv->end[k]);
  }
  if (sv->peak) memcpy(r->stash_peak, sv->peak, sizeof(int64_t) * (size_t)r->world);
  free(sv->start), free(sv->end), free(sv->peak);
  memset(sv, 0, sizeof *sv);
}

/* The loss of one micro-batch by every chunk's forward (F actions only, in chunk order on
   every rank; the stash they leave is dropped).  The last step's timeline and the stash
   peaks are the training steps' (saved and restored around it). */
static int pipe_eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err,
                          size_t errlen) {
  RefExec *r = self;
  Schedule ev, *train = r->sched;
  PipeSaved sv;
  memset(&ev, 0, sizeof ev);
  memset(&sv, 0, sizeof sv);
  int rc = 0;
  if (pipe_forward_schedule(train, &ev) || pipe_save(r, &sv)) {
    snprintf(err, errlen, "out of memory");
    rc = EXIT_RUN;
  }
  if (!rc) {
    r->sched = &ev;
    rc = run_micro_batches(r, 1, inputs, targets, loss, err, errlen);
    r->sched = train;
  }
  pipe_restore(r, &sv);
  schedule_free(&ev);
  return rc;
}

int pipe_exec_setup(RefExec *r, char *err, size_t errlen) {
  const Module *m = r->m;
  Func *f0 = module_find_func(m, "fwd.c0");
  if (!f0 || f0->args.n < 2) {
    snprintf(err, errlen, "the module says it is pipelined but has no @fwd.c0(tokens, targets, ...)");
    return EXIT_USAGE;
  }
  r->sched = calloc(1, sizeof(Schedule));
  int rc = schedule_build(m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, (int)m->pipe.micro, r->sched, err, errlen);
  if (rc) return rc;
  r->act_start = calloc((size_t)r->world, sizeof(double *));
  r->act_end = calloc((size_t)r->world, sizeof(double *));
  for (int k = 0; k < r->world; k++) {
    int q = local_world_rank(r->lw, k)->coord[COMM_PP];
    r->act_start[k] = calloc((size_t)r->sched->n[q] + 1, sizeof(double));
    r->act_end[k] = calloc((size_t)r->sched->n[q] + 1, sizeof(double));
  }
  r->stash_peak = calloc((size_t)r->world, sizeof(int64_t));
  r->owner = calloc((size_t)m->globals.n + 1, sizeof(int));
  for (int i = 0; i < m->globals.n; i++) r->owner[i] = pipe_owner_of(m, m->globals.items[i]);
  r->ex.grad_step = NULL;
  r->ex.pipeline_step = pipeline_step;
  r->ex.optimizer_step = pipe_optimizer_step;
  r->ex.eval_step = pipe_eval_step;
  return 0;
}

void pipe_exec_free(RefExec *r) {
  if (r->sched) {
    for (int k = 0; k < r->world && r->act_start; k++) free(r->act_start[k]), free(r->act_end[k]);
    schedule_free(r->sched);
  }
  free(r->act_start), free(r->act_end), free(r->sched), free(r->owner), free(r->stash_peak);
}

int pipe_exec_trace(RefExec *r, const char *path, const char *backend, char *err, size_t errlen) {
  /* the last step's timeline of the first rank of every stage */
  double *st[64], *en[64];
  for (int q = 0; q < r->sched->p && q < 64; q++) {
    int coord[COMM_AXES] = {0};
    coord[COMM_PP] = q;
    int k = mesh_rank_of(local_world_rank(r->lw, 0)->mesh, coord);
    st[q] = r->act_start[k];
    en[q] = r->act_end[k];
  }
  char what[128];
  snprintf(what, sizeof what, "measured: loom train, %s, the last step", backend);
  return schedule_write_trace(path, r->sched, st, en, what, err, errlen);
}


