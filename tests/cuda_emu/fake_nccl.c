/* tests/cuda_emu/fake_nccl.c — a test double of NCCL (libnccl.so.2) for the emulated device:
 * this file its communicators, collectives and send/recv; fake_nccl_wait.c how a rank waits
 * for the others ((a) to (c) below, strict mode's deadlock detection, the barrier);
 * fake_nccl_internal.h the segment's layout and the communicator they share.
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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_nccl_internal.h"

typedef struct Op {
  ncclComm_t c;
  char *buf;
  size_t bytes, done;
  uint64_t k;        /* the message's number on its pipe */
  int peer, send, open;   /* open: may move (a strict send: once its receive is posted) */
  struct Op *prev;   /* the op before this one on the same pipe: this one waits for it */
} Op;

static struct ncclComm *aborted_list;
static _Atomic unsigned id_counter;
/* Thread-local state is initial-exec (static TLS, no __tls_get_addr) and small: this library is
   dlopened, and GCC 12's LeakSanitizer crashed at exit scanning the dynamic TLS of a dlopened
   library ("Tracer caught signal 11", DTLS of a bogus address).  The last error without a
   communicator is process-wide for the same reason (g_last, fake_nccl_wait.c). */
static __thread __attribute__((tls_model("initial-exec"))) struct {
  int depth, n, cap;
  ncclResult_t err;
  Op *ops;
} grp;

static void map_release(Map *m) {
  if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
    munmap(m->base, m->len);
    free(m);
  }
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