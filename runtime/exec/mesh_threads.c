/* runtime/exec/mesh_threads.c — the mesh executor's world of threads (exec_mesh.h): every rank
   of a partitioned program a thread of this process on the cpu backend.  The program is
   lowered and JIT-compiled once; each rank gets its own CpuProgram (arena, parameters,
   gradients, optimizer state), its collectives going through runtime/comm's LocalWorld, and
   a gather reads the ranks' pieces where they live (host storage).  The lowered program comes
   as bytes (rt_program_save) and the kernels' LLVM IR, as compiled executables carry them. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/pipe_walk.h"

static void *job_main(void *arg) {
  MeshJob *j = arg;
  RtDevice *d = &j->mx->dev[j->rank];
  j->rc = d->call(d, j->func, j->args, j->rets, j->err, sizeof j->err);
  if (j->rc) local_world_abort(j->mx->lw);   /* the others must not wait for this rank */
  return NULL;
}

static int run_threads(MeshExec *mx, MeshJob *jobs, char *err, size_t errlen) {
  pthread_t *th = calloc((size_t)mx->world, sizeof *th);
  if (!th) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int started = 0, rc = 0;
  for (int k = 0; k < mx->world; k++) {
    if (pthread_create(&th[k], NULL, job_main, &jobs[k])) {
      local_world_abort(mx->lw);
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
  if (rc && mx->lw && local_world_fault(mx->lw))   /* the rank and collective that stopped the world */
    snprintf(err, errlen, "%.2000s", local_world_fault(mx->lw));
  return rc;
}

static int gather_host(MeshExec *mx, int k, bool all, char *err, size_t errlen) {
  (void)all, (void)err, (void)errlen;
  for (int q = 0; q < mx->world; q++) mx->piece_of[q] = mx->dev[q].host(&mx->dev[q], k);
  return 0;
}

static void comm_wait_ms(void *self, double *mean, double *most) {
  MeshExec *mx = self;
  *mean = *most = 0;
  for (int k = 0; k < mx->world; k++) {
    double ms = mx->cpu[k].comm_wait_s * 1e3;
    *mean += ms / mx->world;
    if (ms > *most) *most = ms;
    mx->cpu[k].comm_wait_s = 0;
  }
}

/* --trace-out: the last step as a Chrome/Perfetto trace, two tracks per rank (compute: the
   rank's steps, with its waits; communication: its collectives as they ran). */
static int write_trace(MeshExec *mx, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write the trace %s: %s", path, strerror(errno));
    return EXIT_USAGE;
  }
  double t0 = 0;
  bool any = false;
  for (int k = 0; k < mx->world; k++)
    for (int e = 0; e < mx->cpu[k].n_trace; e++)
      if (!any || mx->cpu[k].trace[e].t0 < t0) t0 = mx->cpu[k].trace[e].t0, any = true;
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":\"measured: loom train, cpu backend, the last step\","
          "\"ranks\":%d,\"overlap\":%s},\"traceEvents\":[\n", mx->world, mx->engines ? "true" : "false");
  for (int k = 0; k < mx->world; k++)
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d compute\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d comm\"}},\n",
            2 * k, k, 2 * k + 1, k);
  bool first = true;
  for (int k = 0; k < mx->world; k++)
    for (int e = 0; e < mx->cpu[k].n_trace; e++) {
      const CpuTraceEvent *ev = &mx->cpu[k].trace[e];
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

static int threads_total(int asked) {
  if (asked > 0) return asked;
  const char *e = getenv("LOOM_THREADS");
  if (e && atoi(e) > 0) return atoi(e);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* training: @grad_step and @optimizer_step (the Executor), or a pipelined program's chunks
   (RtProgram.pipe: its walker, exec_mesh_pipe.c); else @forward (eval). */
static int mesh_open(MeshExec *mx, const unsigned char *bytes, size_t n, const char *llvm, uint64_t seed,
                     const char *init, int threads, bool training, bool tracing, FILE *log, char *err, size_t errlen) {
  RtProgram head;   /* the mesh, before the threads are counted */
  int rc = rt_program_load(bytes, n, &head, err, errlen);
  if (rc) return rc;
  for (int a = 0; a < COMM_AXES; a++) mx->mesh[a] = head.mesh[a];
  mx->world = mx->n_local = (int)rt_program_world(&head);
  bool pipe = training && head.pipe.kind;   /* a pipeline: per-chunk functions (exec_mesh_pipe.c) */
  rt_program_free(&head);
  int per = threads_total(threads) / mx->world;
  if (per < 1) per = 1;
  if ((rc = cpu_backend_load(&mx->b, bytes, n, llvm, per, err, errlen))) return rc;
  const RtProgram *p = mx->p = &mx->b.prog;
  if (!(mx->lw = local_world_new(mx->mesh, err, errlen))) return EXIT_USAGE;   /* LOOM_MESH_FAULT or _TIMEOUT */
  mx->cpu = calloc((size_t)mx->world, sizeof *mx->cpu);
  mx->dev = calloc((size_t)mx->world, sizeof *mx->dev);
  mx->coord = calloc((size_t)mx->world, sizeof *mx->coord);
  if (!mx->cpu || !mx->dev || !mx->coord) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int k = 0; k < mx->world; k++) {
    if (k > 0 && (rc = cpu_program_init(&mx->cpu[k], p, mx->b.fns, per, err, errlen))) {
      mx->n_local = k;   /* ranks 1..k-1 hold programs to free */
      return rc;
    }
    if (k == 0) mx->cpu[0] = mx->b.cp;
    mx->cpu[k].comm = local_world_rank(mx->lw, k);
    memcpy(mx->coord[k], mx->cpu[k].comm->coord, sizeof mx->coord[k]);
    cpu_device(&mx->dev[k], &mx->cpu[k]);
  }
  mx->run = run_threads;
  mx->gather = gather_host;
  if ((rc = mesh_exec_open(mx, training, err, errlen))) return rc;
  if ((rc = mesh_exec_init(mx, init, seed, err, errlen))) return rc;
  if (pipe) {   /* the walker over the ranks' devices; their transfers through its tagging communicators */
    if ((rc = pipe_dev_setup(mx, NULL, err, errlen))) return rc;
    for (int k = 0; k < mx->world; k++) mx->cpu[k].comm = &mx->walk->tc[k].c;
  }
  /* async collectives: a communication thread per rank (runtime/cpu/cpu_async.c) */
  if (!pipe && cpu_program_has_async(p)) {
    if (!(mx->engines = calloc((size_t)mx->world, sizeof *mx->engines))) {
      snprintf(err, errlen, "out of memory");
      return EXIT_RUN;
    }
    for (int k = 0; k < mx->world; k++) {
      if (!(mx->engines[k] = comm_engine_new(err, errlen))) return EXIT_RUN;
      mx->cpu[k].engine = mx->engines[k];
    }
  }
  for (int k = 0; k < mx->world && tracing && !pipe; k++) mx->cpu[k].tracing = true;
  mx->ex.comm_wait_ms = pipe ? NULL : comm_wait_ms;
  if (log)
    fprintf(log, "running %d ranks as threads (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld), cpu backend, "
            "%d thread%s each\n", mx->world, (long long)mx->mesh[AX_DP], (long long)mx->mesh[AX_TP],
            (long long)mx->mesh[AX_CP], (long long)mx->mesh[AX_PP], (long long)mx->mesh[AX_EP], per, per == 1 ? "" : "s");
  return 0;
}

static void mesh_close(MeshExec *mx) {
  for (int k = 0; mx->walk && mx->walk->tc && mx->cpu && k < mx->world; k++)   /* their own communicators back */
    if (mx->cpu[k].comm == &mx->walk->tc[k].c) mx->cpu[k].comm = mx->walk->tc[k].inner;
  pipe_dev_free(mx);
  for (int k = 0; mx->engines && k < mx->world; k++) {   /* before the programs whose slots they read */
    comm_engine_free(mx->engines[k]);
    if (mx->cpu) mx->cpu[k].engine = NULL;
  }
  free(mx->engines);
  if (mx->cpu && mx->n_local > 0) {   /* rank 0's CpuProgram is a copy of b.cp: what it allocated since is its own */
    free(mx->cpu[0].async);
    free(mx->cpu[0].trace);
  }
  for (int k = 1; mx->cpu && k < mx->n_local; k++) cpu_program_free(&mx->cpu[k]);
  free(mx->cpu);
  if (mx->p) mesh_exec_free(mx);
  else free(mx->dev), free(mx->coord);
  cpu_backend_free(&mx->b);
  local_world_free(mx->lw);
}

int run_training_cpu_mesh(const unsigned char *prog, size_t n, const char *llvm, const RunPlan *plan, char *err,
                          size_t errlen) {
  MeshExec *mx = calloc(1, sizeof *mx);
  if (!mx) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  int rc = mesh_open(mx, prog, n, llvm, plan->seed, plan->init, plan->threads, true, plan->trace_out != NULL,
                     plan->opt.log, err, errlen);
  if (!rc) rc = train_and_write(&mx->ex, plan, err, errlen);
  if (!rc && !mx->walk && plan->verbose) cpu_arena_report(plan->opt.log, mx->cpu, mx->world);
  if (!rc && plan->trace_out && !mx->walk) {
    rc = write_trace(mx, plan->trace_out, err, errlen);
    if (!rc && plan->opt.log)
      fprintf(plan->opt.log, "wrote the measured timeline to %s (the last step; per rank a compute and a comm track)\n",
              plan->trace_out);
  }
  if (!rc && mx->walk) {
    int64_t peak[64];
    pipe_rt_stash_peaks(mx->walk, mx->p, peak);
    rc = pipe_walk_report(mx->walk, peak, plan, "cpu backend", err, errlen);
  }
  const char *prof = getenv("LOOM_PROFILE");
  if (!rc && prof && *prof) cpu_backend_profile(&mx->b, stderr, atoi(prof) > 0 ? atoi(prof) : 20);
  mesh_close(mx);
  free(mx);
  return rc;
}

int eval_cpu_mesh_open(MeshCpu **out, const unsigned char *prog, size_t n, const char *llvm, const char *weights,
                       char *err, size_t errlen) {
  MeshExec *mx = *out = calloc(1, sizeof *mx);
  if (!mx) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  return mesh_open(mx, prog, n, llvm, 0, weights, 0, false, false, NULL, err, errlen);
}

int eval_cpu_mesh_step(MeshCpu *mc, const int32_t *inputs, const int32_t *targets, float *logits, float *loss, char *err,
                       size_t errlen) {
  return mesh_exec_split(mc, mc->f_grad, inputs, targets, logits, loss, err, errlen);
}

void eval_cpu_mesh_close(MeshCpu *mc) {
  if (!mc) return;
  mesh_close(mc);
  free(mc);
}
