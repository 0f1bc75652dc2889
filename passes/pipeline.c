/* passes/pipeline.c — pass "pipeline": pipeline parallelism over the mesh's pp axis.
 *
 * Input: a partitioned training step (@grad_step for one micro-batch, @optimizer_step).
 * Output: the step cut at layer boundaries into pp x virtual chunks, each a set of
 * functions every rank holding that chunk runs:
 *
 *   @fwd.cK(tokens, targets) -> ([loss,] stash...)   recv chunk K-1's output, the
 *                                                    forward ops, send to chunk K+1
 *   @bwd.cK(tokens, targets, stash...) -> ()         recv chunk K+1's input gradient, the
 *                                                    backward, accumulate $grad.*, send on
 *   zero-bubble schedules split the backward:
 *   @bwd_b.cK(tokens, targets, stash...) -> (wstash...)   input gradients only
 *   @bwd_w.cK(tokens, targets, wstash...) -> ()           weight gradients
 *   @optimizer_step.sR(lr, step) -> (grad_norm)     rank R's parameters; the gradient norm
 *                                                    summed over pp; tied copies' gradients
 *                                                    exchanged and summed first
 *
 * The stash (what a backward needs of its forward) is explicit: results of @fwd.cK that
 * the runtime holds per micro-batch until the backward runs, so memory reports and the
 * schedules' memory bounds see it.
 *
 * How each op of @grad_step finds its chunk.  A parameter's "unit" is its layer + 1 (from
 * the HF name: h.N. or layers.N.); other parameters, the tokens and the targets are unit 0.
 * A forward op's unit is the largest of its operands' (so ln_f and the head land after the
 * last layer, with the loss); a value's "reach" is the largest unit that reads it in the
 * forward.  A backward op's unit is the smallest reach/unit of its operands (the adjoint
 * flows down; the backward of a layer uses the values that layer read).  Ops that read
 * only parameters and constants (weight slices, casts, the seed's constants) belong to no
 * unit: they are cloned into every function that uses them.  Units then map to chunks by
 * the split: balanced by FLOPs (forward + backward, per unit) or the user's --pp-split.
 * The backward is the set of ops that depend on the loss seed (%loss_seed, named by
 * autodiff), and the recompute pass's clones (results named rc.*: forward ops run again in
 * the backward).  A tied parameter (GPT-2's wte, read by the embedding and the head) is read
 * in two chunks: each accumulates its own gradient, and the optimizer steps of the two
 * ranks exchange and add them (a + b == b + a in IEEE arithmetic: both copies get the same
 * bits), so their updates stay identical.
 *
 * The pass is four files on the PP state of one @grad_step walk (pipeline_internal.h):
 * pipeline_units.c finds each op's phase, unit and chunk (the text above), pipeline_chunks.c
 * cuts the step at the chunks' boundaries and builds their functions, pipeline_optimizer.c
 * builds each rank's optimizer step; this file runs them in order.  The schedules that order
 * the chunk functions' calls are ir/schedule.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pipeline_internal.h"
#include "ir/schedule.h"

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  int p = (int)m->mesh.size[AX_PP];
  if (p == 1 || m->pipe.kind) return 0;   /* nothing to pipeline, or done */
  const TrainSettings *ts = ctx->opt && ctx->opt->train ? ctx->opt->train : &train_defaults;
  Func *g = module_find_func(m, "grad_step"), *opt = module_find_func(m, "optimizer_step");
  if (!g || !opt) {
    snprintf(err, errlen, "the pipeline pass cuts a training step: run autodiff and optimizer first (--passes=train)");
    return IR_EINPUT;
  }
  if (!m->local) {
    snprintf(err, errlen, "the pipeline pass runs after the shard pass (the step must be partitioned first)");
    return IR_EINPUT;
  }
  if (ts->zero >= 2) {
    snprintf(err, errlen, "ZeRO-%d shards gradients%s across dp, which pipelines cannot accumulate over micro-batches "
             "(DeepSpeed refuses it too): use --zero 1 or 0 with pp", ts->zero, ts->zero == 3 ? " and parameters" : "");
    return IR_EINPUT;
  }
  PP pp = {0};
  pp.m = m, pp.g = g, pp.err = err, pp.errlen = errlen, pp.p = p;
  pp.kind = ts->pp_schedule ? ts->pp_schedule : PIPE_1F1B;
  pp.v = ts->pp_virtual ? ts->pp_virtual : schedule_default_virtual(pp.kind);
  pp.C = p * pp.v;
  pp.split = pp.kind == PIPE_ZBH1 || pp.kind == PIPE_DUALPIPEV;
  /* The schedule must be able to run before anything is cut. */
  Schedule s;
  int rc = schedule_build(pp.kind, p, pp.v, (int)(ts->grad_accum > 0 ? ts->grad_accum : 1), &s, err, errlen);
  if (rc) return rc;
  schedule_free(&s);
  pp.param = malloc(sizeof *pp.param * ((size_t)m->globals.n + 1));
  if (!pp.param) return pipeline_fail(&pp, IR_ERUN, "out of memory");
  for (int gi = 0; gi < m->globals.n; gi++) pp.param[gi] = pipeline_find_param(m, m->globals.items[gi]);
  pp.n_vals = func_number(g);
  int n = g->ops.n;
  pp.phase = calloc((size_t)n + 1, sizeof(int));
  pp.unit = calloc((size_t)n + 1, sizeof(int));
  pp.vphase = calloc((size_t)pp.n_vals + 1, sizeof(int));
  pp.vunit = calloc((size_t)pp.n_vals + 1, sizeof(int));
  pp.reach = calloc((size_t)pp.n_vals + 1, sizeof(int));
  pp.def = calloc((size_t)pp.n_vals + 1, sizeof(Op *));
  rc = pipeline_classify(&pp);
  if (!rc) rc = pipeline_split_units(&pp, ts);
  if (!rc) {
    pipeline_split_tied_accumulates(&pp);
    pipeline_index_values(&pp);
    pp.part = calloc((size_t)g->ops.n + 1, sizeof(int));
    pipeline_split_parts(&pp);
  }
  if (!rc) rc = pipeline_cut_all(&pp);
  pp.used_ng = m->globals.n;
  if (!rc && !(pp.used = calloc((size_t)p * (size_t)m->globals.n + 1, 1))) rc = pipeline_fail(&pp, IR_ERUN, "out of memory");
  for (int c = 0; c < pp.C && !rc; c++) rc = pipeline_build_chunk(&pp, c);
  pipeline_cut_free(&pp);
  if (rc) free(pp.used);
  if (!rc) {
    bool *used = pp.used;
    pp.used = NULL;
    if (pp.used_ng != m->globals.n) {   /* (building added globals: walk the functions instead) */
      free(used);
      used = calloc((size_t)p * (size_t)m->globals.n + 1, 1);
      pipeline_global_users(&pp, used);
    }
    for (int gi = 0; gi < m->globals.n; gi++) {   /* a parameter nothing reads still gets its update, on rank 0 */
      bool any = false;
      for (int r = 0; r < p; r++) any |= used[r * m->globals.n + gi];
      if (!any && ((Global *)m->globals.items[gi])->kind == GLOBAL_PARAM) used[gi] = true;
    }
    OptPlan pl;
    rc = pipeline_opt_plan(&pp, opt, &pl);
    /* Each rank's ops of @optimizer_step (about none of the parameters, or about one it
       uses), in order: each rank walks and clears only its own, not all p x ops. */
    int ng = m->globals.n, n_opt = opt->ops.n;
    int *owners = NULL, *n_own = NULL, *mine = NULL, *mine_start = NULL;
    if (!rc) {
      owners = malloc(sizeof(int) * ((size_t)ng * (size_t)p + 1)), n_own = calloc((size_t)ng + 1, sizeof(int));
      mine_start = calloc((size_t)p + 2, sizeof(int));
      if (!owners || !n_own || !mine_start) rc = pipeline_fail(&pp, IR_ERUN, "out of memory");
    }
    for (int gi = 0; gi < ng && !rc; gi++)
      for (int r = 0; r < p; r++)
        if (used[r * ng + gi]) owners[gi * p + n_own[gi]++] = r;
    for (int i = 0; i < n_opt && !rc; i++) {   /* counts, then the lists */
      if (pl.ab[i] < 0) for (int r = 0; r < p; r++) mine_start[r + 2]++;
      else for (int q = 0; q < n_own[pl.ab[i]]; q++) mine_start[owners[pl.ab[i] * p + q] + 2]++;
    }
    for (int r = 0; r < p && !rc; r++) mine_start[r + 2] += mine_start[r + 1];
    if (!rc && !(mine = malloc(sizeof(int) * ((size_t)mine_start[p + 1] + 1)))) rc = pipeline_fail(&pp, IR_ERUN, "out of memory");
    for (int i = 0; i < n_opt && !rc; i++) {
      if (pl.ab[i] < 0) for (int r = 0; r < p; r++) mine[mine_start[r + 1]++] = i;
      else for (int q = 0; q < n_own[pl.ab[i]]; q++) mine[mine_start[owners[pl.ab[i] * p + q] + 1]++] = i;
    }
    for (int r = 0; r < p && !rc; r++)
      rc = pipeline_build_optimizer(&pp, opt, &pl, used, r, mine + mine_start[r], mine_start[r + 1] - mine_start[r]);
    free(owners), free(n_own), free(mine), free(mine_start);
    pipeline_opt_plan_free(&pl);
    free(used);
  }
  if (!rc) {
    module_drop_func(m, "grad_step");
    module_drop_func(m, "optimizer_step");
    module_drop_func(m, "forward");
    for (int i = 0; i < m->funcs.n; i++) remove_dead_ops(m->funcs.items[i]);
    m->pipe = (PipeInfo){pp.kind, pp.v, ts->grad_accum > 0 ? ts->grad_accum : 1, pp.C};
    ctx->changed += pp.C;
  }
  free(pp.phase), free(pp.unit), free(pp.part), free(pp.vphase), free(pp.vunit), free(pp.reach), free(pp.def);
  free(pp.unit_chunk), free(pp.vval), free(pp.vidx), free(pp.param);
  return rc;
}

const Pass pass_pipeline = {"pipeline", "pp: the step cut into per-chunk forward/backward functions with send/recv, "
                            "per-rank optimizer steps", run};
