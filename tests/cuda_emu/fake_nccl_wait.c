/* tests/cuda_emu/fake_nccl_wait.c — the NCCL double's waiting (fake_nccl.c's top comment says
 * what it is for): the errors a wait ends in ((a) to (c) there) and how they are recorded,
 * strict mode's published waits and deadlock detection, and the barrier the collectives and
 * splits meet at.  fake_nccl.c holds the communicators, collectives and send/recv that wait
 * here.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_nccl_internal.h"

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
/* The last error without a communicator is process-wide (under g_mu), not thread-local: see
   fake_nccl.c on thread-local state in this dlopened library. */
char g_last[MSG_LEN];

static const char *const fn_name[] = {"a collective", "ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                      "ncclCommSplit"};

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void sleep_ns(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* Records an error (sticky: the communicator's state, first one wins) and returns its code. */
ncclResult_t note(ncclComm_t c, ncclResult_t r, int sticky, const char *fmt, ...) {
  char msg[MSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c && sticky) {
    int z = 0;
    if (!atomic_compare_exchange_strong(&c->err, &z, (int)r)) return (ncclResult_t)z;
  }
  if (c) snprintf(c->last, sizeof c->last, "%s", msg);
  pthread_mutex_lock(&g_mu);
  snprintf(g_last, sizeof g_last, "%s", msg);
  pthread_mutex_unlock(&g_mu);
  fprintf(stderr, "fake_nccl: %s\n", msg);
  return r;
}

/* ------------------------------------------------------------ waiting */

void wait_init(Wait *w) {
  const char *e = getenv("LOOM_FAKE_NCCL_MAX_WAIT");
  w->t0 = now_s();
  w->next_peer = w->t0 + 0.1;
  w->max = e && *e && atof(e) > 0 ? atof(e) : 900;
  w->ns = 1000;
}

int due(Wait *w) {
  double t = now_s();
  if (t < w->next_peer) return 0;
  w->next_peer = t + 0.1;
  return 1;
}

void backoff(Wait *w) {
  sleep_ns(w->ns);
  if (w->ns < 1000000) w->ns *= 2;
}

static int alive(pid_t pid) {
  if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  char *p = strrchr(buf, ')');   /* "pid (comm) S ...": a zombie has exited */
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* ------------------------------------------------------------ strict mode: what holds a wait */
static Hdr *root_hdr(ncclComm_t c) { return (Hdr *)c->root->base; }

/* Publishes this rank's wait: kind (B_NONE: none), on cpeer (this communicator's rank); enter:
   a new call begins (after its receives are posted or its barrier joined). */
void blk_put(ncclComm_t c, int enter, int kind, int fn, int cpeer, uint64_t k, uint64_t tail) {
  Blk *b = &root_hdr(c)->blk[c->root_rank];
  atomic_fetch_add(&b->ver, 1);
  if (enter) atomic_fetch_add(&b->call, 1);
  atomic_store(&b->kind, kind);
  if (kind) {
    atomic_store(&b->peer, atomic_load(&c->hdr->root_of[cpeer]));
    atomic_store(&b->fn, fn);
    atomic_store(&b->split, c->seg != c->root);
    atomic_store(&b->k, k);
    atomic_store(&b->tail, tail);
    atomic_fetch_add(&b->chk, 1);
  }
  atomic_fetch_add(&b->ver, 1);
}

static int blk_get(Hdr *root, int node, Rec *x) {
  Blk *b = &root->blk[node];
  for (int tries = 0; tries < 100; tries++) {
    uint64_t v = atomic_load(&b->ver);
    x->call = atomic_load(&b->call);
    x->chk = atomic_load(&b->chk);
    x->k = atomic_load(&b->k);
    x->tail = atomic_load(&b->tail);
    x->kind = atomic_load(&b->kind);
    x->peer = atomic_load(&b->peer);
    x->fn = atomic_load(&b->fn);
    x->split = atomic_load(&b->split);
    x->node = node;
    if (!(v & 1) && atomic_load(&b->ver) == v) return 1;
  }
  return 0;   /* being written all along: look again later */
}

static void describe(char *s, size_t n, const Rec *x, int first) {
  unsigned long long k = (unsigned long long)x->k + 1;
  int a = x->node, b = x->peer;
  const char *f = fn_name[(unsigned)x->fn < sizeof fn_name / sizeof *fn_name ? x->fn : 0];
  if (x->kind == B_SEND)
    snprintf(s, n, first ? "rank %d's send #%llu to %d waits for a receive %d has not posted"
                         : "%d is blocked in its send #%llu to %d, a receive %d has not posted", a, k, b, b);
  else if (x->kind == B_RECV)
    snprintf(s, n, first ? "rank %d's receive #%llu from %d waits for data %d has not sent"
                         : "%d is blocked in its receive #%llu from %d, data %d has not sent", a, k, b, b);
  else if (first) snprintf(s, n, "rank %d's %s waits for %d, which has not joined it", a, f, b);
  else snprintf(s, n, "%d is blocked in %s, which %d has not joined", a, f, b);
}

/* The waits from rank `from` on, one a rank until one repeats: from the records now (snap
   NULL) or from a look's. */
static void path_msg(Hdr *root, int from, const Rec *snap, char *msg, size_t n) {
  int seen[MAX_RANKS] = {0}, split = 0;
  size_t len = 0;
  msg[0] = 0;
  for (int u = from; u >= 0 && u < root->nranks && !seen[u];) {
    Rec x;
    if (snap) x = snap[u];
    else if (!blk_get(root, u, &x)) break;
    if (!x.kind) break;
    if (len && len + 2 < n) memcpy(msg + len, "; ", 3), len += 2;
    describe(msg + len, n - len, &x, u == from);
    len += strlen(msg + len);
    split |= x.split;
    seen[u] = 1;
    u = x.peer;
  }
  if (split) snprintf(msg + len, n - len, " (world ranks)");
}

/* Strict mode, while this rank is blocked: ncclSystemError if a look (any rank's) found it in
   a deadlock, else every 100 ms (look) a look at every rank's wait.  Look 1 notes them; looks
   2 and 3 keep the ranks found in the same call with the same wait, look 3 those that
   re-confirmed theirs after look 2.  Then at the end of look 1 each kept rank was in its call
   and (the counters only grow) its wait unresolved, and only a rank outside its call resolves
   one: the kept ranks whose waits lead to a cycle of kept ranks wait for ever.  (A receive's
   wait counts only towards a rank in a collective, which sends no data.) */
ncclResult_t detect(ncclComm_t c, Det *d, int look) {
  Hdr *root = root_hdr(c);
  Blk *me = &root->blk[c->root_rank];
  char msg[MSG_LEN - 16];
  if (atomic_load(&me->dead) == atomic_load(&me->call)) {
    path_msg(root, c->root_rank, NULL, msg, sizeof msg);
    return note(c, ncclSystemError, 1, "deadlock: %s", msg);
  }
  if (!look) return ncclSuccess;
  int n = root->nranks, walk[MAX_RANKS];
  for (int q = 0; q < n; q++) {
    Rec x, *p = &d->p[q];
    int ok = blk_get(root, q, &x) && x.kind;
    if (!d->look) *p = x;
    if (!ok || x.call != p->call || x.kind != p->kind || x.peer != p->peer || x.k != p->k || x.tail != p->tail ||
        (d->look == 2 && x.chk <= p->chk2))
      p->kind = B_NONE;
    p->chk2 = x.chk;
  }
  if (d->look++ < 2) return ncclSuccess;
  d->look = 0;
  signed char st[MAX_RANKS] = {0};   /* 1: on this walk; 2: deadlocked; 3: not */
  for (int q = 0; q < n; q++) {
    int m = 0, u = q, verdict = 3;
    for (;;) {
      if (st[u]) {
        verdict = st[u] == 1 ? 2 : st[u];
        break;
      }
      if (!d->p[u].kind) break;
      st[u] = 1;
      walk[m++] = u;
      int v = d->p[u].peer;
      if (v < 0 || v >= n || (d->p[u].kind == B_RECV && d->p[v].kind != B_COLL)) break;
      u = v;
    }
    for (int j = 0; j < m; j++) st[walk[j]] = (signed char)verdict;
  }
  for (int q = 0; q < n; q++)   /* each one reports it at its next poll */
    if (st[q] == 2) atomic_store(&root->blk[q].dead, d->p[q].call);
  if (st[c->root_rank] != 2) return ncclSuccess;
  path_msg(root, c->root_rank, d->p, msg, sizeof msg);
  return note(c, ncclSystemError, 1, "deadlock: %s", msg);
}

/* The reasons to stop waiting; the caller is inside the communicator (busy). */
ncclResult_t checks(ncclComm_t c, Wait *w, int peers) {
  int e = atomic_load(&c->err);
  if (e) return (ncclResult_t)e;
  int a = atomic_load(&((Hdr *)c->root->base)->aborted);
  if (!a && atomic_load(&c->dead)) return note(c, ncclInvalidUsage, 1, "communicator destroyed while in use");
  for (int p = 0; (peers || a) && p < c->nranks; p++) {   /* on an abort too: a dead peer is its likely cause */
    pid_t pid = atomic_load(&c->hdr->pid[p]);
    if (p != c->rank && pid > 0 && pid != getpid() && !alive(pid))
      return note(c, ncclRemoteError, 1, "rank %d (pid %d) exited", p, (int)pid);
  }
  if (a) return note(c, ncclRemoteError, 1, "aborted by rank %d (communicator %s)", a - 1, c->name + 1);
  if (now_s() - w->t0 > w->max) {
    char why[MSG_LEN - 96] = "";
    Rec x;
    if (c->strict && blk_get(root_hdr(c), c->root_rank, &x) && x.kind) {
      why[0] = ':', why[1] = ' ';
      describe(why + 2, sizeof why - 2, &x, 1);
    }
    return note(c, ncclSystemError, 1, "waited %g s for the other ranks (LOOM_FAKE_NCCL_MAX_WAIT)%s", w->max, why);
  }
  return ncclSuccess;
}

ncclResult_t enter(ncclComm_t c) {
  if (!c) return note(NULL, ncclInvalidArgument, 0, "NULL communicator");
  atomic_fetch_add(&c->busy, 1);
  int e = atomic_load(&c->err);
  if (!e && atomic_load(&c->dead)) e = ncclInvalidUsage;   /* destroyed: the caller's bug */
  if (!e && atomic_load(&((Hdr *)c->root->base)->aborted)) {
    Wait w;
    wait_init(&w);
    e = checks(c, &w, 0);
  }
  if (e) atomic_fetch_sub(&c->busy, 1);
  return (ncclResult_t)e;
}

void leave(ncclComm_t c) { atomic_fetch_sub(&c->busy, 1); }

/* fn: an index of fn_name (strict mode's reports) */
ncclResult_t barrier(ncclComm_t c, int fn) {
  Hdr *h = c->hdr;
  uint32_t g = atomic_load(&h->bar_gen);
  atomic_store(&h->arrived[c->rank], g + 1);
  if (atomic_fetch_add(&h->bar_count, 1) + 1 == (uint32_t)c->nranks) {
    atomic_store(&h->bar_count, 0);
    atomic_fetch_add(&h->bar_gen, 1);
    return ncclSuccess;
  }
  Wait w;
  wait_init(&w);
  Det det;   /* (look 1 fills p) */
  det.look = 0;
  ncclResult_t r = ncclSuccess, dl = ncclSuccess;
  if (c->strict) blk_put(c, 1, B_NONE, 0, 0, 0, 0);
  while (!r && atomic_load(&h->bar_gen) == g) {
    if (c->strict) {   /* waits for the first rank that has not joined */
      int q = 0;
      while (q < c->nranks && (int32_t)(atomic_load(&h->arrived[q]) - (g + 1)) >= 0) q++;
      blk_put(c, 0, q < c->nranks ? B_COLL : B_NONE, fn, q < c->nranks ? q : 0, g, 0);
    }
    int peers = due(&w);
    if (!(r = checks(c, &w, peers)) && c->strict) dl = r = detect(c, &det, peers);
    if (!r) backoff(&w);
  }
  if (c->strict && !dl) blk_put(c, 0, B_NONE, 0, 0, 0, 0);   /* (a deadlock's stays, for the others' reports) */
  return r;
}
