/* runtime/exec/eval.c — loom eval's execution: one eval step (a batch's @forward -> logits and
 * loss, and with --grads the gradient of that loss for every parameter), and the loop that
 * scores a token shard batch after batch.
 *
 * The driver (driver/eval.c) runs the passes and the lowering and hands this file what a
 * backend runs: a lowered program's bytes (cpu), a lowered CUDA program and its compiled image
 * (GPU 0), or the module and its description (the reference interpreter).  One rank is one
 * evaluator over the backend's device (runtime/device.h: EvDev); every rank of a mesh a thread
 * of the mesh executor (exec_mesh.c).  eval_run then reads the shard's whole batches, batch k
 * being inputs tokens[k*B*T : (k+1)*B*T] and targets one further (the llm.c loader's
 * windows), and averages their losses.  Every batch has B*T positions, so the mean of the
 * batches' losses is the mean cross-entropy over all positions. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_cpu.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/ref_device.h"
#include "runtime/io/tokens.h"

static int oom(char *err, size_t errlen) {
  snprintf(err, errlen, "out of memory");
  return EXIT_RUN;
}

/* The views of a program's gradient region (checkpoint names: one per expert), its data in
   host[i] (globals[i].n floats each). */
static int grad_views(const RtProgram *p, float *const *host, EvalGrads *g, char *err, size_t errlen) {
  int max = 1;
  for (int i = 0; i < p->n_globals; i++) max += rt_views_of(p->globals[i].rank, p->globals[i].shape, p->globals[i].experts);
  if (!(g->views = calloc((size_t)max, sizeof *g->views))) return oom(err, errlen);
  for (int i = 0; i < p->n_globals; i++) {
    const RtGlobal *gl = &p->globals[i];
    if (gl->region == RT_REGION_GRADS && rt_views_add(g->views, &g->n, gl->name, gl->rank, gl->shape, host[i], gl->experts))
      return oom(err, errlen);
  }
  return 0;
}

void eval_grads_free(EvalGrads *g) {
  rt_views_free(g->views, g->n);
  free(g->views);
  if (g->host)
    for (int i = 0; i < g->n_host; i++) free(g->host[i]);
  free(g->host);
  memset(g, 0, sizeof *g);
}

/* ---- one rank: a device (runtime/device.h) of any backend ---- */

typedef struct {
  RtDevice dev;
  int f_forward, f_grad;
  RtProgram prog;      /* cuda: the lowered program; ref: the module's description */
  CpuBackend cpu;      /* the cpu backend's program and kernels */
  CudaProgram cuda;
  void *image;         /* cuda: the compiled image */
  bool have_cuda;
} EvDev;

static int dev_forward(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                       size_t errlen) {
  EvDev *d = e->impl;
  void *args[2] = {(void *)in, (void *)tg}, *rets[RT_MAX_FUNC_IO] = {logits, loss};
  return d->dev.call(&d->dev, d->f_forward, args, rets, err, errlen);
}

/* @grad_step accumulates d(loss)/d(param) into the gradient region: its globals read in
   place (host storage) or read back, as views under the checkpoint's names. */
static int dev_grads(Evaluator *e, const int32_t *in, const int32_t *tg, EvalGrads *g, char *err, size_t errlen) {
  EvDev *d = e->impl;
  float loss = 0;
  void *args[2] = {(void *)in, (void *)tg}, *rets[RT_MAX_FUNC_IO] = {&loss};
  int rc = d->dev.call(&d->dev, d->f_grad, args, rets, err, errlen);
  if (rc) return rc;
  const RtProgram *p = d->dev.p;
  float **host = calloc((size_t)p->n_globals + 1, sizeof *host);
  if (!host) return oom(err, errlen);
  if (!d->dev.host) g->host = host, g->n_host = p->n_globals;   /* the copies are the views' data */
  for (int i = 0; !rc && i < p->n_globals; i++) {
    const RtGlobal *gl = &p->globals[i];
    if (gl->region != RT_REGION_GRADS) continue;
    if (d->dev.host) host[i] = d->dev.host(&d->dev, i);
    else if (!(host[i] = calloc((size_t)gl->n + 1, sizeof(float)))) rc = oom(err, errlen);
    else rc = d->dev.read(&d->dev, i, host[i], err, errlen);
  }
  if (!rc) rc = grad_views(p, host, g, err, errlen);
  if (d->dev.host) free(host);   /* the views point into the device's storage */
  return rc;
}

static void dev_close(Evaluator *e) {
  EvDev *d = e->impl;
  rt_device_close(&d->dev);
  if (d->have_cuda) cuda_program_free(&d->cuda);
  cpu_backend_free(&d->cpu);
  rt_program_free(&d->prog);
  free(d->image);
  free(d);
}

/* An EvDev for e (closed whatever the open then does). */
static EvDev *dev_new(Evaluator *e, const char *where) {
  memset(e, 0, sizeof *e);
  EvDev *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  e->impl = d;
  e->close = dev_close;
  e->forward = dev_forward;
  e->world = 1;
  snprintf(e->where, sizeof e->where, "%s", where);
  return d;
}

/* The device made: its functions found. */
static int dev_ready(Evaluator *e, char *err, size_t errlen) {
  EvDev *d = e->impl;
  d->f_forward = rt_device_find(&d->dev, "forward");
  d->f_grad = rt_device_find(&d->dev, "grad_step");
  e->grads = d->f_grad >= 0 ? dev_grads : NULL;
  if (d->f_forward >= 0) return 0;
  snprintf(err, errlen, "the program has no @forward(tokens, targets) -> (logits, loss)");
  return EXIT_USAGE;
}

int eval_open_cpu(Evaluator *e, const unsigned char *prog, size_t n, const char *llvm, const char *weights, char *err,
                  size_t errlen) {
  EvDev *d = dev_new(e, "the cpu backend");
  if (!d) return oom(err, errlen);
  int rc = cpu_backend_load(&d->cpu, prog, n, llvm, 0, err, errlen);
  if (!rc) cpu_device(&d->dev, &d->cpu.cp);
  if (!rc) rc = dev_ready(e, err, errlen);
  if (!rc) rc = load_weights_rt(&d->cpu.prog, &d->cpu.cp, weights, err, errlen);
  return rc;
}

int eval_open_cuda(Evaluator *e, RtProgram *prog, void *image, size_t n, const char *where, const char *weights,
                   char *err, size_t errlen) {
  EvDev *d = dev_new(e, where);
  if (!d) {
    rt_program_free(prog);
    free(image);
    return oom(err, errlen);
  }
  d->prog = *prog;   /* taken over */
  memset(prog, 0, sizeof *prog);
  d->image = image;
  int rc = cuda_program_init(&d->cuda, &d->prog, image, n, 0, err, errlen);
  d->have_cuda = !rc;
  if (!rc) cuda_device(&d->dev, &d->cuda);
  if (!rc) rc = dev_ready(e, err, errlen);
  if (!rc) rc = cuda_load_params(&d->cuda, &d->prog, weights, err, errlen);
  return rc;
}

/* ---- a mesh (exec_mesh.c: every rank a thread) ---- */

static int mesh_forward(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                        size_t errlen) {
  return eval_cpu_mesh_step(e->impl, in, tg, logits, loss, err, errlen);
}

static void mesh_close_ev(Evaluator *e) { eval_cpu_mesh_close(e->impl); }

int eval_open_ref(Evaluator *e, Module *m, RtProgram *desc, const char *weights, char *err, size_t errlen) {
  if (mesh_world(&m->mesh) > 1) {   /* every rank a thread (exec_mesh.c) */
    memset(e, 0, sizeof *e);
    e->world = (int)mesh_world(&m->mesh);
    snprintf(e->where, sizeof e->where, "the reference executor");
    e->forward = mesh_forward;
    e->close = mesh_close_ev;
    MeshCpu *mc = NULL;
    int rc = eval_cpu_mesh_open(&mc, m, desc, NULL, 0, NULL, weights, err, errlen);
    e->impl = mc;   /* closed whatever the open did */
    return rc;
  }
  EvDev *d = dev_new(e, "the reference executor");
  if (!d) {
    rt_program_free(desc);
    return oom(err, errlen);
  }
  d->prog = *desc;   /* taken over */
  memset(desc, 0, sizeof *desc);
  int rc = ref_device_open(&d->dev, m, &d->prog, NULL, err, errlen);
  if (!rc) rc = dev_ready(e, err, errlen);
  if (!rc) {   /* the interpreter's initial values, then the weights */
    GlobalStore *g = ((RefRank *)d->dev.impl)->g;
    globals_init(m, g, 0);
    rc = load_weights(m, g, weights, err, errlen);
  }
  return rc;
}

int eval_open_cpu_mesh(Evaluator *e, Module *m, const unsigned char *prog, size_t n, const char *llvm,
                       const char *weights, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  e->forward = mesh_forward;
  e->close = mesh_close_ev;
  e->world = (int)mesh_world(&m->mesh);
  snprintf(e->where, sizeof e->where, "the cpu backend");
  MeshCpu *mc = NULL;
  int rc = eval_cpu_mesh_open(&mc, m, NULL, prog, n, llvm, weights, err, errlen);
  e->impl = mc;   /* closed whatever the open did */
  return rc;
}

void eval_close(Evaluator *e) {
  if (e->close && e->impl) e->close(e);
  e->impl = NULL;
}

/* ---- scoring a token shard ---- */

int eval_run(Evaluator *e, const EvalPlan *p, EvalResult *res, char *err, size_t errlen) {
  int64_t B = p->batch, T = p->seq, V = p->vocab, BT = B * T;
  memset(res, 0, sizeof *res);
  TokShard shard;
  int rc = tok_open(p->tokens, &shard, err, errlen);
  if (rc) return rc;
  if (shard.count < BT + 1) {
    snprintf(err, errlen, "%s: holds %lld tokens, but batch %lld x seq %lld needs %lld (inputs plus one target); "
             "use a smaller --batch or --seq", p->tokens, (long long)shard.count, (long long)B, (long long)T,
             (long long)(BT + 1));
    tok_close(&shard);
    return EXIT_USAGE;
  }
  if ((rc = tok_check_vocab(&shard, V, err, errlen))) {
    tok_close(&shard);
    return rc;
  }
  res->available = (shard.count - 1) / BT;   /* whole batches: each needs one target past its inputs */
  int64_t nb = p->max_batches > 0 && p->max_batches < res->available ? p->max_batches : res->available;
  if ((p->out || p->grads) && nb > 1) nb = 1;   /* one batch's logits and gradients (the caller says so) */
  int32_t *in = malloc(sizeof(int32_t) * (size_t)BT), *tg = malloc(sizeof(int32_t) * (size_t)BT);
  float *logits = malloc(sizeof(float) * (size_t)(BT * V)), loss = 0;
  if (!in || !tg || !logits) rc = oom(err, errlen);
  double t0 = seconds_now(), last = t0, sum = 0;
  for (int64_t b = 0; !rc && b < nb; b++) {
    for (int64_t j = 0; j < BT; j++) {
      in[j] = (int32_t)tok_get(&shard, b * BT + j);
      tg[j] = (int32_t)tok_get(&shard, b * BT + j + 1);
    }
    if ((rc = e->forward(e, in, tg, logits, &loss, err, errlen))) break;
    sum += loss;
    res->batches = b + 1;
    double now = seconds_now();
    if (p->log && b + 1 < nb && now - last >= 2.0) {   /* no silent stretch on a long shard */
      fprintf(p->log, "eval: batch %lld of %lld, mean loss so far %.6f, %.1f s\n", (long long)(b + 1), (long long)nb,
              sum / (double)(b + 1), now - t0);
      fflush(p->log);
      last = now;
    }
  }
  res->seconds = seconds_now() - t0;
  res->tokens = res->batches * BT;
  /* one batch: its loss as the program computed it (a float, exactly) */
  res->loss = res->batches == 1 ? (double)loss : sum / (double)(res->batches ? res->batches : 1);
  EvalGrads g;
  memset(&g, 0, sizeof g);
  if (!rc && p->grads) {
    if (!e->grads) {
      snprintf(err, errlen, "--grads runs one rank; drop --mesh (or --grads)");
      rc = EXIT_USAGE;
    } else {
      rc = e->grads(e, in, tg, &g, err, errlen);
    }
  }
  if (!rc && p->out) {
    StTensor *st = calloc((size_t)g.n + 2, sizeof *st);
    int k = 0;
    if (!st) rc = oom(err, errlen);
    if (!rc) {
      st[k++] = (StTensor){"logits", ST_F32, 3, {B, T, V}, (uint64_t)(BT * V) * 4, logits};
      st[k++] = (StTensor){"loss", ST_F32, 0, {0}, 4, &loss};
      for (int v = 0; v < g.n; v++, k++) {
        st[k] = (StTensor){(char *)g.views[v].name, ST_F32, g.views[v].rank, {0},
                           (uint64_t)st_numel(g.views[v].rank, g.views[v].shape) * 4, g.views[v].data};
        memcpy(st[k].shape, g.views[v].shape, sizeof g.views[v].shape);
      }
      rc = st_write(p->out, st, k, NULL, NULL, 0, err, errlen);
    }
    free(st);
  }
  eval_grads_free(&g);
  free(in);
  free(tg);
  free(logits);
  tok_close(&shard);
  return rc;
}
