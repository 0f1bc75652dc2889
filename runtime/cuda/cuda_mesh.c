/* runtime/cuda/cuda_mesh.c — a CudaProgram as one rank of a mesh (cuda_exec.h,
 * "collectives"): the partitioned program's collective steps as NCCL calls, each on the
 * communication stream of its mesh axis, ordered against the compute stream by events:
 *   collective   compute --ready--> axis stream: NCCL; axis stream --done--> compute
 *   start (h)    the same without the last edge (done[h] recorded)
 *   wait (h)     compute waits for done[h]
 * so kernels run on while a started collective is in flight, as the overlap pass planned.
 * The end of every call waits for the compute stream through nccl_sync (a timeout and the
 * communicators' errors watched), not cuStreamSynchronize. */
#define LOOM_CUDA_INTERNAL 1
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/cuda/cuda_exec.h"

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

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
  if (b == RT_B_COLL_START) {
    b = (int)i[0];
    if (i[1] < 0 || i[1] >= RT_MAX_HANDLES) {
      snprintf(msg, n, "a collective start with a bad handle");
      return false;
    }
    i += 2;
  }
  if (b < RT_B_ALL_REDUCE || b > RT_B_ALL_TO_ALL) {
    snprintf(msg, n, "builtin %d is not a collective: the cuda lowering makes every other builtin a kernel (was the "
             "program lowered for the cpu?)", (int)st->which);
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

#ifdef LOOM_HAVE_CUDA_HEADERS

#define CU(fn, args, where) cuda_cu_fail(d->fn args, #fn, where, err, errlen)

int cuda_program_set_comm(CudaProgram *cp, Comm *comm, char *err, size_t errlen) {
  if (!cp->p) return fail(err, errlen, 2, "the CUDA program is not initialized");
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d || cuda_set_current(cp->ctx, err, errlen)) return 1;
  for (int a = 0; a < 5; a++) {
    if (comm->mesh[a] < 1) return fail(err, errlen, 2, "the mesh has an axis of size %lld", (long long)comm->mesh[a]);
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
  if (!(cp->ev_done = calloc((size_t)cp->n_events, sizeof *cp->ev_done))) return fail(err, errlen, 1, "out of memory");
  int rc = CU(cuEventCreate, ((CUevent *)&cp->ev_ready, CU_EVENT_DISABLE_TIMING), "(the mesh's events)");
  for (int k = 0; !rc && k < cp->n_events; k++)
    rc = CU(cuEventCreate, ((CUevent *)&cp->ev_done[k], CU_EVENT_DISABLE_TIMING), "(the mesh's events)");
  for (int a = 0; !rc && a < 5; a++)
    if (comm->mesh[a] > 1) rc = CU(cuStreamCreate, ((CUstream *)&cp->axis_stream[a], CU_STREAM_NON_BLOCKING), "(a mesh axis's stream)");
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
  free(cp->ev_done);
  cp->ev_done = NULL;
  cp->ev_ready = NULL;
  memset(cp->axis_stream, 0, sizeof cp->axis_stream);
  cp->n_events = 0;
  cp->comm = NULL;
}

int cuda_mesh_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  const RtStep *st = &cp->p->funcs[f].steps[s];
  if (!cp->comm)
    return fail(err, errlen, 2, "%s: a collective, but this program runs on one GPU (a mesh needs one process per GPU: "
                "loom train --backend cuda --mesh ... starts them)", where);
  const CudaDriverApi *d = cuda_driver(err, errlen);
  if (!d) return 1;
  CUstream compute = (CUstream)cp->stream;
  if (st->which == RT_B_COLL_WAIT) {
    int h = (int)st->i[0];
    if (h >= cp->n_events - 1) return fail(err, errlen, 2, "%s: no collective start has handle %d", where, h);
    return CU(cuStreamWaitEvent, (compute, (CUevent)cp->ev_done[h], 0), where);
  }
  bool start = st->which == RT_B_COLL_START;
  int builtin = start ? (int)st->i[0] : st->which;
  const int64_t *ints = start ? st->i + 2 : st->i;
  int axis = (int)(builtin == RT_B_ALL_REDUCE ? ints[1] : ints[0]);
  int h = start ? (int)st->i[1] : cp->n_events - 1;
  if (axis < 0 || axis >= 5 || h < 0 || h >= cp->n_events) return fail(err, errlen, 2, "%s: a bad axis or handle", where);
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

#else

int cuda_program_set_comm(CudaProgram *cp, Comm *comm, char *err, size_t errlen) {
  (void)cp, (void)comm;
  return fail(err, errlen, 1, "this loom was built without the CUDA headers");
}
void cuda_mesh_free(CudaProgram *cp) { (void)cp; }
int cuda_mesh_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen) {
  (void)cp, (void)f, (void)s, (void)where;
  return fail(err, errlen, 1, "this loom was built without the CUDA headers");
}
int cuda_mesh_sync(CudaProgram *cp, const char *where, char *err, size_t errlen) {
  (void)cp, (void)where;
  return fail(err, errlen, 1, "this loom was built without the CUDA headers");
}

#endif
