/* runtime/exec/mesh_threads.c — the mesh executor's world of threads (exec_mesh.h): every rank
   of a partitioned program a thread of this process, on the cpu backend or the reference
   interpreter.  On the cpu backend the program is lowered and JIT-compiled once; each rank
   gets its own CpuProgram (arena, parameters, gradients, optimizer state).  On the reference
   interpreter each rank is the interpreter as a device (ref_device.c) over the module with a
   store of its own pieces.  Their collectives go through runtime/comm's LocalWorld, and a
   gather reads the ranks' pieces where they live (host storage).  The lowered program comes
   as bytes (rt_program_save) and the kernels' LLVM IR, as compiled executables carry them.
   Also here: the reference interpreter's training entry point (one rank: the rank executor). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/pipe_walk.h"
#include "runtime/exec/ref_device.h"

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

/* The ranks' devices (mx->world of them, `per` threads each): the cpu backend's (bytes,
   llvm: the lowered program and its kernels' LLVM IR, JIT-compiled once; a CpuProgram per
   rank) or, ref, the reference interpreter's over m and its description in mx->prog (a store
   of globals per rank). */
static int open_devices(MeshExec *mx, const Module *m, bool ref, const unsigned char *bytes, size_t n, const char *llvm,
                        int per, char *err, size_t errlen) {
  int rc = ref ? 0 : cpu_backend_load(&mx->b, bytes, n, llvm, per, err, errlen);
  if (rc) return rc;
  mx->p = ref ? &mx->prog : &mx->b.prog;
  mx->cpu = ref ? NULL : calloc((size_t)mx->world, sizeof *mx->cpu);
  mx->dev = calloc((size_t)mx->world, sizeof *mx->dev);
  mx->coord = calloc((size_t)mx->world, sizeof *mx->coord);
  if ((!ref && !mx->cpu) || !mx->dev || !mx->coord) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int k = 0; k < mx->world; k++) {
    Comm *c = local_world_rank(mx->lw, k);
    memcpy(mx->coord[k], c->coord, sizeof mx->coord[k]);
    if (ref) {
      if ((rc = ref_device_open(&mx->dev[k], m, mx->p, c, err, errlen))) {
        mx->n_local = k;   /* ranks 0..k-1 hold devices to close */
        return rc;
      }
      continue;
    }
    if (k > 0 && (rc = cpu_program_init(&mx->cpu[k], mx->p, mx->b.fns, per, err, errlen))) {
      mx->n_local = k;   /* ranks 1..k-1 hold programs to free */
      return rc;
    }
    if (k == 0) mx->cpu[0] = mx->b.cp;
    mx->cpu[k].comm = c;
    cpu_device(&mx->dev[k], &mx->cpu[k]);
  }
  return 0;
}

/* training: @grad_step and @optimizer_step (the Executor), or a pipelined program's chunks
   (RtProgram.pipe: its walker, exec_mesh_pipe.c); else @forward (eval).  desc: the reference
   interpreter's ranks over m (desc: m's description, taken over), else the cpu backend's
   (bytes, n, llvm; m unused). */
static int mesh_open(MeshExec *mx, const Module *m, RtProgram *desc, const unsigned char *bytes, size_t n,
                     const char *llvm, uint64_t seed, const char *init, int threads, bool training, bool tracing,
                     FILE *log, char *err, size_t errlen) {
  bool ref = desc != NULL;
  RtProgram head;   /* the mesh, before the threads are counted */
  int rc = 0;
  if (ref) mx->prog = *desc, memset(desc, 0, sizeof *desc);   /* taken over */
  else if ((rc = rt_program_load(bytes, n, &head, err, errlen))) return rc;
  const RtProgram *h = ref ? &mx->prog : &head;
  for (int a = 0; a < COMM_AXES; a++) mx->mesh[a] = h->mesh[a];
  mx->world = mx->n_local = (int)rt_program_world(h);
  bool pipe = training && h->pipe.kind;   /* a pipeline: per-chunk functions (exec_mesh_pipe.c) */
  if (!ref) rt_program_free(&head);
  int per = threads_total(threads) / mx->world;
  if (per < 1) per = 1;
  if (!(mx->lw = local_world_new(mx->mesh, err, errlen))) return EXIT_USAGE;   /* LOOM_MESH_FAULT or _TIMEOUT */
  if ((rc = open_devices(mx, m, ref, bytes, n, llvm, per, err, errlen))) return rc;
  const RtProgram *p = mx->p;
  mx->run = run_threads;
  mx->gather = gather_host;
  if ((rc = mesh_exec_open(mx, training, err, errlen))) return rc;
  if ((rc = mesh_exec_init(mx, init, seed, err, errlen))) return rc;
  if (pipe) {   /* the walker over the ranks' devices; their transfers through its tagging communicators */
    if ((rc = pipe_dev_setup(mx, NULL, err, errlen))) return rc;
    for (int k = 0; k < mx->world; k++) {
      if (ref) ((RefRank *)mx->dev[k].impl)->comm = &mx->walk->tc[k].c;
      else mx->cpu[k].comm = &mx->walk->tc[k].c;
    }
  }
  if (ref) {   /* the interpreter runs its collectives itself and records no timeline */
    if (log)
      fprintf(log, "running %d ranks as threads (mesh dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld)\n", mx->world,
              (long long)mx->mesh[AX_DP], (long long)mx->mesh[AX_TP], (long long)mx->mesh[AX_CP],
              (long long)mx->mesh[AX_PP], (long long)mx->mesh[AX_EP]);
    return 0;
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
  for (int k = 0; mx->dev && k < mx->n_local; k++) rt_device_close(&mx->dev[k]);   /* the interpreter's stores */
  if (mx->p) mesh_exec_free(mx);
  else free(mx->dev), free(mx->coord);
  cpu_backend_free(&mx->b);
  rt_program_free(&mx->prog);   /* the interpreter's description */
  local_world_free(mx->lw);
}

/* Every rank a thread, trained; desc: the reference interpreter's over m (mesh_open). */
static int train_mesh(const Module *m, RtProgram *desc, const unsigned char *prog, size_t n, const char *llvm,
                      const RunPlan *plan, char *err, size_t errlen) {
  MeshExec *mx = calloc(1, sizeof *mx);
  if (!mx) {
    rt_program_free(desc);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  bool ref = desc != NULL;
  int rc = mesh_open(mx, m, desc, prog, n, llvm, plan->seed, plan->init, plan->threads, true, plan->trace_out != NULL,
                     plan->opt.log, err, errlen);
  if (!rc) rc = train_and_write(&mx->ex, plan, err, errlen);
  if (!rc && !ref && !mx->walk && plan->verbose) cpu_arena_report(plan->opt.log, mx->cpu, mx->world);
  if (!rc && !ref && plan->trace_out && !mx->walk) {
    rc = write_trace(mx, plan->trace_out, err, errlen);
    if (!rc && plan->opt.log)
      fprintf(plan->opt.log, "wrote the measured timeline to %s (the last step; per rank a compute and a comm track)\n",
              plan->trace_out);
  }
  if (!rc && mx->walk) {
    int64_t peak[64];
    pipe_rt_stash_peaks(mx->walk, mx->p, peak);
    rc = pipe_walk_report(mx->walk, peak, plan, ref ? "reference executor" : "cpu backend", err, errlen);
  }
  const char *prof = getenv("LOOM_PROFILE");
  if (!rc && !ref && prof && *prof) cpu_backend_profile(&mx->b, stderr, atoi(prof) > 0 ? atoi(prof) : 20);
  mesh_close(mx);
  free(mx);
  return rc;
}

int run_training_cpu_mesh(const unsigned char *prog, size_t n, const char *llvm, const RunPlan *plan, char *err,
                          size_t errlen) {
  return train_mesh(NULL, NULL, prog, n, llvm, plan, err, errlen);
}

int eval_cpu_mesh_open(MeshCpu **out, const Module *m, RtProgram *desc, const unsigned char *prog, size_t n,
                       const char *llvm, const char *weights, char *err, size_t errlen) {
  MeshExec *mx = *out = calloc(1, sizeof *mx);
  if (!mx) {
    rt_program_free(desc);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  return mesh_open(mx, m, desc, prog, n, llvm, 0, weights, 0, false, false, NULL, err, errlen);
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

/* ---- the reference interpreter's training entry point: one rank on the rank executor, a mesh
   as threads ---- */

/* What the reference executor refuses before it starts: a module without its training
   functions, a mesh the module is not partitioned for. */
static int training_check(const Module *m, char *err, size_t errlen) {
  int world = (int)mesh_world(&m->mesh);
  if (m->pipe.kind) {
    const Func *f0 = module_find_func(m, "fwd.c0");
    if (!f0 || f0->args.n < 2) {
      snprintf(err, errlen, "the pipelined module has no @fwd.c0(tokens, targets): run the pipeline pass (--passes=train)");
      return EXIT_USAGE;
    }
  } else {
    const Func *g = module_find_func(m, "grad_step"), *o = module_find_func(m, "optimizer_step");
    if (!g || !o || g->args.n != 2 || o->args.n != 2) {
      snprintf(err, errlen, "the module has no @grad_step(tokens, targets) and @optimizer_step(lr, step); "
               "run the autodiff and optimizer passes (loom ir --passes=train)");
      return EXIT_USAGE;
    }
  }
  if (world > 1 && !m->local) {
    snprintf(err, errlen, "the mesh has %d ranks but the program is not partitioned: run the shard pass", world);
    return EXIT_USAGE;
  }
  return 0;
}

int run_training_ref(Module *m, RtProgram *desc, const RunPlan *plan, char *err, size_t errlen) {
  int rc = training_check(m, err, errlen);
  if (!rc && mesh_world(&m->mesh) > 1) {
    rc = train_mesh(m, desc, NULL, 0, NULL, plan, err, errlen);
  } else if (!rc) {
    RtDevice dev;
    RtRankExec re;
    bool have_re = false;
    rc = ref_device_open(&dev, m, desc, NULL, err, errlen);
    if (!rc) {   /* the parameters as the interpreter initializes them, or the checkpoint's */
      GlobalStore *g = ((RefRank *)dev.impl)->g;
      globals_init(m, g, plan->seed);
      if (plan->init) rc = load_weights(m, g, plan->init, err, errlen);
    }
    const Type *tt = &((const Value *)module_find_func(m, "grad_step")->args.items[0])->type;
    if (!rc) rc = rt_rank_exec_init(&re, &dev, tt->rank == 2 ? tt->dims[0] : 0, tt->rank == 2 ? tt->dims[1] : 0, err,
                                    errlen);
    have_re = !rc;
    if (!rc) rc = train_and_write(&re.ex, plan, err, errlen);
    if (have_re) rt_rank_exec_free(&re);
    rt_device_close(&dev);
  }
  if (!rc && !m->pipe.kind && plan->trace_out && plan->opt.log)
    fprintf(plan->opt.log, "note: --trace-out records pipelines and meshes on the cpu backend; this run writes no "
            "timeline (use --backend cpu)\n");
  rt_program_free(desc);
  return rc;
}
