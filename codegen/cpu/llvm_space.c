/* codegen/cpu/llvm_space.c — the iteration space of a kernel func (see llvm_kernel.c).
 *
 * Boundaries: the suffix products of the dims of every shape that indexes the space (a
 * reduction's operand, a broadcast's result, an iota), only where the reduced or
 * broadcast status changes.  The space is their common refinement when they form a chain
 * of divisors; a shape that does not fit falls back to division of the flat index.
 * Reductions are fitted first (their dims decide the loop order and the parallel dims).
 */
#include "codegen/cpu/llvm_internal.h"

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Adds the boundaries `w` to the space if the result is still a chain of divisors. */
static bool accept(KernelGen *k, const int64_t *w, int nw) {
  int64_t all[SPACE_MAX + 1 + 2 * IR_MAX_RANK + 2];
  int n = 0;
  for (int i = 0; i < k->nb; i++) all[n++] = k->bnd[i];
  for (int i = 0; i < nw; i++) all[n++] = w[i];
  qsort(all, (size_t)n, sizeof all[0], cmp_i64);
  int u = 0;
  for (int i = 0; i < n; i++)
    if (!u || all[i] != all[u - 1]) all[u++] = all[i];
  if (u > SPACE_MAX + 1) return false;
  for (int i = 1; i < u; i++)
    if (all[i] % all[i - 1]) return false;
  memcpy(k->bnd, all, sizeof(int64_t) * (size_t)u);
  k->nb = u;
  return true;
}

bool cpu_space_is_boundary(const KernelGen *k, int64_t b) {
  for (int i = 0; i < k->nb; i++)
    if (k->bnd[i] == b) return true;
  return false;
}

int cpu_space_analyze(KernelGen *k) {
  const Func *f = k->f;
  k->N = 0;
  for (int i = 0; i < f->args.n; i++) {
    int64_t n = type_numel(&((const Value *)f->args.items[i])->type);
    if (n > k->N) k->N = n;
  }
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      int64_t n = type_numel(&op->results[r]->type);
      if (n > k->N) k->N = n;
    }
  }
  if (k->N <= 0) return kfail(k, NULL, "has no elements; empty kernels are not supported");
  k->n_ids = func_number((Func *)f);

  /* What the backend supports. */
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    const OpInfo *info = op_info(op->kind);
    bool ok = info->cls == CLASS_ELEMENTWISE || info->cls == CLASS_REDUCTION || op->kind == OP_BROADCAST ||
              op->kind == OP_RESHAPE || op->kind == OP_CONSTANT || op->kind == OP_IOTA || op->kind == OP_CAST;
    if (!ok) return kfail(k, op, "cannot appear in a kernel func");
    for (int j = 0; j < op->n_operands; j++) {
      const Value *v = op->operands[j];
      if (v->kind == VAL_GLOBAL) return kfail(k, op, "reads the global $%s; kernels take globals as arguments", v->global->name);
      if (is_reduction_result(v))
        return kfail(k, op, "uses a reduction result inside the kernel; the CPU backend supports reductions only as "
                     "kernel results (split the kernel after the reduction)");
    }
    if (info->cls == CLASS_REDUCTION && type_numel(&op->operands[0]->type) != k->N)
      return kfail(k, op, "reduces %lld elements, not the kernel's %lld", (long long)type_numel(&op->operands[0]->type),
                   (long long)k->N);
  }
  for (int i = 0; i < f->rets.n; i++) {
    const Value *v = f->rets.items[i];
    if (v->kind == VAL_GLOBAL) return kfail(k, NULL, "returns the global $%s", v->global->name);
    if (!is_reduction_result(v) && type_numel(&v->type) != k->N)
      return kfail(k, NULL, "result %d has %lld elements, neither the kernel's %lld nor a reduction", i,
                   (long long)type_numel(&v->type), (long long)k->N);
  }

  /* Reductions (one per result slot), and their wishes first. */
  k->nb = 0;
  k->bnd[k->nb++] = 1;
  if (k->N > 1) k->bnd[k->nb++] = k->N;
  k->n_red = 0;
  for (int i = 0; i < f->rets.n; i++) {
    const Value *v = f->rets.items[i];
    if (!is_reduction_result(v)) continue;
    const Op *op = v->def;
    const Type *x = &op->operands[0]->type;
    Red *r = &k->red[k->n_red++];
    memset(r, 0, sizeof *r);
    r->op = op;
    r->slot = i;
    r->dt = v->type.dtype;
    r->is_float = is_float_t(&v->type);
    r->is_max = op->kind == OP_REDUCE_MAX;
    r->is_mean = op->kind == OP_REDUCE_MEAN;
    r->out_n = type_numel(&v->type);
    r->count = r->out_n ? k->N / r->out_n : 0;
    bool reduced[IR_MAX_RANK] = {0};
    for (int d = 0; d < op->attrs[0].n; d++) reduced[op->attrs[0].ints[d]] = true;
    Run runs[IR_MAX_RANK];
    int nr = runs_of(x, reduced, runs);
    int64_t w[2 * IR_MAX_RANK];
    int nw = 0;
    for (int j = 0; j < nr; j++) {
      w[nw++] = runs[j].lo;
      w[nw++] = runs[j].hi;
      r->runs[r->n_runs++] = (RedRun){runs[j].lo, runs[j].hi, runs[j].flag};
      if (!runs[j].flag) {
        int64_t ystride = 1;
        for (int d = runs[j].last + 1; d < x->rank; d++)
          if (!reduced[d]) ystride *= x->dims[d];
        r->kept[r->n_kept++] = (KeptRun){runs[j].lo, runs[j].hi, ystride};
      }
    }
    r->regular = accept(k, w, nw);
  }
  /* Broadcasts and iotas over the whole space. */
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    const Type *t = &op->results[0]->type;
    if (type_numel(t) != k->N) continue;
    int64_t w[2 * IR_MAX_RANK];
    int nw = 0;
    if (op->kind == OP_IOTA) {
      int d = (int)op_int(op, "dim");
      w[nw++] = prod(t, d + 1, t->rank);
      w[nw++] = prod(t, d, t->rank);
    } else if (op->kind == OP_BROADCAST) {
      const Type *x = &op->operands[0]->type;
      int off = t->rank - x->rank;
      if (op->operands[0]->kind == VAL_ARG) {
        /* read straight from the argument: only where broadcast status changes */
        bool bc[IR_MAX_RANK];
        for (int d = 0; d < t->rank; d++) bc[d] = d < off || x->dims[d - off] == 1;
        Run runs[IR_MAX_RANK];
        int nr = runs_of(t, bc, runs);
        for (int j = 0; j < nr; j++)
          if (!runs[j].flag) {
            w[nw++] = runs[j].lo;
            w[nw++] = runs[j].hi;
          }
      } else {
        for (int d = off; d < t->rank; d++)
          if (x->dims[d - off] != 1) {
            w[nw++] = prod(t, d + 1, t->rank);
            w[nw++] = prod(t, d, t->rank);
          }
      }
    }
    if (nw) accept(k, w, nw);   /* if not: div/mod by constants */
  }

  /* The space: one dim between consecutive boundaries, outermost first. */
  k->nd = k->nb - 1;
  for (int j = 0; j < k->nd; j++) {
    int hi = k->nb - 1 - j;
    k->size[j] = k->bnd[hi] / k->bnd[hi - 1];
    k->P[j] = k->bnd[hi - 1];
  }
  if (k->nd == 0) {   /* N == 1 */
    k->nd = 1;
    k->size[0] = 1;
    k->P[0] = 1;
  }
  bool all_regular = true;
  for (int i = 0; i < k->n_red; i++) {
    Red *r = &k->red[i];
    if (!r->regular) {
      all_regular = false;
      continue;
    }
    for (int j = 0; j < k->nd; j++) {
      r->reduced[j] = false;
      for (int q = 0; q < r->n_runs; q++)
        if (r->runs[q].lo <= k->P[j] && k->P[j] < r->runs[q].hi) r->reduced[j] = r->runs[q].reduced;
    }
    r->in_register = r->reduced[k->nd - 1];
  }
  k->n_par = 0;
  k->extent = 1;
  for (int j = 0; j < k->nd; j++) {
    bool p = all_regular;
    for (int i = 0; i < k->n_red && p; i++)
      if (k->red[i].reduced[j]) p = false;
    k->par[j] = p;
    if (p) {
      k->n_par++;
      k->extent *= k->size[j];
    }
  }
  return 0;
}

int cpu_kernel_extent(const Func *kernel, int64_t *extent, char *err, size_t errlen) {
  KernelGen *k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  k->f = kernel;
  k->err = err;
  k->errlen = errlen;
  int rc = cpu_space_analyze(k);
  if (!rc) *extent = k->extent;
  free(k);
  return rc;
}

