/* runtime/comm/comm_local.c — collectives among threads of one process.
 *
 * Every group (the ranks that differ only in one axis) has an exchange table of pointers
 * and a barrier.  A collective: each rank publishes its input, waits, reads what it needs
 * from the others' buffers (sums in coordinate order, so every rank gets bitwise the same
 * result whatever the timing), waits again so no one reuses a buffer still being read.
 * The barrier can be aborted, so a rank that fails cannot leave the others hanging.
 * Point-to-point (pipeline transfers): every rank has a mailbox; send appends a copy,
 * recv waits for the message with its sender and tag and takes it.
 *
 * A watchdog and a fault hook, as the NCCL communicator has them (comm_nccl.c): a rank that
 * waits in a collective longer than LOOM_MESH_TIMEOUT seconds (default 600) aborts the world,
 * naming the collective and the ranks that never came; LOOM_MESH_FAULT=KIND:R:N makes rank
 * R's collective #N (counted per rank from 1: collectives, barriers, sends and receives)
 * fail (fail), end the rank there (kill), or stop the rank forever before it (hang: only the
 * others' timeout ends it).  The first fault's description is kept (local_world_fault), so
 * the executors report the rank and collective that failed, not a rank that was stopped.
 */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/comm/comm.h"

typedef struct LocalWorld LocalWorld;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int size, waiting;
  unsigned generation;
  const atomic_bool *aborted;
  bool *arrived;       /* per member: waiting in this generation (the watchdog names the others) */
  LocalWorld *w;
  int axis;            /* the group's axis, or -1: the whole world */
} Barrier;

typedef struct {
  Barrier bar;
  const float **in;   /* per member: its input */
  float **out;        /* per member: its output (all_to_all) */
} Group;

typedef struct Msg {
  struct Msg *next;
  int from;
  int64_t tag, n;
  float *data;
} Msg;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  Msg *head;
} Mailbox;

struct LocalWorld {
  Mailbox *boxes;             /* per rank */
  int64_t mesh[COMM_AXES];
  int world;
  atomic_bool aborted;
  pthread_mutex_t abort_mu;
  Group *groups[COMM_AXES];   /* per axis: world / size groups, by the group's index */
  int n_groups[COMM_AXES];
  Group all;                  /* the whole world, for barriers */
  Comm *ranks;
  /* the watchdog and LOOM_MESH_FAULT */
  double timeout_s;
  char fault[64], fault_kind[8];
  int fault_rank;
  long long fault_n;
  int64_t *seq;               /* per rank: collectives begun (atomic: a rank's communication thread counts too) */
  const char **op;            /* per rank: the one it is in */
  int *op_axis;
  char reason[1024];          /* the first fault ("" none), under abort_mu */
  pthread_cond_t abort_cv;    /* a hung rank waits here for the abort */
};

static const char *const axis_name[COMM_AXES] = {"dp", "tp", "cp", "pp", "ep"};

/* Keeps the first fault's description, then wakes every rank. */
static void world_fail(LocalWorld *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void world_fail(LocalWorld *w, const char *fmt, ...) {
  pthread_mutex_lock(&w->abort_mu);
  if (!w->reason[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->reason, sizeof w->reason, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&w->abort_mu);
  local_world_abort(w);
}

const char *local_world_fault(LocalWorld *w) {
  pthread_mutex_lock(&w->abort_mu);
  const char *r = w->reason[0] ? w->reason : NULL;
  pthread_mutex_unlock(&w->abort_mu);
  return r;
}

/* Every collective starts here: counts it, and plays LOOM_MESH_FAULT's part when it is this
   rank's collective #N.  Nonzero: the collective must fail (the world is aborted). */
static int enter(Comm *c, const char *op, int axis) {
  LocalWorld *w = c->impl;
  int64_t n = __atomic_add_fetch(&w->seq[c->rank], 1, __ATOMIC_RELAXED);
  w->op[c->rank] = op;
  w->op_axis[c->rank] = axis;
  if (!w->fault_kind[0] || c->rank != w->fault_rank || n != w->fault_n) return 0;
  const char *ax = axis >= 0 ? axis_name[axis] : "the world";
  if (!strcmp(w->fault_kind, "hang")) {
    fprintf(stderr, "loom: rank %d: LOOM_MESH_FAULT=%s: stopping forever before collective #%lld (%s over %s)\n",
            c->rank, w->fault, (long long)n, op, ax);
    fflush(stderr);
    pthread_mutex_lock(&w->abort_mu);   /* never reaches the collective: only the others' watchdog ends this */
    while (!atomic_load(&w->aborted)) pthread_cond_wait(&w->abort_cv, &w->abort_mu);
    pthread_mutex_unlock(&w->abort_mu);
    return 1;
  }
  if (!strcmp(w->fault_kind, "kill")) {
    fprintf(stderr, "loom: rank %d: LOOM_MESH_FAULT=%s: dying before collective #%lld (%s over %s)\n", c->rank,
            w->fault, (long long)n, op, ax);
    fflush(stderr);
    world_fail(w, "rank %d died before collective #%lld (%s over %s; LOOM_MESH_FAULT=%s)", c->rank, (long long)n, op,
               ax, w->fault);
    return 1;
  }
  world_fail(w, "rank %d: collective #%lld (%s over %s) failed (LOOM_MESH_FAULT=%s)", c->rank, (long long)n, op, ax,
             w->fault);
  return 1;
}

/* The member of a barrier's group -> its rank (the group of rank c). */
static int member_rank(const Comm *c, int axis, int member) {
  if (axis < 0) return member;
  int coord[COMM_AXES];
  memcpy(coord, c->coord, sizeof coord);
  coord[axis] = member;
  return mesh_rank_of(c->mesh, coord);
}

/* The watchdog: rank c waited longer than the timeout in barrier b; names who never came. */
static void timed_out(Comm *c, Barrier *b, const bool *arrived) {
  LocalWorld *w = c->impl;
  char missing[256] = "";
  size_t k = 0;
  for (int m = 0; m < b->size && k + 16 < sizeof missing; m++)
    if (!arrived[m]) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", member_rank(c, b->axis, m));
  world_fail(w, "rank %d: collective #%lld (%s over %s) did not complete within %g s: rank%s %s never joined it "
             "(LOOM_MESH_TIMEOUT; a rank that hangs, or one far slower than the others)", c->rank,
             (long long)__atomic_load_n(&w->seq[c->rank], __ATOMIC_RELAXED), w->op[c->rank] ? w->op[c->rank] : "barrier",
             b->axis >= 0 ? axis_name[b->axis] : "the world", w->timeout_s, strchr(missing, ',') ? "s" : "",
             missing[0] ? missing : "?");
}

static struct timespec deadline_of(double s) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double whole = (double)(int64_t)s;
  ts.tv_sec += (time_t)whole;
  ts.tv_nsec += (long)((s - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  return ts;
}

static int bar_wait(Comm *c, Barrier *b, int me) {
  pthread_mutex_lock(&b->mu);
  if (*b->aborted) {
    pthread_mutex_unlock(&b->mu);
    return 1;
  }
  unsigned gen = b->generation;
  bool late = false;
  if (++b->waiting == b->size) {
    b->waiting = 0;
    b->generation++;
    memset(b->arrived, 0, sizeof(bool) * (size_t)b->size);
    pthread_cond_broadcast(&b->cv);
  } else {
    b->arrived[me] = true;
    struct timespec until = deadline_of(((LocalWorld *)c->impl)->timeout_s);
    while (gen == b->generation && !*b->aborted)
      if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT && gen == b->generation && !*b->aborted) {
        late = true;
        break;
      }
  }
  bool *seen = NULL;
  if (late && (seen = malloc(sizeof(bool) * (size_t)b->size))) memcpy(seen, b->arrived, sizeof(bool) * (size_t)b->size);
  int rc = *b->aborted || late ? 1 : 0;
  pthread_mutex_unlock(&b->mu);
  if (late) {   /* outside the lock: the abort takes every barrier's */
    if (seen) timed_out(c, b, seen);
    else local_world_abort(c->impl);
    free(seen);
  }
  return rc;
}

static void group_init(Group *g, int size, LocalWorld *w, int axis) {
  pthread_mutex_init(&g->bar.mu, NULL);
  pthread_cond_init(&g->bar.cv, NULL);
  g->bar.size = size;
  g->bar.aborted = &w->aborted;
  g->bar.w = w;
  g->bar.axis = axis;
  g->bar.arrived = calloc((size_t)size, sizeof *g->bar.arrived);
  g->in = calloc((size_t)size, sizeof *g->in);
  g->out = calloc((size_t)size, sizeof *g->out);
}

static void group_free(Group *g) {
  pthread_mutex_destroy(&g->bar.mu);
  pthread_cond_destroy(&g->bar.cv);
  free(g->in);
  free(g->out);
  free(g->bar.arrived);
}

int mesh_rank_of(const int64_t mesh[COMM_AXES], const int coord[COMM_AXES]) {
  static const int order[COMM_AXES] = {COMM_PP, COMM_DP, COMM_EP, COMM_CP, COMM_TP};   /* outer to inner */
  int64_t r = 0;
  for (int i = 0; i < COMM_AXES; i++) r = r * mesh[order[i]] + coord[order[i]];
  return (int)r;
}

void mesh_coords_of(const int64_t mesh[COMM_AXES], int rank, int coord[COMM_AXES]) {
  static const int order[COMM_AXES] = {COMM_PP, COMM_DP, COMM_EP, COMM_CP, COMM_TP};
  for (int i = COMM_AXES - 1; i >= 0; i--) {
    coord[order[i]] = (int)(rank % mesh[order[i]]);
    rank /= (int)mesh[order[i]];
  }
}

/* The group of c on axis: index = c's rank with that axis's coordinate set to 0,
   compacted by dividing out the axis (its stride). */
static Group *group_of(Comm *c, int axis) {
  LocalWorld *w = c->impl;
  int coord[COMM_AXES];
  memcpy(coord, c->coord, sizeof coord);
  coord[axis] = 0;
  int base = mesh_rank_of(c->mesh, coord), idx = 0;
  /* Enumerate group bases in rank order: the index is the count of bases below. */
  for (int r = 0; r < base; r++) {
    int cr[COMM_AXES];
    mesh_coords_of(c->mesh, r, cr);
    idx += cr[axis] == 0;
  }
  return &w->groups[axis][idx];
}

static int all_reduce(Comm *c, int axis, float *buf, int64_t n, bool max) {
  if (enter(c, "all_reduce", axis)) return 1;
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  float *acc = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!acc) return 1;
  g->in[me] = buf;
  int rc = bar_wait(c, &g->bar, me);
  if (!rc) {
    memcpy(acc, g->in[0], sizeof(float) * (size_t)n);
    for (int r = 1; r < size; r++) {
      const float *x = g->in[r];
      if (max)
        for (int64_t k = 0; k < n; k++) acc[k] = x[k] > acc[k] ? x[k] : acc[k];
      else
        for (int64_t k = 0; k < n; k++) acc[k] += x[k];
    }
    rc = bar_wait(c, &g->bar, me);   /* everyone has read every input */
  }
  if (!rc) memcpy(buf, acc, sizeof(float) * (size_t)n);
  free(acc);
  return rc;
}

static int all_gather(Comm *c, int axis, const float *in, float *out, int64_t n) {
  if (enter(c, "all_gather", axis)) return 1;
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  g->in[me] = in;
  int rc = bar_wait(c, &g->bar, me);
  for (int r = 0; r < size && !rc; r++) memcpy(out + (int64_t)r * n, g->in[r], sizeof(float) * (size_t)n);
  if (!rc) rc = bar_wait(c, &g->bar, me);
  return rc;
}

static int reduce_scatter(Comm *c, int axis, const float *in, float *out, int64_t n_out) {
  if (enter(c, "reduce_scatter", axis)) return 1;
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  g->in[me] = in;
  int rc = bar_wait(c, &g->bar, me);
  if (!rc) {
    memcpy(out, g->in[0] + (int64_t)me * n_out, sizeof(float) * (size_t)n_out);
    for (int r = 1; r < size; r++) {
      const float *x = g->in[r] + (int64_t)me * n_out;
      for (int64_t k = 0; k < n_out; k++) out[k] += x[k];
    }
    rc = bar_wait(c, &g->bar, me);
  }
  return rc;
}

static int all_to_all(Comm *c, int axis, const float *in, float *out, int64_t n_chunk) {
  if (enter(c, "all_to_all", axis)) return 1;
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  g->in[me] = in;
  int rc = bar_wait(c, &g->bar, me);
  for (int r = 0; r < size && !rc; r++)   /* chunk `me` of rank r's input */
    memcpy(out + (int64_t)r * n_chunk, g->in[r] + (int64_t)me * n_chunk, sizeof(float) * (size_t)n_chunk);
  if (!rc) rc = bar_wait(c, &g->bar, me);
  return rc;
}

static int barrier(Comm *c) {
  if (enter(c, "barrier", -1)) return 1;
  return bar_wait(c, &((LocalWorld *)c->impl)->all.bar, c->rank);
}

static int peer_rank(Comm *c, int axis, int peer) {
  int coord[COMM_AXES];
  memcpy(coord, c->coord, sizeof coord);
  coord[axis] = peer;
  return mesh_rank_of(c->mesh, coord);
}

static int p2p_send(Comm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n) {
  LocalWorld *w = c->impl;
  if (peer < 0 || peer >= c->mesh[axis] || atomic_load(&w->aborted) || enter(c, "send", axis)) return 1;
  Msg *m = malloc(sizeof *m);
  float *d = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!m || !d) {
    free(m), free(d);
    return 1;
  }
  memcpy(d, buf, sizeof(float) * (size_t)n);
  *m = (Msg){NULL, c->rank, tag, n, d};
  Mailbox *b = &w->boxes[peer_rank(c, axis, peer)];
  pthread_mutex_lock(&b->mu);
  Msg **tail = &b->head;
  while (*tail) tail = &(*tail)->next;
  *tail = m;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return 0;
}

static int p2p_recv(Comm *c, int axis, int peer, int64_t tag, float *buf, int64_t n) {
  LocalWorld *w = c->impl;
  if (peer < 0 || peer >= c->mesh[axis] || enter(c, "recv", axis)) return 1;
  int from = peer_rank(c, axis, peer);
  Mailbox *b = &w->boxes[c->rank];
  struct timespec until = deadline_of(w->timeout_s);
  pthread_mutex_lock(&b->mu);
  for (;;) {
    if (atomic_load(&w->aborted)) {
      pthread_mutex_unlock(&b->mu);
      return 1;
    }
    for (Msg **p = &b->head; *p; p = &(*p)->next)
      if ((*p)->from == from && (*p)->tag == tag) {
        Msg *m = *p;
        *p = m->next;
        pthread_mutex_unlock(&b->mu);
        int rc = m->n == n ? 0 : 1;
        if (!rc) memcpy(buf, m->data, sizeof(float) * (size_t)n);
        free(m->data);
        free(m);
        return rc;
      }
    if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT) {
      pthread_mutex_unlock(&b->mu);
      world_fail(w, "rank %d: collective #%lld (recv over %s from rank %d) did not complete within %g s: rank %d never "
                 "sent it (LOOM_MESH_TIMEOUT; a rank that hangs, or one far slower than the others)", c->rank,
                 (long long)__atomic_load_n(&w->seq[c->rank], __ATOMIC_RELAXED), axis_name[axis], from, w->timeout_s, from);
      return 1;
    }
  }
}

LocalWorld *local_world_new(const int64_t mesh[COMM_AXES], char *err, size_t errlen) {
  LocalWorld *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  w->world = 1;
  for (int a = 0; a < COMM_AXES; a++) {
    if (mesh[a] < 1 || mesh[a] > 4096) {
      snprintf(err, errlen, "mesh axis %d has size %lld", a, (long long)mesh[a]);
      free(w);
      return NULL;
    }
    w->mesh[a] = mesh[a];
    w->world *= (int)mesh[a];
  }
  /* the watchdog's timeout and the fault hook, read once */
  const char *t = getenv("LOOM_MESH_TIMEOUT"), *f = getenv("LOOM_MESH_FAULT");
  char *end = NULL;
  w->timeout_s = t && *t ? strtod(t, &end) : 600;
  if (t && *t && (*end || !(w->timeout_s > 0) || w->timeout_s > 1e7)) {
    snprintf(err, errlen, "LOOM_MESH_TIMEOUT=%s: give the seconds a collective may wait (a number > 0; default 600)", t);
    free(w);
    return NULL;
  }
  if (f && *f) {
    char tail = 0;
    if (strlen(f) >= sizeof w->fault ||
        sscanf(f, "%7[a-z]:%d:%lld%c", w->fault_kind, &w->fault_rank, &w->fault_n, &tail) != 3 ||
        (strcmp(w->fault_kind, "hang") && strcmp(w->fault_kind, "kill") && strcmp(w->fault_kind, "fail")) ||
        w->fault_rank < 0 || w->fault_rank >= w->world || w->fault_n < 1) {
      snprintf(err, errlen, "LOOM_MESH_FAULT=%.100s: give hang:R:N, kill:R:N or fail:R:N (rank R < %d, the mesh's "
               "ranks; its collective #N, counted from 1)", f, w->world);
      free(w);
      return NULL;
    }
    snprintf(w->fault, sizeof w->fault, "%s", f);
  }
  pthread_mutex_init(&w->abort_mu, NULL);
  pthread_cond_init(&w->abort_cv, NULL);
  for (int a = 0; a < COMM_AXES; a++) {
    w->n_groups[a] = w->world / (int)mesh[a];
    w->groups[a] = calloc((size_t)w->n_groups[a], sizeof(Group));
    for (int i = 0; i < w->n_groups[a]; i++) group_init(&w->groups[a][i], (int)mesh[a], w, a);
  }
  group_init(&w->all, w->world, w, -1);
  w->seq = calloc((size_t)w->world, sizeof *w->seq);
  w->op = calloc((size_t)w->world, sizeof *w->op);
  w->op_axis = calloc((size_t)w->world, sizeof *w->op_axis);
  w->boxes = calloc((size_t)w->world, sizeof(Mailbox));
  for (int r = 0; r < w->world; r++) {
    pthread_mutex_init(&w->boxes[r].mu, NULL);
    pthread_cond_init(&w->boxes[r].cv, NULL);
  }
  w->ranks = calloc((size_t)w->world, sizeof(Comm));
  for (int r = 0; r < w->world; r++) {
    Comm *c = &w->ranks[r];
    c->rank = r;
    c->world = w->world;
    memcpy(c->mesh, w->mesh, sizeof c->mesh);
    mesh_coords_of(w->mesh, r, c->coord);
    c->impl = w;
    c->all_reduce = all_reduce;
    c->all_gather = all_gather;
    c->reduce_scatter = reduce_scatter;
    c->all_to_all = all_to_all;
    c->barrier = barrier;
    c->send = p2p_send;
    c->recv = p2p_recv;
  }
  return w;
}

Comm *local_world_rank(LocalWorld *w, int rank) { return rank >= 0 && rank < w->world ? &w->ranks[rank] : NULL; }

void local_world_abort(LocalWorld *w) {
  /* Set the flag, then wake every group: a waiter checks it under its group's lock. */
  atomic_store(&w->aborted, true);
  for (int a = 0; a < COMM_AXES; a++)
    for (int i = 0; i < w->n_groups[a]; i++) {
      Barrier *b = &w->groups[a][i].bar;
      pthread_mutex_lock(&b->mu);
      pthread_cond_broadcast(&b->cv);
      pthread_mutex_unlock(&b->mu);
    }
  pthread_mutex_lock(&w->all.bar.mu);
  pthread_cond_broadcast(&w->all.bar.cv);
  pthread_mutex_unlock(&w->all.bar.mu);
  for (int r = 0; r < w->world; r++) {
    pthread_mutex_lock(&w->boxes[r].mu);
    pthread_cond_broadcast(&w->boxes[r].cv);
    pthread_mutex_unlock(&w->boxes[r].mu);
  }
  pthread_mutex_lock(&w->abort_mu);   /* a rank that LOOM_MESH_FAULT=hang stopped */
  pthread_cond_broadcast(&w->abort_cv);
  pthread_mutex_unlock(&w->abort_mu);
}

void local_world_free(LocalWorld *w) {
  if (!w) return;
  for (int a = 0; a < COMM_AXES; a++) {
    for (int i = 0; i < w->n_groups[a]; i++) group_free(&w->groups[a][i]);
    free(w->groups[a]);
  }
  group_free(&w->all);
  for (int r = 0; r < w->world; r++) {
    for (Msg *m = w->boxes[r].head, *nx; m; m = nx) {
      nx = m->next;
      free(m->data);
      free(m);
    }
    pthread_mutex_destroy(&w->boxes[r].mu);
    pthread_cond_destroy(&w->boxes[r].cv);
  }
  free(w->boxes);
  pthread_mutex_destroy(&w->abort_mu);
  pthread_cond_destroy(&w->abort_cv);
  free(w->seq);
  free(w->op);
  free(w->op_axis);
  free(w->ranks);
  free(w);
}
