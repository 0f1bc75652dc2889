/* runtime/exec/exec_mesh.c — a partitioned module (a mesh of N ranks) on the cpu backend, for
   training and eval.  The shard pass made one program that every rank runs on its own
   piece (SPMD), so it is lowered and JIT-compiled once; each rank gets its own CpuProgram
   (arena, parameters, gradients, optimizer state) and runs as a thread of this process, its
   collectives going through runtime/comm_local.  Each rank takes its pieces by the lowered
   program's placements (RtGlobal), as a CUDA rank does: the seeded initialization's values
   of just its piece (rt_global_init_piece), or its slices of the memory-mapped safetensors
   file (load_weights_pieces); no whole tensor is made to start.  The whole views of the
   parameters and optimizer state (checkpoints, --out) are RefExec's (runtime/exec/exec_ref.c,
   ref_exec_open_views: untouched until written), filled from the ranks' pieces by sync_out
   and split back by sync_in through the same placements (rt_piece_runs; in a pipeline only
   the stage that updates a global holds its truth).  RefExec also gives the local world and
   a pipeline's schedule, and needs the module: `loom` passes the one it built, a compiled
   executable the IR it carries.  The lowered program comes as bytes (rt_program_save) and
   the kernels' LLVM IR, as compiled executables carry them. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/mesh_pieces.h"

/* ---- a rank's pieces (its CpuProgram's globals) <-> the whole views ---- */

static void mesh_sizes(const MeshCpu *mc, int64_t mesh[COMM_AXES]) {
  for (int a = 0; a < COMM_AXES; a++) mesh[a] = mc->rx.m->mesh.size[a];
}

static const int *rank_coord(const MeshCpu *mc, int rank) {
  static const int zero[COMM_AXES] = {0};
  return mc->rx.lw ? local_world_rank(mc->rx.lw, rank)->coord : zero;
}

/* Every rank's pieces into the whole views (mesh_pieces.c: replicated pieces are equal, rank
   order wins; in a pipeline only the owning stage's count). */
static int sync_out(void *self, char *err, size_t errlen) {
  MeshCpu *mc = self;
  (void)err, (void)errlen;
  int64_t mesh[COMM_AXES];
  mesh_sizes(mc, mesh);
  for (int k = 0; k < mc->b.prog.n_globals; k++) {
    int gi = mc->gmap[k];
    Tensor *whole = gi >= 0 ? mc->rx.full[gi] : NULL;
    if (!whole) continue;
    for (int q = 0; q < mc->world; q++) mc->piece_of[q] = mc->dev[q].host(&mc->dev[q], k);
    mesh_assemble(&mc->b.prog.globals[k], mesh, mc->world, mc->piece_of, mc->rx.owner ? mc->rx.owner[gi] : -1, whole->f);
  }
  return 0;
}

/* The whole views (a resume wrote them) -> every rank's pieces. */
static int sync_in(void *self, char *err, size_t errlen) {
  MeshCpu *mc = self;
  int64_t mesh[COMM_AXES];
  mesh_sizes(mc, mesh);
  for (int k = 0; k < mc->b.prog.n_globals; k++) {
    int gi = mc->gmap[k];
    Tensor *whole = gi >= 0 ? mc->rx.full[gi] : NULL;
    for (int q = 0; whole && q < mc->world; q++) {
      int rc = mesh_scatter(&mc->dev[q], k, mesh, rank_coord(mc, q), whole->f, NULL, err, errlen);
      if (rc) return rc;
    }
  }
  return 0;
}

/* ---- running a function on every rank ---- */

typedef struct {
  MeshCpu *mc;
  int rank, func;
  void *args[2];
  void *rets[2];       /* where the results go (rank 0), or NULL (the others: replicated) */
  int rc;
  char err[1024];
} Job;

static void *job_main(void *arg) {
  Job *j = arg;
  RtDevice *d = &j->mc->dev[j->rank];
  j->rc = d->call(d, j->func, j->args, j->rets, j->err, sizeof j->err);
  if (j->rc) local_world_abort(j->mc->rx.lw);   /* the others must not wait for this rank */
  return NULL;
}

/* Runs func on every rank (args per rank in jobs[k].args); the results are replicated (the
   shard pass makes them so): rank 0's go to `rets`. */
static int run_all(MeshCpu *mc, Job *jobs, int func, void *rets0, void *rets1, char *err, size_t errlen) {
  jobs[0].rets[0] = rets0;
  jobs[0].rets[1] = rets1;
  pthread_t *th = calloc((size_t)mc->world, sizeof *th);
  if (!th) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int started = 0, rc = 0;
  for (int k = 0; k < mc->world; k++) {
    jobs[k].mc = mc;
    jobs[k].rank = k;
    jobs[k].func = func;
    jobs[k].rc = 0;
    if (pthread_create(&th[k], NULL, job_main, &jobs[k])) {
      local_world_abort(mc->rx.lw);
      snprintf(err, errlen, "cannot start the thread of rank %d", k);
      rc = EXIT_RUN;
      break;
    }
    started++;
  }
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  free(th);
  for (int k = 0; k < started && !rc; k++)
    if (jobs[k].rc) {   /* the first rank that failed says why (the others were aborted) */
      rc = jobs[k].rc;
      snprintf(err, errlen, "rank %d: %.2000s", k, jobs[k].err);
    }
  if (rc && mc->rx.lw && local_world_fault(mc->rx.lw))   /* the rank and collective that stopped the world */
    snprintf(err, errlen, "%.2000s", local_world_fault(mc->rx.lw));
  return rc;
}

/* Every rank's piece of a whole micro-batch, as int32 arguments of jobs[k]. */
static void split_tokens(MeshCpu *mc, const int32_t *inputs, const int32_t *targets, Job *jobs) {
  int64_t mesh[COMM_AXES];
  mesh_sizes(mc, mesh);
  for (int k = 0; k < mc->world; k++) {
    mesh_tokens_piece(&mc->tok_place, mesh, rank_coord(mc, k), inputs, mc->tok32[k]);
    mesh_tokens_piece(&mc->tok_place, mesh, rank_coord(mc, k), targets, mc->tgt32[k]);
    jobs[k].args[0] = mc->tok32[k];
    jobs[k].args[1] = mc->tgt32[k];
  }
}

/* The timeline keeps the last step: a step's first micro-batch clears the last one's. */
static void step_begins(MeshCpu *mc) {
  if (mc->step_open) return;
  mc->step_open = true;
  for (int k = 0; k < mc->world; k++) mc->cp[k].n_trace = 0;
}

static void comm_wait_ms(void *self, double *mean, double *most) {
  MeshCpu *mc = self;
  *mean = *most = 0;
  for (int k = 0; k < mc->world; k++) {
    double ms = mc->cp[k].comm_wait_s * 1e3;
    *mean += ms / mc->world;
    if (ms > *most) *most = ms;
    mc->cp[k].comm_wait_s = 0;
  }
}

/* --trace-out: the last step as a Chrome/Perfetto trace, two tracks per rank (compute: the
   rank's steps, with its waits; communication: its collectives as they ran). */
static int write_trace(MeshCpu *mc, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
    return EXIT_USAGE;
  }
  double t0 = 0;
  bool any = false;
  for (int k = 0; k < mc->world; k++)
    for (int e = 0; e < mc->cp[k].n_trace; e++)
      if (!any || mc->cp[k].trace[e].t0 < t0) t0 = mc->cp[k].trace[e].t0, any = true;
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":\"measured: loom train, cpu backend, the last step\","
          "\"ranks\":%d,\"overlap\":%s},\"traceEvents\":[\n", mc->world, mc->engines ? "true" : "false");
  for (int k = 0; k < mc->world; k++)
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d compute\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d comm\"}},\n",
            2 * k, k, 2 * k + 1, k);
  bool first = true;
  for (int k = 0; k < mc->world; k++)
    for (int e = 0; e < mc->cp[k].n_trace; e++) {
      const CpuTraceEvent *ev = &mc->cp[k].trace[e];
      char name[128];
      size_t n = 0;
      for (const char *c = ev->label; *c && n + 2 < sizeof name; c++) {   /* JSON-safe */
        if (*c == '"' || *c == '\\') name[n++] = '\\';
        name[n++] = (unsigned char)*c < 32 ? ' ' : *c;
      }
      name[n] = 0;
      fprintf(f, "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
              first ? "" : ",\n", name, ev->track ? "comm" : "compute", 2 * k + ev->track, (ev->t0 - t0) * 1e6,
              (ev->t1 - ev->t0) * 1e6);
      first = false;
    }
  fputs("\n]}\n", f);
  if (fclose(f)) {
    snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
    return EXIT_RUN;
  }
  return 0;
}

/* func on every rank, each on its piece of a whole micro-batch; rank 0's (replicated) results
   into rets0, rets1. */
static int run_split(MeshCpu *mc, int func, const int32_t *inputs, const int32_t *targets, void *rets0, void *rets1,
                     char *err, size_t errlen) {
  Job *jobs = calloc((size_t)mc->world, sizeof *jobs);
  if (!jobs) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  split_tokens(mc, inputs, targets, jobs);
  int rc = run_all(mc, jobs, func, rets0, rets1, err, errlen);
  free(jobs);
  return rc;
}

static int grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  MeshCpu *mc = self;
  step_begins(mc);
  return run_split(mc, mc->f_grad, inputs, targets, loss, NULL, err, errlen);
}

/* Validation: @forward on every rank; rank 0's (replicated) loss. */
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  MeshCpu *mc = self;
  return run_split(mc, mc->f_forward, inputs, targets, NULL, loss, err, errlen);
}

static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  MeshCpu *mc = self;
  Job *jobs = calloc((size_t)mc->world, sizeof *jobs);
  if (!jobs) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int k = 0; k < mc->world; k++) {
    jobs[k].args[0] = &lr;   /* replicated scalars: every rank reads the same */
    jobs[k].args[1] = &t;
  }
  int rc = run_all(mc, jobs, mc->f_opt, grad_norm, NULL, err, errlen);
  free(jobs);
  mc->step_open = false;
  return rc;
}

/* ---- setup ---- */

static int threads_total(int asked) {
  if (asked > 0) return asked;
  const char *e = getenv("LOOM_THREADS");
  if (e && atoi(e) > 0) return atoi(e);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* training: @grad_step and @optimizer_step (the Executor); else @forward (eval). */
static int mesh_open(MeshCpu *mc, Module *m, const unsigned char *bytes, size_t n, const char *llvm, uint64_t seed,
                     const char *init, int threads, bool training, bool tracing, FILE *log, char *err, size_t errlen) {
  int rc = ref_exec_open_views(&mc->rx, m, training, err, errlen);
  if (rc) return rc;
  mc->world = mc->rx.world;
  int per = threads_total(threads) / mc->world;
  if (per < 1) per = 1;
  if ((rc = cpu_backend_load(&mc->b, bytes, n, llvm, per, err, errlen))) return rc;
  const RtProgram *p = &mc->b.prog;
  mc->cp = calloc((size_t)mc->world, sizeof *mc->cp);
  mc->gmap = calloc((size_t)p->n_globals + 1, sizeof *mc->gmap);
  mc->tok32 = calloc((size_t)mc->world, sizeof *mc->tok32);
  mc->tgt32 = calloc((size_t)mc->world, sizeof *mc->tgt32);
  mc->dev = calloc((size_t)mc->world, sizeof *mc->dev);
  mc->piece_of = calloc((size_t)mc->world, sizeof *mc->piece_of);
  if (!mc->cp || !mc->gmap || !mc->tok32 || !mc->tgt32 || !mc->dev || !mc->piece_of) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  /* program globals <-> module globals, by name; same element counts (a rank's piece) and float */
  for (int k = 0; k < p->n_globals; k++) {
    const Global *gl = module_find_global(m, p->globals[k].name);
    mc->gmap[k] = gl ? gl->index : -1;
    if (!gl || !dtype_is_float(gl->value->type.dtype) || type_numel(&gl->value->type) != p->globals[k].n) {
      snprintf(err, errlen, "internal: the lowered global %s does not match the module's", p->globals[k].name);
      return EXIT_RUN;
    }
  }
  bool pipe = training && m->pipe.kind;   /* a pipeline: per-chunk functions (exec_mesh_pipe.c) */
  mc->f_grad = cpu_find_func(&mc->b.cp, pipe ? "fwd.c0" : training ? "grad_step" : "forward");
  mc->f_opt = cpu_find_func(&mc->b.cp, pipe ? "optimizer_step.s0" : "optimizer_step");
  Func *tf = module_find_func(m, pipe ? "fwd.c0" : training ? "grad_step" : "forward");
  if (mc->f_grad < 0 || (training && mc->f_opt < 0) || !tf || (pipe ? tf->args.n < 2 : tf->args.n != 2)) {
    snprintf(err, errlen, "the program has no %s", training ? "@grad_step and @optimizer_step" : "@forward(tokens, targets)");
    return 2;
  }
  const Type *tt = &((Value *)tf->args.items[0])->type;
  Type whole = whole_type(m, tt);
  piece_placement(tt, &mc->tok_place);
  mc->whole_n = type_numel(&whole);
  for (int k = 0; k < mc->world; k++) {
    if (k > 0 && (rc = cpu_program_init(&mc->cp[k], p, mc->b.fns, per, err, errlen))) {
      mc->world = k;   /* ranks 1..k-1 hold programs to free */
      return rc;
    }
    if (k == 0) mc->cp[0] = mc->b.cp;
    mc->cp[k].comm = local_world_rank(mc->rx.lw, k);
    cpu_device(&mc->dev[k], &mc->cp[k]);
    int64_t mesh[COMM_AXES];
    mesh_sizes(mc, mesh);
    if ((rc = mesh_init_pieces(&mc->dev[k], mesh, rank_coord(mc, k), init, seed, NULL, err, errlen))) return rc;
    mc->tok32[k] = malloc(sizeof(int32_t) * (size_t)(mc->tok_place.n + 1));
    mc->tgt32[k] = malloc(sizeof(int32_t) * (size_t)(mc->tok_place.n + 1));
    if (!mc->tok32[k] || !mc->tgt32[k]) {
      snprintf(err, errlen, "out of memory");
      return EXIT_RUN;
    }
  }
  mc->ex = mc->rx.ex;   /* the whole parameters and state (gathered by sync_out) */
  mc->ex.self = mc;
  mc->ex.grad_step = grad_step;
  mc->ex.optimizer_step = optimizer_step;
  mc->ex.sync_out = sync_out;
  mc->ex.sync_in = sync_in;
  mc->f_forward = training && !pipe ? cpu_find_func(&mc->b.cp, "forward") : -1;
  mc->ex.eval_step = mc->f_forward >= 0 ? eval_step : NULL;
  if (pipe && (rc = pipe_cpu_setup(mc, err, errlen))) return rc;
  /* async collectives: a communication thread per rank (runtime/cpu/cpu_async.c) */
  if (!pipe && cpu_program_has_async(p)) {
    if (!(mc->engines = calloc((size_t)mc->world, sizeof *mc->engines))) {
      snprintf(err, errlen, "out of memory");
      return EXIT_RUN;
    }
    for (int k = 0; k < mc->world; k++) {
      if (!(mc->engines[k] = comm_engine_new(err, errlen))) return EXIT_RUN;
      mc->cp[k].engine = mc->engines[k];
    }
  }
  for (int k = 0; k < mc->world && tracing && !pipe; k++) mc->cp[k].tracing = true;
  mc->ex.comm_wait_ms = pipe ? NULL : comm_wait_ms;
  if (log)
    fprintf(log, "running %d ranks as threads (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld), cpu backend, "
            "%d thread%s each\n", mc->world, (long long)m->mesh.size[AX_DP], (long long)m->mesh.size[AX_TP],
            (long long)m->mesh.size[AX_CP], (long long)m->mesh.size[AX_PP], (long long)m->mesh.size[AX_EP], per,
            per == 1 ? "" : "s");
  return 0;
}

static void mesh_close(MeshCpu *mc) {
  pipe_cpu_free(mc);
  for (int k = 0; mc->engines && k < mc->world; k++) {   /* before the programs whose slots they read */
    comm_engine_free(mc->engines[k]);
    if (mc->cp) mc->cp[k].engine = NULL;
  }
  free(mc->engines);
  if (mc->cp && mc->world > 0) {   /* rank 0's CpuProgram is a copy of b.cp: what it allocated since is its own */
    free(mc->cp[0].async);
    free(mc->cp[0].trace);
  }
  for (int k = 1; mc->cp && k < mc->world; k++) cpu_program_free(&mc->cp[k]);
  for (int k = 0; k < mc->world; k++) {
    if (mc->tok32) free(mc->tok32[k]);
    if (mc->tgt32) free(mc->tgt32[k]);
  }
  free(mc->tok32), free(mc->tgt32), free(mc->gmap), free(mc->cp);
  free(mc->dev), free(mc->piece_of);
  cpu_backend_free(&mc->b);
  ref_exec_free(&mc->rx);
}

int run_training_cpu_mesh(Module *m, const unsigned char *prog, size_t n, const char *llvm, const RunPlan *plan,
                          char *err, size_t errlen) {
  MeshCpu *mc = calloc(1, sizeof *mc);
  if (!mc) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int rc = mesh_open(mc, m, prog, n, llvm, plan->seed, plan->init, plan->threads, true, plan->trace_out != NULL,
                     plan->opt.log, err, errlen);
  if (!rc) rc = train_and_write(&mc->ex, plan, err, errlen);
  if (!rc && !mc->rx.sched && plan->verbose) cpu_arena_report(plan->opt.log, mc->cp, mc->world);
  if (!rc && plan->trace_out && !mc->rx.sched) {
    rc = write_trace(mc, plan->trace_out, err, errlen);
    if (!rc && plan->opt.log)
      fprintf(plan->opt.log, "wrote the measured timeline to %s (the last step; per rank a compute and a comm track)\n",
              plan->trace_out);
  }
  if (!rc && mc->rx.sched) rc = pipe_run_report(&mc->rx, plan, "cpu backend", err, errlen);
  const char *prof = getenv("LOOM_PROFILE");
  if (!rc && prof && *prof) cpu_backend_profile(&mc->b, stderr, atoi(prof) > 0 ? atoi(prof) : 20);
  mesh_close(mc);
  free(mc);
  return rc;
}

/* loom eval --mesh: the mesh opened once for @forward, weights split to the ranks; each
   step runs every rank on its piece of a whole batch; rank 0's logits [B*T*V] and loss. */
int eval_cpu_mesh_open(MeshCpu **out, Module *m, const unsigned char *prog, size_t n, const char *llvm,
                       const char *weights, char *err, size_t errlen) {
  MeshCpu *mc = *out = calloc(1, sizeof *mc);
  if (!mc) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  return mesh_open(mc, m, prog, n, llvm, 0, weights, 0, false, false, NULL, err, errlen);
}

int eval_cpu_mesh_step(MeshCpu *mc, const int32_t *inputs, const int32_t *targets, float *logits, float *loss, char *err,
                       size_t errlen) {
  return run_split(mc, mc->f_grad, inputs, targets, logits, loss, err, errlen);
}

void eval_cpu_mesh_close(MeshCpu *mc) {
  if (!mc) return;
  mesh_close(mc);
  free(mc);
}
