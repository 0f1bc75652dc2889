/* runtime/cpu/cpu_builtin.c — runs one RT_STEP_BUILTIN: checks a step's buffers against its
   sizes (once, when a program is loaded), unpacks i[] and f[] as program.h documents them,
   calls the kernel and rounds what it wrote. */
#include <stdio.h>

#include "runtime/cpu/cpu_kernels.h"


/* ---------------------------------------------------------------- checks */

typedef struct {
  const RtStep *st;
  char *err;
  size_t errlen;
  int rc;
} Chk;

static void bad(Chk *c, const char *what) {
  if (!c->rc) snprintf(c->err, c->errlen, "builtin %s (%s): %s", rt_builtin_name(c->st->which),
                       c->st->label, what);
  c->rc = 2;
}

/* Buffer k must hold exactly n elements of the given kind (is_int < 0: either). */
static void want(Chk *c, int k, int64_t n, int is_int) {
  const RtBuf *b = &c->st->bufs[k];
  char msg[160];
  if (b->n != n) {
    snprintf(msg, sizeof msg, "buffer %d holds %lld elements, expected %lld", k, (long long)b->n, (long long)n);
    bad(c, msg);
  } else if (is_int >= 0 && b->is_int != is_int) {
    snprintf(msg, sizeof msg, "buffer %d must be %s", k, is_int ? "int32" : "f32");
    bad(c, msg);
  }
}

static void nonneg(Chk *c, int from, int to) {
  for (int k = from; k < to; k++)
    if (c->st->i[k] < 0) bad(c, "negative size");
}

static int64_t prod(const int64_t *d, int n) {
  int64_t p = 1;
  for (int k = 0; k < n; k++) p = rt_smul(p, d[k]);
  return p;
}

/* i[0] = rank, then `lists` arrays of rank entries; returns rank or -1. */
static int ranked(Chk *c, int lists) {
  int64_t r = c->st->i[0];
  if (r < 0 || r > 8 || 1 + lists * r > RT_MAX_INTS) {
    bad(c, "rank out of range");
    return -1;
  }
  nonneg(c, 1, 1 + (int)r);
  return (int)r;
}

int cpu_builtin_check(const RtStep *st, char *err, size_t errlen) {
  Chk c = {st, err, errlen, 0};
  if (st->kind != RT_STEP_BUILTIN || st->which < 0 || st->which >= RT_B_COUNT) {
    snprintf(err, errlen, "step %s is not a known builtin", st->label);
    return 2;
  }
  int n_in = rt_builtins[st->which].n_in < 0 ? st->n_in : rt_builtins[st->which].n_in;
  bool n_out_ok = rt_builtins[st->which].n_out < 0 ? st->n_out == 0 || st->n_out == 3 : st->n_out == rt_builtins[st->which].n_out;
  if (st->n_in != n_in || !n_out_ok || st->n_in + st->n_out > RT_MAX_BUFS) {
    bad(&c, "wrong number of buffers");
    return c.rc;
  }
  const int64_t *i = st->i;
  switch ((RtBuiltin)st->which) {
  case RT_B_LAYERNORM:
  case RT_B_RMSNORM:
  case RT_B_SOFTMAX:
  case RT_B_LAYERNORM_GRAD:
  case RT_B_RMSNORM_GRAD:
  case RT_B_SOFTMAX_GRAD: {
    nonneg(&c, 0, 2);
    int64_t N = rt_smul(i[0], i[1]), D = i[1];
    int w = st->which;
    if (w == RT_B_SOFTMAX) want(&c, 0, N, 0), want(&c, 1, N, 0);
    else if (w == RT_B_SOFTMAX_GRAD) want(&c, 0, N, 0), want(&c, 1, N, 0), want(&c, 2, N, 0);
    else if (w == RT_B_LAYERNORM) want(&c, 0, N, 0), want(&c, 1, D, 0), want(&c, 2, D, 0), want(&c, 3, N, 0);
    else if (w == RT_B_RMSNORM) want(&c, 0, N, 0), want(&c, 1, D, 0), want(&c, 2, N, 0);
    else {
      want(&c, 0, N, 0), want(&c, 1, N, 0), want(&c, 2, D, 0), want(&c, 3, N, 0), want(&c, 4, D, 0);
      if (w == RT_B_LAYERNORM_GRAD) want(&c, 5, D, 0);
    }
    break;
  }
  case RT_B_ATTENTION:
  case RT_B_ATTENTION_GRAD: {
    nonneg(&c, 0, 6);
    int64_t nq = rt_smul(rt_smul(i[0], i[1]), rt_smul(i[2], i[3])), nk = rt_smul(rt_smul(i[0], i[4]), rt_smul(i[5], i[3]));
    if (i[5] <= 0 || i[2] % i[5]) bad(&c, "query heads must be a multiple of kv heads");
    if (i[6] && i[1] > i[4]) bad(&c, "causal attention with more queries than keys");
    if (i[7] < 0) bad(&c, "a negative sliding window");
    int o = st->which == RT_B_ATTENTION_GRAD;
    if (o) want(&c, 0, nq, 0);
    want(&c, o, nq, 0), want(&c, o + 1, nk, 0), want(&c, o + 2, nk, 0);
    if (o) want(&c, 4, nq, 0), want(&c, 5, nk, 0), want(&c, 6, nk, 0);
    else want(&c, 3, nq, 0);
    break;
  }
  case RT_B_ROPE:
    nonneg(&c, 0, 4);
    want(&c, 0, prod(i, 4), 0), want(&c, 1, prod(i, 4), 0);
    /* (i[6..8] all 0: a whole sequence, as programs lowered before cp wrote it) */
    if (i[6] < 0 || i[6] > 5 || i[7] < 0 || (i[6] && i[7] < 1) || (i[8] && i[1] % 2))
      bad(&c, "the sequence split (axis, size, zigzag) is not valid");
    break;
  case RT_B_ROPE_AT:
    nonneg(&c, 0, 4);
    want(&c, 0, prod(i, 4), 0), want(&c, 1, rt_smul(i[0], i[1]), 1), want(&c, 2, prod(i, 4), 0);
    if (i[3] % 2) bad(&c, "rope needs an even head size");
    break;
  case RT_B_ATTN_CACHED: {
    nonneg(&c, 0, 6);
    int64_t nq = prod(i, 4), nk = rt_smul(rt_smul(i[0], i[4]), rt_smul(i[5], i[3]));
    if (i[5] <= 0 || i[2] % i[5]) bad(&c, "query heads must be a multiple of kv heads");
    if (i[6] < 0) bad(&c, "a negative sliding window");
    want(&c, 0, nq, 0), want(&c, 1, nk, 0), want(&c, 2, nk, 0), want(&c, 3, rt_smul(i[0], i[1]), 1), want(&c, 4, nq, 0);
    break;
  }
  case RT_B_KV_WRITE:
    nonneg(&c, 0, 4);
    if (i[1] > i[2]) bad(&c, "more new rows than the cache holds");
    want(&c, 0, rt_smul(rt_smul(i[0], i[2]), i[3]), 0), want(&c, 1, rt_smul(rt_smul(i[0], i[1]), i[3]), 0);
    want(&c, 2, rt_smul(i[0], i[1]), 1);
    break;
  case RT_B_ATTN_BLOCK:
  case RT_B_ATTN_BLOCK_GRAD: {
    nonneg(&c, 0, 6);
    int64_t nq = rt_smul(rt_smul(i[0], i[1]), rt_smul(i[2], i[3])), nk = rt_smul(rt_smul(i[0], i[4]), rt_smul(i[5], i[3]));
    int64_t nl = rt_smul(rt_smul(i[0], i[1]), i[2]);
    if (i[5] <= 0 || i[2] % i[5]) bad(&c, "query heads must be a multiple of kv heads");
    if (i[7] < 0 || i[7] > 5 || i[8] < 1 || i[10] < -1 || i[10] >= i[8] || (i[9] && i[1] % 2) ||
        i[4] != (i[10] < 0 ? rt_smul(i[8], i[1]) : i[1]))
      bad(&c, "the sequence split (axis, size, zigzag, kv_shift, keys) is not valid");
    if (i[12] < 0) bad(&c, "a negative sliding window");
    if (st->which == RT_B_ATTN_BLOCK) {
      want(&c, 0, nq, 0), want(&c, 1, nk, 0), want(&c, 2, nk, 0), want(&c, 3, nq, 0), want(&c, 4, nl, 0);
    } else {
      want(&c, 0, nq, 0), want(&c, 1, nq, 0), want(&c, 2, nk, 0), want(&c, 3, nk, 0), want(&c, 4, nl, 0);
      want(&c, 5, nl, 0), want(&c, 6, nq, 0), want(&c, 7, nk, 0), want(&c, 8, nk, 0);
    }
    break;
  }
  case RT_B_TOPK:
    nonneg(&c, 0, 3);
    if (i[2] < 1 || i[2] > i[1]) bad(&c, "k must be between 1 and the experts");
    want(&c, 0, rt_smul(i[0], i[1]), 0), want(&c, 1, rt_smul(i[0], i[2]), 1);
    break;
  case RT_B_GATHER_LAST:
  case RT_B_SCATTER_LAST: {
    nonneg(&c, 0, 3);
    bool g = st->which == RT_B_GATHER_LAST;
    int64_t big = rt_smul(i[0], i[1]), small = rt_smul(i[0], i[2]);
    want(&c, 0, g ? big : small, 0), want(&c, 1, small, 1), want(&c, 2, g ? small : big, 0);
    break;
  }
  case RT_B_MOE_SORT:
  case RT_B_MOE_COUNT:
    nonneg(&c, 0, 3);
    if (i[1] < 1) bad(&c, "no experts");
    want(&c, 0, i[0], 1), want(&c, 1, st->which == RT_B_MOE_SORT ? i[0] : i[1], 1);
    break;
  case RT_B_MOE_DISPATCH:
  case RT_B_MOE_COMBINE:
  case RT_B_MOE_WEIGHT_GRAD: {
    nonneg(&c, 0, 4);
    int64_t nk = rt_smul(i[0], i[1]), nd = rt_smul(i[0], i[2]), rd = rt_smul(i[3], i[2]);
    if (i[3] < nk) bad(&c, "fewer rows than assignments");
    if (st->which == RT_B_MOE_DISPATCH) want(&c, 0, nd, 0), want(&c, 1, nk, 1), want(&c, 2, nk, 0), want(&c, 3, rd, 0);
    else if (st->which == RT_B_MOE_COMBINE) want(&c, 0, rd, 0), want(&c, 1, nk, 1), want(&c, 2, nk, 0), want(&c, 3, nd, 0);
    else want(&c, 0, rd, 0), want(&c, 1, nd, 0), want(&c, 2, nk, 1), want(&c, 3, nk, 0);
    break;
  }
  case RT_B_GROUPED_MATMUL:
  case RT_B_GROUPED_WGRAD: {
    nonneg(&c, 0, 5);
    if (i[3] < 1 || i[4] % i[3] || i[0] > INT32_MAX || i[1] > INT32_MAX || i[2] > INT32_MAX)
      bad(&c, "the groups must be a multiple of the experts, and the sizes fit int32");
    int64_t w = rt_smul(i[3], rt_smul(i[1], i[2]));
    if (st->which == RT_B_GROUPED_MATMUL)
      want(&c, 0, rt_smul(i[0], i[1]), 0), want(&c, 1, w, 0), want(&c, 2, i[4], 1), want(&c, 3, rt_smul(i[0], i[2]), 0);
    else want(&c, 0, rt_smul(i[0], i[2]), 0), want(&c, 1, rt_smul(i[0], i[1]), 0), want(&c, 2, i[4], 1), want(&c, 3, w, 0);
    break;
  }
  case RT_B_CROSS_ENTROPY:
    nonneg(&c, 0, 2);
    want(&c, 0, rt_smul(i[0], i[1]), 0), want(&c, 1, i[0], 1), want(&c, 2, i[0], 0);
    break;
  case RT_B_CROSS_ENTROPY_GRAD:
    nonneg(&c, 0, 2);
    want(&c, 0, i[0], 0), want(&c, 1, rt_smul(i[0], i[1]), 0), want(&c, 2, i[0], 1), want(&c, 3, rt_smul(i[0], i[1]), 0);
    break;
  case RT_B_EMBEDDING:
    nonneg(&c, 0, 4);
    want(&c, 0, rt_smul(i[1], i[2]), 0), want(&c, 1, i[0], 1), want(&c, 2, rt_smul(i[0], i[2]), 0);
    if (i[3] > COMM_AXES) bad(&c, "vocab axis out of range");
    break;
  case RT_B_EMBEDDING_GRAD:
    nonneg(&c, 0, 4);
    want(&c, 0, rt_smul(i[0], i[2]), 0), want(&c, 1, i[0], 1), want(&c, 2, rt_smul(i[1], i[2]), 0);
    if (i[3] > COMM_AXES) bad(&c, "vocab axis out of range");
    break;
  case RT_B_TARGET_PICK:
  case RT_B_ONEHOT:
  case RT_B_ALL_REDUCE:
  case RT_B_ALL_GATHER:
  case RT_B_REDUCE_SCATTER:
  case RT_B_ALL_TO_ALL:
  case RT_B_SHARD_SLICE:
  case RT_B_ALL_TO_ALLV:
  case RT_B_SHARD_PAD:
  case RT_B_SEND:
  case RT_B_RECV:
  case RT_B_COLL_START:
  case RT_B_COLL_WAIT: return cpu_mesh_builtin_check(st, err, errlen);
  case RT_B_TRANSPOSE: {
    int r = ranked(&c, 2);
    if (r < 0) break;
    bool seen[8] = {0};
    for (int d = 0; d < r; d++) {
      int64_t p = i[1 + r + d];
      if (p < 0 || p >= r || seen[p]) bad(&c, "perm is not a permutation");
      else seen[p] = true;
    }
    int64_t n = prod(i + 1, r);
    want(&c, 0, n, -1), want(&c, 1, n, st->bufs[0].is_int);
    break;
  }
  case RT_B_SLICE:
  case RT_B_PAD: {
    int r = ranked(&c, 3);
    if (r < 0) break;
    int64_t n = 1;
    for (int d = 0; d < r; d++) {
      int64_t dim = i[1 + d], a = i[1 + r + d], b = i[1 + 2 * r + d];
      if (st->which == RT_B_SLICE) {
        if (a < 0 || a > b || b > dim) bad(&c, "slice bounds outside the operand");
        n = rt_smul(n, rt_ssub(b, a));
      } else {
        if (a < 0 || b < 0) bad(&c, "negative padding");
        n = rt_smul(n, rt_sadd(rt_sadd(a, dim), b));
      }
    }
    want(&c, 0, prod(i + 1, r), -1), want(&c, 1, n, st->bufs[0].is_int);
    break;
  }
  case RT_B_CONCAT: {
    if (i[0] != st->n_in || st->n_in < 1 || 3 + st->n_in > RT_MAX_INTS) {
      bad(&c, "i[0] must be the number of inputs");
      break;
    }
    nonneg(&c, 1, 3 + st->n_in);
    int64_t total = 0;
    for (int j = 0; j < st->n_in; j++) {
      want(&c, j, rt_smul(rt_smul(i[1], i[3 + j]), i[2]), st->bufs[0].is_int);
      total = rt_sadd(total, i[3 + j]);
    }
    want(&c, st->n_in, rt_smul(rt_smul(i[1], total), i[2]), st->bufs[0].is_int);
    break;
  }
  case RT_B_BROADCAST: {
    int r = ranked(&c, 2);
    if (r < 0) break;
    int64_t n = prod(i + 1, r), last = 0;
    for (int d = 0; d < r; d++) {
      if (i[1 + r + d] < 0) bad(&c, "negative stride");
      if (i[1 + d] > 0) last = rt_sadd(last, rt_smul(i[1 + d] - 1, i[1 + r + d]));
    }
    if (n > 0 && last >= st->bufs[0].n) bad(&c, "strides reach outside the operand");
    want(&c, 1, n, st->bufs[0].is_int);
    break;
  }
  case RT_B_COPY:
    nonneg(&c, 0, 1);
    want(&c, 0, i[0], -1), want(&c, 1, i[0], st->bufs[0].is_int);
    break;
  case RT_B_CAST:
    nonneg(&c, 0, 1);
    want(&c, 0, i[0], -1), want(&c, 1, i[0], -1);
    break;
  case RT_B_FILL:
    nonneg(&c, 0, 1);
    want(&c, 0, i[0], -1);
    break;
  case RT_B_IOTA: {
    int r = ranked(&c, 1);
    if (r < 0) break;
    if (i[1 + r] < 0 || i[1 + r] >= r) bad(&c, "iota dim out of range");
    want(&c, 0, prod(i + 1, r), -1);
    break;
  }
  case RT_B_ACCUMULATE:
  case RT_B_ASSIGN:
    nonneg(&c, 0, 1);
    want(&c, 0, i[0], -1), want(&c, 1, i[0], st->bufs[0].is_int);
    break;
  case RT_B_ADAMW:
    nonneg(&c, 0, 1);
    for (int k = 0; k < 4; k++) want(&c, k, i[0], 0);
    for (int k = 7; k < 7 + st->n_out; k++) want(&c, k, i[0], 0);
    for (int k = 4; k < 7; k++)
      if (st->bufs[k].n < 1 || st->bufs[k].is_int) bad(&c, "gscale, lr and t must be f32 scalars");
    break;
  case RT_B_COUNT: break;
  }
  return c.rc;
}

/* ---------------------------------------------------------------- run */

static void round_out(ThreadPool *tp, const RtStep *st, void *const *bufs, int k) {
  const RtBuf *b = &st->bufs[k];
  if (!b->is_int && b->round != RT_ROUND_NONE) rt_round_buf(tp, bufs[k], b->n, (RtRound)b->round);
}

/* The rank's coordinate on vocab axis + 1 (0: not split), times V: the first row it holds. */
/* The rank's coordinate on a split sequence's axis ("axis + 1"; 0: whole, coordinate 0). */
static int64_t seq_coord(const Comm *comm, int64_t axis1) { return axis1 && comm ? comm->coord[axis1 - 1] : 0; }

static int64_t vocab_off(const Comm *comm, int64_t axis1, int64_t V) {
  return axis1 && comm ? comm->coord[axis1 - 1] * V : 0;
}

int cpu_builtin_run(ThreadPool *tp, Comm *comm, const RtStep *st, void *const *bufs, char *err, size_t errlen) {
  const int64_t *i = st->i;
  const double *f = st->f;
  const RtBuf *bd = st->bufs;
  void *const *b = bufs;
  int rc = 0;
  switch ((RtBuiltin)st->which) {
  case RT_B_LAYERNORM: cpu_layernorm(tp, b[0], b[1], b[2], b[3], i[0], i[1], (float)f[0]); break;
  case RT_B_LAYERNORM_GRAD:
    rc = cpu_layernorm_grad(tp, b[0], b[1], b[2], b[3], b[4], b[5], i[0], i[1], (float)f[0], err, errlen);
    break;
  case RT_B_RMSNORM: cpu_rmsnorm(tp, b[0], b[1], b[2], i[0], i[1], (float)f[0]); break;
  case RT_B_RMSNORM_GRAD:
    rc = cpu_rmsnorm_grad(tp, b[0], b[1], b[2], b[3], b[4], i[0], i[1], (float)f[0], err, errlen);
    break;
  case RT_B_SOFTMAX: cpu_softmax(tp, b[0], b[1], i[0], i[1]); break;
  case RT_B_SOFTMAX_GRAD: cpu_softmax_grad(tp, b[0], b[1], b[2], i[0], i[1]); break;
  case RT_B_ATTENTION:
    rc = cpu_attention(tp, b[0], b[1], b[2], b[3], i[0], i[1], i[2], i[3], i[4], i[5], i[6] != 0, i[7], (float)f[0],
                       err, errlen);
    break;
  case RT_B_ATTENTION_GRAD:
    rc = cpu_attention_grad(tp, b[0], b[1], b[2], b[3], b[4], b[5], b[6], i[0], i[1], i[2], i[3], i[4], i[5],
                            i[6] != 0, i[7], (float)f[0], err, errlen);
    break;
  case RT_B_ROPE:
    rc = cpu_rope(tp, b[0], b[1], i[0], i[1], i[2], i[3], i[4], i[5] != 0, f, seq_coord(comm, i[6]), i[7], i[8] != 0,
                  err, errlen);
    break;
  case RT_B_ROPE_AT: rc = cpu_rope_at(tp, b[0], b[1], b[2], i[0], i[1], i[2], i[3], f, err, errlen); break;
  case RT_B_ATTN_CACHED:
    rc = cpu_attention_cached(tp, b[0], b[1], b[2], b[3], b[4], i[0], i[1], i[2], i[3], i[4], i[5], i[6], (float)f[0],
                              err, errlen);
    break;
  case RT_B_KV_WRITE: rc = cpu_kv_write(b[0], b[1], b[2], i[0], i[1], i[2], i[3], err, errlen); break;
  case RT_B_ATTN_BLOCK:
  case RT_B_ATTN_BLOCK_GRAD: {
    CpuAttnBlock ab = {.B = i[0], .Tq = i[1], .H = i[2], .Dh = i[3], .Tk = i[4], .KV = i[5], .causal = i[6] != 0,
                       .c = seq_coord(comm, i[7]), .n = i[8], .zigzag = i[9] != 0, .kv_shift = i[10], .window = i[12],
                       .scale = (float)f[0]};
    if (st->which == RT_B_ATTN_BLOCK) rc = cpu_attn_block(tp, &ab, b[0], b[1], b[2], b[3], b[4], err, errlen);
    else rc = cpu_attn_block_grad(tp, &ab, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], err, errlen);
    break;
  }
  case RT_B_TOPK: cpu_topk(tp, b[0], b[1], i[0], i[1], i[2]); break;
  case RT_B_GATHER_LAST:
  case RT_B_SCATTER_LAST:
    rc = cpu_gather_last(b[0], b[1], b[2], i[0], i[1], i[2], st->which == RT_B_SCATTER_LAST, err, errlen);
    break;
  case RT_B_MOE_SORT: rc = cpu_moe_sort(b[0], b[1], NULL, i[0], i[1], i[2], err, errlen); break;
  case RT_B_MOE_COUNT: rc = cpu_moe_sort(b[0], NULL, b[1], i[0], i[1], i[2], err, errlen); break;
  case RT_B_MOE_DISPATCH:
  case RT_B_MOE_COMBINE:
  case RT_B_MOE_WEIGHT_GRAD: {
    int kind = st->which == RT_B_MOE_DISPATCH ? 0 : st->which == RT_B_MOE_COMBINE ? 1 : 2;
    rc = cpu_moe_permute(tp, kind, b[0], kind == 2 ? b[1] : b[2], b[kind == 2 ? 2 : 1], b[3], i[0], i[1], i[2], i[3],
                         err, errlen);
    break;
  }
  case RT_B_GROUPED_MATMUL:
  case RT_B_GROUPED_WGRAD:
    rc = cpu_grouped_matmul(tp, st->which == RT_B_GROUPED_WGRAD, b[0], b[1], b[2], b[3], i[0], i[1], i[2], i[3], i[4],
                            st->which == RT_B_GROUPED_WGRAD || i[5], err, errlen);
    break;
  case RT_B_CROSS_ENTROPY: rc = cpu_cross_entropy(tp, b[0], b[1], b[2], i[0], i[1], err, errlen); break;
  case RT_B_CROSS_ENTROPY_GRAD:
    rc = cpu_cross_entropy_grad(tp, b[0], b[1], b[2], b[3], i[0], i[1], err, errlen);
    break;
  case RT_B_EMBEDDING:
    rc = cpu_embedding(tp, b[0], b[1], b[2], i[0], i[1], i[2], vocab_off(comm, i[3], i[1]), i[3] != 0, err, errlen);
    break;
  case RT_B_EMBEDDING_GRAD:
    rc = cpu_embedding_grad(tp, b[0], b[1], b[2], i[0], i[1], i[2], vocab_off(comm, i[3], i[1]), i[3] != 0, err,
                            errlen);
    break;
  case RT_B_TARGET_PICK:
  case RT_B_ONEHOT:
  case RT_B_ALL_REDUCE:
  case RT_B_ALL_GATHER:
  case RT_B_REDUCE_SCATTER:
  case RT_B_ALL_TO_ALL:
  case RT_B_SHARD_SLICE:
  case RT_B_SHARD_PAD:
  case RT_B_ALL_TO_ALLV:
  case RT_B_SEND:
  case RT_B_RECV:
  case RT_B_COLL_START:
  case RT_B_COLL_WAIT: rc = cpu_mesh_builtin_run(tp, comm, st, bufs, err, errlen); break;
  case RT_B_TRANSPOSE: cpu_transpose(tp, b[0], b[1], (int)i[0], i + 1, i + 1 + i[0]); break;
  case RT_B_SLICE: cpu_slice(tp, b[0], b[1], (int)i[0], i + 1, i + 1 + i[0], i + 1 + 2 * i[0]); break;
  case RT_B_PAD: cpu_pad(tp, b[0], b[1], (int)i[0], i + 1, i + 1 + i[0], i + 1 + 2 * i[0]); break;
  case RT_B_CONCAT: cpu_concat(tp, (const void *const *)b, st->n_in, b[st->n_in], i[1], i[2], i + 3); break;
  case RT_B_BROADCAST: cpu_broadcast(tp, b[0], b[1], (int)i[0], i + 1, i + 1 + i[0]); break;
  case RT_B_COPY: cpu_copy(tp, b[0], b[1], i[0]); break;
  /* i[1] = 1: the result is a bool (x != 0); see the report on program.h */
  case RT_B_CAST: cpu_cast(tp, b[0], bd[0].is_int, b[1], bd[1].is_int, bd[1].is_int && i[1] == 1, i[0]); break;
  case RT_B_FILL: cpu_fill(tp, b[0], bd[0].is_int, f[0], i[0]); break;
  case RT_B_IOTA: cpu_iota(tp, b[0], bd[0].is_int, (int)i[0], i + 1, (int)i[1 + i[0]]); break;
  case RT_B_ACCUMULATE: cpu_accumulate(tp, b[0], b[1], bd[0].is_int, i[0]); break;
  case RT_B_ASSIGN: cpu_copy(tp, b[1], b[0], i[0]); break;
  case RT_B_ADAMW: {
    /* in place (no outputs), or into the three outputs p2 m2 v2 (the IR's pure adamw) */
    const float *gscale = b[4], *lr = b[5], *t = b[6];
    int o = st->n_out ? 7 : 0;
    cpu_adamw(tp, b[0], b[1], b[2], b[3], gscale[0], lr[0], (double)t[0], f[0], f[1], f[2], f[3], i[0], b[o],
              b[o + 1], b[o + 2]);
    break;
  }
  default: snprintf(err, errlen, "unknown builtin %d", st->which); return 2;
  }
  if (rc) return rc;
  /* Round what was written: the outputs, and what is updated in place (accumulate's and
     assign's destination; an in-place adamw's p, m, v, which the IR's adamw returns as
     results of their dtypes). */
  for (int k = st->n_in; k < st->n_in + st->n_out; k++) round_out(tp, st, bufs, k);
  if (st->which == RT_B_ACCUMULATE || st->which == RT_B_ASSIGN || (st->which == RT_B_ADAMW && !st->n_out))
    round_out(tp, st, bufs, 0);
  if (st->which == RT_B_ADAMW && !st->n_out) round_out(tp, st, bufs, 1), round_out(tp, st, bufs, 2);
  return 0;
}
