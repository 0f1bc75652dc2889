/* runtime/cuda/cuda_mesh.c — a CudaProgram as one rank of a mesh (cuda_exec.h,
 * "collectives"): the partitioned program's collective steps as NCCL calls, each on the
 * communication stream of its mesh axis, ordered against the compute stream by events:
 *   collective   compute --ready--> axis stream: NCCL; axis stream --done--> compute
 *   start (h)    the same without the last edge (done[h] recorded)
 *   wait (h)     compute waits for done[h]
 * so kernels run on while a started collective is in flight, as the overlap pass planned.
 * The end of every call waits for the compute stream through nccl_sync (a timeout and the
 * communicators' errors watched), not cuStreamSynchronize.
 * Ring transfers (send, recv) run as the groups cuda_p2p_plan makes (cuda_exec.h, "point-to-
 * point transfers"), on the axis's stream like the collectives:
 *   a send       its staging copy (compute stream), if staged
 *   issue (g)    compute --ready--> axis stream: ncclGroupStart, the group's sends and
 *                receives, ncclGroupEnd (nccl_p2p_group); axis stream --p2p_done[g]
 *   wait (g)     compute waits for p2p_done[g]
 *   a recv       its copy out of the staging slot (compute stream), if staged */
#define LOOM_CUDA_INTERNAL 1
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/fail.h"
#include "runtime/comm/comm_nccl.h"
#include "runtime/cuda/cuda_exec.h"

bool cuda_mesh_step_ok(const RtStep *st, char *msg, size_t n) {
  int b = (int)st->which;
  const int64_t *i = st->i;
  if (b == RT_B_COLL_WAIT) {
    if (st->n_in != 1 || st->n_out != 1 || i[0] < 0 || i[0] >= RT_MAX_HANDLES) {
      snprintf(msg, n, "a collective wait with a bad handle or buffers");
      return false;
    }
    return true;
  }
  if (b == RT_B_SEND || b == RT_B_RECV) {   /* i: n, axis, size, peer, tag, rel */
    bool send = b == RT_B_SEND;
    int storage = st->bufs[0].storage;
    if (st->n_in != (send ? 1 : 0) || st->n_out != (send ? 0 : 1)) {
      snprintf(msg, n, "a %s takes one buffer", send ? "send" : "recv");
      return false;
    }
    if (i[1] < 0 || i[1] >= 5 || i[2] < 1 || i[5] < 0 || i[5] > 1 || st->bufs[0].n != i[0]) {
      snprintf(msg, n, "a %s with a bad axis, size or element count", send ? "send" : "recv");
      return false;
    }
    if (storage != RT_ST_F32 && storage != RT_ST_BF16 && storage != RT_ST_F16 && storage != RT_ST_I32) {
      snprintf(msg, n, "NCCL moves f32, bf16, f16 and i32, not %s", cuda_storage_name((RtStorage)storage));
      return false;
    }
    return true;
  }
  if (b == RT_B_ALL_TO_ALLV) {   /* i: axis, size, S, D, rows, El */
    const RtBuf *x = &st->bufs[0], *sc = &st->bufs[1], *rc = &st->bufs[2], *y = &st->bufs[3];
    if (st->n_in != 3 || st->n_out != 1 || i[0] < 0 || i[0] >= 5 || i[1] < 1 || i[5] < 1 || x->storage != y->storage ||
        sc->storage != RT_ST_I32 || rc->storage != RT_ST_I32 || x->n != rt_smul(i[2], i[3]) ||
        y->n != rt_smul(i[4], i[3]) || sc->n != rt_smul(i[1], i[5]) || rc->n != sc->n) {
      snprintf(msg, n, "all_to_allv wants x[S*D], send and recv counts i32[size*El] -> y[rows*D] of x's storage");
      return false;
    }
    return true;
  }
  if (b == RT_B_COLL_START) {
    b = (int)i[0];
    if (i[1] < 0 || i[1] >= RT_MAX_HANDLES) {
      snprintf(msg, n, "a collective start with a bad handle");
      return false;
    }
    i += 2;
  }
  if (b < RT_B_ALL_REDUCE || b > RT_B_ALL_TO_ALL) {
    snprintf(msg, n, "builtin %d is not a collective or a transfer: the cuda lowering makes every other builtin a "
             "kernel (was the program lowered for the cpu?)", (int)st->which);
    return false;
  }
  if (st->n_in != 1 || st->n_out != 1 || st->bufs[0].storage != st->bufs[1].storage) {
    snprintf(msg, n, "a collective takes one buffer to one of the same storage");
    return false;
  }
  int64_t nx = st->bufs[0].n, ny = st->bufs[1].n;
  bool ok;
  switch (b) {
  case RT_B_ALL_REDUCE: ok = i[1] >= 0 && i[1] < 5 && i[2] >= 1 && nx == i[0] && ny == i[0]; break;
  case RT_B_ALL_GATHER:
  case RT_B_REDUCE_SCATTER: {
    int64_t piece = rt_smul(rt_smul(i[2], i[3]), i[4]), whole = rt_smul(piece, i[1]);
    ok = i[0] >= 0 && i[0] < 5 && i[1] >= 1 && i[2] >= 0 && i[3] >= 0 && i[4] >= 0 &&
         nx == (b == RT_B_ALL_GATHER ? piece : whole) && ny == (b == RT_B_ALL_GATHER ? whole : piece);
    break;
  }
  default: {   /* all_to_all */
    int64_t sx = rt_smul(rt_smul(rt_smul(i[2], i[3]), i[4]), i[1]), sy = rt_smul(rt_smul(rt_smul(i[5], i[6]), i[7]), i[1]);
    ok = i[0] >= 0 && i[0] < 5 && i[1] >= 1 && nx == sx && ny == sy;
    break;
  }
  }
  if (!ok) snprintf(msg, n, "the collective's sizes do not match its buffers");
  return ok;
}

/* ------------------------------------------------------------------ point-to-point plan (no device) */

static bool is_transfer(const RtStep *st) {   /* on a ring (a pipeline's are the driver's) */
  return st->kind == RT_STEP_BUILTIN && (st->which == RT_B_SEND || st->which == RT_B_RECV) && st->i[5] == 1;
}

static bool is_pipe_transfer(const RtStep *st) {
  return st->kind == RT_STEP_BUILTIN && (st->which == RT_B_SEND || st->which == RT_B_RECV) && st->i[5] == 0;
}

int cuda_pipe_transfers(const RtProgram *p, int f, CudaPipeXfer **out, int *n) {
  const RtFunc *fn = &p->funcs[f];
  *out = NULL, *n = 0;
  int k = 0;
  for (int s = 0; s < fn->n_steps; s++) k += is_pipe_transfer(&fn->steps[s]);
  if (!k) return 0;
  if (!(*out = calloc((size_t)k, sizeof **out))) return 1;
  for (int s = 0; s < fn->n_steps; s++) {
    const RtStep *st = &fn->steps[s];
    if (!is_pipe_transfer(st)) continue;
    int sz = cuda_storage_size((RtStorage)st->bufs[0].storage);
    (*out)[(*n)++] = (CudaPipeXfer){.step = s, .send = st->which == RT_B_SEND, .peer = (int)st->i[3], .axis = (int)st->i[1],
                                    .count = st->i[0], .bytes = rt_smul(st->i[0], sz ? sz : 4), .tag = st->i[4],
                                    .storage = st->bufs[0].storage};
  }
  return 0;
}

static int64_t buf_end(const RtBuf *b) {
  int sz = cuda_storage_size((RtStorage)b->storage);
  return rt_sadd(b->offset, rt_smul(b->n, sz ? sz : 4));
}

static bool overlap(const RtBuf *a, const RtBuf *b) {
  return a->region == b->region && a->n > 0 && b->n > 0 && a->offset < buf_end(b) && b->offset < buf_end(a);
}

/* Does step st write b (reads: or read it)?  Outputs are written; a step without outputs
   (accumulate, assign, kv_write: in place) counts as writing its inputs too. */
static bool touches(const RtStep *st, const RtBuf *b, bool reads) {
  int nb = st->n_in + st->n_out;
  if (st->n_in < 0 || st->n_out < 0 || nb > RT_MAX_BUFS) return true;
  for (int k = 0; k < nb; k++)
    if ((k >= st->n_in || reads || st->n_out == 0) && overlap(&st->bufs[k], b)) return true;
  return false;
}

typedef struct {
  int s, r;                /* the send's and the receive's steps */
  int axis, g;
  int64_t off, bytes;
  int64_t xs, yr;          /* staging offsets of the send and the receive; -1: direct */
  bool decided;            /* the receive's staging is decided */
} Msg;

typedef struct {
  int axis;
  int64_t size, key;       /* key: the sender's offset (+p for a send to +p and a receive from -p) */
  int pos;
} End;

static int end_key_cmp(const End *a, const End *b) {
  if (a->axis != b->axis) return a->axis < b->axis ? -1 : 1;
  if (a->size != b->size) return a->size < b->size ? -1 : 1;
  return a->key < b->key ? -1 : a->key > b->key;
}

static int end_cmp(const void *pa, const void *pb) {
  const End *a = pa, *b = pb;
  int c = end_key_cmp(a, b);
  return c ? c : (a->pos > b->pos) - (a->pos < b->pos);
}

static int msg_cmp(const void *pa, const void *pb) {
  const Msg *a = pa, *b = pb;
  return (a->s > b->s) - (a->s < b->s);
}

typedef struct {
  int64_t lo, hi, bytes;
  int64_t *out;
} Life;

static int life_cmp(const void *pa, const void *pb) {
  const Life *a = pa, *b = pb;
  if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
  return (a->hi > b->hi) - (a->hi < b->hi);
}

static const char *const p2p_axis[5] = {"dp", "tp", "cp", "pp", "ep"};

/* closed spans [lo, hi] against the open (a, b) */
static bool meets(int64_t lo, int64_t hi, int64_t a, int64_t b) { return lo < b && hi > a; }

typedef struct {
  const RtFunc *fn;
  Msg *m;
  int n_msgs;
  CudaP2pGroup *g;
  int *start_s, *start_w, n_starts;   /* started collectives: start step, wait step (or n_steps) */
} Planner;

/* May something write the send's buffer while NCCL could still be reading it (after its step,
   before its group's wait)? */
static bool send_unsafe(const Planner *P, const Msg *m) {
  const RtStep *steps = P->fn->steps;
  const RtBuf *x = &steps[m->s].bufs[0];
  int a = m->s, b = P->g[m->g].wait;
  for (int k = a + 1; k < b; k++)
    if (!is_transfer(&steps[k]) && touches(&steps[k], x, false)) return true;
  for (int c = 0; c < P->n_starts; c++)
    if (meets(P->start_s[c], P->start_w[c], a, b) && overlap(x, &steps[P->start_s[c]].bufs[1])) return true;
  for (int j = 0; j < P->n_msgs; j++) {   /* receives, wherever they may land */
    const Msg *o = &P->m[j];
    if (meets(P->g[o->g].issue, o->r, a, b) && overlap(x, &steps[o->r].bufs[0])) return true;
  }
  return false;
}

/* May something read or write the receive's buffer between its group's issue (when NCCL may
   start writing it) and its step? */
static bool recv_unsafe(const Planner *P, const Msg *m) {
  const RtStep *steps = P->fn->steps;
  const RtBuf *y = &steps[m->r].bufs[0];
  int a = P->g[m->g].issue, b = m->r;
  for (int k = a + 1; k < b; k++)
    if (!is_transfer(&steps[k]) && touches(&steps[k], y, true)) return true;
  for (int c = 0; c < P->n_starts; c++) {
    const RtStep *st = &steps[P->start_s[c]];
    if (meets(P->start_s[c], P->start_w[c], a, b) && (overlap(y, &st->bufs[0]) || overlap(y, &st->bufs[1]))) return true;
  }
  for (int j = 0; j < P->n_msgs; j++) {
    const Msg *o = &P->m[j];
    const CudaP2pGroup *g = &P->g[o->g];
    /* the send: its staging copy at its step, or NCCL reading while its group runs */
    if ((o->xs >= 0 ? meets(o->s, o->s, a, b) : meets(g->issue, g->wait, a, b)) && overlap(y, &steps[o->s].bufs[0]))
      return true;
    if (o == m) continue;
    /* another receive: decided (its copy out, or NCCL writing), else anywhere it may land */
    bool hit = !o->decided ? meets(g->issue, o->r, a, b) : o->yr >= 0 ? meets(o->r, o->r, a, b) : meets(g->issue, g->wait, a, b);
    if (hit && overlap(y, &steps[o->r].bufs[0])) return true;
  }
  return false;
}

static int plan_fail(CudaP2pPlan *pl, Planner *P, End *ends, char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int plan_fail(CudaP2pPlan *pl, Planner *P, End *ends, char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  free(ends);
  free(P->m);
  free(P->g);
  free(P->start_s);
  free(P->start_w);
  cuda_p2p_plan_free(pl);
  return rc;
}

void cuda_p2p_plan_free(CudaP2pPlan *pl) {
  free(pl->ops);
  free(pl->groups);
  free(pl->op_of_step);
  memset(pl, 0, sizeof *pl);
}

int cuda_p2p_plan(const RtFunc *fn, CudaP2pPlan *pl, char *err, size_t errlen) {
  memset(pl, 0, sizeof *pl);
  Planner P = {.fn = fn};
  const RtStep *steps = fn->steps;
  int n = fn->n_steps, n_ends = 0, n_send = 0, n_waits = 0;
  for (int s = 0; s < n; s++) {
    n_ends += is_transfer(&steps[s]);
    n_send += is_transfer(&steps[s]) && steps[s].which == RT_B_SEND;
    if (steps[s].kind == RT_STEP_BUILTIN && steps[s].which == RT_B_COLL_START) P.n_starts++;
    if (steps[s].kind == RT_STEP_BUILTIN && steps[s].which == RT_B_COLL_WAIT) n_waits++;
  }
  if (!n_ends) return 0;
  int n_recv = n_ends - n_send;
  End *ends = calloc((size_t)n_ends, sizeof *ends);
  P.m = calloc((size_t)(n_send ? n_send : 1), sizeof *P.m);
  P.g = calloc((size_t)(n_send ? n_send : 1), sizeof *P.g);
  P.start_s = calloc((size_t)P.n_starts + 1, sizeof *P.start_s);
  P.start_w = calloc((size_t)P.n_starts + 1, sizeof *P.start_w);
  if (!ends || !P.m || !P.g || !P.start_s || !P.start_w) return plan_fail(pl, &P, ends, err, errlen, 1, "out of memory");
  /* the ends: sends first, then receives, each keyed by the sender's offset */
  End *sends = ends, *recvs = ends + n_send;
  int ks = 0, kr = 0;
  for (int s = 0; s < n; s++) {
    const RtStep *st = &steps[s];
    if (!is_transfer(st)) continue;
    bool send = st->which == RT_B_SEND;
    const int64_t *i = st->i;
    const char *what = send ? "send" : "recv";
    if (st->n_in + st->n_out != 1 || i[1] < 0 || i[1] >= 5 || i[2] < 1)
      return plan_fail(pl, &P, ends, err, errlen, 2, "@%s: step %d (%s): a malformed %s", fn->name, s, st->label, what);
    int64_t size = i[2], off = ((i[3] % size) + size) % size;
    if (!off)
      return plan_fail(pl, &P, ends, err, errlen, 2, "@%s: step %d (%s): a %s to the rank itself (peer %lld on %s=%lld)",
                       fn->name, s, st->label, what, (long long)i[3], p2p_axis[i[1]], (long long)size);
    End e = {(int)i[1], size, send ? off : size - off, s};
    if (send) sends[ks++] = e;
    else recvs[kr++] = e;
  }
  qsort(sends, (size_t)n_send, sizeof *sends, end_cmp);
  qsort(recvs, (size_t)n_recv, sizeof *recvs, end_cmp);
  /* NCCL's pairing: per axis and offset, the k-th send with the k-th receive */
  int a = 0, b = 0, k = 0;
  while (a < n_send || b < n_recv) {
    int c = a == n_send ? 1 : b == n_recv ? -1 : end_key_cmp(&sends[a], &recvs[b]);
    if (c) {
      const End *e = c < 0 ? &sends[a] : &recvs[b];
      return plan_fail(pl, &P, ends, err, errlen, 2,
                       "@%s: step %d (%s): this %s has no %s on %s in the same function (NCCL pairs each send to +%lld "
                       "with a receive from -%lld, in order)", fn->name, e->pos, steps[e->pos].label,
                       c < 0 ? "send" : "recv", c < 0 ? "matching receive" : "matching send", p2p_axis[e->axis],
                       (long long)e->key, (long long)e->key);
    }
    const RtStep *ss = &steps[sends[a].pos], *rs = &steps[recvs[b].pos];
    if (ss->i[4] != rs->i[4])
      return plan_fail(pl, &P, ends, err, errlen, 2,
                       "@%s: NCCL pairs sends and receives in issue order, without tags: the send of step %d (%s, tag "
                       "%lld) would meet the receive of step %d (%s, tag %lld) — the receives from -%lld on %s are not "
                       "in the order of the sends to +%lld; the CUDA backend refuses rather than deliver another message",
                       fn->name, sends[a].pos, ss->label, (long long)ss->i[4], recvs[b].pos, rs->label,
                       (long long)rs->i[4], (long long)sends[a].key, p2p_axis[sends[a].axis], (long long)sends[a].key);
    int64_t bytes = rt_smul(ss->i[0], cuda_storage_size((RtStorage)ss->bufs[0].storage));
    if (ss->bufs[0].storage != rs->bufs[0].storage || ss->i[0] != rs->i[0])
      return plan_fail(pl, &P, ends, err, errlen, 2,
                       "@%s: step %d (%s) sends %lld %s but step %d (%s) receives %lld %s", fn->name, sends[a].pos,
                       ss->label, (long long)ss->i[0], cuda_storage_name((RtStorage)ss->bufs[0].storage), recvs[b].pos,
                       rs->label, (long long)rs->i[0], cuda_storage_name((RtStorage)rs->bufs[0].storage));
    if (recvs[b].pos < sends[a].pos)
      return plan_fail(pl, &P, ends, err, errlen, 2,
                       "@%s: step %d (%s) receives the message that step %d (%s) sends later: every rank would wait "
                       "for its neighbour's send (a deadlock under NCCL)", fn->name, recvs[b].pos, rs->label,
                       sends[a].pos, ss->label);
    P.m[k++] = (Msg){.s = sends[a].pos, .r = recvs[b].pos, .axis = sends[a].axis, .off = sends[a].key, .bytes = bytes,
                     .xs = -1, .yr = -1};
    a++;
    b++;
  }
  P.n_msgs = k;
  qsort(P.m, (size_t)k, sizeof *P.m, msg_cmp);
  /* groups: the messages of a run of consecutive sends on one axis */
  int ng = 0;
  for (int j = 0; j < k; j++) {
    Msg *m = &P.m[j];
    if (!j || m->s != P.m[j - 1].s + 1 || m->axis != P.m[j - 1].axis) {
      P.g[ng] = (CudaP2pGroup){.axis = m->axis, .issue = m->s, .wait = m->r, .first = 2 * j};
      ng++;
    }
    CudaP2pGroup *g = &P.g[ng - 1];
    m->g = ng - 1;
    g->issue = m->s;
    if (m->r < g->wait) g->wait = m->r;
    g->n += 2;
    g->bytes = rt_sadd(g->bytes, m->bytes);
  }
  /* started collectives: from the start to its wait */
  int ns = 0;
  for (int s = 0; s < n; s++) {
    const RtStep *st = &steps[s];
    if (st->kind != RT_STEP_BUILTIN || st->which != RT_B_COLL_START) continue;
    int w = n;
    for (int t = s + 1; t < n && n_waits; t++)
      if (steps[t].kind == RT_STEP_BUILTIN && steps[t].which == RT_B_COLL_WAIT && steps[t].i[0] == st->i[1]) {
        w = t;
        break;
      }
    if (st->n_in != 1 || st->n_out != 1) continue;   /* cuda_mesh_step_ok refuses it */
    P.start_s[ns] = s;
    P.start_w[ns++] = w;
  }
  P.n_starts = ns;
  /* staging: the sends (against every receive's possible span), then the receives */
  for (int j = 0; j < k; j++) P.m[j].xs = send_unsafe(&P, &P.m[j]) ? 0 : -1;
  for (int j = 0; j < k; j++) {
    P.m[j].yr = recv_unsafe(&P, &P.m[j]) ? 0 : -1;
    P.m[j].decided = true;
  }
  /* slots: a send's from its step to its group's wait, a receive's from its group's issue to
     its step; a slot is reused once its last user is done */
  int n_life = 0;
  for (int j = 0; j < k; j++) n_life += (P.m[j].xs >= 0) + (P.m[j].yr >= 0);
  Life *life = calloc((size_t)n_life + 1, sizeof *life);
  int64_t(*slot)[3] = calloc((size_t)n_life + 1, sizeof *slot);   /* offset, size, busy until */
  if (!life || !slot) {
    free(life);
    free(slot);
    return plan_fail(pl, &P, ends, err, errlen, 1, "out of memory");
  }
  int nl = 0, n_slots = 0;
  for (int j = 0; j < k; j++) {
    Msg *m = &P.m[j];
    if (m->xs >= 0) life[nl++] = (Life){m->s, P.g[m->g].wait, m->bytes, &m->xs};
    if (m->yr >= 0) life[nl++] = (Life){P.g[m->g].issue, m->r, m->bytes, &m->yr};
  }
  qsort(life, (size_t)nl, sizeof *life, life_cmp);
  int64_t total = 0;
  for (int l = 0; l < nl; l++) {
    int best = -1;
    for (int q = 0; q < n_slots; q++)
      if (slot[q][2] < life[l].lo && slot[q][1] >= life[l].bytes && (best < 0 || slot[q][1] < slot[best][1])) best = q;
    if (best < 0) {
      best = n_slots++;
      slot[best][0] = total;
      slot[best][1] = rt_smul(rt_sadd(life[l].bytes, 255) / 256, 256);
      total = rt_sadd(total, slot[best][1]);
    }
    slot[best][2] = life[l].hi;
    *life[l].out = slot[best][0];
  }
  free(life);
  free(slot);
  /* the plan */
  pl->ops = calloc((size_t)(2 * k), sizeof *pl->ops);
  pl->groups = calloc((size_t)ng, sizeof *pl->groups);
  pl->op_of_step = malloc(sizeof *pl->op_of_step * (size_t)n);
  if (!pl->ops || !pl->groups || !pl->op_of_step) return plan_fail(pl, &P, ends, err, errlen, 1, "out of memory");
  for (int s = 0; s < n; s++) pl->op_of_step[s] = -1;
  for (int j = 0; j < k; j++) {
    const Msg *m = &P.m[j];
    pl->ops[2 * j] = (CudaP2pOp){m->s, m->g, true, m->off, m->bytes, m->xs};
    pl->ops[2 * j + 1] = (CudaP2pOp){m->r, m->g, false, m->off, m->bytes, m->yr};
    pl->op_of_step[m->s] = 2 * j;
    pl->op_of_step[m->r] = 2 * j + 1;
  }
  memcpy(pl->groups, P.g, sizeof *P.g * (size_t)ng);
  pl->n_ops = 2 * k;
  pl->n_groups = ng;
  pl->staging = total;
  for (int g = 0; g < ng; g++)
    if (P.g[g].n > pl->max_group) pl->max_group = P.g[g].n;
  free(ends);
  free(P.m);
  free(P.g);
  free(P.start_s);
  free(P.start_w);
  return 0;
}

#ifdef LOOM_HAVE_CUDA_HEADERS

#define CU(fn, args, where) cuda_cu_fail(d->fn args, #fn, where, err, errlen)

int cuda_program_set_comm(CudaProgram *cp, Comm *comm, char *err, size_t errlen) {
  if (!cp->p) return rt_fail(err, errlen, 2, "the CUDA program is not initialized");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  for (int a = 0; a < 5; a++) {
    if (comm->mesh[a] < 1) return rt_fail(err, errlen, 2, "the mesh has an axis of size %lld", (long long)comm->mesh[a]);
    cp->coord[a] = comm->coord[a];
  }
  /* events: one per start handle of any function, and one more for the plain collectives */
  int handles = 0;
  for (int f = 0; f < cp->p->n_funcs; f++)
    for (int s = 0; s < cp->p->funcs[f].n_steps; s++) {
      const RtStep *st = &cp->p->funcs[f].steps[s];
      if (st->kind == RT_STEP_BUILTIN && st->which == RT_B_COLL_START && st->i[1] + 1 > handles) handles = (int)st->i[1] + 1;
    }
  cp->n_events = handles + 1;
  if (!(cp->ev_done = calloc((size_t)cp->n_events, sizeof *cp->ev_done))) return rt_fail(err, errlen, 1, "out of memory");
  int rc = CU(cuEventCreate, ((CUevent *)&cp->ev_ready, CU_EVENT_DISABLE_TIMING), "(the mesh's events)");
  for (int k = 0; !rc && k < cp->n_events; k++)
    rc = CU(cuEventCreate, ((CUevent *)&cp->ev_done[k], CU_EVENT_DISABLE_TIMING), "(the mesh's events)");
  for (int a = 0; !rc && a < 5; a++)
    if (comm->mesh[a] > 1) rc = CU(cuStreamCreate, ((CUstream *)&cp->axis_stream[a], CU_STREAM_NON_BLOCKING), "(a mesh axis's stream)");
  /* the transfers: every function's plan (the same on every rank), then the events, the
     staging slots and the room for the largest group's calls */
  int n_groups = 0, max_group = 0;
  int64_t staging = 0;
  if (!rc && !(cp->p2p = calloc((size_t)cp->p->n_funcs + 1, sizeof *cp->p2p))) rc = rt_fail(err, errlen, 1, "out of memory");
  for (int f = 0; !rc && f < cp->p->n_funcs; f++) {
    const RtFunc *fn = &cp->p->funcs[f];
    CudaP2pPlan *pl = &cp->p2p[f];
    rc = cuda_p2p_plan(fn, pl, err, errlen);
    for (int k = 0; !rc && k < pl->n_ops; k++) {
      const RtStep *st = &fn->steps[pl->ops[k].step];
      if (st->i[2] != comm->mesh[st->i[1]])
        rc = rt_fail(err, errlen, 2, "@%s: step %d (%s): the program's axis %s has %lld ranks, the mesh's %lld", fn->name,
                  pl->ops[k].step, st->label, p2p_axis[st->i[1]], (long long)st->i[2], (long long)comm->mesh[st->i[1]]);
    }
    if (pl->n_groups > n_groups) n_groups = pl->n_groups;
    if (pl->max_group > max_group) max_group = pl->max_group;
    if (pl->staging > staging) staging = pl->staging;
  }
  if (!rc && n_groups) {
    cp->n_p2p_events = n_groups;
    if (!(cp->p2p_done = calloc((size_t)n_groups, sizeof *cp->p2p_done)) ||
        !(cp->p2p_args = calloc((size_t)max_group, sizeof *cp->p2p_args)))
      rc = rt_fail(err, errlen, 1, "out of memory");
    for (int k = 0; !rc && k < n_groups; k++)
      rc = CU(cuEventCreate, ((CUevent *)&cp->p2p_done[k], CU_EVENT_DISABLE_TIMING), "(the transfers' events)");
  }
  if (!rc && staging > 0) {
    CUdeviceptr st = 0;
    rc = CU(cuMemAlloc, (&st, (size_t)staging), "(the transfers' staging slots)");
    cp->p2p_staging = (uint64_t)st;
  }
  cp->comm = comm;
  if (rc) cuda_mesh_free(cp);
  return rc;
}

void cuda_mesh_free(CudaProgram *cp) {
  const CudaDriverApi *d = cuda_driver(NULL, 0);
  if (d && cp->ctx) {
    d->cuCtxSetCurrent((CUcontext)cp->ctx);
    for (int a = 0; a < 5; a++)
      if (cp->axis_stream[a]) d->cuStreamDestroy((CUstream)cp->axis_stream[a]);
    if (cp->ev_ready) d->cuEventDestroy((CUevent)cp->ev_ready);
    for (int k = 0; cp->ev_done && k < cp->n_events; k++)
      if (cp->ev_done[k]) d->cuEventDestroy((CUevent)cp->ev_done[k]);
  }
  if (d && cp->ctx) {
    for (int k = 0; cp->p2p_done && k < cp->n_p2p_events; k++)
      if (cp->p2p_done[k]) d->cuEventDestroy((CUevent)cp->p2p_done[k]);
    if (cp->p2p_staging) d->cuMemFree((CUdeviceptr)cp->p2p_staging);
  }
  for (int f = 0; cp->p2p && f < cp->p->n_funcs; f++) cuda_p2p_plan_free(&cp->p2p[f]);
  free(cp->p2p);
  free(cp->p2p_done);
  free(cp->p2p_args);
  cp->p2p = NULL;
  cp->p2p_done = NULL;
  cp->p2p_args = NULL;
  cp->p2p_staging = 0;
  cp->n_p2p_events = 0;
  free(cp->ev_done);
  cp->ev_done = NULL;
  cp->ev_ready = NULL;
  memset(cp->axis_stream, 0, sizeof cp->axis_stream);
  cp->n_events = 0;
  cp->comm = NULL;
}

/* A pipeline's send or recv (rel=0): a copy between its buffer and the slot the driver
   named (cuda_exec.h, "a pipeline's transfers").  In a function called without slots (an
   optimizer step exchanging tied parameters' gradients), each run of consecutive transfer
   steps is one NCCL group on their own buffers, issued at the run's first step and waited
   for before the next: both ranks of such an exchange run send-then-receive, which one
   group pairs. */
static int pipe_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  const RtFunc *fn = &cp->p->funcs[f];
  const RtStep *st = &fn->steps[s];
  if (!cp->pipe_slot) {   /* called on its own (an optimizer step's tied gradients): see run_in_call */
    if (s > 0 && is_pipe_transfer(&fn->steps[s - 1])) return 0;   /* its run's group moved it */
    int e = s;
    while (e < fn->n_steps && is_pipe_transfer(&fn->steps[e])) e++;
    NcclP2p ops[64];
    if (e - s > 64) return rt_fail(err, errlen, 2, "%s: more than 64 transfers in a row", where);
    uint64_t base[RT_REGION_COUNT];
    for (int r = 0; r < RT_REGION_COUNT; r++) base[r] = r == RT_REGION_ARENA ? cp->arena : cp->regions[r];
    for (int t = s; t < e; t++) {
      const RtStep *x = &fn->steps[t];
      ops[t - s] = (NcclP2p){x->which == RT_B_SEND, (int)x->i[3],
                             (void *)(uintptr_t)(base[x->bufs[0].region] + (uint64_t)x->bufs[0].offset), x->i[0],
                             x->bufs[0].storage};
    }
    return cuda_pipe_exchange(cp, (int)st->i[1], e - s, ops, st->label, err, errlen);
  }
  int k = 0;
  for (int t = 0; t < s; t++) k += is_pipe_transfer(&fn->steps[t]);
  if (k >= cp->n_pipe_slot) return rt_fail(err, errlen, 2, "%s: a pipeline's transfer without a slot", where);
  const RtBuf *b = &st->bufs[0];
  uint64_t base = b->region == RT_REGION_ARENA ? cp->arena : cp->regions[b->region];
  CUdeviceptr mine = (CUdeviceptr)(base + (uint64_t)b->offset), slot = (CUdeviceptr)cp->pipe_slot[k];
  size_t bytes = (size_t)b->n * (size_t)cuda_storage_size((RtStorage)b->storage);
  if (!bytes) return 0;
  CUstream compute = (CUstream)cp->stream;
  return st->which == RT_B_SEND ? CU(cuMemcpyDtoDAsync, (slot, mine, bytes, compute), where)
                                : CU(cuMemcpyDtoDAsync, (mine, slot, bytes, compute), where);
}

/* A send or recv step: its part of its group (see the top of this file). */
static int p2p_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  const RtFunc *fn = &cp->p->funcs[f];
  const CudaP2pPlan *pl = cp->p2p ? &cp->p2p[f] : NULL;
  int o = pl && pl->op_of_step ? pl->op_of_step[s] : -1;
  if (o < 0) return rt_fail(err, errlen, 2, "%s: a transfer outside the plan", where);
  const CudaP2pOp *op = &pl->ops[o];
  const CudaP2pGroup *g = &pl->groups[op->group];
  CUstream compute = (CUstream)cp->stream;
  CUstream comm = (CUstream)cp->axis_stream[g->axis];
  if (!comm || op->group >= cp->n_p2p_events) return rt_fail(err, errlen, 2, "%s: no stream or event for the transfer", where);
  uint64_t base[RT_REGION_COUNT];
  for (int r = 0; r < RT_REGION_COUNT; r++) base[r] = r == RT_REGION_ARENA ? cp->arena : cp->regions[r];
  const RtBuf *b = &fn->steps[s].bufs[0];
  CUdeviceptr mine = (CUdeviceptr)(base[b->region] + (uint64_t)b->offset);
  int rc = 0;
  if (op->send && op->stage >= 0 && op->bytes)
    rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)(cp->p2p_staging + (uint64_t)op->stage), mine, (size_t)op->bytes, compute), where);
  if (!rc && s == g->issue) {
    for (int k = 0; k < g->n; k++) {
      const CudaP2pOp *q = &pl->ops[g->first + k];
      const RtStep *qs = &fn->steps[q->step];
      int64_t size = qs->i[2], c = cp->coord[g->axis];
      cp->p2p_args[k] = (NcclP2p){
          .send = q->send,
          .peer = (int)((q->send ? c + q->off : c - q->off + size) % size),
          .buf = (void *)(uintptr_t)(q->stage >= 0 ? cp->p2p_staging + (uint64_t)q->stage
                                                   : base[qs->bufs[0].region] + (uint64_t)qs->bufs[0].offset),
          .count = qs->i[0],
          .storage = qs->bufs[0].storage,
      };
    }
    rc = CU(cuEventRecord, ((CUevent)cp->ev_ready, compute), where);
    if (!rc) rc = CU(cuStreamWaitEvent, (comm, (CUevent)cp->ev_ready, 0), where);
    if (!rc) rc = nccl_p2p_group(cp->comm, g->axis, g->n, cp->p2p_args, comm, fn->steps[s].label, err, errlen);
    if (!rc) rc = CU(cuEventRecord, ((CUevent)cp->p2p_done[op->group], comm), where);
  }
  if (!rc && s == g->wait) rc = CU(cuStreamWaitEvent, (compute, (CUevent)cp->p2p_done[op->group], 0), where);
  if (!rc && !op->send && op->stage >= 0 && op->bytes)
    rc = CU(cuMemcpyDtoDAsync, (mine, (CUdeviceptr)(cp->p2p_staging + (uint64_t)op->stage), (size_t)op->bytes, compute), where);
  return rc;
}

/* all_to_allv: the counts come to the host (a synchronization: they are computed on the
   device just before), then each peer's rows travel by one group of NCCL sends and receives
   on the axis's stream (this rank's own rows by a device copy); y's rows past those
   received are zero.  As ops.def's all_to_allv: rank j gets the rows of send's groups
   j*El.., the received rows packed by source rank. */
static int all_to_allv_step(CudaProgram *cp, const RtStep *st, const char *where, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  const int64_t *i = st->i;
  int axis = (int)i[0], n = (int)i[1], me = cp->comm->coord[axis];
  int64_t S = i[2], D = i[3], rows = i[4], el = i[5];
  int es = cuda_storage_size((RtStorage)st->bufs[0].storage);
  CUstream compute = (CUstream)cp->stream, comm = cp->axis_stream[axis] ? (CUstream)cp->axis_stream[axis] : compute;
  uint64_t base[RT_REGION_COUNT];
  for (int r = 0; r < RT_REGION_COUNT; r++) base[r] = r == RT_REGION_ARENA ? cp->arena : cp->regions[r];
  uint64_t at[4];
  for (int b = 0; b < 4; b++) at[b] = base[st->bufs[b].region] + (uint64_t)st->bufs[b].offset;
  int32_t *counts = calloc(2 * (size_t)n * (size_t)el + 1, sizeof *counts);
  NcclP2p *ops = calloc(2 * (size_t)n + 1, sizeof *ops);
  int rc = counts && ops ? 0 : rt_fail(err, errlen, 1, "out of memory");
  if (!rc) rc = CU(cuMemcpyDtoHAsync, (counts, (CUdeviceptr)at[1], sizeof(int32_t) * (size_t)(n * el), compute), where);
  if (!rc)
    rc = CU(cuMemcpyDtoHAsync, (counts + n * el, (CUdeviceptr)at[2], sizeof(int32_t) * (size_t)(n * el), compute), where);
  if (!rc) rc = CU(cuStreamSynchronize, (compute), where);
  int64_t sent = 0, got = 0, n_ops = 0, self_rows = 0, self_from = 0, self_to = 0;
  for (int64_t g = 0; !rc && g < 2 * n * el; g++)
    if (counts[g] < 0) rc = rt_fail(err, errlen, 2, "%s: negative counts", where);
  for (int j = 0; !rc && j < n; j++) {   /* sends and receives in peer order: both ends agree */
    int64_t out = 0, in = 0;
    for (int64_t e = 0; e < el; e++) out += counts[j * el + e], in += counts[n * el + j * el + e];
    if (j == me) self_rows = out, self_from = sent, self_to = got;
    else {
      if (out) ops[n_ops++] = (NcclP2p){true, j, (void *)(uintptr_t)(at[0] + (uint64_t)(sent * D * es)), out * D,
                                       st->bufs[0].storage};
      if (in) ops[n_ops++] = (NcclP2p){false, j, (void *)(uintptr_t)(at[3] + (uint64_t)(got * D * es)), in * D,
                                      st->bufs[3].storage};
    }
    if (j == me && out != in) rc = rt_fail(err, errlen, 2, "%s: this rank sends itself %lld rows but expects %lld", where,
                                        (long long)out, (long long)in);
    sent += out, got += in;
  }
  if (!rc && (sent > S || got > rows))
    rc = rt_fail(err, errlen, 2, "%s: %lld rows to send of %lld, %lld to receive into %lld", where, (long long)sent,
              (long long)S, (long long)got, (long long)rows);
  if (!rc && self_rows)
    rc = CU(cuMemcpyDtoDAsync, ((CUdeviceptr)(at[3] + (uint64_t)(self_to * D * es)),
                                (CUdeviceptr)(at[0] + (uint64_t)(self_from * D * es)), (size_t)(self_rows * D * es), compute),
            where);
  if (!rc && got < rows)
    rc = CU(cuMemsetD8Async, ((CUdeviceptr)(at[3] + (uint64_t)(got * D * es)), 0, (size_t)((rows - got) * D * es), compute),
            where);
  int h = cp->n_events - 1;
  if (!rc && n_ops) {
    rc = CU(cuEventRecord, ((CUevent)cp->ev_ready, compute), where);
    if (!rc) rc = CU(cuStreamWaitEvent, (comm, (CUevent)cp->ev_ready, 0), where);
    if (!rc) rc = nccl_p2p_group(cp->comm, axis, (int)n_ops, ops, comm, st->label, err, errlen);
    if (!rc) rc = CU(cuEventRecord, ((CUevent)cp->ev_done[h], comm), where);
    if (!rc) rc = CU(cuStreamWaitEvent, (compute, (CUevent)cp->ev_done[h], 0), where);
  }
  free(counts);
  free(ops);
  return rc;
}

int cuda_mesh_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const RtStep *st = &cp->p->funcs[f].steps[s];
  if (!cp->comm)
    return rt_fail(err, errlen, 2, "%s: a collective, but this program runs on one GPU (a mesh needs one process per GPU: "
                "loom train --backend cuda --mesh ... starts them)", where);
  if (st->which == RT_B_SEND || st->which == RT_B_RECV)
    return st->i[5] == 0 ? pipe_step(cp, f, s, where, err, errlen) : p2p_step(cp, f, s, where, err, errlen);
  if (st->which == RT_B_ALL_TO_ALLV) return all_to_allv_step(cp, st, where, err, errlen);
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  CUstream compute = (CUstream)cp->stream;
  if (st->which == RT_B_COLL_WAIT) {
    int h = (int)st->i[0];
    if (h >= cp->n_events - 1) return rt_fail(err, errlen, 2, "%s: no collective start has handle %d", where, h);
    return CU(cuStreamWaitEvent, (compute, (CUevent)cp->ev_done[h], 0), where);
  }
  bool start = st->which == RT_B_COLL_START;
  int builtin = start ? (int)st->i[0] : st->which;
  const int64_t *ints = start ? st->i + 2 : st->i;
  int axis = (int)(builtin == RT_B_ALL_REDUCE ? ints[1] : ints[0]);
  int h = start ? (int)st->i[1] : cp->n_events - 1;
  if (axis < 0 || axis >= 5 || h < 0 || h >= cp->n_events) return rt_fail(err, errlen, 2, "%s: a bad axis or handle", where);
  CUstream comm = cp->axis_stream[axis] ? (CUstream)cp->axis_stream[axis] : compute;
  uint64_t base[RT_REGION_COUNT];
  for (int r = 0; r < RT_REGION_COUNT; r++) base[r] = r == RT_REGION_ARENA ? cp->arena : cp->regions[r];
  const void *x = (const void *)(uintptr_t)(base[st->bufs[0].region] + (uint64_t)st->bufs[0].offset);
  void *y = (void *)(uintptr_t)(base[st->bufs[1].region] + (uint64_t)st->bufs[1].offset);
  int rc = CU(cuEventRecord, ((CUevent)cp->ev_ready, compute), where);
  if (!rc) rc = CU(cuStreamWaitEvent, (comm, (CUevent)cp->ev_ready, 0), where);
  if (!rc) rc = nccl_step(cp->comm, builtin, ints, st->bufs[0].storage, x, y, comm, st->label, err, errlen);
  if (!rc) rc = CU(cuEventRecord, ((CUevent)cp->ev_done[h], comm), where);
  if (!rc && !start) rc = CU(cuStreamWaitEvent, (compute, (CUevent)cp->ev_done[h], 0), where);
  return rc;
}

int cuda_mesh_sync(CudaProgram *cp, const char *where, char *err, size_t errlen) {
  return nccl_sync(cp->comm, cp->stream, where, err, errlen);
}

int cuda_pipe_exchange(CudaProgram *cp, int axis, int n, const NcclP2p *ops, const char *label, char *err, size_t errlen) {
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  if (!cp->comm || axis < 0 || axis >= 5 || !cp->axis_stream[axis] || cp->n_events < 1)
    return rt_fail(err, errlen, 2, "%s: point-to-point transfers on an axis this rank has no stream for", label);
  CUstream compute = (CUstream)cp->stream, comm = (CUstream)cp->axis_stream[axis];
  CUevent done = (CUevent)cp->ev_done[cp->n_events - 1];
  const char *where = "(a pipeline's transfers)";
  int rc = CU(cuEventRecord, ((CUevent)cp->ev_ready, compute), where);
  if (!rc) rc = CU(cuStreamWaitEvent, (comm, (CUevent)cp->ev_ready, 0), where);
  if (!rc) rc = nccl_p2p_group(cp->comm, axis, n, ops, comm, label, err, errlen);
  if (!rc) rc = CU(cuEventRecord, (done, comm), where);
  if (!rc) rc = CU(cuStreamWaitEvent, (compute, done, 0), where);
  return rc;
}

#else

int cuda_program_set_comm(CudaProgram *cp, Comm *comm, char *err, size_t errlen) {
  (void)cp, (void)comm;
  return rt_fail(err, errlen, 1, "this loom was built without the CUDA headers");
}
void cuda_mesh_free(CudaProgram *cp) { (void)cp; }
int cuda_mesh_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  (void)cp, (void)f, (void)s, (void)where;
  return rt_fail(err, errlen, 1, "this loom was built without the CUDA headers");
}
int cuda_mesh_sync(CudaProgram *cp, const char *where, char *err, size_t errlen) {
  (void)cp, (void)where;
  return rt_fail(err, errlen, 1, "this loom was built without the CUDA headers");
}
int cuda_pipe_exchange(CudaProgram *cp, int axis, int n, const NcclP2p *ops, const char *label, char *err, size_t errlen) {
  (void)cp, (void)axis, (void)n, (void)ops, (void)label;
  return rt_fail(err, errlen, 1, "this loom was built without the CUDA headers");
}

#endif
