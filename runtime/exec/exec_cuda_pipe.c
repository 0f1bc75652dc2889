/* runtime/exec/exec_cuda_pipe.c — a pipelined program (pass "pipeline") on one rank of a CUDA
 * mesh: the device transport (exec_mesh_pipe.c: the stash in device memory, RtDevice.buf_alloc,
 * passed to the consumer as device arguments, RtDevice.call_dev) with this file's hook
 * (PipeHook), which issues the point-to-point transfers as NCCL groups between the actions and
 * shares the losses, which reach the ranks of the last chunk only, at the end of a walk.
 *
 * Transfers.  A chunk function's sends and receives go to fixed pp ranks (rel=0), and their
 * partners are other ranks' functions, run at other times.  NCCL pairs them without tags,
 * in issue order per pair of ranks, and a send completes only once its receive is posted,
 * so they are not run where the function has them: a send step copies its buffer into a
 * staging block of its own, a receive step copies its slot into its buffer
 * (runtime/cuda/cuda_mesh.c), and between actions (the walker's `between`) this hook
 * issues NCCL groups on the pp axis's stream that it planned at setup ("the plan" below):
 * every rank runs every rank's action list at once, and each round's pairs of a send and
 * its due receive form one group on each side, so a group holds only messages whose
 * partners are in the partner's group of the same round and none can deadlock.  (Grouping
 * an action's sends with the next action's receives, the obvious plan, deadlocks afab,
 * zb-h1, interleaved and pp=4 1f1b: the simulation showed it before any GPU would have.)  A
 * schedule whose messages do not pair (tag, size, type) or cannot run is refused at setup,
 * naming the ranks and actions.  A transfer to the rank itself (dualpipev's V: chunks pp-1
 * and pp share the last rank) is a device block (of the transport's pool) held from its send to
 * its receive.  The
 * optimizer step's transfers (tied parameters' gradients, sent and received by the two ranks
 * that share one) run inside the call, each run of consecutive transfer steps one group
 * (cuda_mesh.c).
 *
 * Not here yet: the measured timeline (--trace-out) and per-rank idle time in the run's
 * report (the walker records them; this rank holds one pp rank's), and overlapping a group
 * with the previous action's tail (each action's call ends with a synchronization, as every
 * cuda_program_call does).
 */
#include <stdlib.h>
#include <string.h>

#include "ir/schedule.h"
#include "runtime/fail.h"
#include "runtime/comm/comm_nccl.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/pipe_walk.h"

typedef struct {
  CudaPipeXfer *x;   /* the function's fixed-rank transfers, in step order */
  int n;
} FnXfers;

typedef struct {
  int block;         /* pool block of a transfer to this rank itself */
  int64_t tag, mb;
} SelfMsg;

typedef struct CudaPipe CudaPipe;
struct CudaPipe {
  CudaRank *r;
  PipeWalk *walk;           /* the mesh executor's (borrowed) */
  struct RankPlan *plan;   /* this rank's groups for the training schedule */
  struct RankPlan *eval_plan;   /* validation's, made at each one */
  const struct RankPlan *cur;   /* the walk under way: its plan, its schedule, its next item */
  const Schedule *cur_s;
  int item;
  int q;
  FnXfers *fx;       /* per program function */
  uint64_t bank;     /* the next action's receives from other ranks (its groups come after the
                        last action's call returned, which had read its own) */
  int64_t bank_bytes;
  SelfMsg *self;
  int n_self, cap_self;
  uint64_t slot[RT_MAX_FUNC_IO * 2 + 64];
  int max_x;         /* the most transfers a function has */
  int *send_block;   /* [action * max_x + transfer]: the block of a send to another rank, -1 */
  int n_send_block;
  NcclP2p *ops;
  int cap_ops;
};

static int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

/* v[need - 1] made room for (capacity *cap, doubling); 1: out of memory */
static int grow(void **v, int *cap, int need, size_t size) {
  if (need <= *cap) return 0;
  int c = *cap ? 2 * *cap : 16;
  while (c < need) c *= 2;
  void *n = realloc(*v, size * (size_t)c);
  if (!n) return 1;
  *v = n, *cap = c;
  return 0;
}

/* ---- the plan: NCCL groups between the actions, made by running every rank at once ----

   NCCL pairs two ranks' messages in issue order, without tags, and a group completes only
   when every op in it has met its partner.  So the plan is made by a simulation that every
   rank runs identically over every rank's action list (the program and the schedule are the
   same everywhere): a rank runs its next action once every receive of it has happened; a
   send exists once its action has run; in each round, every send whose receive is due (the
   receiver's next action takes it) is paired with it, and each rank's pairs of the round
   form one group, the same round on both sides, its ops ordered by (peer, tag, micro-batch)
   on both sides.  Every group therefore holds only messages whose partners are in the
   partner's group of the same round: it completes once issued, and no order of issue can
   deadlock.  If a round pairs nothing and runs no action while some are left, the schedule
   cannot run (with buffered sends it could not either): refused, naming the ranks. */

typedef struct {
  bool send;
  int peer, mb, action, xfer;   /* the action (an index of the rank's list) and its function's transfer */
  int64_t tag, count;
  int storage;
} PlanOp;

typedef struct {
  int action;                   /* >= 0: run this action; -1: issue group `group` */
  int group;
} PlanItem;

typedef struct {
  PlanOp *ops;
  int n, cap;
} PlanGroup;

typedef struct RankPlan {
  PlanItem *items;
  int n_items, cap_items;
  PlanGroup *g;
  int n_groups, cap_groups;
} RankPlan;

static const char *act_text(const Schedule *s, int q, int i, char *buf, size_t n) {
  if (i < 0 || i >= s->n[q]) snprintf(buf, n, "%s", i < 0 ? "(before the first action)" : "(after the last action)");
  else snprintf(buf, n, "%c%d.%d", "FBW"[s->acts[q][i].kind], s->acts[q][i].mb, s->acts[q][i].chunk);
  return buf;
}

static int action_func(const CudaPipe *pp, const Schedule *s, int q, int i) { return pipe_walk_func(pp->walk, &s->acts[q][i]); }

static const FnXfers *act_fx(const CudaPipe *pp, const Schedule *s, int q, int i) { return &pp->fx[action_func(pp, s, q, i)]; }

static void plan_free(RankPlan *p) {
  for (int i = 0; p->g && i < p->n_groups; i++) free(p->g[i].ops);
  free(p->g);
  free(p->items);
  memset(p, 0, sizeof *p);
}

static int add_item(RankPlan *p, int action, int group) {
  if (grow((void **)&p->items, &p->cap_items, p->n_items + 1, sizeof *p->items)) return 1;
  p->items[p->n_items++] = (PlanItem){action, group};
  return 0;
}

static int op_cmp(const void *pa, const void *pb) {
  const PlanOp *a = pa, *b = pb;
  if (a->peer != b->peer) return a->peer - b->peer;
  if (a->send != b->send) return a->send ? -1 : 1;
  if (a->tag != b->tag) return a->tag < b->tag ? -1 : 1;
  return a->mb - b->mb;
}

/* Every rank's plan for schedule s (R[0..p)).  0, or 2 with the reason (1: out of memory). */
static int make_plans(const CudaPipe *pp, const Schedule *s, RankPlan *R, const char *what, char *err, size_t errlen) {
  int P = s->p, rc = 0;
  memset(R, 0, sizeof *R * (size_t)P);
  int *next = calloc((size_t)P, sizeof(int)), *round_g = calloc((size_t)P, sizeof(int));
  PlanOp **avail = calloc((size_t)P, sizeof *avail);   /* sends made, not yet paired */
  int *n_av = calloc((size_t)P, sizeof(int)), *cap_av = calloc((size_t)P, sizeof(int));
  bool **got = calloc((size_t)P, sizeof *got);        /* [q][x]: receive x of q's next action paired */
  if (!next || !round_g || !avail || !n_av || !cap_av || !got) rc = 1;
  for (int q = 0; !rc && q < P; q++)
    if (!(got[q] = calloc((size_t)pp->max_x + 1, 1))) rc = 1;
  for (bool left = true; !rc && left;) {
    left = false;
    bool moved = false;
    /* run every action whose receives are all done */
    for (int q = 0; !rc && q < P; q++) {
      while (!rc && next[q] < s->n[q]) {
        const FnXfers *f = act_fx(pp, s, q, next[q]);
        bool ready = true;
        for (int x = 0; x < f->n && ready; x++) ready = f->x[x].send || f->x[x].peer == q || got[q][x];
        if (!ready) break;
        for (int x = 0; !rc && x < f->n; x++) {
          const CudaPipeXfer *t = &f->x[x];
          if (!t->send || t->peer == q) continue;
          if (grow((void **)&avail[q], &cap_av[q], n_av[q] + 1, sizeof **avail)) rc = 1;
          else avail[q][n_av[q]++] = (PlanOp){true, t->peer, s->acts[q][next[q]].mb, next[q], x, t->tag, t->count, t->storage};
        }
        if (!rc) rc = add_item(&R[q], next[q], -1);
        memset(got[q], 0, (size_t)pp->max_x + 1);
        next[q]++, moved = true;
      }
    }
    /* pair every available send with its receiver's due receive: this round's groups */
    for (int q = 0; q < P; q++) round_g[q] = -1;
    for (int a = 0; !rc && a < P; a++)
      for (int k = 0; !rc && k < n_av[a]; k++) {
        PlanOp *o = &avail[a][k];
        int b = o->peer;
        if (next[b] >= s->n[b]) continue;
        const FnXfers *f = act_fx(pp, s, b, next[b]);
        int hit = -1;
        for (int x = 0; x < f->n && hit < 0; x++) {
          const CudaPipeXfer *t = &f->x[x];
          if (!t->send && t->peer == a && !got[b][x] && t->tag == o->tag && s->acts[b][next[b]].mb == o->mb) hit = x;
        }
        if (hit < 0) continue;
        const CudaPipeXfer *t = &f->x[hit];
        if (t->count != o->count || t->storage != o->storage) {
          char x1[32], x2[32];
          rc = 2;
          snprintf(err, errlen, "%s: pp rank %d's send in %s (tag %lld, %lld values) and pp rank %d's receive in %s (%lld "
                   "values) do not agree", what, a, act_text(s, a, o->action, x1, sizeof x1), (long long)o->tag,
                   (long long)o->count, b, act_text(s, b, next[b], x2, sizeof x2), (long long)t->count);
          break;
        }
        PlanOp recv = {false, a, o->mb, next[b], hit, t->tag, t->count, t->storage};
        int ends[2] = {a, b};
        PlanOp ops[2] = {*o, recv};
        for (int e = 0; !rc && e < 2; e++) {
          RankPlan *pl = &R[ends[e]];
          if (round_g[ends[e]] < 0) {
            if (grow((void **)&pl->g, &pl->cap_groups, pl->n_groups + 1, sizeof *pl->g)) {
              rc = 1;
              break;
            }
            pl->g[pl->n_groups] = (PlanGroup){0};
            round_g[ends[e]] = pl->n_groups++;
            rc = add_item(pl, -1, round_g[ends[e]]);
          }
          PlanGroup *g = &pl->g[round_g[ends[e]]];
          if (!rc && grow((void **)&g->ops, &g->cap, g->n + 1, sizeof *g->ops)) rc = 1;
          if (!rc) g->ops[g->n++] = ops[e];
        }
        got[b][hit] = true;
        avail[a][k--] = avail[a][--n_av[a]];
        moved = true;
      }
    for (int q = 0; !rc && q < P; q++) {
      if (round_g[q] >= 0) qsort(R[q].g[round_g[q]].ops, (size_t)R[q].g[round_g[q]].n, sizeof(PlanOp), op_cmp);
      if (next[q] < s->n[q] || n_av[q]) left = true;
    }
    if (!rc && left && !moved) {
      int q = 0;
      while (next[q] >= s->n[q] && !n_av[q]) q++;
      char x1[32];
      rc = 2;
      if (next[q] < s->n[q])
        snprintf(err, errlen, "%s: the schedule cannot run: pp rank %d's %s waits for a message no rank sends now", what, q,
                 act_text(s, q, next[q], x1, sizeof x1));
      else
        snprintf(err, errlen, "%s: pp rank %d's send in %s (tag %lld) to pp rank %d is never received", what, q,
                 act_text(s, q, avail[q][0].action, x1, sizeof x1), (long long)avail[q][0].tag, avail[q][0].peer);
    }
  }
  if (rc == 1) snprintf(err, errlen, "out of memory");
  for (int q = 0; q < P; q++) {
    if (avail) free(avail[q]);
    if (got) free(got[q]);
    if (rc) plan_free(&R[q]);
  }
  free(next), free(round_g), free(avail), free(n_av), free(cap_av), free(got);
  return rc;
}

/* This rank's plan of schedule s (every rank's made, the others dropped). */
static int plan_rank(const CudaPipe *pp, const Schedule *s, RankPlan *out, const char *what, char *err, size_t errlen) {
  RankPlan *R = calloc((size_t)s->p, sizeof *R);
  if (!R) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  int rc = make_plans(pp, s, R, what, err, errlen);
  if (!rc) {
    *out = R[pp->q];
    memset(&R[pp->q], 0, sizeof *R);
  }
  for (int q = 0; q < s->p; q++) plan_free(&R[q]);
  free(R);
  return rc;
}

/* ---- a step ---- */

static SelfMsg *self_find(CudaPipe *pp, int64_t tag, int64_t mb) {
  for (int k = 0; k < pp->n_self; k++)
    if (pp->self[k].tag == tag && pp->self[k].mb == mb) return &pp->self[k];
  return NULL;
}

/* Group gi of the rank's plan: sends from their blocks, receives into the bank
   at the receive's place (its order among the action's receives from other ranks); the
   sends' blocks are free once it is issued (every later write to them is on the compute
   stream, which waits for the group). */
static int exchange(CudaPipe *pp, const Schedule *s, const RankPlan *plan, int gi, char *err, size_t errlen) {
  CudaRank *r = pp->r;
  const PlanGroup *g = &plan->g[gi];
  if (!g->n) return 0;
  if (grow((void **)&pp->ops, &pp->cap_ops, g->n, sizeof *pp->ops)) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  for (int k = 0; k < g->n; k++) {
    const PlanOp *o = &g->ops[k];
    uint64_t addr;
    if (o->send) {
      int b = pp->send_block[o->action * pp->max_x + o->xfer];
      if (b < 0) return rt_fail(err, errlen, 2, "pp rank %d: a send of action %d issued before its action ran", pp->q, o->action);
      addr = pipe_dev_addr(r, 0, b);
    } else {
      const FnXfers *f = act_fx(pp, s, pp->q, o->action);
      int64_t at = 0;
      for (int x = 0; x < o->xfer; x++)
        if (!f->x[x].send && f->x[x].peer != pp->q) at += align256(f->x[x].bytes);
      addr = pp->bank + (uint64_t)at;
    }
    pp->ops[k] = (NcclP2p){o->send, o->peer, (void *)(uintptr_t)addr, o->count, o->storage};
  }
  char label[64], x1[32];
  snprintf(label, sizeof label, "pipeline, %s", act_text(s, pp->q, g->ops[0].action, x1, sizeof x1));
  int rc = cuda_pipe_exchange(&r->cp, AX_PP, g->n, pp->ops, label, err, errlen);
  for (int k = 0; k < g->n; k++)
    if (g->ops[k].send) pipe_dev_put(r, 0, &pp->send_block[g->ops[k].action * pp->max_x + g->ops[k].xfer]);
  return rc;
}

/* The slots of action i's transfers (cp->pipe_slot): a block of its own for each send, the
   bank for receives from other ranks, a held block for those from itself (blocks of the
   transport's pool, exec_mesh_pipe.c). */
static int name_slots(CudaPipe *pp, const Schedule *s, int i, char *err, size_t errlen) {
  CudaRank *r = pp->r;
  int q = pp->q;
  const Action *act = &s->acts[q][i];
  const FnXfers *f = act_fx(pp, s, q, i);
  int64_t rat = 0;
  if (f->n > (int)(sizeof pp->slot / sizeof pp->slot[0]) || f->n > pp->max_x)
    return rt_fail(err, errlen, 2, "@%s has %d transfers; the pipeline driver takes %d",
                 r->prog.funcs[action_func(pp, s, q, i)].name, f->n, (int)(sizeof pp->slot / sizeof pp->slot[0]));
  for (int x = 0; x < f->n; x++) {
    const CudaPipeXfer *t = &f->x[x];
    if (t->peer == q && t->send) {   /* to this rank itself: a block held until its receive */
      if (grow((void **)&pp->self, &pp->cap_self, pp->n_self + 1, sizeof *pp->self))
        return rt_fail(err, errlen, EXIT_RUN, "out of memory");
      SelfMsg *m = &pp->self[pp->n_self++];
      *m = (SelfMsg){-1, t->tag, act->mb};
      if (pipe_dev_block(r, 0, t->bytes, &m->block, err, errlen)) return EXIT_RUN;
      pp->slot[x] = pipe_dev_addr(r, 0, m->block);
    } else if (t->peer == q) {
      SelfMsg *m = self_find(pp, t->tag, act->mb);
      if (!m) return rt_fail(err, errlen, 2, "pp rank %d: a receive from itself (tag %lld) before its send", q, (long long)t->tag);
      pp->slot[x] = pipe_dev_addr(r, 0, m->block);
    } else if (t->send) {
      int *b = &pp->send_block[i * pp->max_x + x];
      if (pipe_dev_block(r, 0, t->bytes, b, err, errlen)) return EXIT_RUN;
      pp->slot[x] = pipe_dev_addr(r, 0, *b);
    } else {
      pp->slot[x] = pp->bank + (uint64_t)rat;
      rat += align256(t->bytes);
    }
  }
  r->cp.pipe_slot = pp->slot;
  r->cp.n_pipe_slot = f->n;
  return 0;
}

/* After action i: the blocks of its receives from this rank itself are free. */
static void release_self(CudaPipe *pp, const Schedule *s, int i) {
  int q = pp->q;
  const FnXfers *f = act_fx(pp, s, q, i);
  for (int x = 0; x < f->n; x++) {
    const CudaPipeXfer *t = &f->x[x];
    if (t->send || t->peer != q) continue;
    SelfMsg *m = self_find(pp, t->tag, s->acts[q][i].mb);
    if (!m) continue;
    pipe_dev_put(pp->r, 0, &m->block);
    *m = pp->self[--pp->n_self];
  }
}

/* ---- the hook (PipeHook): the transport's calls are exec_mesh_pipe.c's ---- */

/* Before an action's call: the slots of its transfers named; after it, they are gone and
   the blocks of its receives from this rank itself are free. */
static int cu_before(void *ctx, const PipeCall *c, char *err, size_t errlen) {
  CudaPipe *pp = ctx;
  return name_slots(pp, pp->cur_s, c->action, err, errlen);
}

static void cu_after(void *ctx, const PipeCall *c) {
  CudaPipe *pp = ctx;
  pp->r->cp.pipe_slot = NULL, pp->r->cp.n_pipe_slot = 0;
  release_self(pp, pp->cur_s, c->action);
}

/* The walk of s: its plan (validation's made now), no send blocks yet. */
static int cu_begin(void *ctx, const Schedule *s, bool training, char *err, size_t errlen) {
  CudaPipe *pp = ctx;
  if (grow((void **)&pp->send_block, &pp->n_send_block, (s->n[pp->q] > 0 ? s->n[pp->q] : 1) * pp->max_x, sizeof(int)))
    return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  for (int k = 0; k < pp->n_send_block; k++) pp->send_block[k] = -1;
  pp->cur_s = s, pp->item = 0, pp->cur = pp->plan;
  if (training) return 0;
  if (!(pp->eval_plan = calloc(1, sizeof *pp->eval_plan))) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  pp->cur = pp->eval_plan;
  int rc = plan_rank(pp, s, pp->eval_plan, "validation's forward-only schedule", err, errlen);
  if (rc) free(pp->eval_plan), pp->eval_plan = NULL;
  return rc;
}

/* Before action i (after the last: i = its count): the groups the plan puts there. */
static int cu_between(void *ctx, const Schedule *s, int i, char *err, size_t errlen) {
  CudaPipe *pp = ctx;
  const RankPlan *plan = pp->cur;
  int rc = 0;
  while (!rc && pp->item < plan->n_items && plan->items[pp->item].action < 0)
    rc = exchange(pp, s, plan, plan->items[pp->item++].group, err, errlen);
  if (!rc && i < s->n[pp->q] && (pp->item >= plan->n_items || plan->items[pp->item++].action != i))
    rc = rt_fail(err, errlen, EXIT_RUN, "pp rank %d: the plan does not run action %d next", pp->q, i);
  return rc;
}

/* The losses reach the ranks of the last chunk only: every rank gets those of the one of
   them at coordinate 0 on the other axes (an all-gather of n floats a rank). */
static int cu_end(void *ctx, int rc, float *losses, int64_t n, char *err, size_t errlen) {
  CudaPipe *pp = ctx;
  CudaRank *r = pp->r;
  if (!rc) rc = cuda_mesh_sync(&r->cp, "after the pipeline's last transfers", err, errlen);
  for (int k = 0; k < pp->n_send_block; k++) pipe_dev_put(r, 0, &pp->send_block[k]);
  if (pp->eval_plan) plan_free(pp->eval_plan);
  free(pp->eval_plan);
  pp->eval_plan = NULL, pp->cur = NULL;
  if (rc) return rc;
  const Schedule *s = &pp->walk->sched;
  int coord[COMM_AXES] = {0};
  coord[COMM_PP] = schedule_chunk_rank(s->kind, s->p, s->v, s->chunks - 1);
  int src = mesh_rank_of(r->mesh, coord);
  float *all = calloc((size_t)(n * r->world) + 1, sizeof(float));
  if (!all) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  rc = nccl_all_gather_host(r->comm, losses, all, n, err, errlen);
  if (!rc) memcpy(losses, all + (size_t)src * (size_t)n, sizeof(float) * (size_t)n);
  free(all);
  return rc;
}

/* ---- setup ---- */

static void cu_free(void *ctx) {
  CudaPipe *pp = ctx;
  if (!pp) return;
  cuda_dev_free(&pp->r->cp, pp->bank);
  for (int f = 0; pp->fx && f < pp->r->prog.n_funcs; f++) free(pp->fx[f].x);
  if (pp->plan) plan_free(pp->plan);
  free(pp->plan), free(pp->send_block), free(pp->fx), free(pp->self), free(pp->ops);
  free(pp);
}

int cuda_pipe_setup(CudaRank *r, char *err, size_t errlen) {
  CudaPipe *pp = calloc(1, sizeof *pp);
  if (!pp) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  pp->r = r;
  pp->q = r->comm->coord[COMM_PP];
  pp->walk = r->walk;   /* the mesh executor's, from the program's schedule */
  /* the device transport, bound to the walker, this hook its own (freed with it from now on) */
  PipeHook hook = {pp, cu_begin, cu_between, cu_end, cu_before, cu_after, cu_free};
  int rc = pipe_dev_setup(r, &hook, err, errlen);
  if (rc) return rc;
  int nf = r->prog.n_funcs;
  const Schedule *s = &pp->walk->sched;
  if (!(pp->fx = calloc((size_t)nf + 1, sizeof *pp->fx))) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  /* every function's transfers, and the bank: the most any action receives */
  int64_t most = 256;
  for (int f = 0; f < nf; f++) {
    FnXfers *x = &pp->fx[f];
    if (cuda_pipe_transfers(&r->prog, f, &x->x, &x->n)) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
    int64_t recv = 0;
    for (int k = 0; k < x->n; k++) {
      if (x->x[k].axis != AX_PP)
        return rt_fail(err, errlen, EXIT_USAGE, "@%s: a transfer to a fixed rank on an axis other than pp",
                     r->prog.funcs[f].name);
      if (!x->x[k].send && x->x[k].peer != pp->q) recv += align256(x->x[k].bytes);
    }
    if (recv > most) most = recv;
    if (x->n > pp->max_x) pp->max_x = x->n;
  }
  pp->bank_bytes = most;
  if (cuda_dev_alloc(&r->cp, &pp->bank, pp->bank_bytes, "the pipeline's transfer slots", err, errlen)) return EXIT_RUN;
  /* the plans (and with them the proof that they run): the training schedule's, and
     validation's forward-only one's (made again at each validation) */
  Schedule ev;
  rc = pipe_forward_schedule(s, &ev) ? rt_fail(err, errlen, EXIT_RUN, "out of memory") : 0;
  char what[96];
  snprintf(what, sizeof what, "the %s schedule (pp=%d, %d micro-batches)", pipe_kind_names[s->kind], s->p, s->m);
  RankPlan check;
  if (!rc && !(rc = plan_rank(pp, &ev, &check, "validation's forward-only schedule", err, errlen))) plan_free(&check);
  schedule_free(&ev);
  if (!rc && !(pp->plan = calloc(1, sizeof *pp->plan))) rc = rt_fail(err, errlen, EXIT_RUN, "out of memory");
  if (!rc) rc = plan_rank(pp, s, pp->plan, what, err, errlen);
  return rc;
}
