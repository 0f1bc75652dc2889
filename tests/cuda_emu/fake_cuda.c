/* tests/cuda_emu/fake_cuda.c — a test double of the CUDA driver (libcuda) for the emulated
 * device.
 *
 * `loom` loads it through LOOM_LIBCUDA.  One device, "loom emulated device" (LOOM_EMU_DEVICES=N
 * shows it as N ordinals, so that each process of a mesh takes its own LOCAL_RANK): compute
 * capability LOOM_EMU_CC (default 90), 132 SMs, 227 KiB of opt-in shared memory, 80 GiB.
 * Device memory is host memory (a CUdeviceptr is a host address); every allocation ends at a
 * guard page, so a kernel that writes past an allocation faults at once.  Streams are
 * synchronous, but for copies into page-locked host memory (cuMemAllocHost): those land when
 * the host waits for them (cuStreamSynchronize, cuEventSynchronize), as on a GPU.  A "module" is the shared object fake_nvrtc.c made; a launch runs it through
 * its loom_emu_launch (emu.h).  A failed launch (a deadlock, a warp op with exited lanes, a
 * bad launch shape) prints what happened and is sticky, as a kernel fault is on a GPU: every
 * later synchronization fails until cuDevicePrimaryCtxReset.
 * Tensor maps: cuTensorMapEncodeTiled checks its arguments as the driver API documents them
 * and writes the emulator's encoding (emu_tmap.h); a kernel whose module marks it
 * (LOOM_TMAP_KERNEL, emu.h) takes its LoomTmaps as a second parameter.
 * Stream capture and graphs: between cuStreamBeginCapture and cuStreamEndCapture a stream
 * records its kernel launches (with a copy of their LoomArgs parameter, and of the tensor maps of
 * a kernel that takes them), memsets, copies
 * within the device (cuMemcpyDtoDAsync: a whole training step's graph moves each micro-batch's
 * tokens in and its loss out) and host functions (cuLaunchHostFunc: how the cuBLASLt double
 * captures a GEMM) instead of running them; a copy to or from the host, a synchronization of
 * the stream, an event, or a graph
 * launch on it is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidates the capture,
 * as the driver does.  cuGraphLaunch replays the recorded operations in order.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "emu_tmap.h"

#define TOTAL_MEM (80ull << 30)
#define SMEM_OPTIN 232448
#define SMEM_DEFAULT 49152

typedef int (*LaunchFn)(void *fn, void *arg, const unsigned grid[3], const unsigned block[3], unsigned smem, char *err,
                        size_t errlen);
typedef int (*LaunchMapsFn)(void *fn, void *arg, const void *maps, const unsigned grid[3], const unsigned block[3],
                            unsigned smem, char *err, size_t errlen);

typedef struct Function Function;
typedef struct {
  void *lib;
  LaunchFn launch;
  LaunchMapsFn launch_maps;   /* kernels that take tensor maps (emu_tail.h) */
  Function *functions;   /* freed with the module */
} Module;

struct Function {
  Function *next;
  Module *mod;
  void *fn;
  int max_dynamic_smem;
  int tmaps;   /* a second parameter: LoomTmaps (the module's NAME_loom_tmaps symbol, emu.h) */
  char name[128];
};

typedef struct {
  void *base, *ptr;
  size_t map_bytes, bytes;
} Alloc;

/* Every loom kernel takes one parameter, the LoomArgs of runtime/cuda/cuda_exec.h
   (CudaLoomArgs: 16 pointers, 40 long longs, 4 doubles); a captured launch keeps a copy. */
#define LOOM_ARGS_BYTES 480
/* A kernel marked LOOM_TMAP_KERNEL takes a second: LoomTmaps, four 128-byte tensor maps */
#define LOOM_TMAPS_BYTES 512

typedef enum { NODE_KERNEL, NODE_MEMSET, NODE_HOST, NODE_COPY } NodeKind;
typedef struct {
  NodeKind kind;
  Function *f;
  unsigned grid[3], block[3], smem;
  unsigned char args[LOOM_ARGS_BYTES];
  _Alignas(64) unsigned char maps[LOOM_TMAPS_BYTES];
  CUdeviceptr dst, src;   /* src: NODE_COPY's */
  unsigned char value;
  size_t n;
  CUhostFn fn;
  void *data;
} Node;

typedef struct {
  Node *nodes;
  int n, cap;
} Graph;   /* a CUgraph and a CUgraphExec alike */

typedef struct {
  int capturing;   /* between cuStreamBeginCapture and cuStreamEndCapture */
  int invalid;     /* something unsupported was issued while capturing */
  Graph *graph;
} Stream;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Alloc *allocs;
static int n_allocs, cap_allocs;
static size_t allocated;
static CUresult sticky = CUDA_SUCCESS;
static int initialized;
/* initial-exec: static TLS, not __tls_get_addr.  This library is dlopened, and GCC 12's
   LeakSanitizer crashed at exit scanning its dynamic TLS ("Tracer caught signal 11"). */
static __thread __attribute__((tls_model("initial-exec"))) CUcontext current;
static int ctx_token;   /* the primary context is &ctx_token */

static int cc(void) {
  const char *e = getenv("LOOM_EMU_CC");
  int v = e && *e ? atoi(e) : 90;
  return v >= 50 && v < 200 ? v : 90;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  switch (r) {
  case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
  case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
  case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
  case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
  case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
  case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
  case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
  case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
  case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *s = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
  default: *s = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
  CUresult rc = cuGetErrorName(r, s);
  if (rc == CUDA_SUCCESS && r == CUDA_ERROR_LAUNCH_FAILED) *s = "unspecified launch failure (emulated device; see stderr)";
  return rc;
}

CUresult cuInit(unsigned flags) {
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  initialized = 1;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  const char *e = getenv("LOOM_EMU_DEVICES");
  *n = e && atoi(e) > 0 ? atoi(e) : 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  int n = 0;
  CUresult r = cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS) return r;
  if (ordinal < 0 || ordinal >= n) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;   /* every ordinal is the one emulated device (LOOM_EMU_DEVICES) */
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "loom emulated device (sm_%d)", cc());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = cc() / 10; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = cc() % 10; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = SMEM_OPTIN; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = SMEM_DEFAULT; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)TOTAL_MEM;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = (CUcontext)&ctx_token;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

CUresult cuDevicePrimaryCtxReset(CUdevice d) {
  if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu);
  sticky = CUDA_SUCCESS;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
  current = c;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *c) {
  if (!c) return CUDA_ERROR_INVALID_VALUE;
  *c = current;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *d) {
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  *d = 0;
  return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static CUresult sync_status(void) {
  pthread_mutex_lock(&mu);
  CUresult r = sticky;
  pthread_mutex_unlock(&mu);
  return r;
}

static void land_locked(long seq);
static long n_graphs, graphs_waited;
CUresult cuCtxSynchronize(void) {
  pthread_mutex_lock(&mu);
  land_locked(LONG_MAX);
  graphs_waited = n_graphs;
  pthread_mutex_unlock(&mu);
  return sync_status();
}
/* LOOM_EMU_STATS=1: at exit, how the work reached the device (kernels launched one by one,
   graphs launched and the kernels they replayed), for the tests of CUDA graphs; and every
   cuMemAlloc's size in bytes, in order (as asked, before rounding), for the test that the memory
   plan counts what the runtime allocates (tests/cli/cuda_memory.sh). */
static long n_direct, n_replayed;
/* and how the host waited: stream and event synchronizations, and the graph launches issued
   while the graph launched before them had not been waited for (by a synchronization of the
   stream or of an event recorded after it): the training loop's overlap of step N+1's issue
   with step N (runtime/trainer.c) */
static long n_stream_syncs, n_event_syncs, n_overlapped;
static size_t *alloc_log;
static int n_alloc_log, cap_alloc_log;
__attribute__((destructor)) static void print_stats(void) {
  const char *e = getenv("LOOM_EMU_STATS");
  if (e && *e && strcmp(e, "0")) {
    fprintf(stderr, "loom-emu: %ld kernels launched directly, %ld graph launches replaying %ld kernels\n", n_direct,
            n_graphs, n_replayed);
    fprintf(stderr, "loom-emu: %ld graph launches issued before the host waited for the one before; host waits: %ld stream, "
            "%ld event synchronizations\n", n_overlapped, n_stream_syncs, n_event_syncs);
    fprintf(stderr, "loom-emu: cuMemAlloc bytes:");
    for (int i = 0; i < n_alloc_log; i++) fprintf(stderr, " %zu", alloc_log[i]);
    fprintf(stderr, "\n");
  }
  free(alloc_log);
}

static int capturing(CUstream s) { return s && ((Stream *)s)->capturing; }

/* An operation capture does not support: the capture is invalidated. */
static CUresult refuse_capture(CUstream s) {
  ((Stream *)s)->invalid = 1;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

static Node *add_node(CUstream s, NodeKind kind) {
  Graph *g = ((Stream *)s)->graph;
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 64;
    Node *nodes = realloc(g->nodes, sizeof *nodes * (size_t)cap);
    if (!nodes) return NULL;
    g->nodes = nodes;
    g->cap = cap;
  }
  Node *nd = &g->nodes[g->n++];
  memset(nd, 0, sizeof *nd);
  nd->kind = kind;
  return nd;
}

/* Copies to page-locked host memory (cuMemAllocHost) land when the host waits for them, as
   on a GPU, where they run when the stream reaches them: the source is read when the copy is
   issued (streams are synchronous, so that is what the stream would copy), and written to the
   host when the host synchronizes the stream or an event recorded after the copy.  A host that
   reads the results of a step it did not wait for reads the stale bytes it would on a GPU. */
typedef struct {
  void *dst;
  unsigned char *data;
  size_t n;
  long seq;   /* copies issued before it, and it */
} Landing;
static Landing *landings;
static int n_landings, cap_landings;
static long copy_seq;   /* deferred copies issued so far */
typedef struct {
  void *ptr;
  size_t n;
} HostAlloc;
static HostAlloc *host_allocs;
static int n_host_allocs, cap_host_allocs;

/* lands the deferred copies up to seq (all: LONG_MAX); mu held */
static void land_locked(long seq) {
  int k = 0;
  for (int i = 0; i < n_landings; i++) {
    if (landings[i].seq <= seq) {
      memcpy(landings[i].dst, landings[i].data, landings[i].n);
      free(landings[i].data);
    } else {
      landings[k++] = landings[i];
    }
  }
  n_landings = k;
}

static int in_host_alloc_locked(const void *p, size_t n) {
  for (int i = 0; i < n_host_allocs; i++)
    if ((uintptr_t)p >= (uintptr_t)host_allocs[i].ptr && (uintptr_t)p + n <= (uintptr_t)host_allocs[i].ptr + host_allocs[i].n)
      return 1;
  return 0;
}

CUresult cuMemAllocHost(void **p, size_t bytes) {
  if (!p || !bytes) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_SUCCESS;
  if (n_host_allocs == cap_host_allocs) {
    int cap = cap_host_allocs ? 2 * cap_host_allocs : 16;
    HostAlloc *a = realloc(host_allocs, sizeof *a * (size_t)cap);
    if (a) host_allocs = a, cap_host_allocs = cap;
    else r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = r == CUDA_SUCCESS ? malloc(bytes) : NULL;
  if (*p) host_allocs[n_host_allocs++] = (HostAlloc){*p, bytes};
  else r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemFreeHost(void *p) {
  pthread_mutex_lock(&mu);
  int found = -1;
  for (int i = 0; i < n_host_allocs && found < 0; i++)
    if (host_allocs[i].ptr == p) found = i;
  if (found >= 0) {
    land_locked(LONG_MAX);   /* the driver waits for the copies into it, too */
    host_allocs[found] = host_allocs[--n_host_allocs];
    if (!n_host_allocs) {
      free(host_allocs);
      host_allocs = NULL;
      cap_host_allocs = 0;
      free(landings);
      landings = NULL;
      cap_landings = 0;
    }
  }
  pthread_mutex_unlock(&mu);
  if (found < 0) return CUDA_ERROR_INVALID_VALUE;
  free(p);
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (capturing(s)) return refuse_capture(s);
  pthread_mutex_lock(&mu);
  land_locked(LONG_MAX);
  n_stream_syncs++;
  graphs_waited = n_graphs;
  pthread_mutex_unlock(&mu);
  return sync_status();
}
CUresult cuStreamQuery(CUstream s) {
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (capturing(s)) return refuse_capture(s);
  pthread_mutex_lock(&mu);
  land_locked(LONG_MAX);   /* done: it is all there */
  graphs_waited = n_graphs;
  pthread_mutex_unlock(&mu);
  return sync_status();
}

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  (void)flags;
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = (CUstream)calloc(1, sizeof(Stream));
  return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static void graph_free(Graph *g) {
  if (g) free(g->nodes);
  free(g);
}

CUresult cuStreamDestroy(CUstream s) {
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  graph_free(((Stream *)s)->graph);   /* a capture never ended */
  free(s);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  (void)mode;
  if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;   /* the legacy stream cannot capture */
  Stream *st = (Stream *)s;
  if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  if (!(st->graph = calloc(1, sizeof(Graph)))) return CUDA_ERROR_OUT_OF_MEMORY;
  st->capturing = 1;
  st->invalid = 0;
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *out) {
  if (!s || !out) return CUDA_ERROR_INVALID_VALUE;
  Stream *st = (Stream *)s;
  if (!st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st->capturing = 0;
  *out = NULL;
  if (st->invalid) {
    graph_free(st->graph);
    st->graph = NULL;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *out = (CUgraph)st->graph;
  st->graph = NULL;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  *status = !capturing(s)                ? CU_STREAM_CAPTURE_STATUS_NONE
            : ((Stream *)s)->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                     : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
  (void)flags;
  if (!exec || !g) return CUDA_ERROR_INVALID_VALUE;
  const Graph *src = (const Graph *)g;
  Graph *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  if (src->n && !(e->nodes = malloc(sizeof(Node) * (size_t)src->n))) {
    free(e);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (src->n) memcpy(e->nodes, src->nodes, sizeof(Node) * (size_t)src->n);
  e->n = e->cap = src->n;
  *exec = (CUgraphExec)e;
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g) {
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  graph_free((Graph *)g);
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec e) {
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  graph_free((Graph *)e);
  return CUDA_SUCCESS;
}

/* A host function: run now, or recorded while capturing. */
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  if (capturing(s)) {
    Node *nd = add_node(s, NODE_HOST);
    if (!nd) return CUDA_ERROR_OUT_OF_MEMORY;
    nd->fn = fn;
    nd->data = data;
    return CUDA_SUCCESS;
  }
  CUresult r = sync_status();
  if (r == CUDA_SUCCESS) fn(data);
  return r;
}

/* Events: streams are synchronous, so an event is complete as soon as it is recorded; a wait
   for one lands the page-locked copies issued before it (cuMemcpyDtoHAsync).  An event holds the host's monotonic time when it was recorded
   (negative: never), so the time between two is what the emulated work between them took. */
typedef struct {
  double recorded_s;
  long copies, graphs;   /* deferred copies and graph launches issued before it was recorded */
} Event;

CUresult cuEventCreate(CUevent *e, unsigned flags) {
  (void)flags;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  Event *ev = calloc(1, sizeof *ev);
  if (ev) ev->recorded_s = -1;
  *e = (CUevent)ev;
  return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuEventDestroy(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  free(e);
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  if (capturing(s)) return refuse_capture(s);   /* event nodes are not emulated */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ((Event *)e)->recorded_s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  pthread_mutex_lock(&mu);
  ((Event *)e)->copies = copy_seq;
  ((Event *)e)->graphs = n_graphs;
  pthread_mutex_unlock(&mu);
  return sync_status();
}

/* The work before the event is done: its deferred copies land. */
CUresult cuEventSynchronize(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  Event *ev = (Event *)e;
  pthread_mutex_lock(&mu);
  land_locked(ev->copies);
  n_event_syncs++;
  if (ev->graphs > graphs_waited) graphs_waited = ev->graphs;
  pthread_mutex_unlock(&mu);
  return sync_status();
}

/* As the driver: both recorded (else CUDA_ERROR_INVALID_HANDLE), end minus start in ms. */
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  if (!ms || !start || !end) return CUDA_ERROR_INVALID_VALUE;
  const Event *a = (const Event *)start, *b = (const Event *)end;
  if (a->recorded_s < 0 || b->recorded_s < 0) return CUDA_ERROR_INVALID_HANDLE;
  *ms = (float)((b->recorded_s - a->recorded_s) * 1e3);
  return sync_status();
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
  (void)flags;
  if (capturing(s)) return refuse_capture(s);
  return s && e ? sync_status() : CUDA_ERROR_INVALID_HANDLE;
}

/* ------------------------------------------------------------------ memory */

CUresult cuMemAlloc(CUdeviceptr *p, size_t bytes) {
  if (!p || !bytes) return CUDA_ERROR_INVALID_VALUE;
  size_t page = 4096, data = (bytes + 255) / 256 * 256, map = (data + page - 1) / page * page + page;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_SUCCESS;
  if (allocated + data > TOTAL_MEM) r = CUDA_ERROR_OUT_OF_MEMORY;
  void *base = r ? MAP_FAILED : mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (!r && base == MAP_FAILED) r = CUDA_ERROR_OUT_OF_MEMORY;
  if (!r && n_allocs == cap_allocs) {
    int cap = cap_allocs ? 2 * cap_allocs : 64;
    Alloc *a = realloc(allocs, (size_t)cap * sizeof *a);
    if (!a) r = CUDA_ERROR_OUT_OF_MEMORY;
    else allocs = a, cap_allocs = cap;
  }
  if (!r) {
    mprotect((char *)base + map - page, page, PROT_NONE);
    /* 256-aligned, ending as close to the guard page as that allows */
    char *ptr = (char *)base + (map - page - data);
    allocs[n_allocs++] = (Alloc){base, ptr, map, data};
    allocated += data;
    if (n_alloc_log == cap_alloc_log) {   /* the log is best effort: a failed growth drops the entry */
      int cap = cap_alloc_log ? 2 * cap_alloc_log : 64;
      size_t *l = realloc(alloc_log, (size_t)cap * sizeof *l);
      if (l) alloc_log = l, cap_alloc_log = cap;
    }
    if (n_alloc_log < cap_alloc_log) alloc_log[n_alloc_log++] = bytes;
    *p = (CUdeviceptr)(uintptr_t)ptr;
  } else if (base != MAP_FAILED) {
    munmap(base, map);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemFree(CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < n_allocs; i++)
    if ((uintptr_t)allocs[i].ptr == (uintptr_t)p) {
      munmap(allocs[i].base, allocs[i].map_bytes);
      allocated -= allocs[i].bytes;
      allocs[i] = allocs[--n_allocs];
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  *total = (size_t)TOTAL_MEM;
  *free_bytes = (size_t)TOTAL_MEM - allocated;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

/* Both ends of a device range must lie in one allocation. */
static int in_device(CUdeviceptr p, size_t n) {
  int ok = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < n_allocs && !ok; i++) {
    uintptr_t lo = (uintptr_t)allocs[i].ptr, hi = lo + allocs[i].bytes;
    ok = (uintptr_t)p >= lo && (uintptr_t)p + n <= hi;
  }
  pthread_mutex_unlock(&mu);
  return ok;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  if (capturing(s)) return refuse_capture(s);   /* copies are not emulated in graphs */
  if (!n) return CUDA_SUCCESS;
  if (!src || !in_device(dst, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  if (capturing(s)) return refuse_capture(s);   /* copies are not emulated in graphs */
  if (!n) return CUDA_SUCCESS;
  if (!dst || !in_device(src, n)) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_SUCCESS;
  if (in_host_alloc_locked(dst, n)) {   /* page-locked: lands when the host waits for it */
    if (n_landings == cap_landings) {
      int cap = cap_landings ? 2 * cap_landings : 16;
      Landing *l = realloc(landings, sizeof *l * (size_t)cap);
      if (l) landings = l, cap_landings = cap;
    }
    unsigned char *copy = n_landings < cap_landings ? malloc(n) : NULL;
    if (copy) {
      memcpy(copy, (const void *)(uintptr_t)src, n);
      landings[n_landings++] = (Landing){dst, copy, n, ++copy_seq};
    } else {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  } else {   /* pageable: the driver returns once it is copied */
    memcpy(dst, (const void *)(uintptr_t)src, n);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  if (!n) return CUDA_SUCCESS;
  if (!in_device(dst, n) || !in_device(src, n)) return CUDA_ERROR_INVALID_VALUE;
  if (capturing(s)) {   /* recorded, copied when the graph runs */
    Node *nd = add_node(s, NODE_COPY);
    if (!nd) return CUDA_ERROR_OUT_OF_MEMORY;
    nd->dst = dst;
    nd->src = src;
    nd->n = n;
    return CUDA_SUCCESS;
  }
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  if (!n) return CUDA_SUCCESS;
  if (!in_device(dst, n)) return CUDA_ERROR_INVALID_VALUE;
  if (capturing(s)) {
    Node *nd = add_node(s, NODE_MEMSET);
    if (!nd) return CUDA_ERROR_OUT_OF_MEMORY;
    nd->dst = dst;
    nd->value = v;
    nd->n = n;
    return CUDA_SUCCESS;
  }
  memset((void *)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ modules and launches */

static void jit_log(unsigned n, const CUjit_option *opts, void **vals, const char *msg) {
  char *buf = NULL;
  size_t cap = 0;
  for (unsigned i = 0; i < n; i++) {
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) buf = vals[i];
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) cap = (size_t)(uintptr_t)vals[i];
  }
  if (buf && cap) snprintf(buf, cap, "%s", msg);
}

CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *opts, void **vals) {
  if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
  const unsigned char *b = image;
  if (memcmp(b, "\x7f" "ELF", 4)) {
    jit_log(n, opts, vals, "the emulated device loads only what the fake NVRTC made (an ELF shared object)");
    return CUDA_ERROR_INVALID_IMAGE;
  }
  /* The image's size: the end of its section header table (an ELF64 file ends with it). */
  uint64_t shoff, size;
  uint16_t shentsize, shnum;
  memcpy(&shoff, b + 0x28, 8);
  memcpy(&shentsize, b + 0x3A, 2);
  memcpy(&shnum, b + 0x3C, 2);
  size = shoff + (uint64_t)shentsize * shnum;
  const char *tmp = getenv("TMPDIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/loom-emu-module-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  int ok = write(fd, image, size) == (ssize_t)size;
  close(fd);
  void *lib = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  unlink(path);
  LaunchFn launch = lib ? (LaunchFn)dlsym(lib, "loom_emu_launch") : NULL;
  if (!launch) {
    char msg[600];
    snprintf(msg, sizeof msg, "not an emulator module (a real cubin?): %s", lib ? "no loom_emu_launch" : dlerror());
    jit_log(n, opts, vals, msg);
    if (lib) dlclose(lib);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  Module *mod = calloc(1, sizeof *mod);
  if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
  mod->lib = lib;
  mod->launch = launch;
  mod->launch_maps = (LaunchMapsFn)dlsym(lib, "loom_emu_launch_tmaps");
  *m = (CUmodule)mod;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  Module *mod = (Module *)m;
  while (mod->functions) {
    Function *f = mod->functions;
    mod->functions = f->next;
    free(f);
  }
  dlclose(mod->lib);
  free(mod);
  return CUDA_SUCCESS;
}

/* A function lives as long as its module. */
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
  Module *mod = (Module *)m;
  void *fn = dlsym(mod->lib, name);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  Function *fu = calloc(1, sizeof *fu);
  if (!fu) return CUDA_ERROR_OUT_OF_MEMORY;
  fu->mod = mod;
  fu->next = mod->functions;
  mod->functions = fu;
  fu->fn = fn;
  fu->max_dynamic_smem = SMEM_DEFAULT;
  snprintf(fu->name, sizeof fu->name, "%s", name);
  char mark[200];
  snprintf(mark, sizeof mark, "%s_loom_tmaps", name);
  fu->tmaps = dlsym(mod->lib, mark) != NULL && mod->launch_maps;
  *f = (CUfunction)fu;
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
  if (v < 0 || v > SMEM_OPTIN) return CUDA_ERROR_INVALID_VALUE;
  ((Function *)f)->max_dynamic_smem = v;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  switch (a) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = ((Function *)f)->max_dynamic_smem; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static CUresult run_kernel(Function *fu, const unsigned grid[3], const unsigned block[3], unsigned smem, void *arg,
                           const void *maps) {
  pthread_mutex_lock(&mu);
  CUresult r = sticky;
  if (r == CUDA_SUCCESS) {
    char err[700] = "";
    if (fu->tmaps ? fu->mod->launch_maps(fu->fn, arg, maps, grid, block, smem, err, sizeof err)
                  : fu->mod->launch(fu->fn, arg, grid, block, smem, err, sizeof err)) {
      fprintf(stderr, "loom-emu: kernel %s: %s\n", fu->name, err);
      r = sticky = CUDA_ERROR_LAUNCH_FAILED;
    }
  }
  pthread_mutex_unlock(&mu);
  return r;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream s, void **params, void **extra) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  Function *fu = (Function *)f;
  if (extra || !params || !params[0] || (fu->tmaps && !params[1])) return CUDA_ERROR_INVALID_VALUE;
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 || bx > 1024 || by > 1024 ||
      bz > 64 || (unsigned long long)bx * by * bz > 1024) {
    fprintf(stderr, "loom-emu: %s launched with grid (%u,%u,%u) block (%u,%u,%u): out of the device's limits\n", fu->name,
            gx, gy, gz, bx, by, bz);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((int)smem > fu->max_dynamic_smem) {
    fprintf(stderr, "loom-emu: %s asks for %u bytes of dynamic shared memory; its limit is %d (cuFuncSetAttribute)\n",
            fu->name, smem, fu->max_dynamic_smem);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  if (capturing(s)) {
    Node *nd = add_node(s, NODE_KERNEL);
    if (!nd) return CUDA_ERROR_OUT_OF_MEMORY;
    nd->f = fu;
    memcpy(nd->grid, grid, sizeof grid);
    memcpy(nd->block, block, sizeof block);
    nd->smem = smem;
    memcpy(nd->args, params[0], LOOM_ARGS_BYTES);
    if (fu->tmaps) memcpy(nd->maps, params[1], LOOM_TMAPS_BYTES);
    return CUDA_SUCCESS;
  }
  n_direct++;
  return run_kernel(fu, grid, block, smem, params[0], fu->tmaps ? params[1] : NULL);
}

/* The recorded operations, in order (streams are synchronous). */
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  if (capturing(s)) return refuse_capture(s);
  Graph *g = (Graph *)e;
  CUresult r = sync_status();
  pthread_mutex_lock(&mu);
  if (n_graphs > graphs_waited) n_overlapped++;
  long nth = ++n_graphs;
  pthread_mutex_unlock(&mu);
  /* LOOM_EMU_SIGINT_AT_GRAPH=N: a Ctrl-C while the Nth graph launch is issued (the tests of a
     stop with a step in flight, at a step they can name) */
  const char *sig_at = getenv("LOOM_EMU_SIGINT_AT_GRAPH");
  if (sig_at && *sig_at && atol(sig_at) == nth) raise(SIGINT);
  for (int i = 0; i < g->n && r == CUDA_SUCCESS; i++) {
    Node *nd = &g->nodes[i];
    switch (nd->kind) {
    case NODE_KERNEL: {
      unsigned char args[LOOM_ARGS_BYTES];   /* the kernel may not change the graph's copy */
      memcpy(args, nd->args, sizeof args);
      r = run_kernel(nd->f, nd->grid, nd->block, nd->smem, args, nd->maps);
      n_replayed++;
      break;
    }
    case NODE_MEMSET: memset((void *)(uintptr_t)nd->dst, nd->value, nd->n); break;
    case NODE_HOST: nd->fn(nd->data); break;
    case NODE_COPY: memmove((void *)(uintptr_t)nd->dst, (const void *)(uintptr_t)nd->src, nd->n); break;
    }
  }
  return r;
}

/* ------------------------------------------------------------------ tensor maps */

/* The emulator's encoding (emu_tmap.h), its arguments checked as the documentation says;
   a refusal says why on stderr (the driver says only CUDA_ERROR_INVALID_VALUE).  Built with
   LOOM_EMU_NO_TMAP (libloom_fake_cuda_notmap.so) the driver lacks it, as one before CUDA 12. */
#ifndef LOOM_EMU_NO_TMAP
CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType, cuuint32_t tensorRank,
                                void *globalAddress, const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                const cuuint32_t *boxDim, const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  char why[200];
  _Static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap is 128 bytes");
  if (loom_emu_tmap_encode(tensorMap, (int)tensorDataType, tensorRank, globalAddress, (const uint64_t *)globalDim,
                           (const uint64_t *)globalStrides, (const uint32_t *)boxDim, (const uint32_t *)elementStrides,
                           (int)interleave, (int)swizzle, (int)l2Promotion, (int)oobFill, why, sizeof why)) {
    fprintf(stderr, "loom-emu: cuTensorMapEncodeTiled: %s\n", why);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
#endif
