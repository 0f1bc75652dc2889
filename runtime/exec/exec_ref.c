/* runtime/exec/exec_ref.c — the reference executor behind the training loop, for one rank or for
   every rank of a partitioned program (threads of this process). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/exec_ref.h"
#include "runtime/exec/exec.h"

static bool has_partial(const Type *t) {
  for (int a = 0; a < AX_COUNT; a++)
    if (t->sh.kind[a] == SH_P) return true;
  return false;
}

/* Whole -> every rank.  A partial placement (gradient sums) puts the value on the ranks
   of coordinate 0 on those axes and zeros elsewhere, so the sum is the value. */
static void scatter_global(RefExec *r, int gi) {
  for (int rank = 0; rank < r->world; rank++) {
    Tensor *piece = r->g[rank]->t[gi];
    const int *coord = local_world_rank(r->lw, rank)->coord;
    bool zero = false;
    for (int a = 0; a < AX_COUNT; a++) zero |= piece->type.sh.kind[a] == SH_P && coord[a] != 0;
    if (zero) memset(piece->f ? (void *)piece->f : (void *)piece->i, 0,
                     (size_t)piece->n * (piece->f ? sizeof(float) : sizeof(int64_t)));
    else move_piece(&r->m->mesh, r->full[gi], piece, coord, true);
  }
}

/* Every rank -> whole (replicated pieces are equal on every rank; rank order wins).  In a
   pipeline only the stage that updates a global holds its truth. */
static void gather_global(RefExec *r, int gi) {
  for (int rank = 0; rank < r->world; rank++) {
    const int *coord = local_world_rank(r->lw, rank)->coord;
    if (r->owner && r->owner[gi] >= 0 && coord[AX_PP] != r->owner[gi]) continue;
    move_piece(&r->m->mesh, r->full[gi], r->g[rank]->t[gi], coord, false);
  }
}

static bool exposed(const Global *gl) {
  return dtype_is_float(gl->value->type.dtype) && (gl->kind == GLOBAL_PARAM || strncmp(gl->name, GRAD_PREFIX, strlen(GRAD_PREFIX)));
}

static int sync_out(void *self, char *err, size_t errlen) {
  RefExec *r = self;
  (void)err;
  (void)errlen;
  for (int i = 0; i < r->m->globals.n; i++)
    if (exposed(r->m->globals.items[i]) && !has_partial(&r->g[0]->t[i]->type)) gather_global(r, i);
  return 0;
}

static int sync_in(void *self, char *err, size_t errlen) {
  RefExec *r = self;
  (void)err;
  (void)errlen;
  for (int i = 0; i < r->m->globals.n; i++)
    if (exposed(r->m->globals.items[i])) scatter_global(r, i);
  return 0;
}

/* ---- running every rank ---- */

typedef struct {
  RefExec *r;
  int rank;
  Func *f;
  Tensor *args[8];
  Tensor *ret[8];
  int rc;
  char err[IR_ERR_LEN];
} RankJob;

static void *rank_main(void *arg) {
  RankJob *j = arg;
  RefExec *r = j->r;
  RefComm ad;   /* p2p: cp's ring */
  IrComm *comm = r->lw ? ref_comm(&ad, local_world_rank(r->lw, j->rank)) : NULL;
  j->rc = interp_run_comm(j->f, r->g[j->rank], j->args, j->ret, comm, j->err, sizeof j->err);
  if (j->rc && r->lw) local_world_abort(r->lw);   /* the others must not wait for this rank */
  return NULL;
}

/* Runs f on every rank; args are whole (each rank takes its piece by its placement).
   The results are replicated (the shard pass makes them so): rank 0's are returned. */
int ref_exec_run(RefExec *r, Func *f, Tensor **whole_args, Tensor **rets, char *err, size_t errlen) {
  if (f->args.n > 8 || f->rets.n > 8) {
    snprintf(err, errlen, "@%s has more than 8 arguments or results", f->name);
    return EXIT_RUN;
  }
  RankJob *jobs = calloc((size_t)r->world, sizeof *jobs);
  pthread_t *th = calloc((size_t)r->world, sizeof *th);
  int rc = 0;
  for (int k = 0; k < r->world; k++) {
    jobs[k].r = r;
    jobs[k].rank = k;
    jobs[k].f = f;
    for (int a = 0; a < f->args.n; a++) {
      const Type *lt = &((Value *)f->args.items[a])->type;
      if (r->world == 1) {
        jobs[k].args[a] = whole_args[a];
        continue;
      }
      jobs[k].args[a] = tensor_new(lt);
      move_piece(&r->m->mesh, whole_args[a], jobs[k].args[a], local_world_rank(r->lw, k)->coord, true);
    }
  }
  if (r->world == 1) rank_main(&jobs[0]);
  else {
    for (int k = 0; k < r->world; k++) pthread_create(&th[k], NULL, rank_main, &jobs[k]);
    for (int k = 0; k < r->world; k++) pthread_join(th[k], NULL);
  }
  for (int k = 0; k < r->world && !rc; k++)
    if (jobs[k].rc) {   /* the first rank that failed says why (the others were aborted) */
      rc = jobs[k].rc;
      if (r->world > 1) snprintf(err, errlen, "rank %d: %.2000s", k, jobs[k].err);
      else snprintf(err, errlen, "%s", jobs[k].err);
    }
  if (rc && r->lw && local_world_fault(r->lw))   /* the rank and collective that stopped the world */
    snprintf(err, errlen, "%.2000s", local_world_fault(r->lw));
  for (int i = 0; i < f->rets.n; i++) {
    rets[i] = rc ? NULL : jobs[0].ret[i];   /* replicated: every rank has the same */
    if (rc) tensor_free(jobs[0].ret[i]);
  }
  for (int k = 0; k < r->world; k++) {
    for (int i = 0; i < f->rets.n && k > 0; i++) tensor_free(jobs[k].ret[i]);
    if (r->world > 1)
      for (int a = 0; a < f->args.n; a++) tensor_free(jobs[k].args[a]);
  }
  free(jobs);
  free(th);
  if (rc && r->lw) {   /* a failed world cannot be reused: make a fresh one for what follows */
    int64_t mesh[COMM_AXES];
    for (int a = 0; a < COMM_AXES; a++) mesh[a] = r->m->mesh.size[a];
    local_world_free(r->lw);
    char e2[256];
    r->lw = local_world_new(mesh, e2, sizeof e2);
  }
  return rc;
}

/* A function returning one scalar. */
static int run_scalar(RefExec *r, Func *f, Tensor **args, float *out, char *err, size_t errlen) {
  Tensor *ret = NULL;
  int rc = ref_exec_run(r, f, args, &ret, err, errlen);
  if (!rc) *out = ret->f[0];
  tensor_free(ret);
  return rc;
}

static int grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  RefExec *r = self;
  for (int64_t k = 0; k < r->inputs->n; k++) {
    r->inputs->i[k] = inputs[k];
    r->targets->i[k] = targets[k];
  }
  Tensor *args[2] = {r->inputs, r->targets};
  return run_scalar(r, r->grad_step, args, loss, err, errlen);
}

/* Validation: @forward(tokens, targets) -> (logits, loss); nothing else changes. */
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  RefExec *r = self;
  Func *f = module_find_func(r->m, "forward");
  if (!f || f->args.n != 2 || f->rets.n != 2) {
    snprintf(err, errlen, "the module has no @forward(tokens, targets) -> (logits, loss) to validate with");
    return 2;
  }
  for (int64_t k = 0; k < r->inputs->n; k++) {
    r->inputs->i[k] = inputs[k];
    r->targets->i[k] = targets[k];
  }
  Tensor *args[2] = {r->inputs, r->targets}, *rets[2] = {NULL, NULL};
  int rc = ref_exec_run(r, f, args, rets, err, errlen);
  if (!rc) *loss = rets[1]->f[0];
  tensor_free(rets[0]);
  tensor_free(rets[1]);
  return rc;
}

static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  RefExec *r = self;
  r->lr->f[0] = lr;
  r->step->f[0] = t;
  Tensor *args[2] = {r->lr, r->step};
  return run_scalar(r, r->optimizer_step, args, grad_norm, err, errlen);
}

static RtTensor view(const Global *gl, Tensor *t) {
  RtTensor v = {gl->name, t->type.rank, {0}, t->f, NULL};
  for (int d = 0; d < t->type.rank; d++) v.shape[d] = t->type.dims[d];
  if (gl->hf_rank) {   /* checkpoints and --out use the checkpoint shape */
    v.rank = gl->hf_rank;
    for (int d = 0; d < gl->hf_rank; d++) v.shape[d] = gl->hf_dims[d];
  }
  return v;
}

int ref_exec_init(RefExec *r, const Module *m, uint64_t seed, const char *init, char *err, size_t errlen) {
  return ref_exec_open(r, m, seed, init, true, err, errlen);
}

static int open_common(RefExec *r, const Module *m, uint64_t seed, const char *init, bool training, bool views_only,
                       char *err, size_t errlen);

int ref_exec_open(RefExec *r, const Module *m, uint64_t seed, const char *init, bool training, char *err,
                  size_t errlen) {
  return open_common(r, m, seed, init, training, false, err, errlen);
}

int ref_exec_open_views(RefExec *r, const Module *m, bool training, char *err, size_t errlen) {
  return open_common(r, m, 0, NULL, training, true, err, errlen);
}

static int open_common(RefExec *r, const Module *m, uint64_t seed, const char *init, bool training, bool views_only,
                       char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  r->m = m;
  r->world = (int)mesh_world(&m->mesh);
  r->grad_step = module_find_func(m, "grad_step");
  r->optimizer_step = module_find_func(m, "optimizer_step");
  if (m->pipe.kind) r->grad_step = module_find_func(m, "fwd.c0"), r->optimizer_step = module_find_func(m, "optimizer_step.s0");
  if (training && m->pipe.kind && (!r->grad_step || r->grad_step->args.n < 2)) {
    snprintf(err, errlen, "the pipelined module has no @fwd.c0(tokens, targets): run the pipeline pass (--passes=train)");
    return 2;
  }
  if (training && !m->pipe.kind && (!r->grad_step || !r->optimizer_step || r->grad_step->args.n != 2 || r->optimizer_step->args.n != 2)) {
    snprintf(err, errlen, "the module has no @grad_step(tokens, targets) and @optimizer_step(lr, step); "
             "run the autodiff and optimizer passes (loom ir --passes=train)");
    return 2;
  }
  if (r->world > 1 && !m->local) {
    snprintf(err, errlen, "the mesh has %d ranks but the program is not partitioned: run the shard pass", r->world);
    return 2;
  }
  int64_t mesh[COMM_AXES];
  for (int a = 0; a < COMM_AXES; a++) mesh[a] = m->mesh.size[a];
  if (r->world > 1 && !(r->lw = local_world_new(mesh, err, errlen))) return EXIT_USAGE;   /* LOOM_MESH_FAULT or _TIMEOUT */
  /* Whole tensors, initialized as a single-rank run would, then split to the ranks.  Views
     only: the exposed ones, left as calloc made them (no page touched until a sync_out or a
     resume writes one), and no rank stores: the executor's ranks fill their own pieces. */
  int ng = m->globals.n;
  r->full = calloc((size_t)ng + 1, sizeof *r->full);
  r->g = views_only ? NULL : calloc((size_t)r->world, sizeof *r->g);
  if (!r->full || (!views_only && !r->g)) {
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  GlobalStore whole = {ng, r->full};
  for (int i = 0; i < ng; i++) {
    if (views_only && !exposed(m->globals.items[i])) continue;
    Type t = whole_type(m, &((Global *)m->globals.items[i])->value->type);
    r->full[i] = tensor_new(&t);
    if (!r->full[i]) {
      snprintf(err, errlen, "out of memory for the parameters");
      return 1;
    }
  }
  if (!views_only) {
    /* globals_init and load_weights read the types of the store's tensors: whole ones. */
    globals_init(m, &whole, seed);
    int rc = init ? load_weights(m, &whole, init, err, errlen) : 0;
    if (rc) return rc;
    for (int k = 0; k < r->world; k++) {
      if (r->world == 1) {   /* one rank: its store is the whole one */
        r->g[0] = calloc(1, sizeof(GlobalStore));
        r->g[0]->n = ng;
        r->g[0]->t = r->full;
        break;
      }
      if (!(r->g[k] = globals_new(m))) {
        snprintf(err, errlen, "out of memory for rank %d's parameters", k);
        return 1;
      }
    }
    if (r->world > 1)
      for (int i = 0; i < ng; i++) scatter_global(r, i);
  }
  if (!training) return 0;   /* eval: the stores are all it needs */
  const Type *tt = &((Value *)r->grad_step->args.items[0])->type;
  Type tokens = whole_type(m, tt), scalar = type_scalar(DT_F32);
  r->inputs = tensor_new(&tokens);
  r->targets = tensor_new(&tokens);
  r->lr = tensor_new(&scalar);
  r->step = tensor_new(&scalar);
  int nv = 0;
  for (int i = 0; i < ng; i++) {
    const Global *gl = m->globals.items[i];
    if (r->full[i]) nv += rt_views_of(r->full[i]->type.rank, r->full[i]->type.dims, gl->hf_experts);
  }
  r->ex.params = calloc((size_t)nv + 1, sizeof(RtTensor));
  r->ex.state = calloc((size_t)nv + 1, sizeof(RtTensor));
  if (!r->inputs || !r->targets || !r->lr || !r->step || !r->ex.params || !r->ex.state) {
    snprintf(err, errlen, "out of memory");
    return 1;
  }
  for (int i = 0; i < ng; i++) {
    const Global *gl = m->globals.items[i];
    if (!exposed(gl)) continue;
    RtTensor v = view(gl, r->full[i]);
    bool param = gl->kind == GLOBAL_PARAM;
    if (rt_views_add(param ? r->ex.params : r->ex.state, param ? &r->ex.n_params : &r->ex.n_state, v.name, v.rank, v.shape,
                     v.data, gl->hf_experts)) {
      snprintf(err, errlen, "out of memory");
      return 1;
    }
  }
  r->ex.self = r;
  r->ex.batch = tokens.dims[0];
  r->ex.seq = tokens.dims[1];
  r->ex.grad_step = grad_step;
  r->ex.optimizer_step = optimizer_step;
  if (!m->pipe.kind && module_find_func(m, "forward")) r->ex.eval_step = eval_step;
  if (r->world > 1 && !views_only) {
    r->ex.sync_out = sync_out;
    r->ex.sync_in = sync_in;
  }
  if (m->pipe.kind) return pipe_exec_setup(r, err, errlen);
  return 0;
}

void ref_exec_free(RefExec *r) {
  pipe_exec_free(r);
  if (r->g) {
    if (r->world == 1) free(r->g[0]);
    else
      for (int k = 0; k < r->world; k++) globals_free(r->g[k]);
  }
  free(r->g);
  if (r->full)
    for (int i = 0; i < r->m->globals.n; i++) tensor_free(r->full[i]);
  free(r->full);
  local_world_free(r->lw);
  tensor_free(r->inputs);
  tensor_free(r->targets);
  tensor_free(r->lr);
  tensor_free(r->step);
  rt_views_free(r->ex.params, r->ex.n_params);
  rt_views_free(r->ex.state, r->ex.n_state);
  free(r->ex.params);
  free(r->ex.state);
  memset(r, 0, sizeof *r);
}
