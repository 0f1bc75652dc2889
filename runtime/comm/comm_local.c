/* runtime/comm/comm_local.c — collectives among threads of one process.
 *
 * Every group (the ranks that differ only in one axis) has an exchange table of pointers
 * and a barrier.  A collective: each rank publishes its input, waits, reads what it needs
 * from the others' buffers (sums in coordinate order, so every rank gets bitwise the same
 * result whatever the timing), waits again so no one reuses a buffer still being read.
 * The barrier can be aborted, so a rank that fails cannot leave the others hanging.
 * Point-to-point (pipeline transfers): every rank has a mailbox; send appends a copy,
 * recv waits for the message with its sender and tag and takes it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int size, waiting;
  unsigned generation;
  const atomic_bool *aborted;
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
};

static int bar_wait(Barrier *b) {
  pthread_mutex_lock(&b->mu);
  if (*b->aborted) {
    pthread_mutex_unlock(&b->mu);
    return 1;
  }
  unsigned gen = b->generation;
  if (++b->waiting == b->size) {
    b->waiting = 0;
    b->generation++;
    pthread_cond_broadcast(&b->cv);
  } else {
    while (gen == b->generation && !*b->aborted) pthread_cond_wait(&b->cv, &b->mu);
  }
  int rc = *b->aborted ? 1 : 0;
  pthread_mutex_unlock(&b->mu);
  return rc;
}

static void group_init(Group *g, int size, const atomic_bool *aborted) {
  pthread_mutex_init(&g->bar.mu, NULL);
  pthread_cond_init(&g->bar.cv, NULL);
  g->bar.size = size;
  g->bar.aborted = aborted;
  g->in = calloc((size_t)size, sizeof *g->in);
  g->out = calloc((size_t)size, sizeof *g->out);
}

static void group_free(Group *g) {
  pthread_mutex_destroy(&g->bar.mu);
  pthread_cond_destroy(&g->bar.cv);
  free(g->in);
  free(g->out);
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
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  float *acc = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (!acc) return 1;
  g->in[me] = buf;
  int rc = bar_wait(&g->bar);
  if (!rc) {
    memcpy(acc, g->in[0], sizeof(float) * (size_t)n);
    for (int r = 1; r < size; r++) {
      const float *x = g->in[r];
      if (max)
        for (int64_t k = 0; k < n; k++) acc[k] = x[k] > acc[k] ? x[k] : acc[k];
      else
        for (int64_t k = 0; k < n; k++) acc[k] += x[k];
    }
    rc = bar_wait(&g->bar);   /* everyone has read every input */
  }
  if (!rc) memcpy(buf, acc, sizeof(float) * (size_t)n);
  free(acc);
  return rc;
}

static int all_gather(Comm *c, int axis, const float *in, float *out, int64_t n) {
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  g->in[me] = in;
  int rc = bar_wait(&g->bar);
  for (int r = 0; r < size && !rc; r++) memcpy(out + (int64_t)r * n, g->in[r], sizeof(float) * (size_t)n);
  if (!rc) rc = bar_wait(&g->bar);
  return rc;
}

static int reduce_scatter(Comm *c, int axis, const float *in, float *out, int64_t n_out) {
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  g->in[me] = in;
  int rc = bar_wait(&g->bar);
  if (!rc) {
    memcpy(out, g->in[0] + (int64_t)me * n_out, sizeof(float) * (size_t)n_out);
    for (int r = 1; r < size; r++) {
      const float *x = g->in[r] + (int64_t)me * n_out;
      for (int64_t k = 0; k < n_out; k++) out[k] += x[k];
    }
    rc = bar_wait(&g->bar);
  }
  return rc;
}

static int all_to_all(Comm *c, int axis, const float *in, float *out, int64_t n_chunk) {
  Group *g = group_of(c, axis);
  int size = (int)c->mesh[axis], me = c->coord[axis];
  g->in[me] = in;
  int rc = bar_wait(&g->bar);
  for (int r = 0; r < size && !rc; r++)   /* chunk `me` of rank r's input */
    memcpy(out + (int64_t)r * n_chunk, g->in[r] + (int64_t)me * n_chunk, sizeof(float) * (size_t)n_chunk);
  if (!rc) rc = bar_wait(&g->bar);
  return rc;
}

static int barrier(Comm *c) { return bar_wait(&((LocalWorld *)c->impl)->all.bar); }

static int peer_rank(Comm *c, int axis, int peer) {
  int coord[COMM_AXES];
  memcpy(coord, c->coord, sizeof coord);
  coord[axis] = peer;
  return mesh_rank_of(c->mesh, coord);
}

static int p2p_send(Comm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n) {
  LocalWorld *w = c->impl;
  if (peer < 0 || peer >= c->mesh[axis] || atomic_load(&w->aborted)) return 1;
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
  if (peer < 0 || peer >= c->mesh[axis]) return 1;
  int from = peer_rank(c, axis, peer);
  Mailbox *b = &w->boxes[c->rank];
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
    pthread_cond_wait(&b->cv, &b->mu);
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
  pthread_mutex_init(&w->abort_mu, NULL);
  for (int a = 0; a < COMM_AXES; a++) {
    w->n_groups[a] = w->world / (int)mesh[a];
    w->groups[a] = calloc((size_t)w->n_groups[a], sizeof(Group));
    for (int i = 0; i < w->n_groups[a]; i++) group_init(&w->groups[a][i], (int)mesh[a], &w->aborted);
  }
  group_init(&w->all, w->world, &w->aborted);
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
  free(w->ranks);
  free(w);
}
