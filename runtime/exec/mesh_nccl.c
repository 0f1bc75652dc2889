/* runtime/exec/mesh_nccl.c — the mesh executor's world of processes (exec_mesh.h): this process
   is one rank of the mesh on its GPU, the other ranks being other processes (started by
   `loom train` itself, torchrun, srun or mpirun; runtime/comm/launch.h); the collectives and
   the gathers are NCCL's (runtime/cuda/cuda_mesh.c, runtime/comm/comm_nccl.c).  A rank's host
   memory at the start is its pieces, one at a time.  Checkpoints are a shard per rank
   (save_shards; in a pipeline each global is written by the stage that updates it); rank 0
   alone writes files.  Still owed: resuming a whole (not sharded) checkpoint fills the whole
   views on every rank before each takes its pieces. */
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/io/checkpoint.h"

/* The one rank of this process. */
static int run_rank(MeshExec *r, MeshJob *jobs, char *err, size_t errlen) {
  return r->dev->call(r->dev, jobs[0].func, jobs[0].args, jobs[0].rets, err, errlen);
}

/* Global k's pieces from every rank, gathered over NCCL (every rank takes part). */
static int gather_nccl(MeshExec *r, int k, bool all, char *err, size_t errlen) {
  int rc = r->dev->read(r->dev, k, r->scratch, err, errlen);
  int64_t n = r->p->globals[k].n;
  if (!rc) rc = nccl_all_gather_host(r->comm, r->scratch, r->gather_buf, n, err, errlen);
  for (int q = 0; !rc && (all || r->rank == 0) && q < r->world; q++) r->piece_of[q] = r->gather_buf + (size_t)q * (size_t)n;
  return rc;
}

/* ---- checkpoints: a shard per rank (runtime/io/checkpoint.h) ---- */

/* ckpt_save_shards' exchange over NCCL (the bytes travel as floats: an all-gather copies them). */
static int gather_bytes(void *arg, const void *mine, void *all, size_t bytes, char *err, size_t errlen) {
  MeshExec *r = arg;
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
  MeshExec *r = self;
  float m = (float)mine;
  int rc = nccl_all_gather_host(r->comm, &m, r->gather_buf, 1, err, errlen);
  for (int q = 0; !rc && q < r->world; q++)
    if ((int)r->gather_buf[q] > mine) mine = (int)r->gather_buf[q];
  *agreed = mine;
  return rc;
}

/* A piece replicated over an axis is written by the rank of coordinate 0 on it; in a
   pipeline, over pp by the stage that updates it (owner). */
static bool owns(const MeshExec *r, int k) {
  const RtGlobal *gl = &r->p->globals[k];
  for (int a = 0; a < COMM_AXES; a++) {
    int want = a == COMM_PP && r->owner && r->owner[k] >= 0 ? r->owner[k] : 0;
    if (r->mesh[a] > 1 && !gl->split[a] && r->coord[0][a] != want) return false;
  }
  return true;
}

static void ints_text(const int64_t *v, char *out, size_t n) {
  snprintf(out, n, "%lld,%lld,%lld,%lld,%lld", (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3],
           (long long)v[4]);
}

static int save_shards(void *self, const char *save_dir, int64_t step, const char *state_json, char *err, size_t errlen) {
  MeshExec *r = self;
  const RtProgram *p = r->p;
  int ng = p->n_globals, nt = 0, nm = 2, rc = 0;
  StTensor *ts = calloc((size_t)ng + 1, sizeof *ts);
  char **keys = calloc(2 * (size_t)ng + 2, sizeof *keys), **vals = calloc(2 * (size_t)ng + 2, sizeof *vals);
  float **data = calloc((size_t)ng + 1, sizeof *data);
  if (!ts || !keys || !vals || !data) rc = 1;
  int64_t coord[COMM_AXES];
  for (int a = 0; a < COMM_AXES; a++) coord[a] = r->coord[0][a];
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
    if ((rc = r->dev->read(r->dev, k, data[nt], err, errlen))) break;
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
  MeshExec *r = self;
  for (int k = 0; k < r->p->n_globals; k++) {
    if (!r->whole[k]) continue;
    const RtGlobal *gl = &r->p->globals[k];
    int rc = ckpt_shards_read_piece(c, gl->name, gl, r->mesh, r->coord[0], r->scratch, err, errlen);
    if (!rc) rc = r->dev->write(r->dev, k, r->scratch, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* prog: the lowered program (cuda_lower's, or a compiled executable's; r takes it over),
   image: its CUDA module for this rank's GPU.  A pipelined program (RtProgram.pipe) runs on
   the walker over this rank's GPU (exec_cuda_pipe.c). */
static int rank_open(MeshExec *r, RtProgram *prog, const void *image, size_t n, const RunPlan *plan, char *err,
                     size_t errlen) {
  r->prog = *prog;
  memset(prog, 0, sizeof *prog);
  r->p = &r->prog;
  for (int a = 0; a < COMM_AXES; a++) r->mesh[a] = r->prog.mesh[a] > 1 ? r->prog.mesh[a] : 1;
  /* the world: the rendezvous, the communicators (this also picks the rank's GPU) */
  int rc = nccl_world_new(r->mesh, NULL, &r->comm, err, errlen);
  CudaDeviceInfo info;
  int device = r->comm ? nccl_device(r->comm) : 0;
  if (!rc) rc = cuda_device_query(device, &info, err, errlen);
  if (!rc) {
    r->rank = r->comm->rank;
    r->world = r->comm->world;
    r->n_local = 1;
    if (plan->opt.log)
      fprintf(plan->opt.log, "cuda: %d ranks, one process each (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld), NCCL %d; "
              "rank 0 on %s (%s)\n", r->world, (long long)r->mesh[0], (long long)r->mesh[1], (long long)r->mesh[2],
              (long long)r->mesh[3], (long long)r->mesh[4], nccl_version(NULL, 0), info.name, info.arch);
  }
  if (!rc) r->have_cp = !(rc = cuda_program_init(&r->cp, &r->prog, image, n, device, err, errlen));
  if (!rc) rc = cuda_program_set_comm(&r->cp, r->comm, err, errlen);
  if (rc) return rc;
  if (rt_program_world(&r->prog) != r->world) {
    snprintf(err, errlen, "the mesh has %lld ranks but the launch %d processes", (long long)rt_program_world(&r->prog),
             r->world);
    return EXIT_USAGE;
  }
  r->dev = calloc(1, sizeof *r->dev);
  r->coord = calloc(1, sizeof *r->coord);
  int64_t most = 1;
  for (int k = 0; k < r->prog.n_globals; k++)
    if (r->prog.globals[k].n > most) most = r->prog.globals[k].n;
  r->gather_buf = malloc(sizeof(float) * (size_t)most * (size_t)r->world);
  if (!r->dev || !r->coord || !r->gather_buf) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  cuda_device(r->dev, &r->cp);
  memcpy(r->coord[0], r->comm->coord, sizeof r->coord[0]);
  r->run = run_rank;
  r->gather = gather_nccl;
  bool pipe = r->prog.pipe.kind;   /* a pipeline: per-chunk functions (exec_cuda_pipe.c) */
  if ((rc = mesh_exec_open(r, true, err, errlen))) return rc;
  double t1 = seconds_now();
  if ((rc = mesh_exec_init(r, plan->init, plan->seed, err, errlen))) return rc;
  if (plan->opt.log)
    fprintf(plan->opt.log, "cuda: rank 0's pieces %s in %.1f s; its host memory peak so far %.0f MiB\n",
            plan->init ? "loaded" : "initialized", seconds_now() - t1, peak_rss_mib());
  r->ex.save_shards = save_shards;
  r->ex.load_shards = load_shards;
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
}

int cuda_rank_train(RtProgram *prog, const void *image, size_t n, const RunPlan *plan, char *err, size_t errlen) {
  MeshExec *r = calloc(1, sizeof *r);
  if (!r) {
    rt_program_free(prog);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int rc = rank_open(r, prog, image, n, plan, err, errlen);
  if (!rc) rc = train_and_write(&r->ex, plan, err, errlen);
  if (!rc && plan->opt.log) fprintf(plan->opt.log, "cuda: rank 0's host memory peak %.0f MiB\n", peak_rss_mib());
  /* the others must not wait for this rank (a signal's stop is every rank's, after one step) */
  if (rc && !train_stopped(rc) && r->comm) nccl_world_abort(r->comm);
  pipe_dev_free(r);   /* before the program whose memory its blocks are */
  if (r->p) mesh_exec_free(r);
  free(r->gather_buf);
  if (r->have_cp) cuda_program_free(&r->cp);
  nccl_world_free(r->comm);
  rt_program_free(&r->prog);
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
