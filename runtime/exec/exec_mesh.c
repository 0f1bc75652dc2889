/* runtime/exec/exec_mesh.c — the mesh executor (exec_mesh.h), over a world of ranks (threads
   or processes) each running the lowered program on its device.  No whole tensor is made to
   start: each rank takes its pieces by the program's placements (RtGlobal:
   rt_global_init_piece draws the whole tensor's values of just the piece; load_weights_pieces
   reads just the piece's slices of the memory-mapped safetensors file).  The trainer's whole
   views of the parameters and optimizer state are host buffers left untouched (never paged
   in) until sync_out gathers every rank's pieces into them (checkpoints, --out) or a resume
   writes them (sync_in splits them back); in a pipeline only the stage that updates a global
   holds its truth (owner). */
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_mesh.h"
#include "runtime/exec/pipe_walk.h"

/* ---- pieces and whole tensors ---- */

void mesh_assemble(const RtGlobal *gl, const int64_t mesh[5], int world, float *const *piece_of, int owner, float *whole) {
  for (int q = 0; q < world; q++) {
    int coord[COMM_AXES];
    mesh_coords_of(mesh, q, coord);
    if (owner >= 0 && coord[COMM_PP] != owner) continue;   /* a stage that does not update it */
    rt_piece_copy(gl, mesh, coord, whole, piece_of[q], false);
  }
}

void cuda_rank_tokens(CudaRank *r, const int32_t *inputs, const int32_t *targets) {
  mesh_tokens_piece(&r->tok_place, r->mesh, r->coord[0], inputs, r->tok32[0]);
  mesh_tokens_piece(&r->tok_place, r->mesh, r->coord[0], targets, r->tgt32[0]);
}

/* Global k's whole tensor from every rank's piece (every process takes part); the process of
   mesh rank 0 (with `all`, every one) assembles it into `whole`. */
static int gather_whole(MeshExec *mx, int k, float *whole, bool all, char *err, size_t errlen) {
  int rc = mx->gather(mx, k, all, err, errlen);
  if (rc || !(all || mx->rank == 0)) return rc;
  mesh_assemble(&mx->p->globals[k], mx->mesh, mx->world, mx->piece_of, mx->owner ? mx->owner[k] : -1, whole);
  return 0;
}

/* Every rank's pieces into the whole views, on every process: the views then hold the truth
   everywhere, so a sync_in after it (the trainer's zeroing of a mixture of experts' load
   counts) gives every rank its own pieces back. */
static int sync_out(void *self, char *err, size_t errlen) {
  MeshExec *mx = self;
  for (int k = 0; k < mx->p->n_globals; k++) {
    int rc = mx->whole[k] ? gather_whole(mx, k, mx->whole[k], true, err, errlen) : 0;
    if (rc) return rc;
  }
  return 0;
}

/* The whole views (a resume wrote them) -> every local rank's pieces on its device. */
static int sync_in(void *self, char *err, size_t errlen) {
  MeshExec *mx = self;
  for (int k = 0; k < mx->p->n_globals; k++)
    for (int q = 0; mx->whole[k] && q < mx->n_local; q++) {
      RtDevice *d = &mx->dev[q];
      float *dst = d->host ? d->host(d, k) : mx->scratch;
      rt_piece_copy(&mx->p->globals[k], mx->mesh, mx->coord[q], mx->whole[k], dst, true);
      int rc = d->host ? 0 : d->write(d, k, dst, err, errlen);
      if (rc) return rc;
    }
  return 0;
}

/* --out a tensor at a time: parameter view i's global gathered into one reusable buffer (the
   views of a stack of experts share it), not into the whole views. */
static int stream_param(void *self, int i, const float **data, char *err, size_t errlen) {
  MeshExec *mx = self;
  int k = mx->view_global[i];
  if (k != mx->stream_global) {
    mx->stream_global = -1;
    int rc = gather_whole(mx, k, mx->stream, false, err, errlen);
    if (rc) return rc;
    mx->stream_global = k;
  }
  *data = mx->stream + mx->view_off[i];
  return 0;
}

int mesh_exec_init(MeshExec *mx, const char *init, uint64_t seed, char *err, size_t errlen) {
  const RtProgram *p = mx->p;
  /* the parameters' pieces: loaded together (one map of the file), straight into host
     storage, or into buffers of their own written to the device one at a time */
  float **pieces = calloc((size_t)p->n_globals + 1, sizeof *pieces);
  int rc = pieces ? 0 : EXIT_RUN;
  if (rc) snprintf(err, errlen, "out of memory");
  for (int q = 0; q < mx->n_local && !rc; q++) {
    RtDevice *d = &mx->dev[q];
    for (int k = 0; k < p->n_globals && !rc && init; k++) {
      if (p->globals[k].region != RT_REGION_PARAMS) continue;
      pieces[k] = d->host ? d->host(d, k) : malloc(sizeof(float) * (size_t)(p->globals[k].n + 1));
      if (!pieces[k]) {
        snprintf(err, errlen, "out of memory");
        rc = EXIT_RUN;
      }
    }
    if (!rc && init) rc = load_weights_pieces(p, mx->mesh, mx->coord[q], init, pieces, err, errlen);
    for (int k = 0; k < p->n_globals && !rc; k++) {
      const RtGlobal *gl = &p->globals[k];
      if (pieces[k]) {
        if (!d->host) rc = d->write(d, k, pieces[k], err, errlen);
      } else if (gl->init != RT_INIT_ZEROS) {
        float *dst = d->host ? d->host(d, k) : mx->scratch;
        rt_global_init_piece(gl, mx->mesh, mx->coord[q], seed, dst);
        if (!d->host) rc = d->write(d, k, dst, err, errlen);
      }
      if (!d->host) free(pieces[k]);
      pieces[k] = NULL;
    }
    for (int k = 0; !d->host && k < p->n_globals; k++) free(pieces[k]), pieces[k] = NULL;
  }
  free(pieces);
  return rc;
}

/* ---- the steps ---- */

int mesh_exec_split(MeshExec *mx, int func, const int32_t *inputs, const int32_t *targets, void *rets0, void *rets1,
                    char *err, size_t errlen) {
  MeshJob *jobs = calloc((size_t)mx->n_local, sizeof *jobs);
  if (!jobs) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int q = 0; q < mx->n_local; q++) {
    mesh_tokens_piece(&mx->tok_place, mx->mesh, mx->coord[q], inputs, mx->tok32[q]);
    mesh_tokens_piece(&mx->tok_place, mx->mesh, mx->coord[q], targets, mx->tgt32[q]);
    jobs[q] = (MeshJob){.mx = mx, .rank = q, .func = func, .args = {mx->tok32[q], mx->tgt32[q]}};
  }
  jobs[0].rets[0] = rets0;
  jobs[0].rets[1] = rets1;
  int rc = mx->run(mx, jobs, err, errlen);
  free(jobs);
  return rc;
}

static int grad_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  MeshExec *mx = self;
  if (!mx->step_open && mx->cpu)   /* the timeline keeps the last step: its first micro-batch clears the last one's */
    for (int q = 0; q < mx->n_local; q++) mx->cpu[q].n_trace = 0;
  mx->step_open = true;
  return mesh_exec_split(mx, mx->f_grad, inputs, targets, loss, NULL, err, errlen);
}

/* Validation: @forward on every rank; the (replicated) loss. */
static int eval_step(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen) {
  MeshExec *mx = self;
  return mesh_exec_split(mx, mx->f_forward, inputs, targets, NULL, loss, err, errlen);
}

static int optimizer_step(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen) {
  MeshExec *mx = self;
  MeshJob *jobs = calloc((size_t)mx->n_local, sizeof *jobs);
  if (!jobs) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int q = 0; q < mx->n_local; q++)   /* replicated scalars: every rank reads the same */
    jobs[q] = (MeshJob){.mx = mx, .rank = q, .func = mx->f_opt, .args = {&lr, &t}};
  jobs[0].rets[0] = grad_norm;
  int rc = mx->run(mx, jobs, err, errlen);
  free(jobs);
  mx->step_open = false;
  return rc;
}

/* ---- opening ---- */

/* The trainer's whole views: parameters under their checkpoint names, the optimizer state
   (calloc'd: no page is touched before a sync_out or a resume writes it). */
static int open_views(MeshExec *mx) {
  const RtProgram *p = mx->p;
  int nv = 0;
  for (int k = 0; k < p->n_globals; k++) nv += rt_views_of(p->globals[k].rank, p->globals[k].shape, p->globals[k].experts);
  mx->ex.params = calloc((size_t)nv + 1, sizeof(RtTensor));
  mx->ex.state = calloc((size_t)nv + 1, sizeof(RtTensor));
  mx->view_global = calloc((size_t)nv + 1, sizeof(int));
  mx->view_off = calloc((size_t)nv + 1, sizeof(int64_t));
  if (!mx->ex.params || !mx->ex.state || !mx->view_global || !mx->view_off) return 1;
  int64_t most_whole = 1;
  for (int k = 0; k < p->n_globals; k++) {
    const RtGlobal *gl = &p->globals[k];
    bool param = gl->region == RT_REGION_PARAMS;
    if (!param && gl->region != RT_REGION_OPTIM) continue;
    int64_t whole_n = rt_global_whole_numel(gl, mx->mesh);
    if (!(mx->whole[k] = calloc((size_t)whole_n + 1, sizeof(float)))) return 1;
    int before = mx->ex.n_params;
    if (rt_views_add(param ? mx->ex.params : mx->ex.state, param ? &mx->ex.n_params : &mx->ex.n_state, gl->name, gl->rank,
                     gl->shape, mx->whole[k], gl->experts))
      return 1;
    for (int v = before; param && v < mx->ex.n_params; v++)
      mx->view_global[v] = k, mx->view_off[v] = mx->ex.params[v].data - mx->whole[k];
    if (param && whole_n > most_whole) most_whole = whole_n;
  }
  /* a process of one rank streams --out (its host holds one whole tensor at a time); the
     threads' world writes it from the whole views */
  mx->stream_global = -1;
  if (mx->n_local == mx->world) return 0;
  mx->ex.stream_param = stream_param;
  return !(mx->stream = malloc(sizeof(float) * (size_t)most_whole));
}

int mesh_exec_open(MeshExec *mx, bool training, char *err, size_t errlen) {
  const RtProgram *p = mx->p;
  bool pipe = training && p->pipe.kind;   /* its schedule and its globals' stages are the program's */
  const char *grad = pipe ? "fwd.c0" : training ? "grad_step" : "forward";
  mx->f_grad = rt_device_find(&mx->dev[0], grad);
  mx->f_opt = rt_device_find(&mx->dev[0], pipe ? "optimizer_step.s0" : "optimizer_step");
  mx->f_forward = training && !pipe ? rt_device_find(&mx->dev[0], "forward") : -1;
  const RtFunc *tf = mx->f_grad >= 0 ? &p->funcs[mx->f_grad] : NULL;
  if (!tf || (training && mx->f_opt < 0) || (pipe ? tf->n_args < 2 : tf->n_args != 2)) {
    snprintf(err, errlen, pipe       ? "the pipelined program has no @fwd.c0(tokens, targets, ...)"
                          : training ? "the program has no @grad_step and @optimizer_step"
                                     : "the program has no @forward(tokens, targets)");
    return EXIT_USAGE;
  }
  /* the micro-batch's piece: the placement of the tokens argument, [batch, seq] whole */
  const RtPlace *tp = &tf->arg_place[0];
  if (tp->ir_rank != 2 || !tf->args[0].is_int) {
    snprintf(err, errlen, "@%s's tokens are not an int32 [batch, seq] piece with a placement: recompile the program", grad);
    return EXIT_USAGE;
  }
  mx->tok_place = (RtGlobal){.ir_rank = tp->ir_rank, .n = tf->args[0].n};
  memcpy(mx->tok_place.split, tp->split, sizeof tp->split);
  memcpy(mx->tok_place.piece_dims, tp->piece_dims, sizeof tp->piece_dims);
  int64_t whole[2] = {tp->piece_dims[0], tp->piece_dims[1]};
  for (int a = 0; a < COMM_AXES; a++)
    if (tp->split[a]) whole[tp->split[a] - 1] *= mx->mesh[a];
  mx->whole_n = whole[0] * whole[1];
  int64_t most = 1;
  for (int k = 0; k < p->n_globals; k++)
    if (p->globals[k].n > most) most = p->globals[k].n;
  mx->whole = calloc((size_t)p->n_globals + 1, sizeof *mx->whole);
  mx->scratch = malloc(sizeof(float) * (size_t)most);
  mx->piece_of = calloc((size_t)mx->world, sizeof *mx->piece_of);
  mx->tok32 = calloc((size_t)mx->n_local, sizeof *mx->tok32);
  mx->tgt32 = calloc((size_t)mx->n_local, sizeof *mx->tgt32);
  bool oom = !mx->whole || !mx->scratch || !mx->piece_of || !mx->tok32 || !mx->tgt32 || (training && open_views(mx));
  for (int q = 0; q < mx->n_local && !oom; q++) {
    mx->tok32[q] = malloc(sizeof(int32_t) * (size_t)(mx->tok_place.n + 1));
    mx->tgt32[q] = malloc(sizeof(int32_t) * (size_t)(mx->tok_place.n + 1));
    oom = !mx->tok32[q] || !mx->tgt32[q];
  }
  if (!oom && pipe) {
    oom = !(mx->owner = calloc((size_t)p->n_globals + 1, sizeof(int)));
    for (int k = 0; !oom && k < p->n_globals; k++) mx->owner[k] = p->globals[k].owner;
  }
  if (oom) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  /* a pipeline's walker: every rank of the threads' world, or this process's one rank */
  int rc = pipe ? pipe_walk_new(&mx->walk, p->pipe.kind, (int)mx->mesh[COMM_PP], p->pipe.virt, p->pipe.micro, mx->lw,
                                mx->mesh, mx->coord[0], &mx->tok_place, mx->whole_n, err, errlen)
                : 0;
  if (rc) return rc;
  mx->ex.self = mx;
  mx->ex.batch = whole[0];
  mx->ex.seq = whole[1];
  mx->ex.grad_step = grad_step;
  mx->ex.optimizer_step = optimizer_step;
  mx->ex.eval_step = mx->f_forward >= 0 ? eval_step : NULL;
  mx->ex.sync_out = sync_out;
  mx->ex.sync_in = sync_in;
  return 0;
}

void mesh_exec_free(MeshExec *mx) {
  for (int k = 0; mx->whole && k < mx->p->n_globals; k++) free(mx->whole[k]);
  for (int q = 0; q < mx->n_local; q++) {
    if (mx->tok32) free(mx->tok32[q]);
    if (mx->tgt32) free(mx->tgt32[q]);
  }
  rt_views_free(mx->ex.params, mx->ex.n_params);
  rt_views_free(mx->ex.state, mx->ex.n_state);
  free(mx->ex.params), free(mx->ex.state), free(mx->view_global), free(mx->view_off), free(mx->stream);
  free(mx->whole), free(mx->scratch), free(mx->piece_of), free(mx->tok32), free(mx->tgt32), free(mx->owner);
  free(mx->coord), free(mx->dev);
  pipe_walk_free(mx->walk);
  mx->walk = NULL;
}
