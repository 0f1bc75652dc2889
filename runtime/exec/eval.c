/* runtime/exec/eval.c — loom eval's execution: one eval step (a batch's @forward -> logits and
 * loss, and with --grads the gradient of that loss for every parameter) on each backend and
 * layout, and the loop that scores a token shard batch after batch.
 *
 * The driver (driver/eval.c) runs the passes and the lowering and hands this file what a
 * backend runs: a lowered program's bytes (cpu, one rank or every rank a thread), a lowered
 * CUDA program and its compiled image (GPU 0), or the module itself (the reference executor,
 * one rank or every rank a thread).  Each opens an Evaluator; eval_run then reads the shard's
 * whole batches, batch k being inputs tokens[k*B*T : (k+1)*B*T] and targets one further (the
 * llm.c loader's windows), and averages their losses.  Every batch has B*T positions, so the
 * mean of the batches' losses is the mean cross-entropy over all positions. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_cpu.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/exec_ref.h"
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

/* ---- the cpu backend, one rank ---- */

typedef struct {
  CpuBackend b;
} EvCpu;

static int cpu_forward(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                       size_t errlen) {
  EvCpu *c = e->impl;
  void *args[2] = {(void *)in, (void *)tg}, *rets[2] = {logits, loss};
  return cpu_program_call(&c->b.cp, cpu_find_func(&c->b.cp, "forward"), args, rets, err, errlen);
}

/* @grad_step accumulates d(loss)/d(param) into the gradient region, read in place. */
static int cpu_grads(Evaluator *e, const int32_t *in, const int32_t *tg, EvalGrads *g, char *err, size_t errlen) {
  EvCpu *c = e->impl;
  float loss = 0;
  void *args[2] = {(void *)in, (void *)tg}, *rets[1] = {&loss};
  int rc = cpu_program_call(&c->b.cp, cpu_find_func(&c->b.cp, "grad_step"), args, rets, err, errlen);
  if (rc) return rc;
  float **host = calloc((size_t)c->b.prog.n_globals + 1, sizeof *host);
  if (!host) return oom(err, errlen);
  for (int i = 0; i < c->b.prog.n_globals; i++) host[i] = cpu_global(&c->b.cp, i);
  rc = grad_views(&c->b.prog, host, g, err, errlen);
  free(host);   /* the views point into the program's region */
  return rc;
}

static void cpu_close(Evaluator *e) {
  EvCpu *c = e->impl;
  cpu_backend_free(&c->b);
  free(c);
}

int eval_open_cpu(Evaluator *e, const unsigned char *prog, size_t n, const char *llvm, const char *weights, char *err,
                  size_t errlen) {
  memset(e, 0, sizeof *e);
  EvCpu *c = calloc(1, sizeof *c);
  if (!c) return oom(err, errlen);
  e->impl = c;
  e->close = cpu_close;
  e->forward = cpu_forward;
  e->grads = cpu_grads;
  e->world = 1;
  snprintf(e->where, sizeof e->where, "the cpu backend");
  int rc = cpu_backend_load(&c->b, prog, n, llvm, 0, err, errlen);
  if (!rc) rc = load_weights_rt(&c->b.prog, &c->b.cp, weights, err, errlen);
  return rc;
}

/* ---- the cuda backend, GPU 0 ---- */

typedef struct {
  RtProgram prog;
  void *image;
  CudaProgram cp;
  bool have_cp;
} EvCuda;

static int cuda_forward(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                        size_t errlen) {
  EvCuda *c = e->impl;
  void *args[2] = {(void *)in, (void *)tg}, *rets[2] = {logits, loss};
  return cuda_program_call(&c->cp, cuda_find_func(&c->cp, "forward"), args, rets, err, errlen);
}

static int cuda_grads(Evaluator *e, const int32_t *in, const int32_t *tg, EvalGrads *g, char *err, size_t errlen) {
  EvCuda *c = e->impl;
  float loss = 0;
  void *args[2] = {(void *)in, (void *)tg}, *rets[1] = {&loss};
  int rc = cuda_program_call(&c->cp, cuda_find_func(&c->cp, "grad_step"), args, rets, err, errlen);
  if (rc) return rc;
  g->n_host = c->prog.n_globals;
  if (!(g->host = calloc((size_t)g->n_host + 1, sizeof *g->host))) return oom(err, errlen);
  for (int i = 0; i < c->prog.n_globals; i++) {   /* the gradients read back */
    const RtGlobal *gl = &c->prog.globals[i];
    if (gl->region != RT_REGION_GRADS) continue;
    if (!(g->host[i] = calloc((size_t)gl->n + 1, sizeof(float)))) return oom(err, errlen);
    if ((rc = cuda_global_read(&c->cp, i, g->host[i], err, errlen))) return rc;
  }
  return grad_views(&c->prog, g->host, g, err, errlen);
}

static void cuda_close(Evaluator *e) {
  EvCuda *c = e->impl;
  if (c->have_cp) cuda_program_free(&c->cp);
  rt_program_free(&c->prog);
  free(c->image);
  free(c);
}

int eval_open_cuda(Evaluator *e, RtProgram *prog, void *image, size_t n, const char *where, const char *weights,
                   char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  EvCuda *c = calloc(1, sizeof *c);
  if (!c) {
    rt_program_free(prog);
    free(image);
    return oom(err, errlen);
  }
  c->prog = *prog;   /* taken over */
  memset(prog, 0, sizeof *prog);
  c->image = image;
  e->impl = c;
  e->close = cuda_close;
  e->forward = cuda_forward;
  e->grads = cuda_grads;
  e->world = 1;
  snprintf(e->where, sizeof e->where, "%s", where);
  int rc = cuda_program_init(&c->cp, &c->prog, image, n, 0, err, errlen);
  c->have_cp = !rc;
  if (!rc) rc = cuda_load_params(&c->cp, &c->prog, weights, err, errlen);
  return rc;
}

/* ---- the reference executor: one rank on a store of the module's globals, or every rank of
   a partitioned module as threads (RefExec; no gradients there) ---- */

typedef struct {
  const Module *m;
  GlobalStore *g;    /* one rank */
  RefExec rx;        /* a mesh */
  bool mesh, have_rx;
} EvRef;

/* The forward's arguments from int32 token ids (the whole batch: the ranks take their parts). */
static int ref_args(const EvRef *r, const Func *f, const int32_t *in, const int32_t *tg, Tensor **args, char *err,
                    size_t errlen) {
  for (int k = 0; k < 2; k++) {
    const Type *t = &((Value *)f->args.items[k])->type;
    Type whole = r->mesh ? whole_type(r->m, t) : *t;
    if (!(args[k] = tensor_new(&whole))) return oom(err, errlen);
    for (int64_t j = 0; j < args[k]->n; j++) args[k]->i[j] = (k ? tg : in)[j];
  }
  return 0;
}

static int ref_call(Evaluator *e, const char *fname, const int32_t *in, const int32_t *tg, Tensor **rets, char *err,
                    size_t errlen) {
  EvRef *r = e->impl;
  Func *f = module_find_func(r->m, fname);
  Tensor *args[2] = {0};
  int rc = ref_args(r, f, in, tg, args, err, errlen);
  if (!rc) rc = r->mesh ? ref_exec_run(&r->rx, f, args, rets, err, errlen) : interp_run(f, r->g, args, rets, err, errlen);
  tensor_free(args[0]);
  tensor_free(args[1]);
  return rc;
}

static int ref_forward(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                       size_t errlen) {
  Tensor *rets[2] = {0};
  int rc = ref_call(e, "forward", in, tg, rets, err, errlen);
  if (!rc) {
    memcpy(logits, rets[0]->f, sizeof(float) * (size_t)rets[0]->n);
    *loss = rets[1]->f[0];
  }
  tensor_free(rets[0]);
  tensor_free(rets[1]);
  return rc;
}

/* @grad_step accumulates d(loss)/d(param) into $grad.<name>, written in the checkpoint's
   shape (its HF shape, or a stack of experts as one tensor per expert). */
static int ref_grads(Evaluator *e, const int32_t *in, const int32_t *tg, EvalGrads *g, char *err, size_t errlen) {
  EvRef *r = e->impl;
  Tensor *loss = NULL;
  int rc = ref_call(e, "grad_step", in, tg, &loss, err, errlen);
  tensor_free(loss);
  if (rc) return rc;
  const Module *m = r->m;
  int max = 1;
  for (int i = 0; i < m->globals.n; i++) {
    const Global *gl = m->globals.items[i];
    max += rt_views_of(gl->value->type.rank, r->g->t[i]->type.dims, gl->hf_experts);
  }
  if (!(g->views = calloc((size_t)max, sizeof *g->views))) return oom(err, errlen);
  for (int i = 0; i < m->globals.n; i++) {
    const Global *gl = m->globals.items[i];
    if (gl->kind != GLOBAL_STATE || strncmp(gl->name, GRAD_PREFIX, strlen(GRAD_PREFIX))) continue;
    Tensor *t = r->g->t[i];
    int bad = gl->hf_rank ? rt_views_add(g->views, &g->n, gl->name, gl->hf_rank, gl->hf_dims, t->f, false)
                          : rt_views_add(g->views, &g->n, gl->name, t->type.rank, t->type.dims, t->f, gl->hf_experts);
    if (bad) return oom(err, errlen);
  }
  return 0;
}

static void ref_close(Evaluator *e) {
  EvRef *r = e->impl;
  if (r->have_rx) ref_exec_free(&r->rx);
  globals_free(r->g);
  free(r);
}

int eval_open_ref(Evaluator *e, const Module *m, const char *weights, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  EvRef *r = calloc(1, sizeof *r);
  if (!r) return oom(err, errlen);
  e->impl = r;
  e->close = ref_close;
  e->forward = ref_forward;
  r->m = m;
  r->mesh = mesh_world(&m->mesh) > 1;
  e->world = (int)mesh_world(&m->mesh);
  snprintf(e->where, sizeof e->where, "the reference executor");
  if (r->mesh) {
    r->have_rx = true;   /* freed whatever the open did */
    return ref_exec_open(&r->rx, m, 0, weights, false, err, errlen);
  }
  e->grads = module_find_func(m, "grad_step") ? ref_grads : NULL;
  if (!(r->g = globals_new(m))) {
    snprintf(err, errlen, "out of memory for the parameters");
    return EXIT_RUN;
  }
  return load_weights(m, r->g, weights, err, errlen);
}

/* ---- the cpu backend's mesh (exec_mesh.c: every rank a thread) ---- */

static int mesh_forward(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                        size_t errlen) {
  return eval_cpu_mesh_step(e->impl, in, tg, logits, loss, err, errlen);
}

static void mesh_close_ev(Evaluator *e) { eval_cpu_mesh_close(e->impl); }

int eval_open_cpu_mesh(Evaluator *e, Module *m, const unsigned char *prog, size_t n, const char *llvm,
                       const char *weights, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  e->forward = mesh_forward;
  e->close = mesh_close_ev;
  e->world = (int)mesh_world(&m->mesh);
  snprintf(e->where, sizeof e->where, "the cpu backend");
  MeshCpu *mc = NULL;
  int rc = eval_cpu_mesh_open(&mc, prog, n, llvm, weights, err, errlen);
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
