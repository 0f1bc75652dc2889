/* runtime/exec/exec_cuda_mesh.c — one rank of a mesh on the CUDA backend: this process trains its
   piece of a partitioned module on its GPU, the other ranks being other processes (started
   by `loom train` itself, torchrun, srun or mpirun; runtime/comm/launch.h), the collectives
   NCCL calls (runtime/cuda/cuda_mesh.c, runtime/comm/comm_nccl.c).
   No whole tensor is made to start: each global's piece comes from the lowered program's
   placement (RtGlobal: rt_global_init_piece draws the whole tensor's values of just the
   piece; load_weights_pieces reads just the piece's slices of the memory-mapped safetensors
   file), so a rank's host memory at the start is its pieces, one at a time.  The trainer's
   whole views of the parameters and optimizer state are host buffers left untouched (never
   paged in) until sync_out gathers every rank's pieces over NCCL into them (checkpoints,
   --out) or a resume reads a checkpoint into them; rank 0 alone writes files.
   Checkpoints are a shard per rank (save_shards); in a pipeline each global is written by
   the stage that updates it (owner).  A pipelined module's steps are exec_cuda_pipe.c's.
   --out streams a tensor at a time (stream_param).  Still owed: resuming a whole (not
   sharded) checkpoint fills the whole views on every rank before each takes its pieces. */
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/io/checkpoint.h"
#include "runtime/exec/exec_cuda_mesh.h"
#include "runtime/exec/exec_ref.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/mesh_pieces.h"


/* Global k's pieces from every rank, gathered over NCCL (every rank takes part); rank 0 (with
   `all`, every rank) assembles the whole tensor into `whole` (replicated pieces are equal on
   every rank; in a pipeline only the stage that updates it counts). */
static int gather_global(CudaRank *r, int k, float *whole, bool all, char *err, size_t errlen) {
  const RtGlobal *gl = &r->prog.globals[k];
  int rc = r->dev.read(&r->dev, k, r->piece, err, errlen);
  if (!rc) rc = nccl_all_gather_host(r->comm, r->piece, r->gather, gl->n, err, errlen);
  if (rc || !(all || r->rank == 0)) return rc;
  for (int q = 0; q < r->world; q++) r->piece_of[q] = r->gather + (size_t)q * (size_t)gl->n;
  mesh_assemble(gl, r->mesh, r->world, r->piece_of, r->owner ? r->owner[k] : -1, whole);
  return 0;
}

/* Every rank's pieces into the whole views, one global at a time, on every rank: the views
   then hold the truth everywhere, so a sync_in after it (the trainer's zeroing of a mixture
   of experts' load counts) gives every rank its own pieces back.  (Checkpoints and --out F
   do not come here: save_shards and stream_param.) */
static int sync_out(void *self, char *err, size_t errlen) {
  CudaRank *r = self;
  for (int k = 0; k < r->prog.n_globals; k++) {
    if (!r->whole[k]) continue;
    int rc = gather_global(r, k, r->whole[k], true, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* --out a tensor at a time: parameter view i's global gathered into one reusable buffer
   (the views of a stack of experts share it), not into the whole views. */
static int stream_param(void *self, int i, const float **data, char *err, size_t errlen) {
  CudaRank *r = self;
  int k = r->view_global[i];
  if (k != r->stream_global) {
    r->stream_global = -1;
    int rc = gather_global(r, k, r->stream, false, err, errlen);
    if (rc) return rc;
    r->stream_global = k;
  }
  *data = r->stream + r->view_off[i];
  return 0;
}

/* The whole views (a resume wrote them) -> this rank's pieces on the device. */
static int sync_in(void *self, char *err, size_t errlen) {
  CudaRank *r = self;
  for (int k = 0; k < r->prog.n_globals; k++) {
    if (!r->whole[k]) continue;
    int rc = mesh_scatter(&r->dev, k, r->mesh, r->comm->coord, r->whole[k], r->piece, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* ---- checkpoints: a shard per rank (runtime/io/checkpoint.h) ---- */

/* ckpt_save_shards' exchange over NCCL (the bytes travel as floats: an all-gather copies them). */
static int gather_bytes(void *arg, const void *mine, void *all, size_t bytes, char *err, size_t errlen) {
  CudaRank *r = arg;
  size_t nf = (bytes + 3) / 4;
  float *m = calloc(nf, sizeof(float)), *a = calloc(nf * (size_t)r->world, sizeof(float));
  int rc = m && a ? 0 : 1;
  if (rc) snprintf(err, errlen, "out of memory");
  if (!rc) {
    memcpy(m, mine, bytes);
    rc = nccl_all_gather_host(r->comm, m, a, (int64_t)nf, err, errlen);
  }
  for (int q = 0; !rc && q < r->world; q++) memcpy((char *)all + (size_t)q * bytes, a + (size_t)q * nf, bytes);
  free(m);
  free(a);
  return rc;
}

/* The trainer's stop agreement (Executor.agree_stop): the largest flag over the ranks. */
static int agree_stop(void *self, int mine, int *agreed, char *err, size_t errlen) {
  CudaRank *r = self;
  float m = (float)mine;
  int rc = nccl_all_gather_host(r->comm, &m, r->gather, 1, err, errlen);
  for (int q = 0; !rc && q < r->world; q++)
    if ((int)r->gather[q] > mine) mine = (int)r->gather[q];
  *agreed = mine;
  return rc;
}

/* A piece replicated over an axis is written by the rank of coordinate 0 on it; in a
   pipeline, over pp by the stage that updates it (owner). */
static bool owns(const CudaRank *r, int k) {
  const RtGlobal *gl = &r->prog.globals[k];
  for (int a = 0; a < COMM_AXES; a++) {
    int want = a == COMM_PP && r->owner && r->owner[k] >= 0 ? r->owner[k] : 0;
    if (r->mesh[a] > 1 && !gl->split[a] && r->comm->coord[a] != want) return false;
  }
  return true;
}

static void ints_text(const int64_t *v, char *out, size_t n) {
  snprintf(out, n, "%lld,%lld,%lld,%lld,%lld", (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3],
           (long long)v[4]);
}

static int save_shards(void *self, const char *save_dir, int64_t step, const char *state_json, char *err, size_t errlen) {
  CudaRank *r = self;
  const RtProgram *p = &r->prog;
  int ng = p->n_globals, nt = 0, nm = 2, rc = 0;
  StTensor *ts = calloc((size_t)ng + 1, sizeof *ts);
  char **keys = calloc(2 * (size_t)ng + 2, sizeof *keys), **vals = calloc(2 * (size_t)ng + 2, sizeof *vals);
  float **data = calloc((size_t)ng + 1, sizeof *data);
  if (!ts || !keys || !vals || !data) rc = 1;
  int64_t coord[COMM_AXES];
  for (int a = 0; a < COMM_AXES; a++) coord[a] = r->comm->coord[a];
  char mesh_s[128], coord_s[128];
  ints_text(r->mesh, mesh_s, sizeof mesh_s);
  ints_text(coord, coord_s, sizeof coord_s);
  if (!rc) {
    keys[0] = strdup("loom.mesh"), vals[0] = strdup(mesh_s);
    keys[1] = strdup("loom.coord"), vals[1] = strdup(coord_s);
  }
  for (int k = 0; k < ng && !rc; k++) {
    const RtGlobal *gl = &p->globals[k];
    if (!r->whole[k] || !owns(r, k)) continue;
    if (!(data[nt] = malloc(sizeof(float) * (size_t)(gl->n + 1)))) {
      rc = 1;
      break;
    }
    if ((rc = r->dev.read(&r->dev, k, data[nt], err, errlen))) break;
    StTensor *t = &ts[nt];
    t->name = (char *)gl->name;
    t->dtype = ST_F32;
    t->rank = gl->ir_rank;
    for (int d = 0; d < gl->ir_rank; d++) t->shape[d] = gl->piece_dims[d];
    t->nbytes = sizeof(float) * (uint64_t)gl->n;
    t->data = data[nt++];
    int64_t split[COMM_AXES];
    for (int a = 0; a < COMM_AXES; a++) split[a] = gl->split[a];
    char key[600], v[128];
    ints_text(split, v, sizeof v);
    snprintf(key, sizeof key, "loom.split.%s", gl->name);
    keys[nm] = strdup(key), vals[nm++] = strdup(v);
    if (gl->experts && gl->rank >= 2) {
      snprintf(key, sizeof key, "loom.experts.%s", gl->name);
      snprintf(v, sizeof v, "%lld", (long long)gl->shape[0]);
      keys[nm] = strdup(key), vals[nm++] = strdup(v);
    }
  }
  for (int i = 0; !rc && i < nm; i++)
    if (!keys[i] || !vals[i]) rc = 1;
  if (rc == 1 && !err[0]) snprintf(err, errlen, "out of memory writing a checkpoint");
  /* every rank takes part in the exchanges, even one that failed above (it reports its failure there) */
  char ignored[256];
  int src = ckpt_save_shards(save_dir, step, r->rank, r->world, rc ? NULL : ts, rc ? -1 : nt,
                             (const char *const *)keys, (const char *const *)vals, rc ? 0 : nm, state_json, gather_bytes,
                             r, rc ? ignored : err, rc ? sizeof ignored : errlen);
  if (!rc) rc = src;
  for (int i = 0; i < nt; i++) free(data[i]);
  for (int i = 0; keys && vals && i < nm; i++) free(keys[i]), free(vals[i]);
  free(ts), free(keys), free(vals), free(data);
  return rc;
}

static int load_shards(void *self, const Checkpoint *c, char *err, size_t errlen) {
  CudaRank *r = self;
  for (int k = 0; k < r->prog.n_globals; k++) {
    if (!r->whole[k]) continue;
    const RtGlobal *gl = &r->prog.globals[k];
    int rc = ckpt_shards_read_piece(c, gl->name, gl, r->mesh, r->comm->coord, r->piece, err, errlen);
    if (!rc) rc = r->dev.write(&r->dev, k, r->piece, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

static int grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  CudaRank *r = self;
  cuda_rank_tokens(r, inputs, targets);
  void *args[2] = {r->tok32, r->tgt32}, *rets[2] = {loss, NULL};
  return r->dev.call(&r->dev, r->f_grad, args, rets, err, errlen);
}

static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  CudaRank *r = self;
  cuda_rank_tokens(r, inputs, targets);
  void *args[2] = {r->tok32, r->tgt32}, *rets[2] = {NULL, loss};
  return r->dev.call(&r->dev, r->f_forward, args, rets, err, errlen);
}

static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  CudaRank *r = self;
  void *args[2] = {&lr, &t}, *rets[2] = {grad_norm, NULL};
  return r->dev.call(&r->dev, r->f_opt, args, rets, err, errlen);
}

/* prog: the lowered program (cuda_lower's, or a compiled executable's; r takes it over),
   image: its CUDA module for this rank's GPU. */
static int rank_open(CudaRank *r, Module *m, RtProgram *prog, const void *image, size_t n, const RunPlan *plan, char *err,
                     size_t errlen) {
  r->m = m;
  r->prog = *prog;
  memset(prog, 0, sizeof *prog);
  int64_t mesh[COMM_AXES];
  for (int a = 0; a < COMM_AXES; a++) mesh[a] = m->mesh.size[a];
  /* the world: the rendezvous, the communicators (this also picks the rank's GPU) */
  int rc = nccl_world_new(mesh, NULL, &r->comm, err, errlen);
  CudaDeviceInfo info;
  int device = r->comm ? nccl_device(r->comm) : 0;
  if (!rc) rc = cuda_device_query(device, &info, err, errlen);
  if (!rc) {
    r->rank = r->comm->rank;
    r->world = r->comm->world;
    if (plan->opt.log)
      fprintf(plan->opt.log, "cuda: %d ranks, one process each (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld), NCCL %d; "
              "rank 0 on %s (%s)\n", r->world, (long long)mesh[0], (long long)mesh[1], (long long)mesh[2],
              (long long)mesh[3], (long long)mesh[4], nccl_version(NULL, 0), info.name, info.arch);
  }
  if (!rc) r->have_cp = !(rc = cuda_program_init(&r->cp, &r->prog, image, n, device, err, errlen));
  if (!rc) rc = cuda_program_set_comm(&r->cp, r->comm, err, errlen);
  if (!rc) cuda_device(&r->dev, &r->cp);
  if (rc) return rc;
  if (mesh_world(&m->mesh) != r->world) {
    snprintf(err, errlen, "the mesh has %lld ranks but the launch %d processes", (long long)mesh_world(&m->mesh), r->world);
    return EXIT_USAGE;
  }
  memcpy(r->mesh, mesh, sizeof mesh);
  const RtProgram *p = &r->prog;
  int64_t most = 1;
  int nv = 0;
  for (int k = 0; k < p->n_globals; k++) {
    if (p->globals[k].n > most) most = p->globals[k].n;
    nv += rt_views_of(p->globals[k].rank, p->globals[k].shape, p->globals[k].experts);
  }
  r->whole = calloc((size_t)p->n_globals + 1, sizeof *r->whole);
  r->ex.params = calloc((size_t)nv + 1, sizeof(RtTensor));
  r->ex.state = calloc((size_t)nv + 1, sizeof(RtTensor));
  r->piece = malloc(sizeof(float) * (size_t)most);
  r->gather = malloc(sizeof(float) * (size_t)most * (size_t)r->world);
  r->piece_of = calloc((size_t)r->world, sizeof *r->piece_of);
  if (!r->whole || !r->ex.params || !r->ex.state || !r->piece || !r->gather || !r->piece_of) goto oom;
  /* the trainer's whole views: parameters under their checkpoint names, the optimizer state
     (calloc'd: no page is touched before a sync_out or a resume writes it) */
  r->view_global = calloc((size_t)nv + 1, sizeof(int));
  r->view_off = calloc((size_t)nv + 1, sizeof(int64_t));
  int64_t most_whole = 1;
  if (!r->view_global || !r->view_off) goto oom;
  for (int k = 0; k < p->n_globals; k++) {
    const RtGlobal *gl = &p->globals[k];
    bool param = gl->region == RT_REGION_PARAMS;
    if (!param && gl->region != RT_REGION_OPTIM) continue;
    int64_t whole_n = rt_global_whole_numel(gl, r->mesh);
    if (!(r->whole[k] = calloc((size_t)whole_n + 1, sizeof(float)))) goto oom;
    int before = r->ex.n_params;
    if (rt_views_add(param ? r->ex.params : r->ex.state, param ? &r->ex.n_params : &r->ex.n_state, gl->name, gl->rank,
                     gl->shape, r->whole[k], gl->experts))
      goto oom;
    for (int v = before; param && v < r->ex.n_params; v++)
      r->view_global[v] = k, r->view_off[v] = r->ex.params[v].data - r->whole[k];
    if (param && whole_n > most_whole) most_whole = whole_n;
  }
  if (!(r->stream = malloc(sizeof(float) * (size_t)most_whole))) goto oom;
  r->stream_global = -1;
  double t1 = seconds_now();
  if ((rc = mesh_init_pieces(&r->dev, r->mesh, r->comm->coord, plan->init, plan->seed, r->piece, err, errlen))) return rc;
  if (plan->opt.log)
    fprintf(plan->opt.log, "cuda: rank 0's pieces %s in %.1f s; its host memory peak so far %.0f MiB\n",
            plan->init ? "loaded" : "initialized", seconds_now() - t1, peak_rss_mib());
  bool pipe = m->pipe.kind;   /* a pipeline: per-chunk functions (exec_cuda_pipe.c) */
  r->f_grad = cuda_find_func(&r->cp, "grad_step");
  r->f_opt = cuda_find_func(&r->cp, "optimizer_step");
  r->f_forward = cuda_find_func(&r->cp, "forward");
  Func *tf = module_find_func(m, pipe ? "fwd.c0" : "grad_step");
  if ((!pipe && (r->f_grad < 0 || r->f_opt < 0)) || !tf || (pipe ? tf->args.n < 2 : tf->args.n != 2)) {
    snprintf(err, errlen, pipe ? "the pipelined program has no @fwd.c0(tokens, targets, ...)"
                               : "the program has no @grad_step and @optimizer_step");
    return EXIT_USAGE;
  }
  if (pipe) {
    if (!(r->owner = calloc((size_t)m->globals.n + 1, sizeof(int)))) goto oom;
    for (int k = 0; k < m->globals.n; k++) r->owner[k] = pipe_owner_of(m, m->globals.items[k]);
  }
  const Type *tt = &((Value *)tf->args.items[0])->type;
  Type whole = whole_type(m, tt);
  piece_placement(tt, &r->tok_place);
  r->whole_n = type_numel(&whole);
  r->tok32 = malloc(sizeof(int32_t) * (size_t)(r->tok_place.n + 1));
  r->tgt32 = malloc(sizeof(int32_t) * (size_t)(r->tok_place.n + 1));
  if (!r->tok32 || !r->tgt32) goto oom;
  r->ex.self = r;
  r->ex.batch = whole.dims[0];
  r->ex.seq = whole.dims[1];
  r->ex.grad_step = grad_step;
  r->ex.optimizer_step = optimizer_step;
  r->ex.eval_step = r->f_forward >= 0 ? eval_step : NULL;
  r->ex.sync_out = sync_out;
  r->ex.sync_in = sync_in;
  r->ex.save_shards = save_shards;
  r->ex.load_shards = load_shards;
  r->ex.stream_param = stream_param;
  r->ex.comm_wait_ms = NULL;
  r->ex.agree_stop = agree_stop;
  if (pipe && (rc = cuda_pipe_setup(r, err, errlen))) return rc;
  if (plan->trace_out && plan->opt.log)
    fprintf(plan->opt.log, "cuda: --trace-out: the cuda backend does not record a timeline yet (the cpu and ref backends do); "
            "%s is not written\n", plan->trace_out);
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
  cuda_pipe_free(r);
  free(r->owner);
  free(r->view_global);
  free(r->view_off);
  free(r->stream);
  if (r->have_cp) cuda_program_free(&r->cp);
  nccl_world_free(r->comm);
  for (int k = 0; r->whole && k < r->prog.n_globals; k++) free(r->whole[k]);
  free(r->whole);
  rt_views_free(r->ex.params, r->ex.n_params);
  rt_views_free(r->ex.state, r->ex.n_state);
  free(r->ex.params);
  free(r->ex.state);
  free(r->piece);
  free(r->tok32);
  free(r->tgt32);
  free(r->gather);
  free(r->piece_of);
  rt_program_free(&r->prog);
}

int cuda_rank_train(Module *m, RtProgram *prog, const void *image, size_t n, const RunPlan *plan, char *err,
                    size_t errlen) {
  CudaRank *r = calloc(1, sizeof *r);
  if (!r) {
    rt_program_free(prog);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int rc = rank_open(r, m, prog, image, n, plan, err, errlen);
  if (!rc) rc = train_and_write(&r->ex, plan, err, errlen);
  if (!rc && plan->opt.log) fprintf(plan->opt.log, "cuda: rank 0's host memory peak %.0f MiB\n", peak_rss_mib());
  /* the others must not wait for this rank (a signal's stop is every rank's, after one step) */
  if (rc && !train_stopped(rc) && r->comm) nccl_world_abort(r->comm);
  rank_close(r);
  free(r);
  return rc;
}

void plan_for_rank(RunPlan *plan, int64_t rank) {
  if (rank == 0) return;   /* rank 0 alone logs and writes files */
  plan->opt.log = NULL;
  plan->opt.metrics_path = NULL;
  plan->opt.not_writer = true;
  plan->out_elsewhere = plan->out;
  plan->out = NULL;
  plan->trace_out = NULL;
}
