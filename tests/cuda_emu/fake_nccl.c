/* tests/cuda_emu/fake_nccl.c — a test double of NCCL (libnccl.so.2) for the emulated device.
 *
 * `loom` loads it through LOOM_LIBNCCL.  Every rank is a process (or a thread) with its own
 * fake_cuda, whose device memory is host memory: a buffer here is a host address, and every
 * call completes before it returns (the stream is ignored; fake streams are synchronous).
 * Version 2.28.0; ncclInProgress is never returned, whatever the config's `blocking`.
 *
 * Ranks meet in one POSIX shared-memory segment per communicator, named "/" + the unique id
 * ("loomfake-PID-N-RANDOM", or "loomfake-env-ADDR" when NCCL_COMM_ID is set) or, for a split,
 * the parent's name + ".SPLIT.COLOR".  Segment layout (sizes shrink with nranks: about 4 MiB
 * a segment, reserved with posix_fallocate at init, so a full /dev/shm is an init error and
 * not a SIGBUS later):
 *   Hdr                     magic, nranks, attached count, barrier count and generation,
 *                           abort flag, the pid of every rank, the split posts
 *   RingHdr[n*n]            bytes written/read of the pipe sender -> receiver
 *   data[n][data_bytes]     each rank's staging area for collectives
 *   ring[n*n][ring_bytes]   the send/recv pipes (FIFO byte streams)
 * Init: O_CREAT|O_EXCL picks the creator, which sizes the segment, fills the header and then
 * publishes the magic; every rank claims its pid slot, counts itself in and waits for all,
 * then unlinks the name, so nothing is left in /dev/shm even if a rank crashes later.
 *
 * Collectives go chunk by chunk: each rank copies its input into its area, barrier (a
 * counter and a generation in the header), each rank computes its own output from all the
 * areas, barrier.  Reductions run in rank order 0..n-1 on every rank (bf16 and fp16 in
 * float, rounded once to nearest even), so all ranks get the same bits.  Send/recv stream
 * through the pipe of the pair (a send waits while it is full); a group's sends and receives
 * are queued and moved piece by piece, whichever can move, until all are done, so an
 * all-to-all cannot deadlock.  A collective inside a group runs at once.
 *
 * Waiting polls with a sleep of 1 us doubling up to 1 ms and gives up when
 *   (a) a communicator of the family (a world communicator and every split made from it)
 *       was aborted: ncclCommAbort sets the flag in the root segment -> ncclRemoteError
 *       "aborted by rank N" (N: the rank in the root communicator);
 *   (b) a peer process is gone (kill(pid, 0), or a zombie; checked every 100 ms, and at once
 *       on an abort, its likely cause; a rank that aborted or destroyed the communicator has
 *       left it and is not reported) -> ncclRemoteError "rank N (pid P) exited";
 *   (c) it waited LOOM_FAKE_NCCL_MAX_WAIT seconds (default 900) -> ncclSystemError.
 * These errors are sticky (ncclCommGetAsyncError).  ncclCommAbort may run on another thread
 * while one waits on the communicator: it sets the flag, waits for the waiter to leave,
 * unmaps, and keeps the small struct on a list, so a late call (or ncclCommDestroy) on an
 * aborted communicator gets an error and not a use after free.  At most MAX_RANKS (64) ranks
 * a communicator.
 *
 * Strict mode (LOOM_FAKE_NCCL_STRICT=1, read at init): sends are not buffered.  As on NCCL, a
 * send completes only once its peer has posted the matching receive (the k-th send from A to
 * B pairs with B's k-th receive from A on a communicator, zero-byte messages included), so a
 * program whose point-to-point groups are unbalanced deadlocks here as it would on GPUs.
 * A group (or a lone call) first posts its receives (RingHdr.posted; the size beside it, in
 * a slot), then moves its sends and receives together as above, a send once its receive is
 * posted; a send whose size differs from its receive's is ncclInvalidUsage.  A blocked rank
 * publishes what it waits for in the root segment (Blk, one a rank of the family: its send
 * #k to B waits for B's receive; its receive #k from B for B's data; its collective for B,
 * the first rank that has not joined) and every 100 ms looks at every rank's: the ranks whose
 * waits stay the same over three looks (each re-confirmed in between) and lead to a cycle of
 * such ranks are deadlocked for certain (see detect), and each reports ncclSystemError
 * "deadlock: rank A's send #k to B waits for a receive B has not posted; B is blocked in ...",
 * about 0.3 s into the wait.  Other waits run into (a) to (c), the MAX_WAIT message naming
 * what the rank waits for.  Ranks there are the world's (the root's), message numbers the
 * communicator's, from 1.  One thread a rank calls NCCL (others only abort), as in loom.
 * (Over 1000 lines with strict mode: it shares the pipes, waits and group runner, so it stays
 * in this file rather than in a second double of NCCL.)
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x4e43434cu   /* "NCCL" */
#define MAX_RANKS 64
#define SEG_BUDGET (2u << 20) /* bytes of staging areas, and again of pipes, a segment */
#define NAME_LEN 160
#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-"
#define SLOTS 13          /* strict mode: the sizes of a pipe's last receives posted */
#define MSG_LEN 512

enum { B_NONE, B_SEND, B_RECV, B_COLL };   /* strict mode: what a blocked rank waits for */
static const char *const fn_name[] = {"a collective", "ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                      "ncclCommSplit"};

typedef struct {   /* strict mode: a rank's wait, written by that rank alone (ver: a seqlock) */
  _Atomic uint64_t ver, call, chk, k, tail;   /* call: calls entered; chk: confirmations */
  _Atomic uint64_t dead;                      /* the call a deadlock was found in (by any rank's look) */
  _Atomic int32_t kind, peer, fn, split;      /* peer: the root rank waited for */
} Blk;

typedef struct {
  _Atomic uint32_t magic;
  int32_t nranks;
  _Atomic int32_t attached;
  _Atomic int32_t aborted;   /* root segment: 0, or 1 + the root rank of an abort in the family */
  _Atomic uint32_t bar_count, bar_gen;
  _Atomic int32_t pid[MAX_RANKS];
  int32_t color[MAX_RANKS], key[MAX_RANKS];
  _Atomic uint32_t arrived[MAX_RANKS];   /* 1 + the barrier generation each rank last joined */
  _Atomic int32_t root_of[MAX_RANKS];    /* each rank's rank in the family's root */
  Blk blk[MAX_RANKS];                    /* root segment, strict mode: every rank's wait */
} Hdr;

typedef struct {
  _Atomic uint64_t head, tail;   /* bytes written by the sender, read by the receiver */
  _Atomic uint64_t posted;       /* receives posted by the receiver */
  _Atomic uint64_t size[SLOTS];  /* receive k's (k mod 2^24) << 40 | bytes, in slot k % SLOTS */
} RingHdr;

typedef struct {
  void *base;
  size_t len;
  _Atomic int refs;
} Map;

struct ncclComm {
  struct ncclComm *next;   /* on the list of aborted communicators */
  Map *seg, *root;         /* this one's segment; the family's root segment (the abort flag) */
  Hdr *hdr;
  RingHdr *rings;
  char *data, *ringdata;
  size_t data_bytes, ring_bytes;
  int rank, nranks, root_rank, blocking, strict;
  unsigned splits;
  uint64_t nsend[MAX_RANKS], nrecv[MAX_RANKS];   /* messages issued to / receives posted from each peer */
  _Atomic int dead, busy, err;   /* dead: aborted or destroyed; busy: calls inside; err: sticky */
  char name[NAME_LEN];
  char last[MSG_LEN];
};

typedef struct Op {
  ncclComm_t c;
  char *buf;
  size_t bytes, done;
  uint64_t k;        /* the message's number on its pipe */
  int peer, send, open;   /* open: may move (a strict send: once its receive is posted) */
  struct Op *prev;   /* the op before this one on the same pipe: this one waits for it */
} Op;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *aborted_list;
static _Atomic unsigned id_counter;
/* Thread-local state is initial-exec (static TLS, no __tls_get_addr) and small: this library is
   dlopened, and GCC 12's LeakSanitizer crashed at exit scanning the dynamic TLS of a dlopened
   library ("Tracer caught signal 11", DTLS of a bogus address).  The last error without a
   communicator is process-wide for the same reason (under g_mu). */
static char g_last[MSG_LEN];
static __thread __attribute__((tls_model("initial-exec"))) struct {
  int depth, n, cap;
  ncclResult_t err;
  Op *ops;
} grp;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_ns(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* Records an error (sticky: the communicator's state, first one wins) and returns its code. */
static ncclResult_t note(ncclComm_t c, ncclResult_t r, int sticky, const char *fmt, ...) {
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

static void map_release(Map *m) {
  if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
    munmap(m->base, m->len);
    free(m);
  }
}

/* ------------------------------------------------------------ waiting */
typedef struct {
  double t0, next_peer, max;
  long ns;
} Wait;

static void wait_init(Wait *w) {
  const char *e = getenv("LOOM_FAKE_NCCL_MAX_WAIT");
  w->t0 = now_s();
  w->next_peer = w->t0 + 0.1;
  w->max = e && *e && atof(e) > 0 ? atof(e) : 900;
  w->ns = 1000;
}

static int due(Wait *w) {
  double t = now_s();
  if (t < w->next_peer) return 0;
  w->next_peer = t + 0.1;
  return 1;
}

static void backoff(Wait *w) {
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
typedef struct {
  uint64_t call, chk, k, tail, chk2;
  int node, kind, peer, fn, split;
} Rec;

typedef struct {   /* a blocked rank's looks at every rank's wait: 0, 1, 2 done */
  int look;
  Rec p[MAX_RANKS];   /* by root rank; kind 0: not blocked, or its wait changed */
} Det;

static Hdr *root_hdr(ncclComm_t c) { return (Hdr *)c->root->base; }

/* Publishes this rank's wait: kind (B_NONE: none), on cpeer (this communicator's rank); enter:
   a new call begins (after its receives are posted or its barrier joined). */
static void blk_put(ncclComm_t c, int enter, int kind, int fn, int cpeer, uint64_t k, uint64_t tail) {
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
static ncclResult_t detect(ncclComm_t c, Det *d, int look) {
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
static ncclResult_t checks(ncclComm_t c, Wait *w, int peers) {
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

static ncclResult_t enter(ncclComm_t c) {
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

static void leave(ncclComm_t c) { atomic_fetch_sub(&c->busy, 1); }

/* fn: an index of fn_name (strict mode's reports) */
static ncclResult_t barrier(ncclComm_t c, int fn) {
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

/* ------------------------------------------------------------ communicators */
static void layout(int n, size_t *data, size_t *ring, size_t *rings_off, size_t *total) {
  size_t d = SEG_BUDGET / (size_t)n, r = SEG_BUDGET / ((size_t)n * (size_t)n);
  *data = d < 65536 ? 65536 : d & ~(size_t)63;
  *ring = r < 4096 ? 4096 : r & ~(size_t)63;
  *rings_off = (sizeof(Hdr) + 63) & ~(size_t)63;
  size_t hdrs = (*rings_off + (size_t)n * (size_t)n * sizeof(RingHdr) + 4095) & ~(size_t)4095;
  *total = hdrs + (size_t)n * *data + (size_t)n * (size_t)n * *ring;
}

static void comm_free(ncclComm_t c) {
  map_release(c->seg);
  map_release(c->root);
  free(c);
}

/* Attaches rank `rank` of `nranks` to the segment `name` (creating it if absent) and waits
   for all; root: the family's root segment (NULL: this one is a root). */
static ncclResult_t comm_open(ncclComm_t *out, const char *name, int nranks, int rank, Map *root, int root_rank,
                              int blocking) {
  *out = NULL;
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
    return note(NULL, ncclInvalidArgument, 0, "rank %d of %d ranks (this fake takes 1 to %d ranks)", rank, nranks,
                MAX_RANKS);
  size_t dbytes, rbytes, roff, total;
  layout(nranks, &dbytes, &rbytes, &roff, &total);
  Wait w;
  wait_init(&w);
  int fd, creator = 0;
  for (;;) {
    if ((fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600)) >= 0) {
      creator = 1;
      break;
    }
    if (errno != EEXIST) return note(NULL, ncclSystemError, 0, "shm_open %s: %s", name, strerror(errno));
    if ((fd = shm_open(name, O_RDWR, 0600)) >= 0) break;
    if (errno != ENOENT) return note(NULL, ncclSystemError, 0, "shm_open %s: %s", name, strerror(errno));
    if (now_s() - w.t0 > w.max) return note(NULL, ncclSystemError, 0, "shm_open %s keeps vanishing", name);
  }
  struct stat st = {0};
  int e = 0;
  if (creator) {
    if (ftruncate(fd, (off_t)total)) e = errno;
    else e = posix_fallocate(fd, 0, (off_t)total);
  } else {
    while (!fstat(fd, &st) && st.st_size == 0 && now_s() - w.t0 < w.max) sleep_ns(100000);
    if ((size_t)st.st_size != total) e = -1;
  }
  void *base = e ? MAP_FAILED : mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!e && base == MAP_FAILED) e = errno;
  close(fd);
  if (e) {
    if (creator) shm_unlink(name);
    if (e < 0)
      return note(NULL, ncclInvalidArgument, 0, "%s: the ranks disagree on the number of ranks (%d here)", name, nranks);
    return note(NULL, ncclSystemError, 0, "cannot make %s of %zu bytes: %s (is /dev/shm full?)", name, total,
                strerror(e));
  }
  Hdr *h = base;
  if (creator) {
    h->nranks = nranks;
    atomic_store(&h->magic, MAGIC);
  }
  while (atomic_load(&h->magic) != MAGIC && now_s() - w.t0 < w.max) sleep_ns(100000);
  int32_t z = 0;
  const char *bad = atomic_load(&h->magic) != MAGIC ? "was never initialized"
                    : h->nranks != nranks                   ? "has another number of ranks"
                    : !atomic_compare_exchange_strong(&h->pid[rank], &z, (int32_t)getpid())
                        ? "has this rank already (a rank joined twice, or a stale segment in /dev/shm?)"
                        : NULL;
  ncclComm_t c = bad ? NULL : calloc(1, sizeof *c);
  Map *m = c ? calloc(1, sizeof *m) : NULL;
  if (!m) {
    munmap(base, total);
    free(c);
    return bad ? note(NULL, ncclInvalidUsage, 0, "rank %d: %s %s", rank, name, bad)
               : note(NULL, ncclSystemError, 0, "out of memory");
  }
  atomic_store(&h->root_of[rank], root ? root_rank : rank);
  atomic_fetch_add(&h->attached, 1);
  m->base = base;
  m->len = total;
  atomic_init(&m->refs, root ? 1 : 2);
  if (root) atomic_fetch_add(&root->refs, 1);
  c->seg = m;
  c->root = root ? root : m;
  c->hdr = h;
  c->rings = (RingHdr *)((char *)base + roff);
  c->ringdata = (char *)base + total - (size_t)nranks * (size_t)nranks * rbytes;
  c->data = c->ringdata - (size_t)nranks * dbytes;
  c->data_bytes = dbytes;
  c->ring_bytes = rbytes;
  c->rank = rank;
  c->nranks = nranks;
  c->root_rank = root ? root_rank : rank;
  c->blocking = blocking;
  const char *strict = getenv("LOOM_FAKE_NCCL_STRICT");
  c->strict = strict && *strict && strcmp(strict, "0");
  snprintf(c->name, sizeof c->name, "%s", name);
  atomic_init(&c->busy, 1);
  ncclResult_t r = ncclSuccess;
  while (atomic_load(&h->attached) < nranks && !(r = checks(c, &w, due(&w)))) backoff(&w);
  shm_unlink(name);   /* everyone attached (or this init failed): the name is not needed any more */
  if (r) {
    comm_free(c);
    return r;
  }
  atomic_store(&c->busy, 0);
  *out = c;
  return ncclSuccess;
}

static int id_name(const ncclUniqueId *id, char name[NAME_LEN]) {
  const char *s = id->internal;
  size_t n = strnlen(s, sizeof id->internal);
  if (n == sizeof id->internal || strncmp(s, "loomfake-", 9)) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr(NAME_CHARS "_", s[i])) return 0;
  snprintf(name, NAME_LEN, "/%s", s);
  return 1;
}

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return note(NULL, ncclInvalidArgument, 0, "ncclGetVersion: NULL");
  *version = 22800;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return note(NULL, ncclInvalidArgument, 0, "ncclGetUniqueId: NULL");
  memset(id, 0, sizeof *id);
  const char *env = getenv("NCCL_COMM_ID");
  if (env && *env) {   /* every rank makes the same id from the same address */
    int n = snprintf(id->internal, 100, "loomfake-env-%s", env);
    for (int i = 13; i < n && i < 99; i++)
      if (!strchr(NAME_CHARS, id->internal[i])) id->internal[i] = '_';
    return ncclSuccess;
  }
  unsigned rnd = 0;
  if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (unsigned)(now_s() * 1e9);
  snprintf(id->internal, sizeof id->internal, "loomfake-%d-%u-%08x", (int)getpid(), atomic_fetch_add(&id_counter, 1),
           rnd);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  char name[NAME_LEN];
  if (!comm) return note(NULL, ncclInvalidArgument, 0, "ncclCommInitRankConfig: NULL communicator pointer");
  *comm = NULL;
  if (!id_name(&id, name))
    return note(NULL, ncclInvalidArgument, 0, "the unique id was not made by this fake's ncclGetUniqueId");
  return comm_open(comm, name, nranks, rank, NULL, rank, config ? config->blocking : 1);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  if (!newcomm) return note(c, ncclInvalidArgument, 0, "ncclCommSplit: NULL newcomm");
  *newcomm = NULL;
  ncclResult_t r = enter(c);
  if (r) return r;
  Hdr *h = c->hdr;
  if (color < 0) color = NCCL_SPLIT_NOCOLOR;
  h->color[c->rank] = color;
  h->key[c->rank] = key;
  int n = 0, me = 0;
  if (!(r = barrier(c, 4)))
    for (int q = 0; q < c->nranks && color >= 0; q++)
      if (h->color[q] == color) {
        n++;
        me += h->key[q] < key || (h->key[q] == key && q < c->rank);
      }
  if (!r) r = barrier(c, 4);   /* the posts may be overwritten by the next split from here on */
  unsigned idx = c->splits++;
  if (!r && color >= 0) {
    char tmp[NAME_LEN + 32], name[NAME_LEN];
    snprintf(tmp, sizeof tmp, "%s.%u.%d", c->name, idx, color);
    if (strlen(tmp) < NAME_LEN) {
      memcpy(name, tmp, strlen(tmp) + 1);
    } else {   /* deep splits: fold the name */
      uint64_t x = 1469598103934665603ull;
      for (const char *s = tmp; *s; s++) x = (x ^ (unsigned char)*s) * 1099511628211ull;
      snprintf(name, sizeof name, "/loomfake-h%016llx", (unsigned long long)x);
    }
    r = comm_open(newcomm, name, n, me, c->root, c->root_rank, config ? config->blocking : c->blocking);
  }
  leave(c);
  return r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
  if (!c || !st) return note(NULL, ncclInvalidArgument, 0, "ncclCommGetAsyncError: NULL");
  ncclResult_t e = enter(c);
  if (!e) leave(c);
  *st = e;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (!c || !count) return note(NULL, ncclInvalidArgument, 0, "ncclCommCount: NULL");
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (!c || !rank) return note(NULL, ncclInvalidArgument, 0, "ncclCommUserRank: NULL");
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
  ncclResult_t r = enter(c);
  if (!r) leave(c);
  return r;
}

/* Marks the communicator dead and waits until no call is inside it; 0 if it was dead already. */
static int kill_comm(ncclComm_t c) {
  atomic_fetch_add(&c->busy, 1);
  if (atomic_exchange(&c->dead, 1)) {
    atomic_fetch_sub(&c->busy, 1);
    return 0;
  }
  atomic_fetch_sub(&c->busy, 1);
  while (atomic_load(&c->busy) > 0) sleep_ns(100000);
  return 1;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  /* The flag first, while the segment is surely mapped (a concurrent abort waits in kill_comm). */
  atomic_fetch_add(&c->busy, 1);
  if (!atomic_load(&c->dead)) {
    int z = 0;
    atomic_compare_exchange_strong(&((Hdr *)c->root->base)->aborted, &z, c->root_rank + 1);
    int a = z ? z : c->root_rank + 1, none = 0;
    if (!atomic_load(&c->err)) {   /* the message before the code: a waiter may return at once */
      snprintf(c->last, sizeof c->last, "aborted by rank %d (communicator %s)", a - 1, c->name + 1);
      atomic_compare_exchange_strong(&c->err, &none, ncclRemoteError);
    }
  }
  atomic_fetch_sub(&c->busy, 1);
  if (!kill_comm(c)) return ncclSuccess;
  atomic_store(&c->hdr->pid[c->rank], 0);   /* left: not to be reported dead when it exits */
  map_release(c->seg);
  map_release(c->root);
  c->seg = c->root = NULL;
  pthread_mutex_lock(&g_mu);   /* kept (reachable), so late calls find it dead */
  c->next = aborted_list;
  aborted_list = c;
  pthread_mutex_unlock(&g_mu);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  if (!kill_comm(c)) return note(c, ncclInvalidUsage, 0, "ncclCommDestroy of an aborted or destroyed communicator");
  atomic_store(&c->hdr->pid[c->rank], 0);
  comm_free(c);
  return ncclSuccess;
}

/* ------------------------------------------------------------ collectives */
static size_t dt_size(ncclDataType_t dt) {
  switch (dt) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  default: return 0;
  }
}

static int can_reduce(ncclDataType_t dt, ncclRedOp_t op) {
  int fl = dt == ncclFloat32 || dt == ncclFloat64 || dt == ncclBfloat16 || dt == ncclFloat16;
  if (dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2) return 0;
  return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin || (op == ncclAvg && fl);
}

static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f2bf(float f) {   /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static float h2f(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, u = s;
  if (!e && m) return (s ? -1.0f : 1.0f) * (float)m * 0x1p-24f;   /* subnormal */
  if (e == 0x1f) u = s | 0x7f800000u | m << 13;
  else if (e) u = s | (e + 112) << 23 | m << 13;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f2h(float f) {   /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t s = (uint16_t)((u >> 16) & 0x8000);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return s | 0x7e00;
  if (u >= 0x477ff000u) return s | 0x7c00;   /* 65520 and up: infinity */
  if (u >= 0x38800000u) return s | (uint16_t)((u + 0xfffu + ((u >> 13) & 1) - 0x38000000u) >> 13);
  float a;   /* below 2^-14: a subnormal, a multiple of 2^-24 */
  memcpy(&a, &u, 4);
  a *= 0x1p24f;
  uint32_t q = (uint32_t)a;
  float fr = a - (float)q;
  return s | (uint16_t)(q + (fr > 0.5f || (fr == 0.5f && (q & 1))));
}

#define ID(x) (x)
#define RED_LOOP(T, A, LOAD, STORE)                                                                     \
  for (size_t i = 0; i < n; i++) {                                                                      \
    A acc = (A)LOAD(((const T *)src[0])[i]);                                                            \
    for (int p = 1; p < np; p++) {                                                                      \
      A v = (A)LOAD(((const T *)src[p])[i]);                                                            \
      acc = op == ncclSum || op == ncclAvg ? (A)(acc + v) : op == ncclProd ? (A)(acc * v)              \
            : op == ncclMax                ? (v > acc ? v : acc)                                      \
                                           : (v < acc ? v : acc);                                     \
    }                                                                                                   \
    if (op == ncclAvg) acc = (A)(acc / (A)np);                                                          \
    ((T *)out)[i] = (T)STORE(acc);                                                                      \
  }
/* integers: sums and products wrap (in the unsigned type), comparisons are signed */
#define RED_INT(T, U)                                                                                   \
  if (op == ncclMax || op == ncclMin) {                                                                 \
    RED_LOOP(T, T, ID, ID)                                                                              \
  } else {                                                                                              \
    RED_LOOP(T, U, (U), ID)                                                                             \
  }

/* out[i] = src[0][i] op src[1][i] op ... in rank order (out may be any buffer but the srcs). */
static void reduce(void *out, const void *const *src, int np, size_t n, ncclDataType_t dt, ncclRedOp_t op) {
  switch (dt) {
  case ncclInt8: RED_INT(int8_t, uint8_t) break;
  case ncclUint8: RED_LOOP(uint8_t, uint8_t, ID, ID) break;
  case ncclInt32: RED_INT(int32_t, uint32_t) break;
  case ncclUint32: RED_LOOP(uint32_t, uint32_t, ID, ID) break;
  case ncclInt64: RED_INT(int64_t, uint64_t) break;
  case ncclUint64: RED_LOOP(uint64_t, uint64_t, ID, ID) break;
  case ncclFloat32: RED_LOOP(float, float, ID, ID) break;
  case ncclFloat64: RED_LOOP(double, double, ID, ID) break;
  case ncclBfloat16: RED_LOOP(uint16_t, float, bf2f, f2bf) break;
  case ncclFloat16: RED_LOOP(uint16_t, float, h2f, f2h) break;
  default: break;
  }
}

static char *area(ncclComm_t c, int p) { return c->data + (size_t)p * c->data_bytes; }

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER };

static ncclResult_t coll(int kind, const char *fn, const void *s, void *r, size_t count, ncclDataType_t dt,
                         ncclRedOp_t op, ncclComm_t c) {
  ncclResult_t e = enter(c);
  if (e) return e;
  size_t es = dt_size(dt);
  if (!es) e = note(c, ncclInvalidArgument, 0, "%s: data type %d is not supported by this fake", fn, (int)dt);
  else if (kind != ALL_GATHER && !can_reduce(dt, op))
    e = note(c, ncclInvalidArgument, 0, "%s: reduction %d on data type %d is not supported by this fake", fn, (int)op,
             (int)dt);
  else if (count && (!s || !r)) e = note(c, ncclInvalidArgument, 0, "%s: NULL buffer", fn);
  else if (count > SIZE_MAX / 8 / MAX_RANKS) e = note(c, ncclInvalidArgument, 0, "%s: count %zu is too large", fn, count);
  const void *src[MAX_RANKS];
  int np = c->nranks, nb = kind == REDUCE_SCATTER ? np : 1;   /* blocks of the input */
  size_t chunk = es ? c->data_bytes / es / (size_t)nb : 0;
  for (size_t off = 0; off < count && !e; off += chunk) {
    size_t n = count - off < chunk ? count - off : chunk, bytes = n * es;
    for (int b = 0; b < nb; b++)   /* this rank's piece of every block */
      memcpy(area(c, c->rank) + (size_t)b * bytes, (const char *)s + ((size_t)b * count + off) * es, bytes);
    if ((e = barrier(c, kind + 1))) break;
    for (int p = 0; p < np; p++) src[p] = area(c, p) + (nb > 1 ? (size_t)c->rank * bytes : 0);
    if (kind == ALL_GATHER)
      for (int p = 0; p < np; p++) memcpy((char *)r + ((size_t)p * count + off) * es, src[p], bytes);
    else
      reduce((char *)r + off * es, src, np, n, dt, op);
    e = barrier(c, kind + 1);   /* before the areas are written again */
  }
  leave(c);
  return e;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t stream) {
  return coll(ALL_REDUCE, "ncclAllReduce", s, r, count, dt, op, c);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t dt, ncclComm_t c, cudaStream_t stream) {
  return coll(ALL_GATHER, "ncclAllGather", s, r, count, dt, ncclSum, c);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t stream) {
  return coll(REDUCE_SCATTER, "ncclReduceScatter", s, r, count, dt, op, c);
}

/* ------------------------------------------------------------ send / recv */
static RingHdr *pipe_of(const Op *o, size_t *pair) {
  ncclComm_t c = o->c;
  *pair = o->send ? (size_t)c->rank * (size_t)c->nranks + (size_t)o->peer
                  : (size_t)o->peer * (size_t)c->nranks + (size_t)c->rank;
  return &c->rings[*pair];
}

/* Numbers the message on its pipe; a receive is posted (its size beside it, for strict senders). */
static void post(Op *o) {
  size_t pair;
  RingHdr *rh = pipe_of(o, &pair);
  ncclComm_t c = o->c;
  o->open = !o->send || !c->strict;
  if (o->send) {
    o->k = c->nsend[o->peer]++;
    return;
  }
  o->k = c->nrecv[o->peer]++;
  atomic_store(&rh->size[o->k % SLOTS], o->bytes >> 40 ? UINT64_MAX : (o->k & 0xffffff) << 40 | o->bytes);
  atomic_store(&rh->posted, o->k + 1);
}

/* Strict mode: opens a send once its receive is posted (a size that differs is an error). */
static ncclResult_t gate(Op *o) {
  size_t pair;
  RingHdr *rh = pipe_of(o, &pair);
  if (atomic_load(&rh->posted) <= o->k) return ncclSuccess;
  o->open = 1;
  uint64_t s = atomic_load(&rh->size[o->k % SLOTS]);   /* a later receive's when overwritten */
  if (s != UINT64_MAX && s >> 40 == (o->k & 0xffffff) && (s & ((1ull << 40) - 1)) != o->bytes)
    return note(o->c, ncclInvalidUsage, 1,
                "rank %d's send #%llu to %d has %zu bytes, the receive %d posted for it %llu (sends and receives pair "
                "in issue order)", o->c->rank, (unsigned long long)o->k + 1, o->peer, o->bytes, o->peer,
                (unsigned long long)(s & ((1ull << 40) - 1)));
  return ncclSuccess;
}

/* Strict mode, nothing moved: publishes the first closed send's wait, else the first receive
   that waits on an empty pipe. */
static void blk_ops(ncclComm_t fam, const Op *ops, int n) {
  size_t pair;
  for (int i = 0; i < n; i++)
    if (ops[i].send && !ops[i].open && atomic_load(&pipe_of(&ops[i], &pair)->posted) <= ops[i].k) {
      blk_put(ops[i].c, 0, B_SEND, 0, ops[i].peer, ops[i].k, 0);
      return;
    }
  for (int i = 0; i < n; i++) {
    RingHdr *rh = pipe_of(&ops[i], &pair);
    uint64_t t = atomic_load(&rh->tail);
    if (!ops[i].send && ops[i].done < ops[i].bytes && atomic_load(&rh->head) == t) {
      blk_put(ops[i].c, 0, B_RECV, 0, ops[i].peer, ops[i].k, t);
      return;
    }
  }
  blk_put(fam, 0, B_NONE, 0, 0, 0, 0);
}

/* Moves what it can of one send or receive; 1 if it moved anything. */
static int step(Op *o) {
  ncclComm_t c = o->c;
  size_t R = c->ring_bytes, pair;
  RingHdr *rh = pipe_of(o, &pair);
  char *ring = c->ringdata + pair * R;
  uint64_t head = atomic_load(&rh->head), tail = atomic_load(&rh->tail);
  size_t avail = o->send ? R - (size_t)(head - tail) : (size_t)(head - tail);
  size_t n = o->bytes - o->done < avail ? o->bytes - o->done : avail;
  if (!n) return 0;
  size_t pos = (size_t)((o->send ? head : tail) % R), first = n < R - pos ? n : R - pos;
  if (o->send) {
    memcpy(ring + pos, o->buf + o->done, first);
    memcpy(ring, o->buf + o->done + first, n - first);
    atomic_store(&rh->head, head + n);
  } else {
    memcpy(o->buf + o->done, ring + pos, first);
    memcpy(o->buf + o->done + first, ring, n - first);
    atomic_store(&rh->tail, tail + n);
  }
  o->done += n;
  return 1;
}

static int by_pipe(const void *a, const void *b) {
  const Op *x = *(Op *const *)a, *y = *(Op *const *)b;
  if (x->c != y->c) return (uintptr_t)x->c < (uintptr_t)y->c ? -1 : 1;
  if (x->send != y->send || x->peer != y->peer) return x->send != y->send ? x->send - y->send : x->peer - y->peer;
  return x < y ? -1 : x > y;
}

static int pending(const Op *o) { return !o->open || o->done < o->bytes; }

static ncclResult_t run_ops(Op *ops, int n) {
  ncclResult_t r = ncclSuccess;
  int entered = 0, left = 0;
  Op **order = n > 1 ? malloc((size_t)n * sizeof *order) : NULL;
  for (int i = 0; i < n; i++) {
    ops[i].prev = NULL;
    if (order) order[i] = &ops[i];
  }
  if (order) {
    qsort(order, (size_t)n, sizeof *order, by_pipe);
    for (int i = 1; i < n; i++)
      if (order[i]->c == order[i - 1]->c && order[i]->send == order[i - 1]->send && order[i]->peer == order[i - 1]->peer)
        order[i]->prev = order[i - 1];
    free(order);
  } else if (n > 1) {
    r = note(ops[0].c, ncclSystemError, 0, "out of memory");
  }
  while (!r && entered < n && !(r = enter(ops[entered].c))) entered++;
  ncclComm_t fam = r || !n ? NULL : ops[0].c;   /* strict mode, one family: its waits published */
  for (int i = 0; i < n && !r; i++) {
    post(&ops[i]);   /* the receives first: before any send moves */
    left += pending(&ops[i]);
    if (fam && (!ops[i].c->strict || ops[i].c->root != fam->root)) fam = NULL;
  }
  if (fam) blk_put(fam, 1, B_NONE, 0, 0, 0, 0);
  Wait w;
  wait_init(&w);
  Det det;   /* (look 1 fills p) */
  det.look = 0;
  ncclResult_t dl = ncclSuccess;
  while (!r && left) {
    int moved = 0;
    for (int i = 0; i < n && !r; i++) {
      Op *o = &ops[i];
      const Op *p = o->prev;
      if (!pending(o) || (p && pending(p))) continue;
      if (!o->open && ((r = gate(o)) || !o->open)) continue;
      if (o->done < o->bytes) moved |= step(o);
      if (!pending(o)) {
        moved = 1;
        left--;
      }
    }
    if (!left || r) break;
    if (moved) {
      w.t0 = now_s();
      w.ns = 1000;
      continue;
    }
    if (fam) blk_ops(fam, ops, n);
    int peers = due(&w);
    ncclComm_t last = NULL;
    for (int i = 0; i < n && !r; i++)
      if (pending(&ops[i]) && ops[i].c != last) r = checks(last = ops[i].c, &w, peers);
    if (!r && fam) dl = r = detect(fam, &det, peers);
    if (!r) backoff(&w);
  }
  if (fam && !dl) blk_put(fam, 0, B_NONE, 0, 0, 0, 0);   /* (a deadlock's stays, for the others' reports) */
  for (int i = 0; i < entered; i++) leave(ops[i].c);
  return r;
}

static ncclResult_t p2p(int send, const void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t c) {
  const char *fn = send ? "ncclSend" : "ncclRecv";
  ncclResult_t r = enter(c);
  if (!r) {
    size_t es = dt_size(dt);
    if (!es) r = note(c, ncclInvalidArgument, 0, "%s: data type %d is not supported by this fake", fn, (int)dt);
    else if (peer < 0 || peer >= c->nranks) r = note(c, ncclInvalidArgument, 0, "%s: peer %d of %d ranks", fn, peer, c->nranks);
    else if (count && !buf) r = note(c, ncclInvalidArgument, 0, "%s: NULL buffer", fn);
    else if (count > SIZE_MAX / es) r = note(c, ncclInvalidArgument, 0, "%s: count %zu is too large", fn, count);
    leave(c);
    if (!r) {
      Op op = {c, (char *)(uintptr_t)buf, count * es, 0, 0, peer, send, 0, NULL};
      if (!grp.depth) return run_ops(&op, 1);
      if (grp.n == grp.cap) {
        int cap = grp.cap ? 2 * grp.cap : 16;
        Op *ops = realloc(grp.ops, (size_t)cap * sizeof *ops);
        if (!ops) r = note(c, ncclSystemError, 0, "out of memory");
        else {
          grp.ops = ops;
          grp.cap = cap;
        }
      }
      if (!r) grp.ops[grp.n++] = op;
    }
  }
  if (r && grp.depth && !grp.err) grp.err = r;
  return r;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t stream) {
  return p2p(1, buf, count, dt, peer, c);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t stream) {
  return p2p(0, buf, count, dt, peer, c);
}

ncclResult_t ncclGroupStart(void) {
  grp.depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (grp.depth <= 0) return note(NULL, ncclInvalidUsage, 0, "ncclGroupEnd without ncclGroupStart");
  if (--grp.depth) return ncclSuccess;
  ncclResult_t r = grp.err ? grp.err : run_ops(grp.ops, grp.n);   /* a group with a bad call does nothing */
  free(grp.ops);
  grp.ops = NULL;
  grp.n = grp.cap = 0;
  grp.err = ncclSuccess;
  return r;
}

/* ------------------------------------------------------------ errors */
const char *ncclGetErrorString(ncclResult_t r) {
  static const char *const names[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                                      "invalid argument", "invalid usage",
                                      "remote process exited or there was a network error", "NCCL operation in progress"};
  return (unsigned)r < sizeof names / sizeof *names ? names[r] : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t c) { return c && c->last[0] ? c->last : g_last; }
