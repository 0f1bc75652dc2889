/* tests/cuda_emu/test_fake_nccl.c — checks the NCCL test double (fake_nccl.c).
 *
 *   test_fake_nccl LIBNCCL   (ctest emu.nccl; LIBNCCL: libloom_fake_nccl.so)
 *
 * Loads the library with dlopen, as loom does, then forks 4 ranks (the unique ids are made
 * before the fork) that run the collectives against values they can compute themselves:
 * all-reduce (f32, bf16; sum, max; in place; more than a staging area), all-gather and
 * reduce-scatter (in place and not), grouped and plain send/recv, splits, an abort from
 * another thread while a rank waits, and a rank that exits before a collective.  Then threads
 * of one process as ranks, the LOOM_FAKE_NCCL_MAX_WAIT cap, strict mode (LOOM_FAKE_NCCL_STRICT:
 * a ring in one group and a grouped all-to-all work, a ring as a send group then a receive
 * group and a send to a rank in an all-reduce are reported deadlocks, unequal sizes refused;
 * not strict, the two groups pass), and that nothing named after the ids is left in /dev/shm.
 * Prints "ok ..." lines; exits 1 on any failure.
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FUNCS(X)                                                                                                  \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommSplit) X(ncclCommGetAsyncError)      \
  X(ncclCommAbort) X(ncclCommFinalize) X(ncclCommDestroy) X(ncclAllReduce) X(ncclAllGather) X(ncclReduceScatter) \
  X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetErrorString) X(ncclGetLastError)           \
  X(ncclCommInitRank) X(ncclCommCount) X(ncclCommUserRank)
#define DECL(f) static __typeof__(f) *p_##f;
FUNCS(DECL)

#define N 4
static int me = -1;   /* the rank of this process; -1: the parent */
static int fails;

static void fail_at(int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL (rank %d, line %d): ", me, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fails++;
}
#define CHECK(cond, ...)                                                                                          \
  do {                                                                                                            \
    if (!(cond)) fail_at(__LINE__, __VA_ARGS__);                                                                  \
  } while (0)
#define OK(call)                                                                                                  \
  do {                                                                                                            \
    ncclResult_t r_ = (call);                                                                                     \
    CHECK(r_ == ncclSuccess, "%s: %s: %s", #call, p_ncclGetErrorString(r_), p_ncclGetLastError(NULL));           \
  } while (0)

static void ok(int before, const char *what) {
  if (me <= 0 && fails == before) printf("ok %s\n", what);
  fflush(stdout);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A float in [-4, 4) with a full mantissa, from (a, b, i). */
static float rnd(uint64_t a, uint64_t b, uint64_t i) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ b * 0xc2b2ae3d27d4eb4full ^ i * 0x165667b19e3779f9ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (float)(int64_t)(x >> 40) / (float)(1 << 21) - 4.0f;
}
/* An integer-valued float, exact in bf16 and in sums of 4. */
static float ival(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 101) - 50); }

static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static int all_ranks_same(ncclComm_t c, const void *buf, size_t bytes) {
  uint64_t h = 1469598103934665603ull, got[N];
  for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
  OK(p_ncclAllGather(&h, got, 8, ncclUint8, c, NULL));
  for (int p = 0; p < N; p++)
    if (got[p] != h) return 0;
  return 1;
}

static void test_all_reduce(ncclComm_t c) {
  int f0 = fails;
  const size_t sizes[] = {1, 1000, 300007};   /* 300007 floats: more than one staging area */
  for (int k = 0; k < 3; k++) {
    size_t n = sizes[k];
    float *x = malloc(n * 4), *y = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = ival(me, i);
    OK(p_ncclAllReduce(x, y, n, ncclFloat32, ncclSum, c, NULL));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++) {
      float e = 0;
      for (int r = 0; r < N; r++) e += ival(r, i);
      if (y[i] != e) bad = i;
    }
    CHECK(bad == n, "all-reduce sum f32 of %zu: element %zu is %g", n, bad, bad < n ? y[bad] : 0.0);
    OK(p_ncclAllReduce(x, x, n, ncclFloat32, ncclMax, c, NULL));   /* in place */
    for (size_t i = 0; i < n && bad == n; i++) {
      float e = ival(0, i);
      for (int r = 1; r < N; r++) e = ival(r, i) > e ? ival(r, i) : e;
      if (x[i] != e) bad = i;
    }
    CHECK(bad == n, "all-reduce max f32 in place of %zu: element %zu is %g", n, bad, bad < n ? x[bad] : 0.0);
    free(x);
    free(y);
  }
  ok(f0, "all-reduce f32 sum and max, exact (1, 1000 and 300007 floats, in place)");

  /* random floats: the sum in rank order 0..3 exactly, the same bits on every rank */
  f0 = fails;
  size_t n = 200001;
  float *x = malloc(n * 4), *y = malloc(n * 4);
  uint16_t *b = malloc(n * 2), *bo = malloc(n * 2);
  for (size_t i = 0; i < n; i++) x[i] = rnd(1, (uint64_t)me, i);
  OK(p_ncclAllReduce(x, y, n, ncclFloat32, ncclSum, c, NULL));
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++) {
    float e = rnd(1, 0, i);
    for (int r = 1; r < N; r++) e += rnd(1, (uint64_t)r, i);
    if (memcmp(&e, &y[i], 4)) bad = i;
  }
  CHECK(bad == n, "all-reduce sum f32 (random): element %zu differs from the sum in rank order", bad);
  CHECK(all_ranks_same(c, y, n * 4), "all-reduce sum f32 (random): the ranks disagree");
  ok(f0, "all-reduce f32 sum of random floats: the sum in rank order, bitwise the same on every rank");

  f0 = fails;
  for (size_t i = 0; i < n; i++) b[i] = f2bf(ival(me, i));
  OK(p_ncclAllReduce(b, bo, n, ncclBfloat16, ncclSum, c, NULL));
  for (size_t i = 0; i < n && bad == n; i++) {
    float e = 0;
    for (int r = 0; r < N; r++) e += ival(r, i);
    if (bf2f(bo[i]) != e) bad = i;
  }
  CHECK(bad == n, "all-reduce sum bf16 (integers): element %zu is %g", bad, bad < n ? bf2f(bo[bad]) : 0.0);
  OK(p_ncclAllReduce(b, b, n, ncclBfloat16, ncclMax, c, NULL));
  for (size_t i = 0; i < n && bad == n; i++) {
    float e = ival(0, i);
    for (int r = 1; r < N; r++) e = ival(r, i) > e ? ival(r, i) : e;
    if (bf2f(b[i]) != e) bad = i;
  }
  CHECK(bad == n, "all-reduce max bf16 in place: element %zu is %g", bad, bad < n ? bf2f(b[bad]) : 0.0);
  for (size_t i = 0; i < n; i++) b[i] = f2bf(rnd(2, (uint64_t)me, i));
  OK(p_ncclAllReduce(b, bo, n, ncclBfloat16, ncclSum, c, NULL));
  for (size_t i = 0; i < n && bad == n; i++) {
    float e = 0;
    for (int r = 0; r < N; r++) e += bf2f(f2bf(rnd(2, (uint64_t)r, i)));
    if (bo[i] != f2bf(e)) bad = i;
  }
  CHECK(bad == n, "all-reduce sum bf16 (random): element %zu is not the float sum in rank order, rounded once", bad);
  CHECK(all_ranks_same(c, bo, n * 2), "all-reduce sum bf16 (random): the ranks disagree");
  /* rounded once: 2048 + 1 + 1 + 1 = 2051 -> 2052 in fp16, 256 + 1 + 1 + 1 -> 260 in bf16 (step by step: 2048, 256) */
  uint16_t h[2] = {me ? 0x3c00 : 0x6800, me ? 0x3f80 : 0x4380}, ho[2] = {0, 0};
  OK(p_ncclAllReduce(h, ho, 1, ncclFloat16, ncclSum, c, NULL));
  OK(p_ncclAllReduce(h + 1, ho + 1, 1, ncclBfloat16, ncclSum, c, NULL));
  CHECK(ho[0] == 0x6802 && ho[1] == 0x4382, "fp16/bf16 sums rounded once: %04x %04x", ho[0], ho[1]);
  ok(f0, "all-reduce bf16 (and fp16) sum and max: exact on integers, float sum rounded once to nearest even, "
         "bitwise the same on every rank");
  free(x);
  free(y);
  free(b);
  free(bo);
}

static void test_gather_scatter(ncclComm_t c) {
  int f0 = fails;
  const size_t sizes[] = {1000, 200003};
  for (int k = 0; k < 2; k++) {
    size_t m = sizes[k], bad = N * m;
    float *x = malloc(m * 4), *y = malloc(N * m * 4), *z = malloc(N * m * 4);
    for (size_t i = 0; i < m; i++) x[i] = z[(size_t)me * m + i] = ival(me, i);
    OK(p_ncclAllGather(x, y, m, ncclFloat32, c, NULL));
    OK(p_ncclAllGather(z + (size_t)me * m, z, m, ncclFloat32, c, NULL));   /* in place */
    for (size_t i = 0; i < N * m && bad == N * m; i++)
      if (y[i] != ival((int)(i / m), i % m) || z[i] != y[i]) bad = i;
    CHECK(bad == N * m, "all-gather of %zu: element %zu is %g, in place %g", m, bad, y[bad % (N * m)], z[bad % (N * m)]);

    /* reduce-scatter: block r of the input is reduced into rank r */
    for (size_t i = 0; i < N * m; i++) y[i] = z[i] = ival(me, i);
    OK(p_ncclReduceScatter(y, x, m, ncclFloat32, ncclSum, c, NULL));
    OK(p_ncclReduceScatter(z, z + (size_t)me * m, m, ncclFloat32, ncclSum, c, NULL));   /* in place */
    bad = m;
    for (size_t i = 0; i < m && bad == m; i++) {
      float e = 0;
      for (int r = 0; r < N; r++) e += ival(r, (size_t)me * m + i);
      if (x[i] != e || z[(size_t)me * m + i] != e) bad = i;
    }
    CHECK(bad == m, "reduce-scatter of %zu: element %zu is %g, in place %g", m, bad, x[bad % m], z[(size_t)me * m + bad % m]);
    free(x);
    free(y);
    free(z);
  }
  unsigned char mine[3] = {(unsigned char)me, 0xa5, (unsigned char)(200 + me)}, all[3 * N];
  OK(p_ncclAllGather(mine, all, 3, ncclInt8, c, NULL));
  for (int p = 0; p < N; p++) CHECK(all[3 * p] == p && all[3 * p + 1] == 0xa5 && all[3 * p + 2] == 200 + p, "all-gather int8");
  ok(f0, "all-gather and reduce-scatter, in place and not (1000 and 200003 floats), all-gather int8");
}

static float a2a(int src, int dst, size_t i) { return (float)(src * 10000 + dst * 1000 + (int)(i % 997)); }

static void test_send_recv(ncclComm_t c) {
  int f0 = fails;
  size_t k = 50000;   /* 200 KB a peer: more than a pipe holds */
  float *in = malloc(N * k * 4), *out = malloc(N * k * 4);
  for (int p = 0; p < N; p++)
    for (size_t i = 0; i < k; i++) in[(size_t)p * k + i] = a2a(me, p, i);
  int next = (me + 1) % N, prev = (me + N - 1) % N;
  int32_t tail[2] = {me, -me}, got[2] = {0, 0};
  OK(p_ncclGroupStart());
  for (int p = 0; p < N; p++) {
    OK(p_ncclSend(in + (size_t)p * k, k, ncclFloat32, p, c, NULL));
    OK(p_ncclRecv(out + (size_t)p * k, k, ncclFloat32, p, c, NULL));
  }
  OK(p_ncclSend(tail, 2, ncclInt32, next, c, NULL));   /* a second message on one pipe: after the first */
  OK(p_ncclRecv(got, 2, ncclInt32, prev, c, NULL));
  OK(p_ncclGroupEnd());
  size_t bad = N * k;
  for (size_t i = 0; i < N * k && bad == N * k; i++)
    if (out[i] != a2a((int)(i / k), me, i % k)) bad = i;
  CHECK(bad == N * k, "grouped all-to-all: element %zu is %g", bad, out[bad % (N * k)]);
  CHECK(got[0] == prev && got[1] == -prev, "grouped second message: %d %d", got[0], got[1]);
  ok(f0, "grouped send/recv all-to-all (200 KB a peer, self included, two messages on a pipe)");

  f0 = fails;
  int32_t s1[100], s2[7], r1[100], r2[7];
  for (int i = 0; i < 100; i++) s1[i] = me * 1000 + i;
  for (int i = 0; i < 7; i++) s2[i] = -me * 1000 - i;
  OK(p_ncclSend(s1, 100, ncclInt32, next, c, NULL));   /* buffered: two messages in a row */
  OK(p_ncclSend(s2, 7, ncclInt32, next, c, NULL));
  OK(p_ncclRecv(r1, 100, ncclInt32, prev, c, NULL));
  OK(p_ncclRecv(r2, 7, ncclInt32, prev, c, NULL));
  for (int i = 0; i < 100; i++) CHECK(r1[i] == prev * 1000 + i, "plain recv: element %d is %d", i, r1[i]);
  for (int i = 0; i < 7; i++) CHECK(r2[i] == -prev * 1000 - i, "plain recv (second message): element %d is %d", i, r2[i]);
  /* a message larger than the pipe: even ranks send first, odd ranks receive first */
  for (int t = 0; t < 2; t++) {
    if ((me % 2) == t) OK(p_ncclSend(in, N * k, ncclFloat32, next, c, NULL));
    else OK(p_ncclRecv(out, N * k, ncclFloat32, prev, c, NULL));
  }
  for (size_t i = 0; i < N * k && bad == N * k; i++)
    if (out[i] != a2a(prev, (int)(i / k), i % k)) bad = i;
  CHECK(bad == N * k, "plain send/recv of 800 KB: element %zu is %g", bad, out[bad % (N * k)]);
  free(in);
  free(out);
  ok(f0, "plain send/recv (buffered, FIFO, and 800 KB through the pipe)");

  f0 = fails;
  ncclResult_t r = p_ncclAllReduce(s1, r1, 4, ncclFloat8e4m3, ncclSum, c, NULL);
  CHECK(r == ncclInvalidArgument && strstr(p_ncclGetLastError(c), "not supported"), "fp8 all-reduce gave %d: %s", r,
        p_ncclGetLastError(c));
  r = p_ncclSend(s1, 4, ncclInt32, N, c, NULL);
  CHECK(r == ncclInvalidArgument, "send to rank %d gave %d", N, r);
  ncclResult_t st = ncclInternalError;
  OK(p_ncclCommGetAsyncError(c, &st));
  CHECK(st == ncclSuccess, "the communicator is in error (%d) after invalid arguments", st);
  ok(f0, "unsupported data types and peers: ncclInvalidArgument, and the communicator still works");
}

static void test_split(ncclComm_t c) {
  int f0 = fails, n = 0, r = -1;
  ncclComm_t s = NULL, t = NULL;
  OK(p_ncclCommSplit(c, me / 2, -me, &s, NULL));   /* color rank/2; key -rank: reversed order */
  CHECK(s != NULL, "split gave no communicator");
  if (!s) return;
  OK(p_ncclCommCount(s, &n));
  OK(p_ncclCommUserRank(s, &r));
  CHECK(n == 2 && r == 1 - me % 2, "split: rank %d of %d", r, n);
  int32_t mine = me, got[2] = {-1, -1}, sum = 0;
  OK(p_ncclAllGather(&mine, got, 1, ncclInt32, s, NULL));
  CHECK(got[0] == me / 2 * 2 + 1 && got[1] == me / 2 * 2, "split all-gather: %d %d", got[0], got[1]);
  OK(p_ncclAllReduce(&mine, &sum, 1, ncclInt32, ncclSum, s, NULL));
  CHECK(sum == me / 2 * 4 + 1, "split all-reduce: %d", sum);
  OK(p_ncclCommSplit(c, me == 3 ? NCCL_SPLIT_NOCOLOR : 7, 0, &t, NULL));   /* rank 3 out */
  CHECK((t == NULL) == (me == 3), "NCCL_SPLIT_NOCOLOR: %p", (void *)t);
  if (t) {
    OK(p_ncclCommCount(t, &n));
    OK(p_ncclCommUserRank(t, &r));
    CHECK(n == 3 && r == me, "second split: rank %d of %d", r, n);
    OK(p_ncclAllReduce(&mine, &sum, 1, ncclInt32, ncclSum, t, NULL));
    CHECK(sum == 3, "second split all-reduce: %d", sum);
    OK(p_ncclCommFinalize(t));
    OK(p_ncclCommDestroy(t));
  }
  OK(p_ncclAllReduce(&mine, &sum, 1, ncclInt32, ncclSum, c, NULL));   /* the parent still works */
  CHECK(sum == 6, "parent all-reduce after splits: %d", sum);
  OK(p_ncclCommFinalize(s));
  OK(p_ncclCommDestroy(s));
  ok(f0, "split into 2 groups of 2 (key = -rank orders them), NCCL_SPLIT_NOCOLOR, collectives on them");
}

static void *abort_later(void *c) {
  usleep(200000);
  p_ncclCommAbort(c);
  return NULL;
}

static void test_abort(ncclUniqueId id) {
  int f0 = fails;
  ncclComm_t w = NULL, s = NULL;
  float x = 1, y = 0;
  OK(p_ncclCommInitRank(&w, N, id, me));
  OK(p_ncclCommSplit(w, me / 2, me, &s, NULL));
  if (!w || !s) return;
  double t0 = now_s();
  if (me == 0) {   /* waits in an all-reduce that rank 1 never joins; another thread aborts */
    pthread_t th;
    pthread_create(&th, NULL, abort_later, w);
    ncclResult_t r = p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, w, NULL);
    double dt = now_s() - t0;
    pthread_join(th, NULL);
    CHECK(r != ncclSuccess && dt < 1.0, "all-reduce while aborted from another thread: %d after %.2f s", r, dt);
    CHECK(strstr(p_ncclGetLastError(w), "aborted by rank 0"), "last error: %s", p_ncclGetLastError(w));
    ncclResult_t st = ncclSuccess;
    p_ncclCommGetAsyncError(w, &st);
    CHECK(st == ncclRemoteError, "ncclCommGetAsyncError after the abort: %d", st);
    OK(p_ncclCommAbort(s));   /* nobody waits on it */
    CHECK(p_ncclCommDestroy(w) != ncclSuccess, "ncclCommDestroy of an aborted communicator succeeded");
    ok(f0, "ncclCommAbort from another thread while waiting in an all-reduce: an error within 1 s");
    return;
  }
  ncclResult_t r;
  if (me == 1) {   /* waits on the split; rank 0 aborts the world: the whole family */
    r = p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, s, NULL);
  } else {
    usleep(50000);
    r = p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, w, NULL);
  }
  double dt = now_s() - t0;
  CHECK(r == ncclRemoteError && dt < 1.2, "a peer's abort: %d after %.2f s", r, dt);
  CHECK(strstr(p_ncclGetLastError(me == 1 ? s : w), "aborted by rank 0"), "last error: %s", p_ncclGetLastError(me == 1 ? s : w));
  r = p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, me == 1 ? w : s, NULL);
  CHECK(r == ncclRemoteError && now_s() - t0 < 1.5, "the family after a peer's abort: %d", r);
  OK(p_ncclCommAbort(s));
  OK(p_ncclCommAbort(w));
}

static void test_dead_peer(ncclUniqueId id) {
  int f0 = fails;
  ncclComm_t w = NULL;
  OK(p_ncclCommInitRank(&w, N, id, me));
  if (!w) return;
  if (me == 3) _exit(fails ? 1 : 0);
  float x = 1, y = 0;
  double t0 = now_s();
  ncclResult_t r = p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, w, NULL), st = ncclSuccess;
  double dt = now_s() - t0;
  CHECK(r == ncclRemoteError && dt < 1.5, "all-reduce with rank 3 gone: %d after %.2f s", r, dt);
  CHECK(strstr(p_ncclGetLastError(w), "rank 3 (pid"), "last error: %s", p_ncclGetLastError(w));
  p_ncclCommGetAsyncError(w, &st);
  CHECK(st == ncclRemoteError, "ncclCommGetAsyncError after a peer exited: %d", st);
  OK(p_ncclCommAbort(w));
  ok(f0, "a rank that exits before a collective: ncclRemoteError naming it within 1.5 s");
}

static int rank_main(const ncclUniqueId *ids) {
  alarm(60);
  ncclComm_t w = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  int f0 = fails, n = 0, r = -1;
  OK(p_ncclCommInitRankConfig(&w, N, ids[0], me, &cfg));
  if (!w) return 1;
  ncclResult_t st = ncclInternalError;
  OK(p_ncclCommGetAsyncError(w, &st));
  OK(p_ncclCommCount(w, &n));
  OK(p_ncclCommUserRank(w, &r));
  CHECK(st == ncclSuccess && n == N && r == me, "after init: state %d, rank %d of %d", st, r, n);
  ok(f0, "ncclCommInitRankConfig of 4 processes");
  test_all_reduce(w);
  test_gather_scatter(w);
  test_send_recv(w);
  test_split(w);
  OK(p_ncclCommFinalize(w));
  OK(p_ncclCommDestroy(w));
  test_abort(ids[1]);
  test_dead_peer(ids[2]);
  return fails ? 1 : 0;
}

/* ------------------------------------------------------------ threads of one process */
typedef struct {
  ncclUniqueId id;
  int rank, n, mode;
} Th;
static _Atomic int max_wait_done;

static void *thread_rank(void *arg) {
  Th *t = arg;
  ncclComm_t c = NULL, s = NULL;
  OK(p_ncclCommInitRank(&c, t->n, t->id, t->rank));
  if (!c) return NULL;
  float x = (float)(t->rank + 1), y = 0, in[3], out[3];
  if (t->mode == 1) {   /* LOOM_FAKE_NCCL_MAX_WAIT: rank 0 waits alone */
    if (t->rank == 0) {
      double t0 = now_s();
      ncclResult_t r = p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, c, NULL);
      CHECK(r == ncclSystemError && strstr(p_ncclGetLastError(c), "waited") && now_s() - t0 < 2, "max wait: %d: %s", r,
            p_ncclGetLastError(c));
      max_wait_done = 1;
    }
    while (!max_wait_done) usleep(1000);   /* rank 1's abort would end rank 0's wait */
    p_ncclCommAbort(c);
    return NULL;
  }
  OK(p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, c, NULL));
  CHECK(y == 6, "threads: all-reduce gave %g", y);
  for (int p = 0; p < 3; p++) in[p] = (float)(t->rank * 10 + p);
  OK(p_ncclGroupStart());
  for (int p = 0; p < 3; p++) {
    OK(p_ncclSend(in + p, 1, ncclFloat32, p, c, NULL));
    OK(p_ncclRecv(out + p, 1, ncclFloat32, p, c, NULL));
  }
  OK(p_ncclGroupEnd());
  for (int p = 0; p < 3; p++) CHECK(out[p] == (float)(p * 10 + t->rank), "threads: all-to-all gave %g", out[p]);
  OK(p_ncclCommSplit(c, t->rank % 2, 0, &s, NULL));
  if (s) {
    OK(p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, s, NULL));
    CHECK(y == (t->rank % 2 ? 2 : 4), "threads: split all-reduce gave %g", y);
    OK(p_ncclCommDestroy(s));
  }
  OK(p_ncclCommDestroy(c));
  return NULL;
}

static void run_threads(int n, int mode) {
  Th t[3];
  pthread_t th[3];
  ncclUniqueId id;
  OK(p_ncclGetUniqueId(&id));
  for (int i = 0; i < n; i++) {
    t[i] = (Th){id, i, n, mode};
    pthread_create(&th[i], NULL, thread_rank, &t[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* ------------------------------------------------------------ strict mode (threads as ranks) */
#define SN 3
typedef struct {
  ncclUniqueId id[5];
  int rank, strict;
} St;
static pthread_barrier_t st_bar;
static _Atomic int st_sent;
static double st_worst;   /* the longest wait before a deadlock was reported */

static int32_t tv(int from, int to, int i) { return from * 1000000 + to * 1000 + i; }

/* A ring as two groups: all sends, then all receives (buffered: fine; strict: a deadlock). */
static ncclResult_t two_groups(ncclComm_t c, int r, double *dt) {
  int32_t x[5], y[5] = {0};
  for (int i = 0; i < 5; i++) x[i] = tv(r, (r + 1) % SN, i);
  double t0 = now_s();
  OK(p_ncclGroupStart());
  OK(p_ncclSend(x, 5, ncclInt32, (r + 1) % SN, c, NULL));
  ncclResult_t e = p_ncclGroupEnd();
  *dt = now_s() - t0;
  if (e) return e;
  OK(p_ncclGroupStart());
  OK(p_ncclRecv(y, 5, ncclInt32, (r + SN - 1) % SN, c, NULL));
  OK(p_ncclGroupEnd());
  for (int i = 0; i < 5; i++) CHECK(y[i] == tv((r + SN - 1) % SN, r, i), "two groups: element %d is %d", i, y[i]);
  return ncclSuccess;
}

static void deadlock_seen(ncclComm_t c, ncclResult_t e, double dt, const char *want1, const char *want2) {
  const char *m = p_ncclGetLastError(c);
  CHECK(e == ncclSystemError && !strncmp(m, "deadlock: rank ", 15) && strstr(m, want1) && strstr(m, want2),
        "strict: %d after %.2f s: %s", e, dt, m);
  if (dt > st_worst) st_worst = dt;   /* (a race between the threads: a rough figure) */
}

static void *strict_rank(void *arg) {
  St *t = arg;
  int r = t->rank, next = (r + 1) % SN, prev = (r + SN - 1) % SN;
  ncclComm_t c = NULL;
  double dt = 0;
  OK(p_ncclCommInitRank(&c, SN, t->id[0], r));
  if (!c) return NULL;
  float x = 1, y = 0;
  OK(p_ncclGroupStart());   /* a group of collectives alone (as loom's nccl_step makes) */
  OK(p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, c, NULL));
  OK(p_ncclGroupEnd());
  CHECK(y == SN, "a group of one all-reduce gave %g", y);
  if (!t->strict) {   /* (d) buffered sends: the two groups pass */
    OK(two_groups(c, r, &dt));
    OK(p_ncclCommDestroy(c));
    return NULL;
  }
  /* (a) a ring in one group, 200 KB (more than a pipe); (c) a grouped all-to-all, self included,
     and a second message on a pipe */
  size_t k = 50000;
  int32_t *in = malloc(SN * k * 4), *out = calloc(SN * k, 4), tail = -r, got = 0;
  for (int p = 0; p < SN; p++)
    for (size_t i = 0; i < k; i++) in[(size_t)p * k + i] = tv(r, p, (int)i);
  OK(p_ncclGroupStart());
  OK(p_ncclSend(in + (size_t)next * k, k, ncclInt32, next, c, NULL));
  OK(p_ncclRecv(out + (size_t)prev * k, k, ncclInt32, prev, c, NULL));
  OK(p_ncclGroupEnd());
  size_t bad = k;
  for (size_t i = 0; i < k && bad == k; i++)
    if (out[(size_t)prev * k + i] != tv(prev, r, (int)i)) bad = i;
  CHECK(bad == k, "strict ring in one group: element %zu", bad);
  memset(out, 0, SN * k * 4);
  OK(p_ncclGroupStart());
  for (int p = 0; p < SN; p++) {
    OK(p_ncclSend(in + (size_t)p * k, k, ncclInt32, p, c, NULL));
    OK(p_ncclRecv(out + (size_t)p * k, k, ncclInt32, p, c, NULL));
  }
  OK(p_ncclSend(&tail, 1, ncclInt32, next, c, NULL));
  OK(p_ncclRecv(&got, 1, ncclInt32, prev, c, NULL));
  OK(p_ncclGroupEnd());
  for (size_t i = 0; i < SN * k && bad == k; i++)
    if (out[i] != tv((int)(i / k), r, (int)(i % k))) bad = i;
  CHECK(bad == k && got == -prev, "strict grouped all-to-all: element %zu, second message %d", bad, got);
  free(in);
  free(out);
  OK(p_ncclCommDestroy(c));

  /* (b) the ring as two groups: every rank's send waits for a receive not posted */
  OK(p_ncclCommInitRank(&c, SN, t->id[1], r));
  if (!c) return NULL;
  ncclResult_t e = two_groups(c, r, &dt);
  deadlock_seen(c, e, dt, "'s send #1 to ", "waits for a receive");
  CHECK(strstr(p_ncclGetLastError(c), "is blocked in its send #1 to"), "strict two groups: %s", p_ncclGetLastError(c));
  pthread_barrier_wait(&st_bar);   /* each has its report before any aborts */
  OK(p_ncclCommAbort(c));

  /* (b') rank 0 sends to 1, which is in an all-reduce that waits for rank 0 */
  OK(p_ncclCommInitRank(&c, SN, t->id[2], r));
  if (!c) return NULL;
  double t0 = now_s();
  e = r ? p_ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, c, NULL) : p_ncclSend(&x, 1, ncclFloat32, 1, c, NULL);
  deadlock_seen(c, e, now_s() - t0, "send #1 to 1", "ncclAllReduce");
  pthread_barrier_wait(&st_bar);
  OK(p_ncclCommAbort(c));

  /* (e) a send of 4 elements paired with a receive of 3: ncclInvalidUsage */
  OK(p_ncclCommInitRank(&c, SN, t->id[3], r));
  if (!c) return NULL;
  int32_t four[4] = {1, 2, 3, 4}, three[3];
  OK(p_ncclGroupStart());
  OK(p_ncclSend(four, 4, ncclInt32, next, c, NULL));
  OK(p_ncclRecv(three, 3, ncclInt32, prev, c, NULL));
  e = p_ncclGroupEnd();
  CHECK(e == ncclInvalidUsage && strstr(p_ncclGetLastError(c), "has 16 bytes, the receive"), "strict sizes: %d: %s", e,
        p_ncclGetLastError(c));
  pthread_barrier_wait(&st_bar);
  OK(p_ncclCommAbort(c));

  /* (f) no cycle (rank 1 is not in NCCL at all): LOOM_FAKE_NCCL_MAX_WAIT, naming the wait */
  OK(p_ncclCommInitRank(&c, SN, t->id[4], r));
  if (!c) return NULL;
  if (r == 0) {
    e = p_ncclSend(&x, 1, ncclFloat32, 1, c, NULL);
    CHECK(e == ncclSystemError && strstr(p_ncclGetLastError(c), "(LOOM_FAKE_NCCL_MAX_WAIT): rank 0's send #1 to 1 "
                                                                 "waits for a receive 1 has not posted"),
          "strict max wait: %d: %s", e, p_ncclGetLastError(c));
    st_sent = 1;
  }
  while (!st_sent) usleep(1000);
  OK(p_ncclCommAbort(c));
  return NULL;
}

static void run_strict(int strict) {
  St t[SN];
  pthread_t th[SN];
  ncclUniqueId ids[5];
  for (int i = 0; i < 5; i++) OK(p_ncclGetUniqueId(&ids[i]));
  pthread_barrier_init(&st_bar, NULL, SN);
  for (int i = 0; i < SN; i++) {
    t[i].rank = i;
    t[i].strict = strict;
    memcpy(t[i].id, ids, sizeof ids);
    pthread_create(&th[i], NULL, strict_rank, &t[i]);
  }
  for (int i = 0; i < SN; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&st_bar);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_fake_nccl LIBNCCL\n");
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "FAIL: %s\n", dlerror());
    return 1;
  }
#define LOAD(f)                                                                                                   \
  if (!(p_##f = (__typeof__(p_##f))dlsym(h, #f))) {                                                               \
    fprintf(stderr, "FAIL: %s lacks %s\n", argv[1], #f);                                                          \
    return 1;                                                                                                     \
  }
  FUNCS(LOAD)
  int f0 = fails, v = 0;
  OK(p_ncclGetVersion(&v));
  CHECK(v == 22800, "version %d", v);
  ncclUniqueId ids[3], bad;
  for (int i = 0; i < 3; i++) OK(p_ncclGetUniqueId(&ids[i]));
  CHECK(memcmp(&ids[0], &ids[1], sizeof bad) && memcmp(&ids[1], &ids[2], sizeof bad), "the unique ids repeat");
  ncclComm_t c = (ncclComm_t)&bad;
  CHECK(p_ncclCommInitRank(&c, 0, ids[0], 0) == ncclInvalidArgument && !c, "0 ranks accepted");
  CHECK(p_ncclCommInitRank(&c, N, ids[0], N) == ncclInvalidArgument, "rank N of N accepted");
  memset(&bad, 0, sizeof bad);
  CHECK(p_ncclCommInitRank(&c, N, bad, 0) == ncclInvalidArgument, "an empty unique id accepted");
  ncclUniqueId one;   /* a communicator of one rank */
  float x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
  OK(p_ncclGetUniqueId(&one));
  OK(p_ncclCommInitRank(&c, 1, one, 0));
  OK(p_ncclAllReduce(x, y, 3, ncclFloat32, ncclSum, c, NULL));
  CHECK(y[0] == 1 && y[1] == 2 && y[2] == 3, "all-reduce of one rank: %g %g %g", y[0], y[1], y[2]);
  OK(p_ncclCommDestroy(c));
  ok(f0, "exports, version 22800, unique ids, invalid init arguments, a communicator of one rank");
  fflush(NULL);

  pid_t pids[N];
  for (int r = 0; r < N; r++) {
    if ((pids[r] = fork()) == 0) {
      me = r;
      exit(rank_main(ids));   /* (stdio was flushed before the fork) */
    }
    CHECK(pids[r] > 0, "fork failed");
  }
  for (int left = N; left > 0; left--) {   /* any order: a rank that exits is reaped at once */
    int status = 0;
    pid_t p = wait(&status);
    if (p < 0) break;
    int r = 0;
    while (r < N && pids[r] != p) r++;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d exited with status 0x%x", r, status);
  }

  f0 = fails;
  run_threads(3, 0);
  ok(f0, "threads of one process as ranks: all-reduce, grouped all-to-all, split");
  f0 = fails;
  setenv("LOOM_FAKE_NCCL_MAX_WAIT", "0.3", 1);
  run_threads(2, 1);
  unsetenv("LOOM_FAKE_NCCL_MAX_WAIT");
  ok(f0, "LOOM_FAKE_NCCL_MAX_WAIT: ncclSystemError after waiting 0.3 s");

  f0 = fails;
  setenv("LOOM_FAKE_NCCL_STRICT", "1", 1);
  setenv("LOOM_FAKE_NCCL_MAX_WAIT", "1", 1);
  double t0 = now_s();
  run_strict(1);
  unsetenv("LOOM_FAKE_NCCL_STRICT");
  unsetenv("LOOM_FAKE_NCCL_MAX_WAIT");
  char what[400];
  snprintf(what, sizeof what, "LOOM_FAKE_NCCL_STRICT (3 threads, %.1f s): a ring in one group and a grouped all-to-all "
           "move; a ring as a send group then a receive group, and a send to a rank in an all-reduce, are deadlocks "
           "reported on every rank within %.2f s; unequal sizes ncclInvalidUsage; a wait with no cycle named at "
           "LOOM_FAKE_NCCL_MAX_WAIT", now_s() - t0, st_worst);
  ok(f0, what);
  f0 = fails;
  run_strict(0);
  ok(f0, "not strict: the ring as a send group then a receive group passes (buffered sends); a group of a "
         "collective alone");

  f0 = fails;
  char prefix[64];
  snprintf(prefix, sizeof prefix, "loomfake-%d-", (int)getpid());
  DIR *d = opendir("/dev/shm");
  for (struct dirent *e; d && (e = readdir(d));)
    CHECK(strncmp(e->d_name, prefix, strlen(prefix)), "left in /dev/shm: %s", e->d_name);
  if (d) closedir(d);
  ok(f0, "nothing left in /dev/shm");
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails ? 1 : 0;
}
