/* ir/interp_ops.c — the meaning of every op: the simplest correct code, f32 arithmetic
   (results are rounded to their dtype by the caller).  Shapes are already verified. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp_ops.h"
#include "ir/fmath.h"

static int fail(char *err, size_t errlen, const char *msg) {
  snprintf(err, errlen, "%s", msg);
  return IR_ERUN;
}

/* Row-major strides of a type. */
static void strides_of(const Type *t, int64_t *st) {
  int64_t s = 1;
  for (int d = t->rank - 1; d >= 0; d--) {
    st[d] = s;
    s *= t->dims[d];
  }
}

/* Reads element k of any tensor as a double / as an integer. */
static double get_f(const Tensor *t, int64_t k) { return t->f ? t->f[k] : (double)t->i[k]; }
static int64_t get_i(const Tensor *t, int64_t k) { return t->i ? t->i[k] : (int64_t)t->f[k]; }

static float gelu_tanh(float x) {
  const float c = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + fm_tanhf(c * (x + 0.044715f * x * x * x)));
}

static float unary(OpKind k, const Op *op, float x) {
  switch (k) {
  case OP_NEG: return -x;
  case OP_EXP: return fm_expf(x);
  case OP_LOG: return logf(x);
  case OP_SQRT: return sqrtf(x);
  case OP_RSQRT: return 1.0f / sqrtf(x);
  case OP_RECIP: return 1.0f / x;
  case OP_TANH: return fm_tanhf(x);
  case OP_SIGMOID: return 1.0f / (1.0f + fm_expf(-x));
  case OP_GELU_TANH: return gelu_tanh(x);
  case OP_SILU: return x / (1.0f + fm_expf(-x));
  case OP_RELU: return x > 0 ? x : 0;
  case OP_ABS: return fabsf(x);
  case OP_SQUARE: return x * x;
  case OP_SCALE: return x * (float)op_float(op, "by");
  case OP_ADD_SCALAR: return x + (float)op_float(op, "value");
  case OP_SIGN: return (float)((x > 0) - (x < 0));
  default: return 0;
  }
}

static float binary(OpKind k, float a, float b) {
  switch (k) {
  case OP_ADD: return a + b;
  case OP_SUB: return a - b;
  case OP_MUL: return a * b;
  case OP_DIV: return a / b;
  case OP_MAX: return a > b ? a : b;
  case OP_MIN: return a < b ? a : b;
  case OP_POW: return powf(a, b);
  case OP_GELU_TANH_GRAD: {   /* a = x, b = dy */
    const float c = 0.7978845608028654f;
    float u = c * (a + 0.044715f * a * a * a), t = fm_tanhf(u);
    return b * (0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * a * a));
  }
  case OP_SILU_GRAD: {
    float sg = 1.0f / (1.0f + fm_expf(-a));
    return b * sg * (1.0f + a * (1.0f - sg));
  }
  case OP_RELU_GRAD: return a > 0 ? b : 0;
  default: return 0;
  }
}

static int64_t binary_i(OpKind k, int64_t a, int64_t b) {
  switch (k) {
  case OP_ADD: return a + b;
  case OP_SUB: return a - b;
  case OP_MUL: return a * b;
  case OP_DIV: return b ? a / b : 0;
  case OP_MAX: return a > b ? a : b;
  case OP_MIN: return a < b ? a : b;
  case OP_RELU_GRAD: return a > 0 ? b : 0;
  default: return 0;
  }
}

static int64_t unary_i(OpKind k, int64_t x) {
  switch (k) {
  case OP_NEG: return -x;
  case OP_ABS: return x < 0 ? -x : x;
  case OP_RELU: return x > 0 ? x : 0;
  case OP_SQUARE: return x * x;
  case OP_SIGN: return (x > 0) - (x < 0);
  default: return 0;
  }
}

/* Reductions: each input element adds into the output element with the reduced dims
   dropped. */
static void reduce(const Op *op, const Tensor *x, Tensor *y) {
  const Attr *dims = &op->attrs[0];
  bool reduced[IR_MAX_RANK] = {0};
  for (int i = 0; i < dims->n; i++) reduced[dims->ints[i]] = true;
  int64_t xst[IR_MAX_RANK] = {0}, yst[IR_MAX_RANK] = {0}, ymap[IR_MAX_RANK] = {0};
  strides_of(&x->type, xst);
  strides_of(&y->type, yst);
  for (int d = 0, j = 0; d < x->type.rank; d++) ymap[d] = reduced[d] ? 0 : yst[j++];
  bool is_max = op->kind == OP_REDUCE_MAX;
  int64_t count = y->n ? x->n / y->n : 0;
  if (is_max)
    for (int64_t k = 0; k < y->n; k++) {
      if (y->f) y->f[k] = -INFINITY;
      else y->i[k] = INT64_MIN;
    }
  for (int64_t k = 0; k < x->n; k++) {
    int64_t yk = 0, rem = k;
    for (int d = 0; d < x->type.rank; d++) {
      int64_t c = rem / xst[d];
      rem -= c * xst[d];
      yk += c * ymap[d];
    }
    if (y->f) y->f[yk] = is_max ? fmaxf(y->f[yk], x->f[k]) : y->f[yk] + x->f[k];
    else y->i[yk] = is_max ? (x->i[k] > y->i[yk] ? x->i[k] : y->i[yk]) : y->i[yk] + x->i[k];
  }
  if (op->kind == OP_REDUCE_MEAN)
    for (int64_t k = 0; k < y->n; k++) y->f[k] /= (float)count;
}

/* matmul: copies each operand into [M,K] / [N,K] row-major panels so every output is a
   contiguous dot product. */
static int matmul(const Op *op, const Tensor *a, const Tensor *b, Tensor *c, char *err, size_t errlen) {
  bool ta = op_bool(op, "ta"), tb = op_bool(op, "tb");
  const Type *at = &a->type, *bt = &b->type;
  int64_t M = c->type.dims[c->type.rank - 2], N = c->type.dims[c->type.rank - 1];
  int64_t K = at->dims[at->rank - (ta ? 2 : 1)];
  int64_t batches = (M * N != 0) ? c->n / (M * N) : 0;
  bool b_batched = bt->rank > 2;
  float *ap = malloc(sizeof(float) * (size_t)(M * K > 0 ? M * K : 1));
  float *bp = malloc(sizeof(float) * (size_t)(N * K > 0 ? N * K : 1));
  if (!ap || !bp) {
    free(ap);
    free(bp);
    return fail(err, errlen, "out of memory in matmul");
  }
  for (int64_t bi = 0; bi < batches; bi++) {
    const float *A = a->f + bi * M * K;
    const float *B = b->f + (b_batched ? bi * K * N : 0);
    for (int64_t m = 0; m < M; m++)
      for (int64_t k = 0; k < K; k++) ap[m * K + k] = ta ? A[k * M + m] : A[m * K + k];
    if (bi == 0 || b_batched)
      for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) bp[n * K + k] = tb ? B[n * K + k] : B[k * N + n];
    float *C = c->f + bi * M * N;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        const float *x = ap + m * K, *y = bp + n * K;
        float acc = 0;
        for (int64_t k = 0; k < K; k++) acc += x[k] * y[k];
        C[m * N + n] = acc;
      }
  }
  free(ap);
  free(bp);
  return 0;
}

static void broadcast(const Tensor *x, Tensor *y) {
  int64_t xst[IR_MAX_RANK], yst[IR_MAX_RANK];
  strides_of(&x->type, xst);
  strides_of(&y->type, yst);
  int off = y->type.rank - x->type.rank;
  for (int64_t k = 0; k < y->n; k++) {
    int64_t xk = 0, rem = k;
    for (int d = 0; d < y->type.rank; d++) {
      int64_t c = rem / yst[d];
      rem -= c * yst[d];
      int xd = d - off;
      if (xd >= 0 && x->type.dims[xd] != 1) xk += c * xst[xd];
    }
    if (y->f) y->f[k] = x->f[xk];
    else y->i[k] = x->i[xk];
  }
}

static void transpose(const Op *op, const Tensor *x, Tensor *y) {
  const int64_t *perm = op->attrs[0].ints;
  int64_t xst[IR_MAX_RANK], yst[IR_MAX_RANK];
  strides_of(&x->type, xst);
  strides_of(&y->type, yst);
  for (int64_t k = 0; k < y->n; k++) {
    int64_t xk = 0, rem = k;
    for (int d = 0; d < y->type.rank; d++) {
      int64_t c = rem / yst[d];
      rem -= c * yst[d];
      xk += c * xst[perm[d]];
    }
    if (y->f) y->f[k] = x->f[xk];
    else y->i[k] = x->i[xk];
  }
}

static void slice(const Op *op, const Tensor *x, Tensor *y) {
  const int64_t *start = op->attrs[0].ints;
  int64_t xst[IR_MAX_RANK], yst[IR_MAX_RANK];
  strides_of(&x->type, xst);
  strides_of(&y->type, yst);
  for (int64_t k = 0; k < y->n; k++) {
    int64_t xk = 0, rem = k;
    for (int d = 0; d < y->type.rank; d++) {
      int64_t c = rem / yst[d];
      rem -= c * yst[d];
      xk += (c + start[d]) * xst[d];
    }
    if (y->f) y->f[k] = x->f[xk];
    else y->i[k] = x->i[xk];
  }
}

static void concat(const Op *op, Tensor **in, Tensor *y) {
  int dim = (int)op_int(op, "dim");
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; d++) outer *= y->type.dims[d];
  for (int d = dim + 1; d < y->type.rank; d++) inner *= y->type.dims[d];
  int64_t yrow = y->type.dims[dim] * inner, off = 0;
  for (int i = 0; i < op->n_operands; i++) {
    const Tensor *x = in[i];
    int64_t xrow = x->type.dims[dim] * inner;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t k = 0; k < xrow; k++) {
        if (y->f) y->f[o * yrow + off + k] = x->f[o * xrow + k];
        else y->i[o * yrow + off + k] = x->i[o * xrow + k];
      }
    off += xrow;
  }
}

static void layernorm(const Op *op, Tensor **in, Tensor *y) {
  const Tensor *x = in[0], *w = in[1], *b = op->kind == OP_LAYERNORM ? in[2] : NULL;
  float eps = (float)op_float(op, "eps");
  int64_t D = x->type.dims[x->type.rank - 1], rows = D ? x->n / D : 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x->f + r * D;
    float *yr = y->f + r * D;
    if (b) {
      float mean = 0, var = 0;
      for (int64_t i = 0; i < D; i++) mean += xr[i];
      mean /= (float)D;
      for (int64_t i = 0; i < D; i++) var += (xr[i] - mean) * (xr[i] - mean);
      var /= (float)D;
      float rstd = 1.0f / sqrtf(var + eps);
      for (int64_t i = 0; i < D; i++) yr[i] = (xr[i] - mean) * rstd * w->f[i] + b->f[i];
    } else {
      float ms = 0;
      for (int64_t i = 0; i < D; i++) ms += xr[i] * xr[i];
      ms /= (float)D;
      float rstd = 1.0f / sqrtf(ms + eps);
      for (int64_t i = 0; i < D; i++) yr[i] = xr[i] * rstd * w->f[i];
    }
  }
}

static void softmax_rows(const float *x, float *y, int64_t n) {
  float mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < n; i++) mx = fmaxf(mx, x[i]);
  for (int64_t i = 0; i < n; i++) sum += (y[i] = expf(x[i] - mx));
  for (int64_t i = 0; i < n; i++) y[i] /= sum;
}

/* attention: for each (b, query t, head h): p = softmax(scale * q.k_s over allowed s),
   out = sum_s p_s v_s.  Query head h reads kv head h / (H/KV).  Allowed: s <= t when
   causal, and t - s < window when window > 0 (the first key win_first gives). */
static int64_t win_first(int64_t t, int64_t window) { return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; }

/* One row of attention: query (b, t, h) against the keys first..n-1 of its kv head; out's
   row (zeros) gets the softmax-weighted sum of the values.  p: S floats of scratch. */
static void attend_row(const Tensor *q, const Tensor *k, const Tensor *v, Tensor *out, int64_t b, int64_t t, int64_t h,
                       int64_t first, int64_t n, float scale, float *p) {
  int64_t T = q->type.dims[1], H = q->type.dims[2], Dh = q->type.dims[3];
  int64_t S = k->type.dims[1], KV = k->type.dims[2], kvh = h / (H / KV);
  const float *qv = q->f + ((b * T + t) * H + h) * Dh;
  for (int64_t s = first; s < n; s++) {
    const float *kv = k->f + ((b * S + s) * KV + kvh) * Dh;
    float dot = 0;
    for (int64_t d = 0; d < Dh; d++) dot += qv[d] * kv[d];
    p[s] = dot * scale;
  }
  softmax_rows(p + first, p + first, n - first);
  float *o = out->f + ((b * T + t) * H + h) * Dh;
  for (int64_t s = first; s < n; s++) {
    const float *vv = v->f + ((b * S + s) * KV + kvh) * Dh;
    for (int64_t d = 0; d < Dh; d++) o[d] += p[s] * vv[d];
  }
}

static int attention(const Op *op, Tensor **in, Tensor *out, char *err, size_t errlen) {
  const Tensor *q = in[0], *k = in[1], *v = in[2];
  int64_t B = q->type.dims[0], T = q->type.dims[1], H = q->type.dims[2], S = k->type.dims[1];
  float scale = (float)op_float(op, "scale");
  bool causal = op_bool(op, "causal");
  int64_t window = op_int(op, "window");
  float *p = malloc(sizeof(float) * (size_t)(S ? S : 1));
  if (!p) return fail(err, errlen, "out of memory in attention");
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) attend_row(q, k, v, out, b, t, h, win_first(t, window), causal ? t + 1 : S, scale, p);
  free(p);
  return 0;
}

/* Where a sequence is split over a mesh axis (seq_axis, seq_n, zigzag: rope and the
   attention blocks), the rank's coordinate there and the layout; positions by ir_seq_pos. */
typedef struct {
  int64_t c, n;
  bool zigzag;
} SeqSplit;

static SeqSplit seq_split(const Op *op, const int *coord) {
  const Attr *a = op_attr(op, "seq_axis");
  int axis = a && a->s && a->s[0] ? mesh_axis_parse(a->s) : -1;
  SeqSplit sp = {axis >= 0 && coord ? coord[axis] : 0, op_int(op, "seq_n"), op_bool(op, "zigzag")};
  return sp;
}

/* rope, rotate-half: dim i pairs with i + Dh/2; angle = pos * theta^(-2i/Dh) (or its
   Llama 3.1 scaling: ir_rope_inv_freq). */
static void rope(const Op *op, const Tensor *x, Tensor *y, const int *coord) {
  int64_t B = x->type.dims[0], T = x->type.dims[1], H = x->type.dims[2], Dh = x->type.dims[3], half = Dh / 2;
  int64_t offset = op_int(op, "offset");
  double sign = op_bool(op, "inverse") ? -1.0 : 1.0;
  SeqSplit sp = seq_split(op, coord);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      double angle = (double)(ir_seq_pos(sp.c, t, T, sp.n, sp.zigzag) + offset) * ir_rope_inv_freq(op, i, Dh);
      float c = (float)cos(angle), s = (float)(sign * sin(angle));
      for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
          const float *xr = x->f + ((b * T + t) * H + h) * Dh;
          float *yr = y->f + ((b * T + t) * H + h) * Dh;
          yr[i] = xr[i] * c - xr[i + half] * s;
          yr[i + half] = xr[i + half] * c + xr[i] * s;
        }
    }
}

/* The global positions of an attention block's query rows and keys (see ops.def). */
static void block_positions(const Op *op, const int *coord, int64_t Tq, int64_t Tk, int64_t *qpos, int64_t *kpos) {
  SeqSplit sp = seq_split(op, coord);
  int64_t shift = op_int(op, "kv_shift");
  for (int64_t t = 0; t < Tq; t++) qpos[t] = ir_seq_pos(sp.c, t, Tq, sp.n, sp.zigzag);
  for (int64_t j = 0; j < Tk; j++) {
    int64_t r = shift < 0 ? j / Tq : ((sp.c - shift) % sp.n + sp.n) % sp.n, t = shift < 0 ? j % Tq : j;
    kpos[j] = ir_seq_pos(r, t, Tq, sp.n, sp.zigzag);
  }
}

/* ---- generation with a KV cache ---- */

/* The position of new token (b, c), checked against the cache's rows. */
static int cache_pos(const Tensor *pos, int64_t i, int64_t tmax, int64_t *out, char *err, size_t errlen) {
  int64_t p = pos->i[i];
  if (p < 0 || p >= tmax) {
    snprintf(err, errlen, "position %lld is outside the KV cache's %lld rows", (long long)p, (long long)tmax);
    return IR_EINPUT;
  }
  *out = p;
  return 0;
}

static int rope_at(const Op *op, Tensor **in, Tensor *y, char *err, size_t errlen) {
  const Tensor *x = in[0], *pos = in[1];
  int64_t B = x->type.dims[0], C = x->type.dims[1], H = x->type.dims[2], Dh = x->type.dims[3], half = Dh / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < C; c++) {
      int64_t p = pos->i[b * C + c];
      if (p < 0) return fail(err, errlen, "rope_at: a negative position");
      for (int64_t i = 0; i < half; i++) {
        double angle = (double)p * ir_rope_inv_freq(op, i, Dh);
        float cs = (float)cos(angle), sn = (float)sin(angle);
        for (int64_t h = 0; h < H; h++) {
          const float *xr = x->f + ((b * C + c) * H + h) * Dh;
          float *yr = y->f + ((b * C + c) * H + h) * Dh;
          yr[i] = xr[i] * cs - xr[i + half] * sn;
          yr[i + half] = xr[i + half] * cs + xr[i] * sn;
        }
      }
    }
  (void)err;
  return 0;
}

static int attention_cached(const Op *op, Tensor **in, Tensor *y, char *err, size_t errlen) {
  const Tensor *q = in[0], *k = in[1], *v = in[2], *pos = in[3];
  int64_t B = q->type.dims[0], C = q->type.dims[1], H = q->type.dims[2], S = k->type.dims[1];
  float scale = (float)op_float(op, "scale");
  float *p = malloc(sizeof(float) * (size_t)(S ? S : 1));
  if (!p) return fail(err, errlen, "out of memory in attention_cached");
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < C; c++) {
      int64_t last;
      if (cache_pos(pos, b * C + c, S, &last, err, errlen)) {
        free(p);
        return IR_EINPUT;
      }
      for (int64_t h = 0; h < H; h++)   /* keys 0..pos (the window's) */
        attend_row(q, k, v, y, b, c, h, win_first(last, op_int(op, "window")), last + 1, scale, p);
    }
  free(p);
  return 0;
}

static int kv_write(Tensor **in, char *err, size_t errlen) {
  Tensor *cache = in[0];
  const Tensor *x = in[1], *pos = in[2];
  int64_t B = x->type.dims[0], C = x->type.dims[1], row = x->type.dims[2] * x->type.dims[3], S = cache->type.dims[1];
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < C; c++) {
      int64_t p;
      if (cache_pos(pos, b * C + c, S, &p, err, errlen)) return IR_EINPUT;
      for (int64_t e = 0; e < row; e++)
        cache->f[(b * S + p) * row + e] = dtype_round(cache->type.dtype, x->f[(b * C + c) * row + e]);
    }
  return 0;
}

#define LSE_NONE (-1e30f)   /* the lse of a row that sees no key of the block */

/* attention_block: o and lse of one block of keys (ops.def); attention_block_grad: its
   share of dq, dk, dv given the whole rows' lse and delta. */
static int attention_block(const Op *op, Tensor **in, Tensor **out, const int *coord, char *err, size_t errlen) {
  bool grad = op->kind == OP_ATTENTION_BLOCK_GRAD;
  const Tensor *dout = grad ? in[0] : NULL, *q = in[grad], *k = in[grad + 1], *v = in[grad + 2];
  int64_t B = q->type.dims[0], T = q->type.dims[1], H = q->type.dims[2], Dh = q->type.dims[3];
  int64_t S = k->type.dims[1], KV = k->type.dims[2], group = H / KV;
  float scale = (float)op_float(op, "scale");
  bool causal = op_bool(op, "causal");
  int64_t window = op_int(op, "window");
  int64_t *qpos = malloc(sizeof(int64_t) * (size_t)(T + S + 1)), *kpos = qpos + T;
  float *p = malloc(sizeof(float) * (size_t)(S ? S : 1));
  if (!qpos || !p) {
    free(qpos);
    free(p);
    return fail(err, errlen, "out of memory in an attention block");
  }
  block_positions(op, coord, T, S, qpos, kpos);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) {
        int64_t row = (b * T + t) * H + h, kvh = h / group;
        const float *qv = q->f + row * Dh;
        float mx = -INFINITY;
        for (int64_t s = 0; s < S; s++) {
          p[s] = -INFINITY;
          if (causal && kpos[s] > qpos[t]) continue;
          if (window > 0 && qpos[t] - kpos[s] >= window) continue;
          const float *kv = k->f + ((b * S + s) * KV + kvh) * Dh;
          float dot = 0;
          for (int64_t d = 0; d < Dh; d++) dot += qv[d] * kv[d];
          p[s] = dot * scale;
          mx = p[s] > mx ? p[s] : mx;
        }
        if (!grad) {
          float *o = out[0]->f + row * Dh;
          if (mx == -INFINITY) {   /* no key of this block is seen */
            out[1]->f[row] = LSE_NONE;
            continue;
          }
          float sum = 0;
          for (int64_t s = 0; s < S; s++) {
            p[s] = p[s] == -INFINITY ? 0.0f : expf(p[s] - mx);
            sum += p[s];
          }
          for (int64_t s = 0; s < S; s++) {
            if (p[s] == 0) continue;
            const float *vv = v->f + ((b * S + s) * KV + kvh) * Dh;
            for (int64_t d = 0; d < Dh; d++) o[d] += p[s] / sum * vv[d];
          }
          out[1]->f[row] = mx + logf(sum);
          continue;
        }
        float lse = in[4]->f[row], delta = in[5]->f[row];
        const float *dov = dout->f + row * Dh;
        float *dqv = out[0]->f + row * Dh;
        for (int64_t s = 0; s < S; s++) {
          if (p[s] == -INFINITY) continue;
          float pr = expf(p[s] - lse);
          const float *vv = v->f + ((b * S + s) * KV + kvh) * Dh, *kv = k->f + ((b * S + s) * KV + kvh) * Dh;
          float *dvv = out[2]->f + ((b * S + s) * KV + kvh) * Dh, *dkv = out[1]->f + ((b * S + s) * KV + kvh) * Dh;
          float dp = 0;
          for (int64_t d = 0; d < Dh; d++) {
            dp += dov[d] * vv[d];
            dvv[d] += pr * dov[d];
          }
          float ds = pr * (dp - delta) * scale;
          for (int64_t d = 0; d < Dh; d++) {
            dqv[d] += ds * kv[d];
            dkv[d] += ds * qv[d];
          }
        }
      }
  free(qpos);
  free(p);
  return 0;
}

static int cross_entropy(const Tensor *logits, const Tensor *targets, Tensor *loss, char *err, size_t errlen) {
  int64_t V = logits->type.dims[logits->type.rank - 1];
  for (int64_t r = 0; r < loss->n; r++) {
    const float *l = logits->f + r * V;
    int64_t t = targets->i[r];
    if (t < 0 || t >= V) {
      snprintf(err, errlen, "target %lld at position %lld is outside the vocabulary of %lld", (long long)t,
               (long long)r, (long long)V);
      return IR_EINPUT;
    }
    float mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++) mx = fmaxf(mx, l[i]);
    for (int64_t i = 0; i < V; i++) sum += expf(l[i] - mx);
    loss->f[r] = logf(sum) + mx - l[t];
  }
  return 0;
}

static void pad(const Op *op, const Tensor *x, Tensor *y) {
  const int64_t *low = op->attrs[0].ints;
  int64_t xst[IR_MAX_RANK], yst[IR_MAX_RANK];
  strides_of(&x->type, xst);
  strides_of(&y->type, yst);
  for (int64_t k = 0; k < x->n; k++) {
    int64_t yk = 0, rem = k;
    for (int d = 0; d < x->type.rank; d++) {
      int64_t c = rem / xst[d];
      rem -= c * xst[d];
      yk += (c + low[d]) * yst[d];
    }
    if (y->f) y->f[yk] = x->f[k];
    else y->i[yk] = x->i[k];
  }
}

/* layernorm / rmsnorm backward, per row with xhat the normalized input:
     dxhat = dy*w;  layernorm: dx = rstd*(dxhat - mean(dxhat) - xhat*mean(dxhat*xhat))
                    rmsnorm:   dx = rstd*(dxhat - xhat*mean(dxhat*xhat))
     dw += dy*xhat; db += dy */
static void norm_grad(const Op *op, Tensor **in, Tensor **out) {
  const Tensor *dy = in[0], *x = in[1], *w = in[2];
  bool ln = op->kind == OP_LAYERNORM_GRAD;
  float eps = (float)op_float(op, "eps");
  int64_t D = x->type.dims[x->type.rank - 1], rows = D ? x->n / D : 0;
  Tensor *dx = out[0], *dw = out[1], *db = ln ? out[2] : NULL;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x->f + r * D, *dyr = dy->f + r * D;
    float *dxr = dx->f + r * D;
    float mean = 0, var = 0;
    if (ln) {
      for (int64_t i = 0; i < D; i++) mean += xr[i];
      mean /= (float)D;
      for (int64_t i = 0; i < D; i++) var += (xr[i] - mean) * (xr[i] - mean);
    } else {
      for (int64_t i = 0; i < D; i++) var += xr[i] * xr[i];
    }
    var /= (float)D;
    float rstd = 1.0f / sqrtf(var + eps), sum_g = 0, sum_gx = 0;
    for (int64_t i = 0; i < D; i++) {
      float xhat = (xr[i] - mean) * rstd, g = dyr[i] * w->f[i];
      sum_g += g;
      sum_gx += g * xhat;
      dw->f[i] += dyr[i] * xhat;
      if (db) db->f[i] += dyr[i];
    }
    sum_g /= (float)D;
    sum_gx /= (float)D;
    for (int64_t i = 0; i < D; i++) {
      float xhat = (xr[i] - mean) * rstd, g = dyr[i] * w->f[i];
      dxr[i] = rstd * (g - (ln ? sum_g : 0) - xhat * sum_gx);
    }
  }
}

/* attention backward, recomputing the probabilities p of each query row:
     dv_s += p_s dout;  dp_s = dout . v_s;  ds_s = p_s (dp_s - sum_j p_j dp_j)
     dq += scale sum_s ds_s k_s;  dk_s += scale ds_s q
   Key/value gradients of a kv head sum over the query heads that share it. */
static int attention_grad(const Op *op, Tensor **in, Tensor **out, char *err, size_t errlen) {
  const Tensor *dout = in[0], *q = in[1], *k = in[2], *v = in[3];
  Tensor *dq = out[0], *dk = out[1], *dv = out[2];
  int64_t B = q->type.dims[0], T = q->type.dims[1], H = q->type.dims[2], Dh = q->type.dims[3];
  int64_t S = k->type.dims[1], KV = k->type.dims[2], group = H / KV;
  float scale = (float)op_float(op, "scale");
  bool causal = op_bool(op, "causal");
  int64_t window = op_int(op, "window");
  float *p = malloc(sizeof(float) * (size_t)(S ? S : 1)), *dp = malloc(sizeof(float) * (size_t)(S ? S : 1));
  if (!p || !dp) {
    free(p);
    free(dp);
    return fail(err, errlen, "out of memory in attention_grad");
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H; h++) {
        const float *qv = q->f + ((b * T + t) * H + h) * Dh, *dov = dout->f + ((b * T + t) * H + h) * Dh;
        float *dqv = dq->f + ((b * T + t) * H + h) * Dh;
        int64_t kvh = h / group, n = causal ? t + 1 : S, first = win_first(t, window);
        for (int64_t s = first; s < n; s++) {
          const float *kv = k->f + ((b * S + s) * KV + kvh) * Dh;
          float dot = 0;
          for (int64_t d = 0; d < Dh; d++) dot += qv[d] * kv[d];
          p[s] = dot * scale;
        }
        softmax_rows(p + first, p + first, n - first);
        float sum = 0;
        for (int64_t s = first; s < n; s++) {
          const float *vv = v->f + ((b * S + s) * KV + kvh) * Dh;
          float *dvv = dv->f + ((b * S + s) * KV + kvh) * Dh;
          float dot = 0;
          for (int64_t d = 0; d < Dh; d++) {
            dot += dov[d] * vv[d];
            dvv[d] += p[s] * dov[d];
          }
          dp[s] = dot;
          sum += p[s] * dot;
        }
        for (int64_t s = first; s < n; s++) {
          float ds = p[s] * (dp[s] - sum) * scale;
          const float *kv = k->f + ((b * S + s) * KV + kvh) * Dh;
          float *dkv = dk->f + ((b * S + s) * KV + kvh) * Dh;
          for (int64_t d = 0; d < Dh; d++) {
            dqv[d] += ds * kv[d];
            dkv[d] += ds * qv[d];
          }
        }
      }
  free(p);
  free(dp);
  return 0;
}

static int cross_entropy_grad(Tensor **in, Tensor *dlogits, char *err, size_t errlen) {
  const Tensor *dloss = in[0], *logits = in[1], *targets = in[2];
  int64_t V = logits->type.dims[logits->type.rank - 1];
  for (int64_t r = 0; r < dloss->n; r++) {
    const float *l = logits->f + r * V;
    float *g = dlogits->f + r * V;
    int64_t t = targets->i[r];
    if (t < 0 || t >= V) {
      snprintf(err, errlen, "target %lld at position %lld is outside the vocabulary of %lld", (long long)t,
               (long long)r, (long long)V);
      return IR_EINPUT;
    }
    softmax_rows(l, g, V);
    g[t] -= 1.0f;
    for (int64_t i = 0; i < V; i++) g[i] *= dloss->f[r];
  }
  return 0;
}

static void adamw(const Op *op, Tensor **in, Tensor **out) {
  const Tensor *p = in[0], *m = in[1], *v = in[2], *g = in[3];
  Tensor *p2 = out[0], *m2 = out[1], *v2 = out[2];
  float gscale = in[4]->f[0], lr = in[5]->f[0];
  double t = in[6]->f[0];
  float b1 = (float)op_float(op, "beta1"), b2 = (float)op_float(op, "beta2"), eps = (float)op_float(op, "eps");
  float wd = (float)op_float(op, "weight_decay");
  float bc1 = (float)(1.0 - pow(op_float(op, "beta1"), t)), bc2_sqrt = (float)sqrt(1.0 - pow(op_float(op, "beta2"), t));
  float step_size = lr / bc1;
  for (int64_t k = 0; k < p->n; k++) {
    float gk = g->f[k] * gscale;
    float pk = p->f[k] * (1.0f - lr * wd);
    m2->f[k] = b1 * m->f[k] + (1.0f - b1) * gk;
    v2->f[k] = b2 * v->f[k] + (1.0f - b2) * gk * gk;
    float denom = sqrtf(v2->f[k]) / bc2_sqrt + eps;
    p2->f[k] = pk - step_size * m2->f[k] / denom;
  }
}

/* The first row this rank holds of a vocabulary split over op's vocab_axis (0 if none). */
static int64_t vocab_offset(const Op *op, int64_t rows, const int *coord) {
  const Attr *a = op_attr(op, "vocab_axis");
  int axis = a && a->s && a->s[0] ? mesh_axis_parse(a->s) : -1;
  return axis >= 0 && coord ? coord[axis] * rows : 0;
}

int interp_op_rank(const Op *op, Tensor **in, Tensor **out, const int *coord, char *err, size_t errlen) {
  const OpInfo *info = op_info(op->kind);
  Tensor *y = out[0];
  if (op->kind == OP_EQ || op->kind == OP_GE) {
    for (int64_t k = 0; k < y->n; k++) {
      double a = get_f(in[0], k), b = get_f(in[1], k);
      y->i[k] = op->kind == OP_EQ ? a == b : a >= b;
    }
    return 0;
  }
  if (op->kind == OP_WHERE) {
    for (int64_t k = 0; k < y->n; k++) {
      const Tensor *src = in[0]->i[k] ? in[1] : in[2];
      if (y->f) y->f[k] = src->f[k];
      else y->i[k] = src->i[k];
    }
    return 0;
  }
  if (info->cls == CLASS_ELEMENTWISE) {
    bool fl = y->f != NULL;
    for (int64_t k = 0; k < y->n; k++) {
      if (info->n_operands == 1) {
        if (fl) y->f[k] = unary(op->kind, op, in[0]->f[k]);
        else y->i[k] = unary_i(op->kind, in[0]->i[k]);
      } else {
        if (fl) y->f[k] = binary(op->kind, in[0]->f[k], in[1]->f[k]);
        else y->i[k] = binary_i(op->kind, in[0]->i[k], in[1]->i[k]);
      }
    }
    return 0;
  }
  if (info->cls == CLASS_REDUCTION) {
    reduce(op, in[0], y);
    return 0;
  }
  if (op->kind >= OP_TOPK && op->kind <= OP_GROUPED_MATMUL_WGRAD) return interp_moe_op(op, in, out, err, errlen);
  switch (op->kind) {
  case OP_MATMUL: return matmul(op, in[0], in[1], y, err, errlen);
  case OP_EMBEDDING: {
    const Tensor *table = in[0], *ids = in[1];
    int64_t V = table->type.dims[0], D = table->type.dims[1], off = vocab_offset(op, V, coord);
    bool split = op_attr(op, "vocab_axis")->s[0] != 0;
    for (int64_t r = 0; r < ids->n; r++) {
      int64_t id = ids->i[r] - off;
      if (split && (id < 0 || id >= V)) continue;   /* another rank's row: zeros */
      if (id < 0 || id >= V) {
        snprintf(err, errlen, "token id %lld at position %lld is outside the vocabulary of %lld", (long long)id,
                 (long long)r, (long long)V);
        return IR_EINPUT;
      }
      memcpy(y->f + r * D, table->f + id * D, sizeof(float) * (size_t)D);
    }
    return 0;
  }
  case OP_RESHAPE:
    if (y->f) memcpy(y->f, in[0]->f, sizeof(float) * (size_t)y->n);
    else memcpy(y->i, in[0]->i, sizeof(int64_t) * (size_t)y->n);
    return 0;
  case OP_BROADCAST: broadcast(in[0], y); return 0;
  case OP_CAST:
    for (int64_t k = 0; k < y->n; k++) {
      if (y->f) y->f[k] = (float)get_f(in[0], k);
      else if (y->type.dtype == DT_BOOL) y->i[k] = get_f(in[0], k) != 0;
      else y->i[k] = get_i(in[0], k);
    }
    return 0;
  case OP_TRANSPOSE: transpose(op, in[0], y); return 0;
  case OP_SLICE: slice(op, in[0], y); return 0;
  case OP_CONCAT: concat(op, in, y); return 0;
  case OP_CONSTANT: {
    double v = op_float(op, "value");
    for (int64_t k = 0; k < y->n; k++) {
      if (y->f) y->f[k] = (float)v;
      else y->i[k] = (int64_t)v;
    }
    return 0;
  }
  case OP_IOTA: {
    int64_t st[IR_MAX_RANK];
    strides_of(&y->type, st);
    int d = (int)op_int(op, "dim");
    for (int64_t k = 0; k < y->n; k++) {
      int64_t c = (k / st[d]) % y->type.dims[d];
      if (y->f) y->f[k] = (float)c;
      else y->i[k] = c;
    }
    return 0;
  }
  case OP_LAYERNORM:
  case OP_RMSNORM: layernorm(op, in, y); return 0;
  case OP_SOFTMAX: {
    int64_t D = y->type.dims[y->type.rank - 1];
    for (int64_t r = 0; D && r < y->n / D; r++) softmax_rows(in[0]->f + r * D, y->f + r * D, D);
    return 0;
  }
  case OP_ATTENTION: return attention(op, in, y, err, errlen);
  case OP_ROPE: rope(op, in[0], y, coord); return 0;
  case OP_ATTENTION_BLOCK:
  case OP_ATTENTION_BLOCK_GRAD: return attention_block(op, in, out, coord, err, errlen);
  case OP_ROPE_AT: return rope_at(op, in, y, err, errlen);
  case OP_ATTENTION_CACHED: return attention_cached(op, in, y, err, errlen);
  case OP_KV_WRITE: return kv_write(in, err, errlen);
  case OP_CROSS_ENTROPY: return cross_entropy(in[0], in[1], y, err, errlen);
  case OP_PAD: pad(op, in[0], y); return 0;
  case OP_LAYERNORM_GRAD:
  case OP_RMSNORM_GRAD: norm_grad(op, in, out); return 0;
  case OP_SOFTMAX_GRAD: {
    int64_t D = y->type.dims[y->type.rank - 1];
    for (int64_t r = 0; D && r < y->n / D; r++) {
      const float *dy = in[0]->f + r * D, *yy = in[1]->f + r * D;
      float dot = 0;
      for (int64_t i = 0; i < D; i++) dot += dy[i] * yy[i];
      for (int64_t i = 0; i < D; i++) y->f[r * D + i] = yy[i] * (dy[i] - dot);
    }
    return 0;
  }
  case OP_ATTENTION_GRAD: return attention_grad(op, in, out, err, errlen);
  case OP_CROSS_ENTROPY_GRAD: return cross_entropy_grad(in, y, err, errlen);
  case OP_EMBEDDING_GRAD: {
    const Tensor *dy = in[0], *ids = in[1];
    int64_t V = y->type.dims[0], D = y->type.dims[1], off = vocab_offset(op, V, coord);
    bool split = op_attr(op, "vocab_axis")->s[0] != 0;
    for (int64_t r = 0; r < ids->n; r++) {
      int64_t id = ids->i[r] - off;
      if (split && (id < 0 || id >= V)) continue;
      if (id < 0 || id >= V) {
        snprintf(err, errlen, "token id %lld at position %lld is outside the vocabulary of %lld", (long long)id,
                 (long long)r, (long long)V);
        return IR_EINPUT;
      }
      for (int64_t d = 0; d < D; d++) y->f[id * D + d] += dy->f[r * D + d];
    }
    return 0;
  }
  case OP_TARGET_PICK: {
    const Tensor *x = in[0], *t = in[1];
    int64_t V = x->type.dims[x->type.rank - 1], off = vocab_offset(op, V, coord);
    for (int64_t r = 0; r < y->n; r++) {
      int64_t id = t->i[r] - off;
      y->f[r] = id >= 0 && id < V ? x->f[r * V + id] : 0.0f;
    }
    return 0;
  }
  case OP_ONEHOT: {
    const Tensor *t = in[0];
    int64_t V = y->type.dims[y->type.rank - 1], off = vocab_offset(op, V, coord);
    for (int64_t r = 0; r < t->n; r++) {
      int64_t id = t->i[r] - off;
      if (id >= 0 && id < V) y->f[r * V + id] = 1.0f;
    }
    return 0;
  }
  case OP_ACCUMULATE:
  case OP_ASSIGN: {
    Tensor *dst = in[0];
    const Tensor *x = in[1];
    bool acc = op->kind == OP_ACCUMULATE;
    for (int64_t k = 0; k < dst->n; k++) {
      if (dst->f) dst->f[k] = dtype_round(dst->type.dtype, (acc ? dst->f[k] : 0) + x->f[k]);
      else dst->i[k] = (acc ? dst->i[k] : 0) + x->i[k];
    }
    return 0;
  }
  case OP_FILL: {
    Tensor *dst = in[0];
    double v = op_float(op, "value");
    for (int64_t k = 0; k < dst->n; k++) {
      if (dst->f) dst->f[k] = dtype_round(dst->type.dtype, (float)v);
      else dst->i[k] = (int64_t)v;
    }
    return 0;
  }
  case OP_ADAMW: adamw(op, in, out); return 0;
  default: break;
  }
  snprintf(err, errlen, "the reference executor has no kernel for op '%s'", info->name);
  return IR_ERUN;
}
