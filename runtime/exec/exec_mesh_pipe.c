/* runtime/exec/exec_mesh_pipe.c — a pipelined program (pass "pipeline") on the mesh
 * executor's devices (runtime/device.h): the pipeline walker's transport (pipe_walk.h) for
 * every backend, the cpu's, the cuda's and the reference interpreter's (ref_device.c).
 *
 * The walker runs the ranks of this process: every rank a thread (the cpu backend or the
 * interpreter, mesh_threads.c) or the one rank of this process (a CUDA mesh, mesh_nccl.c).  A
 * stash slot is a block of the rank's device memory (RtDevice.buf_alloc: device memory on
 * cuda, a host block on the cpu and the interpreter), from a pool of the rank's reused by
 * size; it holds the producer's results after the loss laid one after another, each in its
 * RtBuf's storage at a 256-byte boundary, which is how the consumer takes them as its
 * arguments 2.. (RtDevice.call_dev).
 *
 * The point-to-point transfers between the chunks are the backend's: on the cpu and the
 * interpreter they run inside the calls, the program's send/recv talking through the walker's
 * tagging communicator (mesh_threads.c hands it to the ranks); on cuda they are NCCL groups
 * that a hook (PipeHook, exec_cuda_pipe.c) issues between the actions, naming the slots of an
 * action's transfers before its call (blocks of this pool too) and sharing the losses at the
 * end of a walk.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/pipe_walk.h"
#include "runtime/fail.h"

typedef struct {
  uint64_t addr;
  int64_t bytes;
  bool busy;
} Block;

typedef struct {
  Block *b;
  int n, cap;
} Pool;

struct PipeDev {
  Pool *pool;        /* [n_local]: each rank's blocks (a rank's thread alone touches its pool) */
  PipeHook hook;     /* all NULL: none (the cpu backend) */
};

/* ---- blocks ---- */

int pipe_dev_block(MeshExec *mx, int rank, int64_t bytes, int *block, char *err, size_t errlen) {
  Pool *pl = &mx->pipe->pool[rank];
  int best = -1;
  for (int k = 0; k < pl->n; k++)
    if (!pl->b[k].busy && pl->b[k].bytes >= bytes && (best < 0 || pl->b[k].bytes < pl->b[best].bytes)) best = k;
  if (best < 0) {
    if (pl->n == pl->cap) {
      int cap = pl->cap ? 2 * pl->cap : 16;
      Block *b = realloc(pl->b, sizeof *b * (size_t)cap);
      if (!b) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
      pl->b = b, pl->cap = cap;
    }
    Block *b = &pl->b[pl->n];
    *b = (Block){0, bytes > 0 ? bytes : 256, false};
    int rc = rt_device_buf_alloc(&mx->dev[rank], b->bytes, &b->addr, err, errlen);
    if (rc) return rc;
    best = pl->n++;
  }
  pl->b[best].busy = true;
  *block = best;
  return 0;
}

uint64_t pipe_dev_addr(const MeshExec *mx, int rank, int block) { return mx->pipe->pool[rank].b[block].addr; }

void pipe_dev_put(MeshExec *mx, int rank, int *block) {
  if (*block >= 0) mx->pipe->pool[rank].b[*block].busy = false;
  *block = -1;
}

/* Bytes of buffers b[from..n) laid one after another, each in its storage at a 256-byte
   boundary, and their offsets (off[k - from]): a producer's results as its block holds them,
   which its consumer takes as arguments 2.. */
static int64_t laid(const RtBuf *b, int n, int from, int64_t *off) {
  int64_t at = 0;
  for (int k = from; k < n; k++) {
    if (off) off[k - from] = at;
    at += (b[k].n * rt_storage_size((RtStorage)b[k].storage) + 255) / 256 * 256;
  }
  return at;
}

/* addr[k], k in [from, n): buffer k of the block at base, laid as laid() lays them */
static void lay(uint64_t *addr, const RtBuf *b, int n, int from, uint64_t base) {
  int64_t off[RT_MAX_FUNC_IO];
  laid(b, n, from, off);
  for (int k = from; k < n; k++) addr[k] = base + (uint64_t)off[k - from];
}

/* ---- the transport ---- */

/* A stash slot is a pool block: its index + 1 (0 is the walker's empty slot). */
static int blk(const void *slot) { return (int)(intptr_t)slot - 1; }

static int dev_find(void *ctx, const char *name) { return rt_device_find(&((MeshExec *)ctx)->dev[0], name); }

static int dev_takes(void *ctx, int from, int skip, int to, char *err, size_t errlen) {
  return pipe_rt_takes(((MeshExec *)ctx)->p, from, skip, to, err, errlen);
}

static int dev_alloc(void *ctx, int rank, int func, int skip, void **slot, int64_t *bytes, char *err, size_t errlen) {
  MeshExec *mx = ctx;
  const RtFunc *fn = &mx->p->funcs[func];
  int b, rc = pipe_dev_block(mx, rank, laid(fn->rets, fn->n_rets, skip, NULL), &b, err, errlen);
  *slot = rc ? NULL : (void *)(intptr_t)(b + 1);
  *bytes = 0;   /* the stash measured: 4 bytes a value, as the prediction counts it */
  for (int k = skip; k < fn->n_rets; k++) *bytes += 4 * fn->rets[k].n;
  return rc;
}

static void dev_free(void *ctx, int rank, void *slot) {
  int b = blk(slot);
  pipe_dev_put(ctx, rank, &b);
}

static int dev_call(void *ctx, const PipeCall *c, char *err, size_t errlen) {
  MeshExec *mx = ctx;
  RtDevice *d = &mx->dev[c->rank];
  const PipeHook *h = &mx->pipe->hook;
  float lr = c->lr, t = c->t;
  if (c->action < 0) {   /* the optimizer step: its transfers (tied parameters' gradients) run inside */
    void *args[2] = {&lr, &t}, *rets[RT_MAX_FUNC_IO] = {c->norm};
    return d->call(d, c->func, args, rets, err, errlen);
  }
  const RtFunc *fn = &mx->p->funcs[c->func];
  uint64_t dargs[RT_MAX_FUNC_IO] = {0}, drets[RT_MAX_FUNC_IO] = {0};
  void *args[RT_MAX_FUNC_IO] = {(void *)c->tok, (void *)c->tgt}, *rets[RT_MAX_FUNC_IO] = {c->loss};
  if (c->in) lay(dargs, fn->args, fn->n_args, 2, pipe_dev_addr(mx, c->rank, blk(c->in)));   /* the producer's results */
  if (c->out) lay(drets, fn->rets, fn->n_rets, c->skip, pipe_dev_addr(mx, c->rank, blk(c->out)));   /* kept for B (W) */
  int rc = h->before ? h->before(h->ctx, c, err, errlen) : 0;
  if (!rc) rc = rt_device_call_dev(d, c->func, args, dargs, rets, drets, err, errlen);
  if (h->after) h->after(h->ctx, c);
  return rc;
}

static int dev_begin(void *ctx, const Schedule *s, bool training, char *err, size_t errlen) {
  const PipeHook *h = &((MeshExec *)ctx)->pipe->hook;
  return h->begin ? h->begin(h->ctx, s, training, err, errlen) : 0;
}
static int dev_between(void *ctx, const Schedule *s, int i, char *err, size_t errlen) {
  const PipeHook *h = &((MeshExec *)ctx)->pipe->hook;
  return h->between ? h->between(h->ctx, s, i, err, errlen) : 0;
}
static int dev_end(void *ctx, int rc, float *losses, int64_t n, char *err, size_t errlen) {
  const PipeHook *h = &((MeshExec *)ctx)->pipe->hook;
  return h->end ? h->end(h->ctx, rc, losses, n, err, errlen) : rc;
}

static const PipeOps dev_ops = {dev_find, dev_takes, dev_alloc, dev_free, dev_call, dev_begin, dev_between, dev_end};

static int pipeline_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                         size_t errlen) {
  return pipe_walk_step(((MeshExec *)self)->walk, n, inputs, targets, losses, err, errlen);
}
static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  return pipe_walk_optimizer(((MeshExec *)self)->walk, lr, t, grad_norm, err, errlen);
}
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  return pipe_walk_eval(((MeshExec *)self)->walk, inputs, targets, loss, err, errlen);
}

/* ---- setup ---- */

int pipe_dev_setup(MeshExec *mx, const PipeHook *hook, char *err, size_t errlen) {
  struct PipeDev *pd = mx->pipe = calloc(1, sizeof *pd);
  if (!pd) {
    if (hook && hook->free) hook->free(hook->ctx);
    return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  }
  if (hook) pd->hook = *hook;   /* pipe_dev_free frees it from now on */
  if (!(pd->pool = calloc((size_t)mx->n_local, sizeof *pd->pool))) return rt_fail(err, errlen, EXIT_RUN, "out of memory");
  int rc = pipe_walk_bind(mx->walk, &dev_ops, mx, err, errlen);
  if (rc) return rc;
  mx->ex.grad_step = NULL;
  mx->ex.pipeline_step = pipeline_step;
  mx->ex.optimizer_step = optimizer_step;
  mx->ex.eval_step = eval_step;
  return 0;
}

void pipe_dev_free(MeshExec *mx) {
  struct PipeDev *pd = mx->pipe;
  if (!pd) return;
  if (pd->hook.free) pd->hook.free(pd->hook.ctx);   /* first: it may hold blocks of the pools */
  for (int q = 0; pd->pool && q < mx->n_local; q++) {
    for (int k = 0; k < pd->pool[q].n; k++) rt_device_buf_free(&mx->dev[q], pd->pool[q].b[k].addr);
    free(pd->pool[q].b);
  }
  free(pd->pool);
  free(pd);
  mx->pipe = NULL;
}
