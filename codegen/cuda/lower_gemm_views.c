/* codegen/cuda/lower_gemm_views.c — GEMMs that read and write in place: slices read through
 * an operand's leading dimension (views: no copy kernel), and gradient trees whose pieces are
 * added into their part of the gradient (C's row stride, beta = 1: no pads, sums, cast or
 * accumulate).  Planned for cl_plan_bgrad (lower_gemm_plan.c) into Lower's view, acc_into and
 * leaf_into; lower_gemm.c makes the steps.  Its own file: both plans reason about byte ranges
 * of the memory plan (rows, row strides, offsets), which the other fusions do not. */
#include "codegen/cuda/lower_gemm_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- gradient trees

   c_attn's gradients are sums of pieces padded into place: per q, k, v the weight's
   dW_j = x^T d_j and the bias's db_j, each reshaped and padded to [D, 3, D] ([3, D]), the
   three added (kernels), cast to f32 and accumulated into $grad (GPT-2 124M: 8 launches a
   layer and the padded matrices written and read).  A tree of such sums (kernels that only
   add their arguments, then maybe cast to f32) under an accumulate has leaves pad(reshape(y))
   padded on one axis: y lands on a view of the gradient (rows, a row stride, an offset).  A
   product y of a GEMM accumulates there itself (beta = 1, C's row stride: program.h
   RT_GEMM_LDC_INT); any other y is accumulated there by the pad's step.  The pads, the sums
   and the accumulate are gone.  Adding zeros is exact, so a leaf's own accumulation is the
   same arithmetic (on always); a GEMM's adds its product unrounded, which moves a bf16
   program's rounding point: bf16 GEMM leaves only with LOOM_CUDA_FUSE_BF16=1.
   LOOM_CUDA_NO_EPILOGUE=1 or LOOM_CUDA_NO_TREES=1: off (whole leaves, below: LOOM_CUDA_NO_TIED_GRAD=1). */

/* A kernel func that adds its arguments, each once, maybe casting the sum to f32 last. */
static bool is_sum_kernel(const Func *k) {
  if (!k || !k->is_kernel || k->args.n < 2 || k->rets.n != 1 || k->ops.n < 1) return false;
  int adds = 0;
  for (int o = 0; o < k->ops.n; o++) {
    const Op *op = k->ops.items[o];
    bool last = o == k->ops.n - 1;
    if (op->kind == OP_CAST && last && o > 0 && op->results[0]->type.dtype == DT_F32 &&
        op->operands[0] == ((const Op *)k->ops.items[o - 1])->results[0])
      continue;
    if (op->kind != OP_ADD || op->operands[0] == op->operands[1] || cl_uses(k, op->results[0]) != 1) return false;
    adds++;
  }
  for (int a = 0; a < k->args.n; a++)
    if (cl_uses(k, k->args.items[a]) != 1) return false;
  const Op *fin = k->ops.items[k->ops.n - 1];
  return adds == k->args.n - 1 && k->rets.items[0] == fin->results[0];
}

/* The view of the gradient g a pad leaf's operand lands on. */
static bool pad_view(Lower *L, const Op *pad, const Value *g, RtBuf *view, int64_t *rows, int64_t *cols, int64_t *ld) {
  const Attr *lo = op_attr(pad, "low"), *hi = op_attr(pad, "high");
  const Type *t = &pad->results[0]->type;
  if (pad->kind != OP_PAD || !lo || !hi || lo->n != t->rank || hi->n != t->rank || t->rank != g->type.rank ||
      type_numel(t) != type_numel(&g->type))
    return false;
  int a = -1;
  for (int d = 0; d < t->rank; d++) {
    if (t->dims[d] != g->type.dims[d] || lo->ints[d] < 0 || hi->ints[d] < 0) return false;
    if (lo->ints[d] || hi->ints[d]) {
      if (a >= 0) return false;
      a = d;
    }
  }
  if (a < 0) return false;
  int64_t inner = cl_prod_dims(t, a + 1, t->rank);
  *rows = cl_prod_dims(t, 0, a);
  *ld = cl_prod_dims(t, a, t->rank);
  *cols = (t->dims[a] - lo->ints[a] - hi->ints[a]) * inner;
  if (cl_buf_of(L, g, view)) {
    L->err[0] = 0;
    return false;
  }
  view->offset += lo->ints[a] * inner * cl_st_size(view->storage);
  view->n = (*rows - 1) * *ld + *cols;
  return view->offset % 64 == 0;   /* as every buffer of the program (kernels may load vectors) */
}

static int op_index(const Func *f, const Op *op, int below) {
  for (int q = below - 1; q >= 0; q--)
    if (f->ops.items[q] == op) return q;
  return -1;
}

/* Op q of f, a whole leaf of a tree into the f32 gradient g: a matmul or an embedding's gradient
   of g's element count, used once, whose sum with the other pieces g was (a tied embedding's
   table: the lm_head's dW and the embedding's rows).  It adds into g itself: the GEMM with
   beta = 1, the embedding's gradient its rows (no fill of the table, no sum, no cast, no
   accumulate).  The pieces overlap, so their sum's order changes (fp32: g + a + b for
   g + (a + b), the same bits while g is zero) and a narrow sum is no longer rounded: narrow
   leaves only with LOOM_CUDA_FUSE_BF16=1.  LOOM_CUDA_NO_TIED_GRAD=1: off. */
static bool whole_leaf(Lower *L, const Func *f, int q, const Value *g) {
  const Op *op = f->ops.items[q];
  const Value *y = op->results[0];
  if ((op->kind != OP_MATMUL && op->kind != OP_EMBEDDING_GRAD) || op->n_results != 1 || cl_uses(f, y) != 1 ||
      type_numel(&y->type) != type_numel(&g->type) || y->type.rank != g->type.rank || L->defer[q] >= 0 || L->skip[q] ||
      L->gemm_at[q] >= 0 || (y->type.dtype != DT_F32 && !cl_fuse_narrow()))
    return false;
  for (int d = 0; d < y->type.rank; d++)
    if (y->type.dims[d] != g->type.dims[d]) return false;
  return true;
}

void cl_gemm_plan_trees(Lower *L, const Func *f) {
  /* LOOM_CUDA_NO_TREES: no pad leaves; LOOM_CUDA_NO_TIED_GRAD: no whole ones */
  bool pads_ok = !getenv("LOOM_CUDA_NO_TREES"), whole_ok = !cl_env_on("LOOM_CUDA_NO_TIED_GRAD");
  if (getenv("LOOM_CUDA_NO_EPILOGUE") || (!pads_ok && !whole_ok)) return;
  int n = f->ops.n;
  int *stack = malloc(sizeof(int) * (size_t)(n + 1)), *calls = malloc(sizeof(int) * (size_t)(n + 1));
  int *pads = malloc(sizeof(int) * (size_t)(n + 1));
  if (!stack || !calls || !pads) goto done;
  for (int a = 0; a < n; a++) {
    const Op *acc = f->ops.items[a];
    if (acc->kind != OP_ACCUMULATE || L->skip[a] || L->defer[a] >= 0) continue;
    const Value *g = acc->operands[0], *t = acc->operands[1];
    if (g->kind != VAL_GLOBAL || g->type.dtype != DT_F32 || t->kind != VAL_RESULT || t->def->kind != OP_CALL ||
        cl_uses(f, t) != 1)
      continue;
    /* the tree: sum calls down to pads */
    int ns = 0, nc = 0, np = 0, first = a;
    bool ok = true;
    int c0 = op_index(f, t->def, a);
    if (c0 < 0) continue;
    stack[ns++] = c0;
    while (ns && ok) {
      int c = stack[--ns];
      const Op *call = f->ops.items[c];
      if (L->skip[c] || L->defer[c] >= 0 || L->gemm_at[c] >= 0 || !is_sum_kernel(call->callee)) {
        ok = false;
        break;
      }
      calls[nc++] = c;
      if (c < first) first = c;
      for (int o = 0; o < call->n_operands && ok; o++) {
        const Value *v = call->operands[o];
        int q = v->kind == VAL_RESULT ? op_index(f, v->def, c) : -1;
        if (q < 0 || cl_uses(f, v) != 1 || L->skip[q] || L->defer[q] >= 0) {
          ok = false;
          break;
        }
        if (v->def->kind == OP_CALL) stack[ns++] = q;
        else if ((pads_ok && v->def->kind == OP_PAD) || (whole_ok && whole_leaf(L, f, q, g))) pads[np++] = q;
        else ok = false;
      }
    }
    if (!ok || !np) continue;
    /* each leaf: pad(reshape(y)) or pad(y) */
    RtBuf views[64];
    int64_t lds[64];
    const Value *ys[64];
    int gemm[64];
    if (np > 64) continue;
    for (int l = 0; l < np && ok; l++) {
      const Op *pad = f->ops.items[pads[l]];
      int64_t rows, cols, ld;
      const Value *y = pad->operands[0];
      if (pad->kind != OP_PAD) {   /* a whole leaf: the gradient itself */
        y = pad->results[0];
        cols = g->type.rank ? g->type.dims[g->type.rank - 1] : 1;
        rows = cols ? type_numel(&g->type) / cols : 0;
        ld = cols;
        if (cl_buf_of(L, g, &views[l])) {
          L->err[0] = 0;
          ok = false;
          break;
        }
        ys[l] = y;
        lds[l] = ld;
        gemm[l] = pad->kind == OP_MATMUL ? pads[l] : -1;
        if (pad->kind == OP_MATMUL) {   /* a single GEMM of the gradient's shape, as a pad leaf's below */
          const Op *save = L->op;
          L->op = pad;
          bool single = cl_gemm_is_single(L);
          L->op = save;
          int last;
          if (!single || y->type.rank != 2 || y->type.dims[0] != rows || y->type.dims[1] != cols || L->resid[pads[l]] ||
              L->sum_into[pads[l]] >= 0 || cl_gemm_grad_accum(f, pads[l], &last))
            ok = false;
        }
        if (pads[l] < first) first = pads[l];
        continue;
      }
      if (y->kind == VAL_RESULT && y->def->kind == OP_RESHAPE && cl_uses(f, y) == 1) y = y->def->operands[0];
      if (!pad_view(L, pad, g, &views[l], &rows, &cols, &ld) || type_numel(&y->type) != rows * cols) {
        ok = false;
        break;
      }
      ys[l] = y;
      lds[l] = ld;
      gemm[l] = -1;
      int q = y->kind == VAL_RESULT ? op_index(f, y->def, pads[l]) : -1;
      if (q >= 0 && y->def->kind == OP_MATMUL && cl_uses(f, y) == 1 && y->type.rank == 2 && y->type.dims[0] == rows &&
          y->type.dims[1] == cols && (y->type.dtype == DT_F32 || cl_fuse_narrow()) && !L->resid[q] && L->sum_into[q] < 0 &&
          L->defer[q] < 0 && !L->skip[q]) {
        int last;
        const Op *save = L->op;
        L->op = y->def;
        bool single = cl_gemm_is_single(L);
        L->op = save;
        if (single && !cl_gemm_grad_accum(f, q, &last)) {
          gemm[l] = q;
          if (q < first) first = q;
          continue;
        }
      }
      /* accumulated by the pad's step: contiguous, a float */
      if (!(rows == 1 || cols == ld) || !dtype_is_float(y->type.dtype)) ok = false;
    }
    if (!ok) continue;
    /* nothing else touches the gradient from the first piece on */
    for (int q = first; q < a && ok; q++) {
      const Op *op = f->ops.items[q];
      for (int o = 0; o < op->n_operands && ok; o++) ok = op->operands[o] != g;
    }
    if (!ok) continue;
    for (int l = 0; l < np; l++) {
      const Op *leaf = f->ops.items[pads[l]];
      if (leaf->kind != OP_PAD) {   /* a whole leaf lowers in place: the GEMM or the embedding's rows add */
        if (gemm[l] >= 0) {
          L->acc_into[ys[l]->id] = views[l];
          L->acc_ld[ys[l]->id] = 0;   /* whole: C is the gradient (lower_matmul) */
        } else {
          L->leaf_into[pads[l]] = views[l];
          L->leaf_of[pads[l]] = ys[l];
        }
        continue;
      }
      L->skip[pads[l]] = true;
      if (gemm[l] >= 0) {
        L->acc_into[ys[l]->id] = views[l];
        L->acc_ld[ys[l]->id] = lds[l];
      } else {
        L->skip[pads[l]] = false;
        L->leaf_into[pads[l]] = views[l];
        L->leaf_of[pads[l]] = ys[l];
      }
    }
    for (int c = 0; c < nc; c++) L->skip[calls[c]] = true;
    L->skip[a] = true;
  }
done:
  free(stack);
  free(calls);
  free(pads);
}

/* ---------------------------------------------------------------- views

   The q, k and v projections take slices of one [D, 3, D] c_attn weight and of its [3, D]
   bias: a copy kernel each (GPT-2 124M: 72 a step).  A slice restricted on one axis, every
   other axis whole, is a matrix of rows (the axes before) with a row stride (the axes from
   it on), at an offset: a GEMM reads it in place through its leading dimension (program.h
   RT_GEMM_LDA_INT / RT_GEMM_LDB_INT), and any op reads it in place when it is contiguous
   (one row: the bias's slice).  So the slice becomes no step when every use of it (through
   reshapes) is a rank-2 GEMM operand, or it is contiguous, and nothing writes its operand's
   bytes before the last use (the memory plan may have given them away after the slice). */

/* Op k's writes: its results (but in-place reshapes, and the view's values), and the
   global an accumulate, assign or fill writes; false if one has no buffer or op k is a
   parameter update (which writes its operands). */
static bool op_writes(Lower *L, const Op *op, const bool *in_view, RtBuf *w, int *nw, int cap) {
  if (op->kind == OP_ADAMW) return false;
  for (int t = 0; t < op->n_results; t++) {
    const Value *v = op->results[t];
    if (v->kind != VAL_GLOBAL && v->id >= 0 && v->id < L->n_view && in_view[v->id]) continue;
    if (op->kind == OP_RESHAPE && v->kind != VAL_GLOBAL && op->operands[0]->kind != VAL_GLOBAL &&
        v->offset == op->operands[0]->offset)
      continue;
    if (*nw >= cap || cl_buf_of(L, v, &w[(*nw)++])) return false;
  }
  if ((op->kind == OP_ACCUMULATE || op->kind == OP_ASSIGN || op->kind == OP_FILL) &&
      (*nw >= cap || cl_buf_of(L, op->operands[0], &w[(*nw)++])))
    return false;
  return true;
}

void cl_gemm_plan_views(Lower *L, const Func *f) {
  if (getenv("LOOM_CUDA_NO_VIEWS")) return;
  bool *in_view = calloc((size_t)L->n_view + 1, sizeof(bool));
  if (!in_view) return;   /* copies: correct, only slower */
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    if (op->kind != OP_SLICE || L->skip[i]) continue;
    const Value *x = op->operands[0], *y = op->results[0];
    const Attr *st = op_attr(op, "start"), *en = op_attr(op, "end");
    const Type *xt = &x->type;
    if (!st || !en || st->n != xt->rank || en->n != xt->rank || y->id < 0 || y->id >= L->n_view) continue;
    int a = -1;   /* the one restricted axis */
    bool ok = true;
    for (int d = 0; d < xt->rank && ok; d++)
      if (st->ints[d] != 0 || en->ints[d] != xt->dims[d]) ok = a < 0 ? (a = d, true) : false;
    if (!ok || a < 0) continue;
    int64_t rows = cl_prod_dims(xt, 0, a), ld = cl_prod_dims(xt, a, xt->rank), inner = cl_prod_dims(xt, a + 1, xt->rank);
    int64_t cols = (en->ints[a] - st->ints[a]) * inner, off = st->ints[a] * inner;
    bool contiguous = rows == 1 || cols == ld;
    RtBuf xb;
    if (cl_buf_of(L, x, &xb)) {
      L->err[0] = 0;
      continue;
    }
    /* the view's values (the slice, its reshapes) and their uses, up to the last */
    memset(in_view, 0, (size_t)L->n_view + 1);
    in_view[y->id] = true;
    int last = i;
    for (int k = i + 1; k < f->ops.n && ok; k++) {
      const Op *u = f->ops.items[k];
      for (int o = 0; o < u->n_operands && ok; o++) {
        const Value *v = u->operands[o];
        if (v->kind == VAL_GLOBAL || v->id < 0 || v->id >= L->n_view || !in_view[v->id]) continue;
        last = k;
        if (u->kind == OP_RESHAPE && u->results[0]->offset == v->offset && u->results[0]->id >= 0 &&
            u->results[0]->id < L->n_view)
          in_view[u->results[0]->id] = true;
        else if (!contiguous && !(u->kind == OP_MATMUL && o < 2 && v->type.rank == 2 && rows == v->type.dims[0] &&
                                  cols == v->type.dims[1] && u->operands[1 - o] != v))
          ok = false;
      }
    }
    for (int r = 0; r < f->rets.n && ok; r++) {
      const Value *v = f->rets.items[r];
      ok = v->kind == VAL_GLOBAL || v->id < 0 || v->id >= L->n_view || !in_view[v->id];
    }
    /* nothing between writes x's bytes */
    for (int k = i + 1; k <= last && ok; k++) {
      enum { CAP = 16 };
      RtBuf w[CAP];
      int nw = 0;
      if (!op_writes(L, f->ops.items[k], in_view, w, &nw, CAP)) {
        L->err[0] = 0;
        ok = false;
      }
      for (int t = 0; t < nw && ok; t++) ok = !cl_overlap(&w[t], &xb);
    }
    /* at 64 bytes, as every buffer of the program (kernels may load vectors) */
    if (!ok || (xb.offset + off * cl_st_size(xb.storage)) % 64) continue;
    RtBuf vb = xb;
    vb.offset += off * cl_st_size(xb.storage);
    vb.n = contiguous ? cols * rows : (rows - 1) * ld + cols;
    for (int id = 0; id < L->n_view; id++)
      if (in_view[id]) {
        L->view[id] = vb;
        L->view_ld[id] = contiguous ? 0 : ld;
      }
    L->skip[i] = true;
  }
  free(in_view);
}
