/* runtime/exec/exec_mesh_pipe.c — a pipelined module (pass "pipeline") on the cpu backend:
 * every rank's device (a CpuProgram, runtime/device.h) as the pipeline walker's transport
 * (pipe_walk.h).
 *
 * Every rank is a thread of the walker.  The stash is a host block per F (split B), its
 * buffers laid one after another as the function returns them, which is how the consumer
 * takes them; the point-to-point transfers are the program's send/recv builtins, run inside
 * the calls through the walker's tagging communicator (the rank's CpuProgram talks through
 * it while the pipeline is set up).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/pipe_walk.h"

static int cpu_find(void *ctx, const char *name) { return cpu_find_func(&((MeshCpu *)ctx)->b.cp, name); }

static int cpu_takes(void *ctx, int from, int skip, int to, char *err, size_t errlen) {
  return pipe_rt_takes(((MeshCpu *)ctx)->dev[0].p, from, skip, to, err, errlen);
}

static int cpu_alloc(void *ctx, int rank, int func, int skip, void **slot, int64_t *bytes, char *err, size_t errlen) {
  const RtFunc *fn = &((MeshCpu *)ctx)->dev[rank].p->funcs[func];
  int64_t n = 0;
  for (int r = skip; r < fn->n_rets; r++) n += fn->rets[r].n;
  *bytes = 4 * n;
  if ((*slot = malloc(4 * (size_t)(n ? n : 1)))) return 0;
  snprintf(err, errlen, "out of memory for the stash of @%s", fn->name);
  return EXIT_RUN;
}

static void cpu_free(void *ctx, int rank, void *slot) {
  (void)ctx, (void)rank;
  free(slot);
}

/* ptr[0..n): buffers b[0..n) laid one after another in block (NULL: none) */
static void lay(void **ptr, const RtBuf *b, int n, float *block) {
  for (int64_t k = 0, at = 0; block && k < n; at += b[k++].n) ptr[k] = block + at;
}

static int cpu_call(void *ctx, const PipeCall *c, char *err, size_t errlen) {
  RtDevice *dev = &((MeshCpu *)ctx)->dev[c->rank];
  void *args[RT_MAX_FUNC_IO] = {0}, *rets[RT_MAX_FUNC_IO] = {0};
  float lr = c->lr, t = c->t;
  if (c->action < 0) {
    args[0] = &lr, args[1] = &t, rets[0] = c->norm;
  } else {
    const RtFunc *fn = &dev->p->funcs[c->func];
    args[0] = (void *)c->tok, args[1] = (void *)c->tgt, rets[0] = c->loss;
    lay(args + 2, fn->args + 2, fn->n_args - 2, c->in);
    lay(rets + c->skip, fn->rets + c->skip, fn->n_rets - c->skip, c->out);   /* F keeps them for B, a split B for W */
  }
  return dev->call(dev, c->func, args, rets, err, errlen);
}

static const PipeOps cpu_ops = {cpu_find, cpu_takes, cpu_alloc, cpu_free, cpu_call, NULL, NULL, NULL};

static int pipeline_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                         size_t errlen) {
  return pipe_walk_step(((MeshCpu *)self)->walk, n, inputs, targets, losses, err, errlen);
}
static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  return pipe_walk_optimizer(((MeshCpu *)self)->walk, lr, t, grad_norm, err, errlen);
}
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  return pipe_walk_eval(((MeshCpu *)self)->walk, inputs, targets, loss, err, errlen);
}

/* The walker the mesh executor's open made from the program (its schedule, timeline and
   stash, which the run's report reads), bound to the ranks' programs. */
int pipe_cpu_setup(MeshCpu *mc, char *err, size_t errlen) {
  PipeWalk *w = mc->walk;
  int rc = pipe_walk_bind(w, &cpu_ops, mc, err, errlen);
  if (rc) return rc;
  for (int k = 0; k < mc->world; k++) mc->cpu[k].comm = &w->tc[k].c;
  mc->ex.grad_step = NULL;
  mc->ex.pipeline_step = pipeline_step;
  mc->ex.optimizer_step = optimizer_step;
  mc->ex.eval_step = eval_step;
  return 0;
}

void pipe_cpu_free(MeshCpu *mc) {
  PipeWalk *w = mc->walk;
  for (int k = 0; w && w->tc && mc->cpu && k < mc->world; k++)
    if (mc->cpu[k].comm == &w->tc[k].c) mc->cpu[k].comm = w->tc[k].inner;
}
