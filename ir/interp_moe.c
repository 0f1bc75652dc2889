/* ir/interp_moe.c — the reference semantics of the mixture-of-experts ops (ops.def: topk,
   gather_last, scatter_last, moe_sort, moe_count, moe_dispatch, moe_combine,
   moe_weight_grad, grouped_matmul, grouped_matmul_wgrad).  Plain loops, f32 sums in index
   order, as the rest of the reference executor.  Integer tensors hold int64 values. */
#include <stdlib.h>

#include "interp_ops.h"

static int fail(char *err, size_t errlen, const char *msg) {
  snprintf(err, errlen, "%s", msg);
  return IR_ERUN;
}

/* Assignment a's expert, checked. */
static int expert_of(const Tensor *idx, int64_t a, int64_t E, int64_t *e, char *err, size_t errlen) {
  *e = idx->i[a];
  if (*e < 0 || *e >= E) return fail(err, errlen, "moe: an expert index is out of range");
  return 0;
}

/* pos (NULL: only counts) and per-expert kept counts of the assignments idx[N,k]. */
static int sort_assignments(const Op *op, const Tensor *idx, int64_t *pos, int64_t *count, char *err, size_t errlen) {
  int64_t E = op_int(op, "experts"), cap = op_int(op, "capacity"), n = idx->n;
  int64_t *start = calloc((size_t)E + 1, sizeof *start), *seen = calloc((size_t)E + 1, sizeof *seen);
  if (!start || !seen) {
    free(start), free(seen);
    return fail(err, errlen, "out of memory in moe_sort");
  }
  int rc = 0;
  for (int64_t a = 0; a < n && !rc; a++) {
    int64_t e;
    if (!(rc = expert_of(idx, a, E, &e, err, errlen))) seen[e]++;
  }
  for (int64_t e = 0; e < E && !rc; e++) {
    count[e] = cap > 0 && seen[e] > cap ? cap : seen[e];
    start[e + 1] = start[e] + count[e];
    seen[e] = 0;
  }
  for (int64_t a = 0; a < n && !rc && pos; a++) {
    int64_t e = idx->i[a];
    pos[a] = seen[e] < count[e] ? start[e] + seen[e] : -1;
    seen[e]++;
  }
  free(start), free(seen);
  return rc;
}

/* Row r of a [R,D] tensor, or NULL when r is a dropped (-1) or impossible position. */
static const float *row_at(const Tensor *t, int64_t r) {
  return r >= 0 && r < t->type.dims[0] ? t->f + r * t->type.dims[1] : NULL;
}

int interp_moe_op(const Op *op, Tensor **in, Tensor **out, char *err, size_t errlen) {
  Tensor *y = out[0];
  switch (op->kind) {
  case OP_TOPK: {
    const Tensor *x = in[0];
    int64_t E = x->type.dims[x->type.rank - 1], k = op_int(op, "k"), rows = E ? x->n / E : 0;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x->f + r * E;
      int64_t *o = y->i + r * k;
      for (int64_t j = 0; j < k; j++) {   /* the j-th largest: selection, ties to the lower index */
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
          bool taken = false;
          for (int64_t i = 0; i < j && !taken; i++) taken = o[i] == e;
          if (!taken && (best < 0 || xr[e] > xr[best])) best = e;
        }
        o[j] = best;
      }
    }
    return 0;
  }
  case OP_GATHER_LAST:
  case OP_SCATTER_LAST: {
    bool g = op->kind == OP_GATHER_LAST;
    const Tensor *idx = in[1], *big = g ? in[0] : y;
    int64_t E = big->type.dims[big->type.rank - 1], k = idx->type.dims[idx->type.rank - 1];
    for (int64_t a = 0; a < idx->n; a++) {
      int64_t e = idx->i[a];
      if (e < 0 || e >= E) return fail(err, errlen, "gather_last/scatter_last: an index is out of range");
      if (g) y->f[a] = in[0]->f[(a / k) * E + e];
      else y->f[(a / k) * E + e] += in[0]->f[a];
    }
    return 0;
  }
  case OP_MOE_SORT:
  case OP_MOE_COUNT: {
    int64_t E = op_int(op, "experts");
    int64_t *pos = op->kind == OP_MOE_SORT ? y->i : NULL, *count = op->kind == OP_MOE_COUNT ? y->i : malloc(sizeof(int64_t) * (size_t)E);
    if (!count) return fail(err, errlen, "out of memory in moe_sort");
    int rc = sort_assignments(op, in[0], pos, count, err, errlen);
    if (count != y->i) free(count);
    return rc;
  }
  case OP_MOE_DISPATCH:
  case OP_MOE_COMBINE: {
    bool disp = op->kind == OP_MOE_DISPATCH;
    const Tensor *pos = in[1], *w = in[2];
    int64_t D = in[0]->type.dims[1], k = w->type.dims[1];
    for (int64_t a = 0; a < pos->n; a++) {
      int64_t p = pos->i[a];
      if (p < 0) continue;   /* dropped by the capacity */
      if (p >= (disp ? y : in[0])->type.dims[0]) return fail(err, errlen, "moe_dispatch/combine: a position is out of range");
      float wa = w->f[a];
      if (disp) {
        const float *src = in[0]->f + (a / k) * D;
        float *dst = y->f + p * D;
        for (int64_t d = 0; d < D; d++) dst[d] = wa * src[d];
      } else {
        const float *src = row_at(in[0], p);
        float *dst = y->f + (a / k) * D;
        for (int64_t d = 0; d < D; d++) dst[d] += wa * src[d];
      }
    }
    return 0;
  }
  case OP_MOE_WEIGHT_GRAD: {
    const Tensor *rows = in[0], *x = in[1], *pos = in[2];
    int64_t D = x->type.dims[1], k = y->type.dims[1];
    for (int64_t a = 0; a < pos->n; a++) {
      const float *r = row_at(rows, pos->i[a]), *t = x->f + (a / k) * D;
      float acc = 0;
      for (int64_t d = 0; r && d < D; d++) acc += r[d] * t[d];
      y->f[a] = acc;
    }
    return 0;
  }
  case OP_GROUPED_MATMUL:
  case OP_GROUPED_MATMUL_WGRAD: {
    bool wgrad = op->kind == OP_GROUPED_MATMUL_WGRAD;
    const Tensor *x = in[0], *b = in[1], *cnt = in[2];
    int64_t R = x->type.dims[0], G = cnt->n;
    int64_t E = wgrad ? op_int(op, "experts") : b->type.dims[0];
    bool tb = wgrad || op_bool(op, "tb");
    /* forward: y[r, n] = sum_k x[r,k] w[e][n,k] (tb) or w[e][k,n];  wgrad: dw[e][n,k] += dy[r,n] x'[r,k] */
    int64_t N = wgrad ? x->type.dims[1] : y->type.dims[1], K = wgrad ? b->type.dims[1] : x->type.dims[1];
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; g++) {
      int64_t c = cnt->i[g];
      if (c < 0 || r0 + c > R) return fail(err, errlen, "grouped_matmul: the group counts exceed the rows");
      int64_t e = g % E;
      if (wgrad) {
        float *dw = y->f + e * N * K;
        for (int64_t n = 0; n < N; n++)
          for (int64_t kk = 0; kk < K; kk++) {
            float acc = 0;
            for (int64_t r = r0; r < r0 + c; r++) acc += x->f[r * N + n] * b->f[r * K + kk];
            dw[n * K + kk] += acc;
          }
      } else {
        const float *w = b->f + e * N * K;
        for (int64_t r = r0; r < r0 + c; r++)
          for (int64_t n = 0; n < N; n++) {
            float acc = 0;
            for (int64_t kk = 0; kk < K; kk++) acc += x->f[r * K + kk] * (tb ? w[n * K + kk] : w[kk * N + n]);
            y->f[r * N + n] = acc;
          }
      }
      r0 += c;
    }
    return 0;
  }
  default: return fail(err, errlen, "not a mixture-of-experts op");
  }
}
