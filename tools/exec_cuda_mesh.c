/* tools/exec_cuda_mesh.c — one rank of a mesh on the CUDA backend: this process trains its
   piece of a partitioned module on its GPU, the other ranks being other processes (started
   by `loom train` itself, torchrun, srun or mpirun; runtime/comm/launch.h), the collectives
   NCCL calls (runtime/cuda/cuda_mesh.c, runtime/comm/comm_nccl.c).
   Parameters and optimizer state start as the CPU mesh's do: whole, as one rank would have
   them, then this rank's pieces (the reference executor's bookkeeping, tools/exec_ref.c, so
   the bits are the CPU mesh's).  sync_out (checkpoints, --out) gathers every rank's pieces
   over NCCL and assembles the whole tensors on every rank; rank 0 alone writes files.
   Still owed (issue 15): each process holds the whole model on the host here (the pieces
   come from whole tensors, and sync_out assembles them); reading only its own slices and
   writing only its own shards is the next step.  Pipelines (send/recv), context and expert
   parallelism (ring transfers, all_to_allv) are refused by the CUDA lowering. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda.h"
#include "runtime/comm/comm_nccl.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/nvrtc.h"
#include "tools/exec_ref.h"
#include "tools/tools.h"

typedef struct {
  Executor ex;
  RefExec rx;            /* whole tensors and every rank's pieces (only this rank's are live) */
  const Module *m;
  Comm *comm;
  int rank, world;
  RtProgram prog;
  CudaProgram cp;
  bool have_cp;
  int f_grad, f_opt, f_forward;
  int *gmap;             /* program global -> module global */
  Tensor *whole_tok, *whole_tgt, *tok, *tgt;
  int32_t *tok32, *tgt32;
  float *gather;         /* world x the largest global, for sync_out */
} CudaRank;

/* This rank's pieces <-> its device globals. */
static int pieces_to_device(CudaRank *r, char *err, size_t errlen) {
  for (int k = 0; k < r->prog.n_globals; k++) {
    const Tensor *t = r->rx.g[r->rank]->t[r->gmap[k]];
    int rc = cuda_global_write(&r->cp, k, t->f, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

static int sync_out(void *self, char *err, size_t errlen) {
  CudaRank *r = self;
  for (int k = 0; k < r->prog.n_globals; k++) {
    Tensor *mine = r->rx.g[r->rank]->t[r->gmap[k]];
    int rc = cuda_global_read(&r->cp, k, mine->f, err, errlen);
    if (!rc) rc = nccl_all_gather_host(r->comm, mine->f, r->gather, mine->n, err, errlen);
    if (rc) return rc;
    for (int q = 0; q < r->world; q++)
      memcpy(r->rx.g[q]->t[r->gmap[k]]->f, r->gather + (size_t)q * (size_t)mine->n, sizeof(float) * (size_t)mine->n);
  }
  return r->rx.ex.sync_out(&r->rx, err, errlen);
}

static int sync_in(void *self, char *err, size_t errlen) {
  CudaRank *r = self;
  int rc = r->rx.ex.sync_in(&r->rx, err, errlen);
  return rc ? rc : pieces_to_device(r, err, errlen);
}

/* This rank's piece of a whole micro-batch, as int32. */
static void my_tokens(CudaRank *r, const int32_t *inputs, const int32_t *targets) {
  for (int64_t k = 0; k < r->whole_tok->n; k++) {
    r->whole_tok->i[k] = inputs[k];
    r->whole_tgt->i[k] = targets[k];
  }
  move_piece(&r->m->mesh, r->whole_tok, r->tok, r->comm->coord, true);
  move_piece(&r->m->mesh, r->whole_tgt, r->tgt, r->comm->coord, true);
  for (int64_t e = 0; e < r->tok->n; e++) {
    r->tok32[e] = (int32_t)r->tok->i[e];
    r->tgt32[e] = (int32_t)r->tgt->i[e];
  }
}

static int grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  CudaRank *r = self;
  my_tokens(r, inputs, targets);
  void *args[2] = {r->tok32, r->tgt32}, *rets[2] = {loss, NULL};
  return cuda_program_call(&r->cp, r->f_grad, args, rets, err, errlen);
}

static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  CudaRank *r = self;
  my_tokens(r, inputs, targets);
  void *args[2] = {r->tok32, r->tgt32}, *rets[2] = {NULL, loss};
  return cuda_program_call(&r->cp, r->f_forward, args, rets, err, errlen);
}

static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  CudaRank *r = self;
  void *args[2] = {&lr, &t}, *rets[2] = {grad_norm, NULL};
  return cuda_program_call(&r->cp, r->f_opt, args, rets, err, errlen);
}

static int rank_open(CudaRank *r, Module *m, const RunPlan *plan, char *err, size_t errlen) {
  r->m = m;
  if (m->pipe.kind) {
    snprintf(err, errlen, "--backend cuda does not run pipelines yet (point-to-point transfers over NCCL are owed, "
             "issue 15): use --backend cpu for pp > 1");
    return EXIT_USAGE;
  }
  int64_t mesh[COMM_AXES];
  for (int a = 0; a < COMM_AXES; a++) mesh[a] = m->mesh.size[a];
  char *src = NULL, *log = NULL;
  unsigned char *image = NULL;
  size_t n = 0;
  bool is_cubin = false, hit = false;
  double t0 = seconds_now();
  int rc = cuda_lower(m, &r->prog, &src, err, errlen);
  /* the world: the rendezvous, the communicators (this also picks the rank's GPU) */
  if (!rc) rc = nccl_world_new(mesh, NULL, &r->comm, err, errlen);
  CudaDeviceInfo info;
  int device = r->comm ? nccl_device(r->comm) : 0;
  if (!rc) rc = cuda_device_query(device, &info, err, errlen);
  if (!rc) rc = nvrtc_compile_cached(src, info.arch, NULL, 0, &image, &n, &is_cubin, &log, &hit, err, errlen);
  if (!rc) {
    r->rank = r->comm->rank;
    r->world = r->comm->world;
    if (plan->opt.log)
      fprintf(plan->opt.log, "cuda: %d ranks, one process each (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld), NCCL %d; "
              "rank 0 on %s (%s): %d kernels in %.2f s%s\n", r->world, (long long)mesh[0], (long long)mesh[1],
              (long long)mesh[2], (long long)mesh[3], (long long)mesh[4], nccl_version(NULL, 0), info.name, info.arch,
              r->prog.n_kernels, seconds_now() - t0, hit ? " (from the cache)" : "");
  }
  if (!rc) r->have_cp = !(rc = cuda_program_init(&r->cp, &r->prog, image, n, device, err, errlen));
  free(src);
  free(log);
  free(image);
  if (!rc) rc = cuda_program_set_comm(&r->cp, r->comm, err, errlen);
  if (!rc) rc = ref_exec_open(&r->rx, m, plan->seed, plan->init, true, err, errlen);
  if (rc) return rc;
  if (r->rx.world != r->world) {
    snprintf(err, errlen, "the mesh has %d ranks but the launch %d processes", r->rx.world, r->world);
    return EXIT_USAGE;
  }
  const RtProgram *p = &r->prog;
  r->gmap = calloc((size_t)p->n_globals + 1, sizeof *r->gmap);
  if (!r->gmap) goto oom;
  int64_t most = 1;
  for (int k = 0; k < p->n_globals; k++) {
    const Global *gl = module_find_global(m, p->globals[k].name);
    r->gmap[k] = gl ? gl->index : -1;
    const Tensor *t = r->gmap[k] < 0 ? NULL : r->rx.g[0]->t[r->gmap[k]];
    if (!t || !t->f || t->n != p->globals[k].n) {
      snprintf(err, errlen, "internal: the lowered global %s does not match the module's", p->globals[k].name);
      return EXIT_RUN;
    }
    if (t->n > most) most = t->n;
  }
  if (!(r->gather = malloc(sizeof(float) * (size_t)most * (size_t)r->world))) goto oom;
  if ((rc = cuda_globals_init(&r->cp, plan->seed, err, errlen)) || (rc = pieces_to_device(r, err, errlen))) return rc;
  r->f_grad = cuda_find_func(&r->cp, "grad_step");
  r->f_opt = cuda_find_func(&r->cp, "optimizer_step");
  r->f_forward = cuda_find_func(&r->cp, "forward");
  Func *tf = module_find_func(m, "grad_step");
  if (r->f_grad < 0 || r->f_opt < 0 || !tf || tf->args.n != 2) {
    snprintf(err, errlen, "the program has no @grad_step and @optimizer_step");
    return EXIT_USAGE;
  }
  const Type *tt = &((Value *)tf->args.items[0])->type;
  Type whole = whole_type(m, tt);
  r->whole_tok = tensor_new(&whole);
  r->whole_tgt = tensor_new(&whole);
  r->tok = tensor_new(tt);
  r->tgt = tensor_new(tt);
  if (!r->whole_tok || !r->whole_tgt || !r->tok || !r->tgt) goto oom;
  r->tok32 = malloc(sizeof(int32_t) * (size_t)r->tok->n);
  r->tgt32 = malloc(sizeof(int32_t) * (size_t)r->tok->n);
  if (!r->tok32 || !r->tgt32) goto oom;
  r->ex = r->rx.ex;   /* the whole parameters and state, gathered by sync_out */
  r->ex.self = r;
  r->ex.grad_step = grad_step;
  r->ex.optimizer_step = optimizer_step;
  r->ex.eval_step = r->f_forward >= 0 ? eval_step : NULL;
  r->ex.sync_out = sync_out;
  r->ex.sync_in = sync_in;
  r->ex.comm_wait_ms = NULL;
  if (plan->opt.log)
    fprintf(plan->opt.log, "cuda: device memory per rank %.1f MiB (arenas %.1f, parameters and state %.1f, workspace %.1f)\n",
            r->cp.mem.total / 1048576.0, r->cp.mem.arenas / 1048576.0, r->cp.mem.regions / 1048576.0,
            r->cp.mem.workspace / 1048576.0);
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
  return EXIT_RUN;
}

static void rank_close(CudaRank *r) {
  if (r->have_cp) cuda_program_free(&r->cp);
  rt_program_free(&r->prog);
  if (r->rx.m) ref_exec_free(&r->rx);
  nccl_world_free(r->comm);
  tensor_free(r->whole_tok);
  tensor_free(r->whole_tgt);
  tensor_free(r->tok);
  tensor_free(r->tgt);
  free(r->tok32);
  free(r->tgt32);
  free(r->gmap);
  free(r->gather);
}

int run_training_cuda_rank(Module *m, const RunPlan *plan, char *err, size_t errlen) {
  CudaRank *r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int rc = rank_open(r, m, plan, err, errlen);
  if (!rc) rc = train_and_write(&r->ex, plan, err, errlen);
  if (rc && r->comm) nccl_world_abort(r->comm);   /* the others must not wait for this rank */
  rank_close(r);
  free(r);
  return rc;
}
