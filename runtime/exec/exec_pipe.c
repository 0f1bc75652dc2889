/* runtime/exec/exec_pipe.c — a pipelined module (pass "pipeline") on the reference executor:
 * the reference interpreter as the pipeline walker's transport (pipe_walk.h).
 *
 * Every rank is a thread of the walker; a call runs the IR function on the interpreter with
 * the rank's globals, its transfers through the walker's tagging communicator; the stash is
 * the Tensors F and B return.  Also here: the interpreter's communicator over a runtime one
 * (exec_ref.c's ranks use it too).
 *
 * The interpreter is not an RtDevice (runtime/device.h says why), so it is a transport of its
 * own rather than the device transport's: its functions are the module's, its buffers Tensors.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/schedule.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_ref.h"
#include "runtime/exec/pipe_walk.h"

/* ---- the interpreter's communicator over a runtime one ---- */

static Comm *over(IrComm *c) { return ((RefComm *)c)->comm; }
static int rc_all_reduce(IrComm *c, int axis, float *buf, int64_t n, bool max) {
  return over(c)->all_reduce(over(c), axis, buf, n, max);
}
static int rc_all_gather(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  return over(c)->all_gather(over(c), axis, in, out, n);
}
static int rc_reduce_scatter(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  return over(c)->reduce_scatter(over(c), axis, in, out, n);
}
static int rc_all_to_all(IrComm *c, int axis, const float *in, float *out, int64_t n) {
  return over(c)->all_to_all(over(c), axis, in, out, n);
}
static int rc_send(IrComm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n) {
  return over(c)->send(over(c), axis, peer, tag, buf, n);
}
static int rc_recv(IrComm *c, int axis, int peer, int64_t tag, float *buf, int64_t n) {
  return over(c)->recv(over(c), axis, peer, tag, buf, n);
}

IrComm *ref_comm(RefComm *a, Comm *c) {
  *a = (RefComm){{NULL, {0}, rc_all_reduce, rc_all_gather, rc_reduce_scatter, rc_all_to_all, rc_send, rc_recv}, c};
  memcpy(a->ir.coord, c->coord, sizeof a->ir.coord);
  return &a->ir;
}

/* ---- the transport ---- */

typedef struct {
  Tensor **t;   /* the results after the loss */
  int n;
} Held;

static Func *func_of(RefExec *r, int f) { return r->m->funcs.items[f]; }

static int ref_find(void *ctx, const char *name) {
  const Module *m = ((RefExec *)ctx)->m;
  const Func *f = module_find_func(m, name);
  for (int i = 0; f && i < m->funcs.n; i++)
    if (m->funcs.items[i] == f) return i;
  return -1;
}

static int ref_takes(void *ctx, int from, int skip, int to, char *err, size_t errlen) {
  const Func *f = func_of(ctx, from), *g = func_of(ctx, to);
  if (f->rets.n - skip == g->args.n - 2 && f->rets.n <= IR_MAX_RESULTS && g->rets.n <= IR_MAX_RESULTS) return 0;
  snprintf(err, errlen, "@%s takes %d arguments; @%s leaves %d", g->name, g->args.n, f->name, 2 + f->rets.n - skip);
  return EXIT_USAGE;
}

static int ref_alloc(void *ctx, int rank, int func, int skip, void **slot, int64_t *bytes, char *err, size_t errlen) {
  (void)rank;
  const Func *f = func_of(ctx, func);
  Held *h = calloc(1, sizeof *h);
  if (h) h->t = calloc((size_t)f->rets.n + 1, sizeof(Tensor *));
  if (!h || !h->t) {
    free(h);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  h->n = f->rets.n - skip;
  *bytes = 0;
  for (int k = skip; k < f->rets.n; k++) *bytes += 4 * type_numel(&((Value *)f->rets.items[k])->type);
  *slot = h;
  return 0;
}

static void ref_free(void *ctx, int rank, void *slot) {
  (void)ctx, (void)rank;
  Held *h = slot;
  for (int k = 0; k < h->n; k++) tensor_free(h->t[k]);
  free(h->t), free(h);
}

static Tensor *tokens(const Type *t, const int32_t *v) {
  Tensor *x = tensor_new(t);
  for (int64_t k = 0; x && k < x->n; k++) x->i[k] = v[k];
  return x;
}

static int ref_call(void *ctx, const PipeCall *c, char *err, size_t errlen) {
  RefExec *r = ctx;
  Func *f = func_of(r, c->func);
  RefComm ad;
  IrComm *comm = ref_comm(&ad, &r->walk->tc[c->rank].c);
  if (c->action < 0) {
    Tensor *args[2] = {r->lr, r->step}, *ret = NULL;
    int rc = interp_run_comm(f, r->g[c->rank], args, &ret, comm, err, errlen);
    if (!rc) *c->norm = ret->f[0];
    tensor_free(ret);
    return rc;
  }
  const Type *tt = &((Value *)f->args.items[0])->type;
  Tensor *args[IR_MAX_RESULTS + 2] = {tokens(tt, c->tok), tokens(tt, c->tgt)}, *rets[IR_MAX_RESULTS + 1] = {0};
  const Held *in = c->in;
  for (int k = 0; in && k < in->n; k++) args[2 + k] = in->t[k];
  int rc = args[0] && args[1] ? interp_run_comm(f, r->g[c->rank], args, rets, comm, err, errlen) : EXIT_RUN;
  if (!args[0] || !args[1]) snprintf(err, errlen, "out of memory");
  tensor_free(args[0]), tensor_free(args[1]);
  if (!rc && c->skip) *c->loss = rets[0]->f[0];
  Held *out = c->out;
  for (int k = 0; k < f->rets.n; k++) {
    if (!rc && out && k >= c->skip) out->t[k - c->skip] = rets[k];   /* kept for B (W) */
    else tensor_free(rets[k]);
  }
  return rc;
}

static const PipeOps ref_ops = {ref_find, ref_takes, ref_alloc, ref_free, ref_call, NULL, NULL, NULL};

static int pipeline_step(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                         size_t errlen) {
  return pipe_walk_step(((RefExec *)self)->walk, n, inputs, targets, losses, err, errlen);
}
static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  RefExec *r = self;
  r->lr->f[0] = lr, r->step->f[0] = t;
  return pipe_walk_optimizer(r->walk, lr, t, grad_norm, err, errlen);
}
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  return pipe_walk_eval(((RefExec *)self)->walk, inputs, targets, loss, err, errlen);
}

int pipe_exec_setup(RefExec *r, char *err, size_t errlen) {
  const Module *m = r->m;
  Func *f0 = module_find_func(m, "fwd.c0");
  if (!f0 || f0->args.n < 2 || !r->lw) {
    snprintf(err, errlen, "the module says it is pipelined but has no @fwd.c0(tokens, targets, ...)");
    return EXIT_USAGE;
  }
  RtGlobal place;
  piece_placement(&((Value *)f0->args.items[0])->type, &place);
  int64_t mesh[COMM_AXES];
  for (int a = 0; a < COMM_AXES; a++) mesh[a] = m->mesh.size[a];
  int rc = pipe_walk_new(&r->walk, m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, (int)m->pipe.micro, r->lw,
                         mesh, NULL, &place, r->inputs->n, err, errlen);
  if (!rc) rc = pipe_walk_bind(r->walk, &ref_ops, r, err, errlen);
  if (rc) return rc;
  r->sched = &r->walk->sched;
  if (!(r->owner = calloc((size_t)m->globals.n + 1, sizeof(int)))) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int i = 0; i < m->globals.n; i++) r->owner[i] = pipe_owner_of(m, m->globals.items[i]);
  r->ex.grad_step = NULL;
  r->ex.pipeline_step = pipeline_step;
  r->ex.optimizer_step = optimizer_step;
  r->ex.eval_step = eval_step;
  return 0;
}

void pipe_exec_free(RefExec *r) {
  pipe_walk_free(r->walk);
  free(r->owner);
  r->walk = NULL, r->sched = NULL, r->owner = NULL;
}
