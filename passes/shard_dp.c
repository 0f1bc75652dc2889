/* passes/shard_dp.c — the shard pass's rules for the dp axis (data parallel, ZeRO 0-3).
 *
 * Data parallelism splits the batch: token inputs are S(0) over dp, parameters R, and the
 * gradient accumulators P (each rank sums its micro-batches; the sum over ranks is taken
 * once per optimizer step).  ZeRO partitions the training state over dp along one dim of
 * each tensor (zero_dim_of): ZeRO-1 the optimizer moments, ZeRO-2 the gradients too (so a
 * partial gradient is reduce-scattered to the rank's shard, not all-reduced), ZeRO-3 the
 * parameters too (stored split, gathered before every use: the rules see them whole).
 *
 * Everything else on dp follows from the rules that hold on every axis (shard.c).
 */
#include "shard_internal.h"

/* The dim ZeRO splits over dp: the first dim the dp size divides (after other axes). */
static int zero_dim_of(const Module *m, const Type *t) {
  int64_t dp = m->mesh.size[AX_DP];
  for (int d = 0; d < t->rank; d++) {
    int64_t local = t->dims[d];
    for (int a = 0; a < AX_COUNT; a++)
      if (t->sh.kind[a] == SH_S && t->sh.dim[a] == d) local /= m->mesh.size[a];
    if (local % dp == 0) return d;
  }
  return -1;
}

/* Parameters R (ZeRO-3: split), gradients P until the optimizer step (ZeRO-2: split),
   optimizer moments R (ZeRO-1: split).  The split dim is chosen on the parameter as the
   other axes leave it, so every state of one parameter is split alike. */
void shard_dp_plan_global(Sharder *s, int gi, const Global *g, bool grad, const Type *param, Sharding *sh) {
  int zd = zero_dim_of(s->m, param);
  Place want = R;
  if (g->kind == GLOBAL_PARAM) {
    if (s->zero >= 3 && zd >= 0) want = S(zd);
  } else if (grad) {
    /* partial sums until the optimizer step, except: ZeRO-2/3 reduce-scatter each
       micro-batch's gradient to the rank's shard; ZeRO-0 with one micro-batch a step
       all-reduces it in the backward (the playbook's overlap of gradient synchronization
       with the backward; AR(0 + g) before, 0 + AR(g) now: the same bits).
       With several micro-batches ZeRO-0/1 reduce once, in @optimizer_step (the volume
       of one reduction, not grad_accum of them: the playbook's no_sync). */
    want = (s->zero >= 2 && zd >= 0) ? S(zd) : s->dp_in_step ? R : P;
  } else if (s->zero >= 1 && zd >= 0) {
    want = S(zd);
  }
  s->zero_dim[gi] = zd;
  set_place(sh, AX_DP, want);
}

/* Token inputs are split over dp along the batch; other arguments are replicated. */
int shard_dp_plan_arg(Sharder *s, const Func *src, const Value *a, Sharding *sh) {
  const Module *m = s->m;
  if (a->type.rank >= 1 && !dtype_is_float(a->type.dtype)) {
    if (a->type.dims[0] % m->mesh.size[AX_DP])
      return shard_fail(s, "shard: the batch of @%s's argument %%%s (%lld) does not split over dp=%lld; make the "
                           "batch a multiple of dp", src->name, a->name ? a->name : "?", (long long)a->type.dims[0],
                        (long long)m->mesh.size[AX_DP]);
    set_place(sh, AX_DP, S(0));
  }
  return 0;
}

void shard_dp_operand(const Sharder *s, const Value *v, Place *in, int *hint) {
  /* ZeRO-3 splits a parameter's storage, not the computation: rules see it whole, so
     it is gathered before each use (and the optimizer, elementwise on shards, does not). */
  if (shard_dp_zero3_param(s, v)) *in = R;
  *hint = s->zero >= 1 && v->kind == VAL_GLOBAL ? s->zero_dim[v->global->index] : -1;
}

/* ZeRO: a partial gradient is reduce-scattered to the rank's shard, not all-reduced. */
Place shard_dp_partial_target(const Op *op, const Place *in, const Decision *d) {
  Place target = R;
  for (int i = 0; i < op->n_operands; i++)
    if (in[i].kind == SH_P && d->hint[i] >= 0) target = S(d->hint[i]);
  return target;
}
