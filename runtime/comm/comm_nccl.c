/* runtime/comm/comm_nccl.c — see comm_nccl.h. */
#define LOOM_CUDA_INTERNAL 1
#include "runtime/fail.h"
#include "runtime/comm/comm_nccl.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/cuda/cuda_api.h"
#include "runtime/program.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static const char *const axis_name[COMM_AXES] = {"dp", "tp", "cp", "pp", "ep"};

static int check_mesh(const int64_t mesh[COMM_AXES], const NcclBootstrap *bs, int64_t *world, char *err, size_t errlen) {
  *world = 1;
  for (int a = 0; a < COMM_AXES; a++) {
    if (mesh[a] < 1 || mesh[a] > 65536) return rt_fail(err, errlen, 2, "mesh axis %s has size %lld", axis_name[a], (long long)mesh[a]);
    *world *= mesh[a];
  }
  if (*world != bs->world)
    return rt_fail(err, errlen, 2, "the mesh has %lld ranks but WORLD_SIZE is %d", (long long)*world, bs->world);
  if (bs->rank < 0 || bs->rank >= bs->world) return rt_fail(err, errlen, 2, "rank %d of a world of %d", bs->rank, bs->world);
  return 0;
}

#ifdef LOOM_HAVE_CUDA_HEADERS
/* ================================================================== NCCL */
#include <nccl.h>

#define LOOM_NCCL_FUNCS(X)                                                                                         \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommSplit) X(ncclCommGetAsyncError)          \
  X(ncclCommAbort) X(ncclCommFinalize) X(ncclCommDestroy) X(ncclAllReduce) X(ncclAllGather) X(ncclReduceScatter)   \
  X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetErrorString) X(ncclGetLastError)

typedef struct {
  LOOM_NCCL_FUNCS(LOOM_API_FIELD)
} NcclApi;

static pthread_mutex_t nccl_mu = PTHREAD_MUTEX_INITIALIZER;
static bool nccl_tried, nccl_ok;
static char nccl_msg[1024];
static NcclApi nccl;

#define LOOM_STR2(x) #x
#define LOOM_STR(x) LOOM_STR2(x)
#define LOOM_API_NAME(f) LOOM_STR(f),
#define LOOM_API_COUNT(f) +1

static const NcclApi *nccl_api(char *err, size_t errlen) {
  pthread_mutex_lock(&nccl_mu);
  if (!nccl_tried) {
    nccl_tried = true;
    static const char *const libs[] = {"libnccl.so.2", "libnccl.so"};
    char why[800];
    void *h = cuda_dlopen_first("LOOM_LIBNCCL", libs, 2, why, sizeof why);
    if (!h) {
      snprintf(nccl_msg, sizeof nccl_msg, "NCCL not found (%s): multi-GPU runs need libnccl.so.2 (NCCL >= 2.18)", why);
    } else {
      static const char *const names[] = {LOOM_NCCL_FUNCS(LOOM_API_NAME)};
      enum { N_NCCL = 0 LOOM_NCCL_FUNCS(LOOM_API_COUNT) };
      void *slots[N_NCCL];
      _Static_assert(sizeof slots == sizeof(NcclApi), "NCCL table layout");
      nccl_ok = true;
      for (int i = 0; i < N_NCCL && nccl_ok; i++)
        if (!(slots[i] = dlsym(h, names[i]))) {
          snprintf(nccl_msg, sizeof nccl_msg, "libnccl lacks %s: loom needs NCCL >= 2.18 (ncclCommSplit)", names[i]);
          nccl_ok = false;
        }
      if (nccl_ok) memcpy(&nccl, slots, sizeof slots);
      /* Never dlclosed: NCCL keeps threads of its own. */
    }
  }
  bool ok = nccl_ok;
  if (!ok) snprintf(err, errlen, "%s", nccl_msg);
  pthread_mutex_unlock(&nccl_mu);
  return ok ? &nccl : NULL;
}

int nccl_version(char *err, size_t errlen) {
  const NcclApi *n = nccl_api(err, errlen);
  int v = 0;
  if (!n) return 0;
  if (n->ncclGetVersion(&v) != ncclSuccess) return rt_fail(err, errlen, 0, "ncclGetVersion failed");
  return v;
}

#define FLIGHT 32
typedef struct {
  int64_t seq;          /* 1-based, in the rank's order of collectives */
  char what[200];       /* "all_reduce on tp, 4096 bytes (all_reduce %x)" */
  double t0;            /* when it was called (CLOCK_MONOTONIC seconds) */
  int state;            /* FL_CALLED .. FL_DONE */
} Flight;
enum { FL_CALLED, FL_ENQUEUED, FL_DONE };

typedef struct {
  const NcclApi *n;
  const CudaDriverApi *d;
  void *ctx;
  int device;
  ncclComm_t world;
  ncclComm_t axis[COMM_AXES];   /* NULL: the axis has size 1; == world: as large as the world */
  CUstream own, stream;
  bool wait;
  CUdeviceptr scratch;          /* one float, for barriers */
  double timeout_s;
  atomic_bool aborted;
  pthread_mutex_t mu;
  char last[1024];
  /* the flight recorder: the last FLIGHT collectives of nccl_step (under mu) */
  Flight flight[FLIGHT];
  int64_t n_flight;
  /* the watchdog: when the rank has been inside one NCCL call (busy_ns: since when, 0 when
     not) longer than timeout_s, it reports and aborts every communicator */
  atomic_llong busy_ns;
  atomic_bool dog_stop;
  bool dog_started;
  pthread_t dog;
} World;

static void abort_all(World *w) {
  bool was = atomic_exchange(&w->aborted, true);
  if (was) return;
  for (int a = 0; a < COMM_AXES; a++)
    if (w->axis[a] && w->axis[a] != w->world) w->n->ncclCommAbort(w->axis[a]);
  if (w->world) w->n->ncclCommAbort(w->world);
  for (int a = 0; a < COMM_AXES; a++) w->axis[a] = NULL;
  w->world = NULL;
}

static int nccl_fail(World *w, int rank, ncclResult_t r, ncclComm_t c, const char *what, char *err, size_t errlen) {
  const char *s = w->n->ncclGetErrorString ? w->n->ncclGetErrorString(r) : "";
  const char *last = c && w->n->ncclGetLastError ? w->n->ncclGetLastError(c) : NULL;
  snprintf(err, errlen, "rank %d: %s: %s%s%s", rank, what, s, last && *last ? ": " : "", last && *last ? last : "");
  return 1;
}

/* Polls a non-blocking communicator until its last operation leaves ncclInProgress. */
static int ready(World *w, int rank, ncclComm_t c, ncclResult_t r, const char *what, char *err, size_t errlen) {
  double deadline = now_s() + w->timeout_s, pause = 1e-5;
  if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(w, rank, r, c, what, err, errlen);
  for (;;) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t q = w->n->ncclCommGetAsyncError(c, &st);
    if (q != ncclSuccess) return nccl_fail(w, rank, q, c, what, err, errlen);
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress) return nccl_fail(w, rank, st, c, what, err, errlen);
    if (now_s() > deadline)
      return rt_fail(err, errlen, 1, "rank %d: %s did not finish within %g s (LOOM_NCCL_TIMEOUT)", rank, what, w->timeout_s);
    sleep_s(pause);
    if (pause < 1e-3) pause *= 2;
  }
}

/* Waits for the stream while watching every communicator for asynchronous errors. */
static int drain_stream(World *w, CUstream stream, int rank, const char *what, char *err, size_t errlen) {
  double deadline = now_s() + w->timeout_s, pause = 1e-6;
  for (;;) {
    CUresult q = w->d->cuStreamQuery(stream);
    if (q == CUDA_SUCCESS) return 0;
    if (q != CUDA_ERROR_NOT_READY) {
      char where[160];
      snprintf(where, sizeof where, "rank %d, %s", rank, what);
      return cuda_cu_fail(q, "cuStreamQuery", where, err, errlen);
    }
    for (int a = -1; a < COMM_AXES; a++) {
      ncclComm_t c = a < 0 ? w->world : w->axis[a];
      if (!c || (a >= 0 && c == w->world)) continue;
      ncclResult_t st = ncclSuccess;
      if (w->n->ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
        return nccl_fail(w, rank, st, c, what, err, errlen);
    }
    if (now_s() > deadline)
      return rt_fail(err, errlen, 1, "rank %d: %s did not complete within %g s (a rank died or hangs? LOOM_NCCL_TIMEOUT)", rank,
                  what, w->timeout_s);
    sleep_s(pause);
    if (pause < 1e-4) pause *= 2;
  }
}

static int drain(World *w, int rank, const char *what, char *err, size_t errlen) {
  return drain_stream(w, w->stream, rank, what, err, errlen);
}

static World *world_of(Comm *c) { return c->impl; }

/* Records the failure, aborts every communicator, returns 1. */
static int coll_fail(Comm *c, const char *msg) {
  World *w = world_of(c);
  pthread_mutex_lock(&w->mu);
  if (!w->last[0]) snprintf(w->last, sizeof w->last, "%s", msg);
  pthread_mutex_unlock(&w->mu);
  abort_all(w);
  return 1;
}

/* The communicator of an axis (NULL for a size-1 axis), or an error if aborted. */
static int coll_begin(Comm *c, int axis, ncclComm_t *comm) {
  World *w = world_of(c);
  if (atomic_load(&w->aborted) || axis < 0 || axis >= COMM_AXES) return 1;
  *comm = w->axis[axis];
  char err[256];
  if (cuda_set_current(w->ctx, err, sizeof err)) return coll_fail(c, err);
  return 0;
}

static int coll_end(Comm *c, ncclComm_t comm, ncclResult_t r, const char *name, int axis, int64_t n) {
  World *w = world_of(c);
  char what[128], err[1024];
  snprintf(what, sizeof what, "%s on axis %s (%lld floats)", name, axis >= 0 ? axis_name[axis] : "world", (long long)n);
  if (comm && ready(w, c->rank, comm, r, what, err, sizeof err)) return coll_fail(c, err);
  if (w->wait && drain(w, c->rank, what, err, sizeof err)) return coll_fail(c, err);
  return 0;
}

static int local_copy(Comm *c, const float *in, float *out, int64_t n, const char *name, int axis) {
  World *w = world_of(c);
  if (in == out || n == 0) return coll_end(c, NULL, ncclSuccess, name, axis, n);
  char where[128], err[512];
  snprintf(where, sizeof where, "(rank %d, %s on a size-1 axis)", c->rank, name);
  if (cuda_cu_fail(w->d->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)in, sizeof(float) * (size_t)n,
                                            w->stream),
                   "cuMemcpyDtoDAsync", where, err, sizeof err))
    return coll_fail(c, err);
  return coll_end(c, NULL, ncclSuccess, name, axis, n);
}

static int n_all_reduce(Comm *c, int axis, float *buf, int64_t n, bool max) {
  ncclComm_t comm;
  if (coll_begin(c, axis, &comm)) return 1;
  if (!comm) return coll_end(c, NULL, ncclSuccess, "all_reduce", axis, n);
  World *w = world_of(c);
  ncclResult_t r = w->n->ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, max ? ncclMax : ncclSum, comm, w->stream);
  return coll_end(c, comm, r, "all_reduce", axis, n);
}

static int n_all_gather(Comm *c, int axis, const float *in, float *out, int64_t n) {
  ncclComm_t comm;
  if (coll_begin(c, axis, &comm)) return 1;
  if (!comm) return local_copy(c, in, out, n, "all_gather", axis);
  World *w = world_of(c);
  ncclResult_t r = w->n->ncclAllGather(in, out, (size_t)n, ncclFloat32, comm, w->stream);
  return coll_end(c, comm, r, "all_gather", axis, n);
}

static int n_reduce_scatter(Comm *c, int axis, const float *in, float *out, int64_t n_out) {
  ncclComm_t comm;
  if (coll_begin(c, axis, &comm)) return 1;
  if (!comm) return local_copy(c, in, out, n_out, "reduce_scatter", axis);
  World *w = world_of(c);
  ncclResult_t r = w->n->ncclReduceScatter(in, out, (size_t)n_out, ncclFloat32, ncclSum, comm, w->stream);
  return coll_end(c, comm, r, "reduce_scatter", axis, n_out);
}

static int n_all_to_all(Comm *c, int axis, const float *in, float *out, int64_t n_chunk) {
  ncclComm_t comm;
  if (coll_begin(c, axis, &comm)) return 1;
  if (!comm) return local_copy(c, in, out, n_chunk, "all_to_all", axis);
  World *w = world_of(c);
  int size = (int)c->mesh[axis];
  /* Grouped sends and receives (ncclAlltoAll is only in NCCL >= 2.28). */
  ncclResult_t r = w->n->ncclGroupStart();
  for (int p = 0; r == ncclSuccess && p < size; p++) {
    r = w->n->ncclSend(in + (int64_t)p * n_chunk, (size_t)n_chunk, ncclFloat32, p, comm, w->stream);
    if (r == ncclSuccess || r == ncclInProgress)
      r = w->n->ncclRecv(out + (int64_t)p * n_chunk, (size_t)n_chunk, ncclFloat32, p, comm, w->stream);
    if (r == ncclInProgress) r = ncclSuccess;
  }
  ncclResult_t e = w->n->ncclGroupEnd();
  return coll_end(c, comm, r != ncclSuccess ? r : e, "all_to_all", axis, n_chunk);
}

static int n_barrier(Comm *c) {
  World *w = world_of(c);
  if (atomic_load(&w->aborted)) return 1;
  char err[256];
  if (cuda_set_current(w->ctx, err, sizeof err)) return coll_fail(c, err);
  if (!w->world) return 0;
  float *s = (float *)(uintptr_t)w->scratch;
  ncclResult_t r = w->n->ncclAllReduce(s, s, 1, ncclFloat32, ncclSum, w->world, w->stream);
  bool keep = w->wait;
  w->wait = true;   /* a barrier always waits */
  int rc = coll_end(c, w->world, r, "barrier", -1, 1);
  w->wait = keep;
  return rc;
}

const char *nccl_last_error(const Comm *c) { return c && c->impl ? ((World *)c->impl)->last : ""; }

void nccl_world_abort(Comm *c) {
  if (c && c->impl) abort_all(c->impl);
}

int nccl_set_stream(Comm *c, void *stream, bool wait, char *err, size_t errlen) {
  World *w = world_of(c);
  w->stream = stream ? (CUstream)stream : w->own;
  w->wait = wait;
  return 0;
}

int nccl_wait(Comm *c, char *err, size_t errlen) {
  World *w = world_of(c);
  if (atomic_load(&w->aborted)) return rt_fail(err, errlen, 1, "%s", w->last[0] ? w->last : "the NCCL world was aborted");
  if (cuda_set_current(w->ctx, err, errlen)) return 1;
  if (drain(w, c->rank, "waiting for the enqueued collectives", err, errlen)) {
    coll_fail(c, err);
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- a lowered program's collectives */

static ncclDataType_t nccl_type(int storage, int *size) {
  switch (storage) {
  case RT_ST_F32: *size = 4; return ncclFloat32;
  case RT_ST_BF16: *size = 2; return ncclBfloat16;
  case RT_ST_F16: *size = 2; return ncclFloat16;
  case RT_ST_I32: *size = 4; return ncclInt32;
  default: *size = 0; return ncclFloat32;
  }
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The flight recorder's report: the collective(s) not finished and the last ones finished. */
static void flight_report(World *w, int rank, char *out, size_t n) {
  size_t at = 0;
  out[0] = 0;
  pthread_mutex_lock(&w->mu);
  int64_t first = w->n_flight > FLIGHT ? w->n_flight - FLIGHT : 0;
  int done = 0;
  for (int64_t k = w->n_flight - 1; k >= first && at + 1 < n; k--) {
    const Flight *f = &w->flight[k % FLIGHT];
    if (f->state == FL_DONE && ++done > 3) continue;
    static const char *const state[] = {"did not return (waiting for the other ranks)", "enqueued, not completed",
                                        "finished"};
    at += (size_t)snprintf(out + at, n - at, "\n  rank %d: collective #%lld %s: %s, called %.1f s ago", rank, (long long)f->seq,
                           f->what, state[f->state], now_s() - f->t0);
  }
  if (!w->n_flight && at + 1 < n) snprintf(out + at, n - at, "\n  rank %d: no collective of the program ran yet", rank);
  pthread_mutex_unlock(&w->mu);
}

static void *watchdog(void *arg) {
  Comm *c = arg;
  World *w = c->impl;
  while (!atomic_load(&w->dog_stop)) {
    sleep_s(0.05);
    int64_t busy = atomic_load(&w->busy_ns);
    if (!busy || (double)(now_ns() - busy) * 1e-9 <= w->timeout_s || atomic_load(&w->aborted)) continue;
    char rep[2048];
    flight_report(w, c->rank, rep, sizeof rep);
    fprintf(stderr, "loom: rank %d: a collective did not complete within %g s (--nccl-timeout); aborting this rank's "
            "communicators (NCCL's ncclCommAbort)%s\n", c->rank, w->timeout_s, rep);
    pthread_mutex_lock(&w->mu);
    if (!w->last[0])
      snprintf(w->last, sizeof w->last, "rank %d: a collective did not complete within %g s (--nccl-timeout)", c->rank,
               w->timeout_s);
    pthread_mutex_unlock(&w->mu);
    abort_all(w);
    /* The call should now fail; a rank still stuck in it after a grace period ends itself. */
    for (int k = 0; k < 200 && atomic_load(&w->busy_ns) == busy && !atomic_load(&w->dog_stop); k++) sleep_s(0.05);
    if (atomic_load(&w->busy_ns) == busy && !atomic_load(&w->dog_stop)) {
      fprintf(stderr, "loom: rank %d: still blocked in NCCL 10 s after the abort; exiting\n", c->rank);
      fflush(stderr);
      _exit(1);
    }
    return NULL;
  }
  return NULL;
}

/* The fault tests' hook: LOOM_NCCL_FAULT=hang:R:N or kill:R:N makes rank R, before its
   collective #N, stop forever (never reaching it) or die by SIGKILL. */
static void test_fault(int rank, int64_t seq) {
  const char *f = getenv("LOOM_NCCL_FAULT");
  char what[8];
  int r;
  long long n;
  if (!f || sscanf(f, "%7[a-z]:%d:%lld", what, &r, &n) != 3 || r != rank || n != seq) return;
  fprintf(stderr, "loom: rank %d: LOOM_NCCL_FAULT=%s: %s before collective #%lld\n", rank, f,
          strcmp(what, "kill") ? "stopping forever" : "dying", n);
  fflush(stderr);
  if (!strcmp(what, "kill")) raise(SIGKILL);
  for (;;) pause();
}

/* A collective's or a send/recv group's end: wait for NCCL to take it (comm NULL: nothing
   was issued), then the flight entry enqueued, or the world failed with the flight report. */
static int flight_end(World *w, Comm *c, Flight *fl, ncclComm_t comm, ncclResult_t r, const char *what, char *err,
                      size_t errlen) {
  char m[1024];
  int rc = comm ? ready(w, c->rank, comm, r, what, m, sizeof m) : 0;
  atomic_store(&w->busy_ns, 0);
  if (rc || atomic_load(&w->aborted)) {
    if (!rc) snprintf(m, sizeof m, "%s", w->last[0] ? w->last : "the NCCL world was aborted");
    coll_fail(c, m);
    char rep[2048];
    flight_report(w, c->rank, rep, sizeof rep);
    return rt_fail(err, errlen, 1, "%s%s", m, rep);
  }
  pthread_mutex_lock(&w->mu);
  fl->state = FL_ENQUEUED;
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int nccl_step(Comm *c, int builtin, const int64_t *i, int storage, const void *x, void *y, void *stream, const char *label,
              char *err, size_t errlen) {
  World *w = world_of(c);
  test_fault(c->rank, w->n_flight + 1);
  int es;
  ncclDataType_t dt = nccl_type(storage, &es);
  if (!es) return rt_fail(err, errlen, 2, "%s: NCCL moves f32, bf16, f16 and i32, not storage %d", label, storage);
  int axis = (int)(builtin == RT_B_ALL_REDUCE ? i[1] : i[0]);
  if (axis < 0 || axis >= COMM_AXES) return rt_fail(err, errlen, 2, "%s: no mesh axis %d", label, axis);
  int64_t size = c->mesh[axis], n = 0;
  const char *name = "all_reduce";
  const char *xb = x;
  char *yb = y;
  CUstream st = (CUstream)stream;
  switch (builtin) {
  case RT_B_ALL_REDUCE: n = i[0]; break;
  case RT_B_ALL_GATHER: name = "all_gather"; n = i[2] * i[3] * i[4] * size; break;
  case RT_B_REDUCE_SCATTER: name = "reduce_scatter"; n = i[2] * i[3] * i[4] * size; break;
  case RT_B_ALL_TO_ALL:
    name = "all_to_all";
    n = i[2] * i[3] * i[4] * size;
    if (!((i[2] == 1 && i[5] == 1) || (i[2] == i[5] && i[3] * i[4] == i[6] * i[7])))
      return rt_fail(err, errlen, 2, "%s: an all_to_all whose chunks are not contiguous rows of equal size on both sides "
                  "is not supported by the NCCL path", label);
    break;
  default: return rt_fail(err, errlen, 2, "%s: builtin %d is not a collective", label, builtin);
  }
  if (i[builtin == RT_B_ALL_REDUCE ? 2 : 1] != size)
    return rt_fail(err, errlen, 2, "%s: the program's axis %s has %lld ranks, this world's %lld", label, axis_name[axis],
                (long long)i[builtin == RT_B_ALL_REDUCE ? 2 : 1], (long long)size);
  ncclComm_t comm;
  if (coll_begin(c, axis, &comm))
    return rt_fail(err, errlen, 1, "%s", w->last[0] ? w->last : "the NCCL world was aborted");
  Flight *fl;
  pthread_mutex_lock(&w->mu);
  fl = &w->flight[w->n_flight % FLIGHT];
  fl->seq = ++w->n_flight;
  snprintf(fl->what, sizeof fl->what, "%s on %s, %lld bytes (%s)", name, axis_name[axis], (long long)(n * es), label);
  fl->t0 = now_s();
  fl->state = FL_CALLED;
  char what[256];
  snprintf(what, sizeof what, "collective #%lld %s", (long long)fl->seq, fl->what);
  pthread_mutex_unlock(&w->mu);
  atomic_store(&w->busy_ns, now_ns());
  ncclResult_t r = ncclSuccess;
  int64_t chunk = n / size;
  if (!comm) {   /* a size-1 axis: the result is the input */
    if (x != y && n) {
      char m[512];
      if (cuda_cu_fail(w->d->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)y, (CUdeviceptr)(uintptr_t)x, (size_t)(n * es), st),
                       "cuMemcpyDtoDAsync", what, m, sizeof m)) {
        atomic_store(&w->busy_ns, 0);
        coll_fail(c, m);
        return rt_fail(err, errlen, 1, "%s", m);
      }
    }
  } else if (builtin == RT_B_ALL_REDUCE) {
    r = w->n->ncclAllReduce(x, y, (size_t)n, dt, i[3] ? ncclMax : ncclSum, comm, st);
  } else if (builtin == RT_B_ALL_TO_ALL) {
    /* grouped sends and receives: per peer, each outer row's chunk (one when contiguous) */
    int64_t rows = i[2], cnt = i[3] * i[4];
    r = w->n->ncclGroupStart();
    for (int p = 0; p < size && (r == ncclSuccess || r == ncclInProgress); p++)
      for (int64_t o = 0; o < rows && (r == ncclSuccess || r == ncclInProgress); o++) {
        r = w->n->ncclSend(xb + (o * size * cnt + p * cnt) * es, (size_t)cnt, dt, p, comm, st);
        if (r == ncclSuccess || r == ncclInProgress)
          r = w->n->ncclRecv(yb + (o * size * cnt + p * cnt) * es, (size_t)cnt, dt, p, comm, st);
      }
    ncclResult_t e = w->n->ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
  } else {
    /* all_gather / reduce_scatter along a dim: one call per outer row (NCCL's chunks are
       contiguous), grouped */
    int64_t rows = i[2], piece = i[3] * i[4];
    (void)chunk;
    r = rows > 1 ? w->n->ncclGroupStart() : ncclSuccess;
    for (int64_t o = 0; o < rows && (r == ncclSuccess || r == ncclInProgress); o++) {
      if (builtin == RT_B_ALL_GATHER)
        r = w->n->ncclAllGather(xb + o * piece * es, yb + o * size * piece * es, (size_t)piece, dt, comm, st);
      else r = w->n->ncclReduceScatter(xb + o * size * piece * es, yb + o * piece * es, (size_t)piece, dt, ncclSum, comm, st);
    }
    if (rows > 1) {
      ncclResult_t e = w->n->ncclGroupEnd();
      if (r == ncclSuccess || r == ncclInProgress) r = e;
    }
  }
  return flight_end(w, c, fl, comm, r, what, err, errlen);
}

int nccl_p2p_group(Comm *c, int axis, int n, const NcclP2p *ops, void *stream, const char *label, char *err,
                   size_t errlen) {
  World *w = world_of(c);
  test_fault(c->rank, w->n_flight + 1);
  if (axis < 0 || axis >= COMM_AXES) return rt_fail(err, errlen, 2, "%s: no mesh axis %d", label, axis);
  int64_t size = c->mesh[axis], out = 0, in = 0;
  if (n < 1) return rt_fail(err, errlen, 2, "%s: an empty send/recv group", label);
  if (size < 2) return rt_fail(err, errlen, 2, "%s: point-to-point on %s, an axis of size 1", label, axis_name[axis]);
  for (int k = 0; k < n; k++) {
    int es;
    nccl_type(ops[k].storage, &es);
    if (!es) return rt_fail(err, errlen, 2, "%s: NCCL moves f32, bf16, f16 and i32, not storage %d", label, ops[k].storage);
    if (ops[k].peer < 0 || ops[k].peer >= size || ops[k].peer == c->coord[axis] || ops[k].count < 0 || (ops[k].count && !ops[k].buf))
      return rt_fail(err, errlen, 2, "%s: a %s with peer %d on %s (this rank is %d of %lld)", label, ops[k].send ? "send" : "recv",
                  ops[k].peer, axis_name[axis], c->coord[axis], (long long)size);
    *(ops[k].send ? &out : &in) += ops[k].count * es;
  }
  ncclComm_t comm;
  if (coll_begin(c, axis, &comm))
    return rt_fail(err, errlen, 1, "%s", w->last[0] ? w->last : "the NCCL world was aborted");
  if (!comm) return rt_fail(err, errlen, 2, "%s: no communicator for %s", label, axis_name[axis]);
  Flight *fl;
  pthread_mutex_lock(&w->mu);
  fl = &w->flight[w->n_flight % FLIGHT];
  fl->seq = ++w->n_flight;
  if (out == in)
    snprintf(fl->what, sizeof fl->what, "send/recv group of %d on %s, %lld bytes each way (%s)", n, axis_name[axis],
             (long long)out, label);
  else
    snprintf(fl->what, sizeof fl->what, "send/recv group of %d on %s, %lld bytes out, %lld in (%s)", n, axis_name[axis],
             (long long)out, (long long)in, label);
  fl->t0 = now_s();
  fl->state = FL_CALLED;
  char what[256];
  snprintf(what, sizeof what, "collective #%lld %s", (long long)fl->seq, fl->what);
  pthread_mutex_unlock(&w->mu);
  atomic_store(&w->busy_ns, now_ns());
  CUstream st = (CUstream)stream;
  ncclResult_t r = w->n->ncclGroupStart();
  for (int k = 0; k < n && (r == ncclSuccess || r == ncclInProgress); k++) {
    int es;
    ncclDataType_t dt = nccl_type(ops[k].storage, &es);
    r = ops[k].send ? w->n->ncclSend(ops[k].buf, (size_t)ops[k].count, dt, ops[k].peer, comm, st)
                    : w->n->ncclRecv(ops[k].buf, (size_t)ops[k].count, dt, ops[k].peer, comm, st);
  }
  ncclResult_t e = w->n->ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = e;
  return flight_end(w, c, fl, comm, r, what, err, errlen);
}

int nccl_sync(Comm *c, void *stream, const char *what, char *err, size_t errlen) {
  World *w = world_of(c);
  if (atomic_load(&w->aborted)) return rt_fail(err, errlen, 1, "%s", w->last[0] ? w->last : "the NCCL world was aborted");
  if (cuda_set_current(w->ctx, err, errlen)) return 1;
  char m[1024];
  atomic_store(&w->busy_ns, now_ns());
  int rc = drain_stream(w, (CUstream)stream, c->rank, what, m, sizeof m);
  atomic_store(&w->busy_ns, 0);
  if (rc) {
    coll_fail(c, m);
    char rep[2048];
    flight_report(w, c->rank, rep, sizeof rep);
    return rt_fail(err, errlen, 1, "%s%s", m, rep);
  }
  pthread_mutex_lock(&w->mu);
  for (int k = 0; k < FLIGHT; k++)
    if (w->flight[k].state == FL_ENQUEUED) w->flight[k].state = FL_DONE;
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int nccl_all_gather_host(Comm *c, const float *mine, float *all, int64_t n, char *err, size_t errlen) {
  World *w = world_of(c);
  if (atomic_load(&w->aborted)) return rt_fail(err, errlen, 1, "%s", w->last[0] ? w->last : "the NCCL world was aborted");
  if (cuda_set_current(w->ctx, err, errlen)) return 1;
  if (c->world == 1 || n == 0) {
    memcpy(all, mine, sizeof(float) * (size_t)n);
    return 0;
  }
  const CudaDriverApi *d = w->d;
  size_t bytes = sizeof(float) * (size_t)n;
  CUdeviceptr din = 0, dout = 0;
  char where[96], m[1024] = "";
  snprintf(where, sizeof where, "(rank %d, gathering the pieces of a tensor)", c->rank);
  int rc = cuda_cu_fail(d->cuMemAlloc(&din, bytes), "cuMemAlloc", where, m, sizeof m);
  if (!rc) rc = cuda_cu_fail(d->cuMemAlloc(&dout, bytes * (size_t)c->world), "cuMemAlloc", where, m, sizeof m);
  if (!rc) rc = cuda_cu_fail(d->cuMemcpyHtoDAsync(din, mine, bytes, w->own), "cuMemcpyHtoDAsync", where, m, sizeof m);
  if (!rc) {
    atomic_store(&w->busy_ns, now_ns());
    ncclResult_t r = w->n->ncclAllGather((const void *)(uintptr_t)din, (void *)(uintptr_t)dout, (size_t)n, ncclFloat32,
                                         w->world, w->own);
    rc = ready(w, c->rank, w->world, r, "all_gather of a tensor's pieces over the world", m, sizeof m);
    if (!rc) rc = drain_stream(w, w->own, c->rank, "all_gather of a tensor's pieces over the world", m, sizeof m);
    atomic_store(&w->busy_ns, 0);
    if (rc) coll_fail(c, m);
  }
  if (!rc) rc = cuda_cu_fail(d->cuMemcpyDtoHAsync(all, dout, bytes * (size_t)c->world, w->own), "cuMemcpyDtoHAsync", where, m, sizeof m);
  if (!rc) rc = cuda_cu_fail(d->cuStreamSynchronize(w->own), "cuStreamSynchronize", where, m, sizeof m);
  if (din) d->cuMemFree(din);
  if (dout) d->cuMemFree(dout);
  return rc ? rt_fail(err, errlen, 1, "%s", m) : 0;
}

int nccl_device(const Comm *c) { return c && c->impl ? ((const World *)c->impl)->device : -1; }

void nccl_world_free(Comm *c) {
  if (!c) return;
  World *w = c->impl;
  if (w && w->dog_started) {
    atomic_store(&w->dog_stop, true);
    pthread_join(w->dog, NULL);
  }
  if (w) {
    char err[512];
    bool ctx_ok = w->ctx && !cuda_set_current(w->ctx, err, sizeof err);
    if (!atomic_load(&w->aborted) && ctx_ok && w->stream) w->d->cuStreamSynchronize(w->stream);
    /* Finalize (flushes, non-blocking: poll), then destroy; abort whatever does not finish. */
    ncclComm_t all[COMM_AXES + 1];
    int n = 0;
    for (int a = 0; a < COMM_AXES; a++)
      if (w->axis[a] && w->axis[a] != w->world) all[n++] = w->axis[a];
    if (w->world) all[n++] = w->world;
    bool bad = atomic_load(&w->aborted);
    for (int i = 0; i < n && !bad; i++)
      bad = ready(w, c->rank, all[i], w->n->ncclCommFinalize(all[i]), "ncclCommFinalize", err, sizeof err) != 0;
    if (bad) abort_all(w);
    else
      for (int i = 0; i < n; i++) w->n->ncclCommDestroy(all[i]);
    if (ctx_ok) {
      if (w->scratch) w->d->cuMemFree(w->scratch);
      if (w->own) w->d->cuStreamDestroy(w->own);
    }
    if (w->ctx) cuda_device_release(w->device);
    pthread_mutex_destroy(&w->mu);
    free(w);
  }
  free(c);
}

int nccl_world_new(const int64_t mesh[COMM_AXES], const NcclBootstrap *bs, Comm **out, char *err, size_t errlen) {
  *out = NULL;
  NcclBootstrap env;
  if (!bs) {
    int rc = nccl_bootstrap_from_env(&env, err, errlen);
    if (rc) return rc;
    bs = &env;
  }
  int64_t world;
  int rc0 = check_mesh(mesh, bs, &world, err, errlen);
  if (rc0) return rc0;
  const int rank = bs->rank;
  /* The device first: without a driver there is nothing NCCL could do. */
  char why[1024];
  if (!cuda_available(why, sizeof why)) return rt_fail(err, errlen, 1, "rank %d: NCCL needs a GPU: %s", rank, why);
  const NcclApi *n = nccl_api(err, errlen);
  if (!n) return 1;
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  Comm *c = calloc(1, sizeof *c);
  World *w = calloc(1, sizeof *w);
  if (!c || !w) {
    free(c);
    free(w);
    return rt_fail(err, errlen, 1, "out of memory");
  }
  pthread_mutex_init(&w->mu, NULL);
  atomic_init(&w->aborted, false);
  w->n = n;
  w->d = d;
  w->wait = true;
  w->timeout_s = bs->timeout_s > 0 ? bs->timeout_s : 300;
  c->impl = w;
  c->rank = rank;
  c->world = bs->world;
  memcpy(c->mesh, mesh, sizeof c->mesh);
  mesh_coords_of(c->mesh, rank, c->coord);
  c->all_reduce = n_all_reduce;
  c->all_gather = n_all_gather;
  c->reduce_scatter = n_reduce_scatter;
  c->all_to_all = n_all_to_all;
  c->barrier = n_barrier;
  int count = 0, rc = cuda_device_count(&count, err, errlen);
  w->device = bs->device >= 0 ? bs->device : count > 0 ? rank % count : 0;
  if (!rc && w->device >= count)
    rc = rt_fail(err, errlen, 2, "rank %d: LOCAL_RANK %d but this machine has %d GPU%s", rank, w->device, count,
              count == 1 ? "" : "s");
  if (!rc && cuda_device_retain(w->device, &w->ctx, err, errlen)) rc = 1;
  char where[96];
  snprintf(where, sizeof where, "(rank %d, NCCL set-up)", rank);
  if (!rc) rc = cuda_cu_fail(d->cuStreamCreate(&w->own, CU_STREAM_NON_BLOCKING), "cuStreamCreate", where, err, errlen);
  w->stream = w->own;
  if (!rc) rc = cuda_cu_fail(d->cuMemAlloc(&w->scratch, sizeof(float)), "cuMemAlloc", where, err, errlen);
  /* The unique id: rank 0 makes it and hands it out; with NCCL_COMM_ID every rank makes the
     same one from that address. */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  _Static_assert(sizeof id == NCCL_ID_BYTES, "ncclUniqueId size");
  if (!rc && (rank == 0 || bs->use_comm_id)) {
    ncclResult_t r = n->ncclGetUniqueId(&id);
    if (r != ncclSuccess) rc = nccl_fail(w, rank, r, NULL, "ncclGetUniqueId", err, errlen);
  }
  if (!rc && !bs->use_comm_id)
    rc = nccl_rendezvous(bs->addr, bs->port, rank, bs->world, (unsigned char *)id.internal, w->timeout_s, err, errlen);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "loom";
  if (!rc) {
    ncclResult_t r = n->ncclCommInitRankConfig(&w->world, bs->world, id, rank, &cfg);
    if (w->world) rc = ready(w, rank, w->world, r, "ncclCommInitRankConfig (the world)", err, errlen);
    else rc = nccl_fail(w, rank, r, NULL, "ncclCommInitRankConfig (the world)", err, errlen);
  }
  /* One communicator per axis, every rank in the same order (dp, tp, cp, pp, ep). */
  for (int a = 0; !rc && a < COMM_AXES; a++) {
    if (mesh[a] == 1) continue;
    if (mesh[a] == world) {
      w->axis[a] = w->world;
      continue;
    }
    int co[COMM_AXES];
    memcpy(co, c->coord, sizeof co);
    co[a] = 0;
    int color = mesh_rank_of(c->mesh, co), key = c->coord[a];
    char what[96];
    snprintf(what, sizeof what, "ncclCommSplit (axis %s, color %d, key %d)", axis_name[a], color, key);
    ncclComm_t sub = NULL;
    ncclResult_t r = n->ncclCommSplit(w->world, color, key, &sub, &cfg);
    /* The split is an operation of the parent as well: both must settle. */
    rc = ready(w, rank, w->world, r, what, err, errlen);
    if (!rc && !sub) rc = rt_fail(err, errlen, 1, "rank %d: %s gave no communicator", rank, what);
    w->axis[a] = sub;
    if (!rc) rc = ready(w, rank, sub, ncclSuccess, what, err, errlen);
  }
  if (rc) {
    abort_all(w);
    nccl_world_free(c);
    return rc;
  }
  atomic_init(&w->busy_ns, 0);
  atomic_init(&w->dog_stop, false);
  w->dog_started = pthread_create(&w->dog, NULL, watchdog, c) == 0;
  *out = c;
  return 0;
}

#else /* built without the CUDA headers */

#define NO_CUDA "this loom was built without the CUDA headers (cuda.h, nccl.h): NCCL is not available"

int nccl_version(char *err, size_t errlen) { return rt_fail(err, errlen, 0, "%s", NO_CUDA); }
int nccl_world_new(const int64_t mesh[COMM_AXES], const NcclBootstrap *bs, Comm **out, char *err, size_t errlen) {
  *out = NULL;
  NcclBootstrap env;
  int64_t world;
  int rc = bs ? 0 : nccl_bootstrap_from_env(&env, err, errlen);
  if (!rc) rc = check_mesh(mesh, bs ? bs : &env, &world, err, errlen);
  return rc ? rc : rt_fail(err, errlen, 1, "rank %d: %s", (bs ? bs : &env)->rank, NO_CUDA);
}
void nccl_world_free(Comm *c) { free(c); }
void nccl_world_abort(Comm *c) { (void)c; }
const char *nccl_last_error(const Comm *c) { return ""; }
int nccl_set_stream(Comm *c, void *stream, bool wait, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }
int nccl_wait(Comm *c, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }
int nccl_step(Comm *c, int builtin, const int64_t *i, int storage, const void *x, void *y, void *stream, const char *label,
              char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int nccl_p2p_group(Comm *c, int axis, int n, const NcclP2p *ops, void *stream, const char *label, char *err,
                   size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int nccl_sync(Comm *c, void *stream, const char *what, char *err, size_t errlen) { return rt_fail(err, errlen, 1, "%s", NO_CUDA); }
int nccl_all_gather_host(Comm *c, const float *mine, float *all, int64_t n, char *err, size_t errlen) {
  return rt_fail(err, errlen, 1, "%s", NO_CUDA);
}
int nccl_device(const Comm *c) { return -1; }

#endif
