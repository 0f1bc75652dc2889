/* runtime/cpu/cpu_kernels.c — rounding, normalization, softmax, losses and elementwise
   builtins of the CPU runtime (see cpu_kernels.h; attention in cpu_attention.c, data
   movement in cpu_data.c, the dispatcher in cpu_builtin.c). */
#include "runtime/cpu/cpu_kernels.h"

#include <stdio.h>

#include "runtime/cpu/cpu_vec.h"

/* Work below this many elements runs on the calling thread: waking the pool costs more. */
#define ELEM_BLOCK 16384

/* Rows per parallel item so that an item holds at least ~ELEM_BLOCK/2 elements. */
static int64_t row_block(int64_t D) { return D >= ELEM_BLOCK / 2 ? 1 : (ELEM_BLOCK / 2) / (D ? D : 1); }
static int64_t n_blocks(int64_t n, int64_t blk) { return (n + blk - 1) / blk; }

/* ---------------------------------------------------------------- rounding */

/* Copy of ir/types.c round_to_format (runtime/ may not include ir/): round to a format with
   `mbits` mantissa bits and exponent bias `bias`, RNE, with subnormals. */
static float round_to_format(float x, int mbits, int bias, float maxval, bool has_inf) {
  if (isnan(x) || isinf(x)) return has_inf || isnan(x) ? x : copysignf(maxval, x);
  if (x == 0) return x;
  int e;
  frexpf(fabsf(x), &e);
  int exp = e - 1;
  int min_exp = 1 - bias;
  if (exp < min_exp) exp = min_exp;
  float quantum = ldexpf(1.0f, exp - mbits);
  float r = nearbyintf(x / quantum) * quantum;
  if (fabsf(r) > maxval) return has_inf ? copysignf(INFINITY, x) : copysignf(maxval, x);
  return r;
}

static inline float round_bf16(float x) {
  if (isnan(x)) return x;
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  u &= 0xFFFF0000u;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

float rt_round(RtRound r, float x) {
  switch (r) {
  case RT_ROUND_BF16: return round_bf16(x);
  case RT_ROUND_F16: return round_to_format(x, 10, 15, 65504.0f, true);
  case RT_ROUND_F8E4M3: return round_to_format(x, 3, 7, 448.0f, false);
  case RT_ROUND_F8E5M2: return round_to_format(x, 2, 15, 57344.0f, true);
  default: return x;
  }
}

typedef struct {
  float *x;
  RtRound r;
} RoundCtx;

static void round_chunk(void *c, int64_t b, int64_t e) {
  RoundCtx *rc = c;
  float *x = rc->x;
  if (rc->r == RT_ROUND_BF16) {
    for (int64_t k = b; k < e; k++) x[k] = round_bf16(x[k]);
  } else {
    for (int64_t k = b; k < e; k++) x[k] = rt_round(rc->r, x[k]);
  }
}

void rt_round_buf(ThreadPool *tp, float *x, int64_t n, RtRound r) {
  if (r == RT_ROUND_NONE || n <= 0) return;
  RoundCtx c = {x, r};
  /* Items are blocks of elements: a float is rounded on its own, so blocks change nothing. */
  if (n < ELEM_BLOCK) round_chunk(&c, 0, n);
  else tp_run(tp, n, round_chunk, &c);
}

/* ---------------------------------------------------------------- layernorm / rmsnorm */

typedef struct {
  const float *x, *w, *b, *dy;
  float *y, *dx, *dw, *db, *stats;
  int64_t rows, D, blk;
  float eps;
} NormCtx;

static void norm_rows(void *c, int64_t ib, int64_t ie) {
  const NormCtx *n = c;
  int64_t D = n->D, r1 = ie * n->blk < n->rows ? ie * n->blk : n->rows;
  for (int64_t r = ib * n->blk; r < r1; r++) {
    const float *x = n->x + r * D, *w = n->w;
    float *y = n->y + r * D;
    if (n->b) {
      const float *b = n->b;
      float mean = cv_sum(x, D) / (float)D;
      float var = cv_sumsq_centered(x, mean, D) / (float)D;
      float rstd = 1.0f / sqrtf(var + n->eps);
      int64_t i = 0;
      for (; i + CV_W <= D; i += CV_W) {
        float t[CV_W];
        for (int j = 0; j < CV_W; j++) t[j] = (x[i + j] - mean) * rstd * w[i + j] + b[i + j];
        for (int j = 0; j < CV_W; j++) y[i + j] = t[j];
      }
      for (; i < D; i++) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
    } else {
      float ms = cv_dot(x, x, D) / (float)D;
      float rstd = 1.0f / sqrtf(ms + n->eps);
      int64_t i = 0;
      for (; i + CV_W <= D; i += CV_W) {
        float t[CV_W];
        for (int j = 0; j < CV_W; j++) t[j] = x[i + j] * rstd * w[i + j];
        for (int j = 0; j < CV_W; j++) y[i + j] = t[j];
      }
      for (; i < D; i++) y[i] = x[i] * rstd * w[i];
    }
  }
}

void cpu_layernorm(ThreadPool *tp, const float *x, const float *w, const float *b, float *y, int64_t rows,
                   int64_t D, float eps) {
  NormCtx c = {.x = x, .w = w, .b = b, .y = y, .rows = rows, .D = D, .blk = row_block(D), .eps = eps};
  tp_run(tp, n_blocks(rows, c.blk), norm_rows, &c);
}

void cpu_rmsnorm(ThreadPool *tp, const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps) {
  cpu_layernorm(tp, x, w, NULL, y, rows, D, eps);
}

/* Pass 1 of the gradient, per row: the row's statistics (kept for pass 2) and dx. */
static void norm_grad_rows(void *c, int64_t ib, int64_t ie) {
  const NormCtx *n = c;
  int64_t D = n->D, r1 = ie * n->blk < n->rows ? ie * n->blk : n->rows;
  bool ln = n->db != NULL;
  const float *w = n->w;
  for (int64_t r = ib * n->blk; r < r1; r++) {
    const float *x = n->x + r * D, *dy = n->dy + r * D;
    float *dx = n->dx + r * D;
    float mean = 0, var;
    if (ln) {
      mean = cv_sum(x, D) / (float)D;
      var = cv_sumsq_centered(x, mean, D) / (float)D;
    } else {
      var = cv_dot(x, x, D) / (float)D;
    }
    float rstd = 1.0f / sqrtf(var + n->eps);
    n->stats[2 * r] = mean;
    n->stats[2 * r + 1] = rstd;
    float ag[CV_W] = {0}, agx[CV_W] = {0};
    int64_t i = 0;
    for (; i + CV_W <= D; i += CV_W)
      for (int j = 0; j < CV_W; j++) {
        float xhat = (x[i + j] - mean) * rstd, g = dy[i + j] * w[i + j];
        ag[j] += g;
        agx[j] += g * xhat;
      }
    float sum_g = cv_hsum8(ag), sum_gx = cv_hsum8(agx);
    for (int64_t k = i; k < D; k++) {
      float xhat = (x[k] - mean) * rstd, g = dy[k] * w[k];
      sum_g += g;
      sum_gx += g * xhat;
    }
    sum_g = ln ? sum_g / (float)D : 0;
    sum_gx /= (float)D;
    for (i = 0; i + CV_W <= D; i += CV_W) {
      float t[CV_W];
      for (int j = 0; j < CV_W; j++) {
        float xhat = (x[i + j] - mean) * rstd, g = dy[i + j] * w[i + j];
        t[j] = rstd * (g - sum_g - xhat * sum_gx);
      }
      for (int j = 0; j < CV_W; j++) dx[i + j] = t[j];
    }
    for (; i < D; i++) {
      float xhat = (x[i] - mean) * rstd, g = dy[i] * w[i];
      dx[i] = rstd * (g - sum_g - xhat * sum_gx);
    }
  }
}

/* Pass 2: dw, db over rows in row order, split along D in blocks of NORM_COLS columns, so
   each column's sum is formed by one thread in the reference's order.  64 columns (4 cache
   lines of each row) let the hardware prefetcher follow the rows; 16 ran ~2x slower. */
#define NORM_COLS 64
static void norm_grad_cols(void *c, int64_t ib, int64_t ie) {
  const NormCtx *n = c;
  int64_t c0 = ib * NORM_COLS, c1 = ie * NORM_COLS < n->D ? ie * NORM_COLS : n->D, D = n->D, w = c1 - c0;
  float *restrict dw = n->dw + c0, *restrict db = n->db ? n->db + c0 : NULL;
  memset(dw, 0, sizeof(float) * (size_t)w);
  if (db) memset(db, 0, sizeof(float) * (size_t)w);
  for (int64_t r = 0; r < n->rows; r++) {
    const float *restrict x = n->x + r * D + c0, *restrict dy = n->dy + r * D + c0;
    float mean = n->stats[2 * r], rstd = n->stats[2 * r + 1];
    int64_t i = 0;
    for (; i + CV_W <= w; i += CV_W)
      for (int j = 0; j < CV_W; j++) dw[i + j] += dy[i + j] * ((x[i + j] - mean) * rstd);
    for (; i < w; i++) dw[i] += dy[i] * ((x[i] - mean) * rstd);
    if (db) cv_axpy(db, 1.0f, dy, w);
  }
}

int cpu_layernorm_grad(ThreadPool *tp, const float *dy, const float *x, const float *w, float *dx, float *dw,
                       float *db, int64_t rows, int64_t D, float eps, char *err, size_t errlen) {
  NormCtx c = {.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .db = db, .rows = rows, .D = D,
               .blk = row_block(D), .eps = eps};
  c.stats = cv_alloc((size_t)(2 * rows));
  if (!c.stats) {
    snprintf(err, errlen, "out of memory in %s", db ? "layernorm_grad" : "rmsnorm_grad");
    return 1;
  }
  tp_run(tp, n_blocks(rows, c.blk), norm_grad_rows, &c);
  int64_t ncol = n_blocks(D, NORM_COLS);
  /* Small problems on one thread; the split along D never changes a sum's order. */
  if (rows * D < ELEM_BLOCK) norm_grad_cols(&c, 0, ncol);
  else tp_run(tp, ncol, norm_grad_cols, &c);
  free(c.stats);
  return 0;
}

int cpu_rmsnorm_grad(ThreadPool *tp, const float *dy, const float *x, const float *w, float *dx, float *dw,
                     int64_t rows, int64_t D, float eps, char *err, size_t errlen) {
  return cpu_layernorm_grad(tp, dy, x, w, dx, dw, NULL, rows, D, eps, err, errlen);
}

/* ---------------------------------------------------------------- softmax */

typedef struct {
  const float *x, *dy, *dloss;
  const int32_t *targets;
  float *y;
  int64_t rows, D, blk;
} RowCtx;

/* y = softmax(x) over n, as the reference: exp(x - max), divided by the sum. */
static void softmax_row(const float *x, float *y, int64_t n) {
  float mx = cv_max(x, n);
  cv_div(y, y, cv_exp_sub_sum(y, x, mx, n), n);
}

static void softmax_rows(void *c, int64_t ib, int64_t ie) {
  const RowCtx *s = c;
  int64_t r1 = ie * s->blk < s->rows ? ie * s->blk : s->rows;
  for (int64_t r = ib * s->blk; r < r1; r++) softmax_row(s->x + r * s->D, s->y + r * s->D, s->D);
}

void cpu_softmax(ThreadPool *tp, const float *x, float *y, int64_t rows, int64_t D) {
  RowCtx c = {.x = x, .y = y, .rows = rows, .D = D, .blk = row_block(D)};
  tp_run(tp, n_blocks(rows, c.blk), softmax_rows, &c);
}

/* dx = y * (dy - dot(dy, y)); c.x holds y */
static void softmax_grad_rows(void *c, int64_t ib, int64_t ie) {
  const RowCtx *s = c;
  int64_t D = s->D, r1 = ie * s->blk < s->rows ? ie * s->blk : s->rows;
  for (int64_t r = ib * s->blk; r < r1; r++) {
    const float *dy = s->dy + r * D, *y = s->x + r * D;
    float *dx = s->y + r * D;
    float dot = cv_dot(dy, y, D);
    int64_t i = 0;
    for (; i + CV_W <= D; i += CV_W) {
      float t[CV_W];
      for (int j = 0; j < CV_W; j++) t[j] = y[i + j] * (dy[i + j] - dot);
      for (int j = 0; j < CV_W; j++) dx[i + j] = t[j];
    }
    for (; i < D; i++) dx[i] = y[i] * (dy[i] - dot);
  }
}

void cpu_softmax_grad(ThreadPool *tp, const float *dy, const float *y, float *dx, int64_t rows, int64_t D) {
  RowCtx c = {.x = y, .dy = dy, .y = dx, .rows = rows, .D = D, .blk = row_block(D)};
  tp_run(tp, n_blocks(rows, c.blk), softmax_grad_rows, &c);
}

/* ---------------------------------------------------------------- cross-entropy */

static int check_targets(const int32_t *t, int64_t rows, int64_t V, char *err, size_t errlen) {
  for (int64_t r = 0; r < rows; r++)
    if (t[r] < 0 || t[r] >= V) {
      snprintf(err, errlen, "target %lld at position %lld is outside the vocabulary of %lld", (long long)t[r],
               (long long)r, (long long)V);
      return 2;
    }
  return 0;
}

static void ce_rows(void *c, int64_t ib, int64_t ie) {
  const RowCtx *s = c;
  int64_t V = s->D, r1 = ie * s->blk < s->rows ? ie * s->blk : s->rows;
  for (int64_t r = ib * s->blk; r < r1; r++) {
    const float *l = s->x + r * V;
    float mx = cv_max(l, V), sum = cv_exp_sub_sum(NULL, l, mx, V);
    s->y[r] = logf(sum) + mx - l[s->targets[r]];
  }
}

int cpu_cross_entropy(ThreadPool *tp, const float *logits, const int32_t *targets, float *loss, int64_t rows,
                      int64_t V, char *err, size_t errlen) {
  int rc = check_targets(targets, rows, V, err, errlen);
  if (rc) return rc;
  RowCtx c = {.x = logits, .targets = targets, .y = loss, .rows = rows, .D = V, .blk = row_block(V)};
  tp_run(tp, n_blocks(rows, c.blk), ce_rows, &c);
  return 0;
}

static void ce_grad_rows(void *c, int64_t ib, int64_t ie) {
  const RowCtx *s = c;
  int64_t V = s->D, r1 = ie * s->blk < s->rows ? ie * s->blk : s->rows;
  for (int64_t r = ib * s->blk; r < r1; r++) {
    const float *l = s->x + r * V;
    float *g = s->y + r * V, d = s->dloss[r];
    int32_t t = s->targets[r];
    float sum = cv_exp_sub_sum(g, l, cv_max(l, V), V), et = g[t];
    /* the reference's softmax, minus the one-hot, times dloss, in one pass: the same
       operations per element ((e / sum) * d; at the target (e / sum - 1) * d) */
    int64_t i = 0;
    for (; i + CV_W <= V; i += CV_W)
      for (int j = 0; j < CV_W; j++) g[i + j] = g[i + j] / sum * d;
    for (; i < V; i++) g[i] = g[i] / sum * d;
    g[t] = (et / sum - 1.0f) * d;
  }
}

int cpu_cross_entropy_grad(ThreadPool *tp, const float *dloss, const float *logits, const int32_t *targets,
                           float *dlogits, int64_t rows, int64_t V, char *err, size_t errlen) {
  int rc = check_targets(targets, rows, V, err, errlen);
  if (rc) return rc;
  RowCtx c = {.x = logits, .dloss = dloss, .targets = targets, .y = dlogits, .rows = rows, .D = V,
              .blk = row_block(V)};
  tp_run(tp, n_blocks(rows, c.blk), ce_grad_rows, &c);
  return 0;
}

/* ---------------------------------------------------------------- elementwise */

typedef struct {
  const void *x;
  void *y;
  bool x_int, y_int, y_bool;
  double value;
  /* adamw */
  const float *p, *m, *v, *g;
  float *p2, *m2, *v2;
  float gscale, lr, b1, b2, eps, wd, bc2_sqrt, step_size;
} EwCtx;

/* Runs fn over [0,n) in blocks of ELEM_BLOCK elements (inline when there is one). */
static void ew_run(ThreadPool *tp, int64_t n, void (*fn)(void *, int64_t, int64_t), EwCtx *c) {
  if (n <= ELEM_BLOCK) fn(c, 0, n);
  else tp_run(tp, n, fn, c);
}

static void copy_chunk(void *c, int64_t b, int64_t e) {
  const EwCtx *k = c;
  memmove((uint32_t *)k->y + b, (const uint32_t *)k->x + b, sizeof(uint32_t) * (size_t)(e - b));
}

void cpu_copy(ThreadPool *tp, const void *x, void *y, int64_t n) {
  if (x == y || n <= 0) return;
  EwCtx c = {.x = x, .y = y};
  ew_run(tp, n, copy_chunk, &c);
}

static void cast_chunk(void *c, int64_t b, int64_t e) {
  const EwCtx *k = c;
  const float *xf = k->x;
  const int32_t *xi = k->x;
  float *yf = k->y;
  int32_t *yi = k->y;
  for (int64_t i = b; i < e; i++) {
    double v = k->x_int ? (double)xi[i] : (double)xf[i];
    if (!k->y_int) yf[i] = (float)v;
    else if (k->y_bool) yi[i] = v != 0;
    else yi[i] = (int32_t)(int64_t)v;   /* truncation toward zero, as the reference */
  }
}

void cpu_cast(ThreadPool *tp, const void *x, bool x_int, void *y, bool y_int, bool y_bool, int64_t n) {
  EwCtx c = {.x = x, .y = y, .x_int = x_int, .y_int = y_int, .y_bool = y_bool};
  ew_run(tp, n, cast_chunk, &c);
}

static void fill_chunk(void *c, int64_t b, int64_t e) {
  const EwCtx *k = c;
  if (k->y_int) {
    int32_t v = (int32_t)(int64_t)k->value;
    for (int64_t i = b; i < e; i++) ((int32_t *)k->y)[i] = v;
  } else {
    float v = (float)k->value;
    for (int64_t i = b; i < e; i++) ((float *)k->y)[i] = v;
  }
}

void cpu_fill(ThreadPool *tp, void *y, bool is_int, double value, int64_t n) {
  EwCtx c = {.y = y, .y_int = is_int, .value = value};
  ew_run(tp, n, fill_chunk, &c);
}

static void acc_chunk(void *c, int64_t b, int64_t e) {
  const EwCtx *k = c;
  if (k->y_int) {
    int32_t *y = k->y;
    const int32_t *x = k->x;
    for (int64_t i = b; i < e; i++) y[i] = (int32_t)((uint32_t)y[i] + (uint32_t)x[i]);
    return;
  }
  float *y = k->y;
  const float *x = k->x;
  int64_t i = b;
  for (; i + CV_W <= e; i += CV_W) {
    float t[CV_W];
    for (int j = 0; j < CV_W; j++) t[j] = y[i + j] + x[i + j];
    for (int j = 0; j < CV_W; j++) y[i + j] = t[j];
  }
  for (; i < e; i++) y[i] += x[i];
}

void cpu_accumulate(ThreadPool *tp, void *dst, const void *x, bool is_int, int64_t n) {
  EwCtx c = {.x = x, .y = dst, .y_int = is_int};
  ew_run(tp, n, acc_chunk, &c);
}

/* One element of the update: the reference's expressions, operation for operation (bitwise
   equal results). */
typedef struct {
  float decay, omb1, omb2, gscale, b1, b2, bc2_sqrt, eps, step_size;
} AdamConst;

static inline void adamw_one(const AdamConst *c, float g, float p, float m, float v, float *p2, float *m2, float *v2) {
  float gk = g * c->gscale;
  float pk = p * c->decay;
  float mk = c->b1 * m + c->omb1 * gk;
  float vk = c->b2 * v + c->omb2 * gk * gk;
  float denom = sqrtf(vk) / c->bc2_sqrt + c->eps;
  *m2 = mk;
  *v2 = vk;
  *p2 = pk - c->step_size * mk / denom;
}

CV_HOT static void adamw_chunk(void *ctx, int64_t b, int64_t e) {
  const EwCtx *k = ctx;
  const float *p = k->p, *m = k->m, *v = k->v, *g = k->g;
  float *p2 = k->p2, *m2 = k->m2, *v2 = k->v2;
  const AdamConst c = {1.0f - k->lr * k->wd, 1.0f - k->b1, 1.0f - k->b2, k->gscale, k->b1, k->b2, k->bc2_sqrt,
                       k->eps, k->step_size};
  /* A block of CV_W elements is read before any of it is written, so the outputs may be the
     inputs (element for element); the fixed-width inner loops are what the vectorizer widens. */
  int64_t i = b;
  for (; i + CV_W <= e; i += CV_W) {
    float tp[CV_W], tm[CV_W], tv[CV_W];
    for (int j = 0; j < CV_W; j++) adamw_one(&c, g[i + j], p[i + j], m[i + j], v[i + j], &tp[j], &tm[j], &tv[j]);
    for (int j = 0; j < CV_W; j++) m2[i + j] = tm[j];
    for (int j = 0; j < CV_W; j++) v2[i + j] = tv[j];
    for (int j = 0; j < CV_W; j++) p2[i + j] = tp[j];
  }
  for (; i < e; i++) adamw_one(&c, g[i], p[i], m[i], v[i], &p2[i], &m2[i], &v2[i]);
}

void cpu_adamw(ThreadPool *tp, const float *p, const float *m, const float *v, const float *g, float gscale,
               float lr, double t, double beta1, double beta2, double eps, double weight_decay, int64_t n,
               float *p_out, float *m_out, float *v_out) {
  float bc1 = (float)(1.0 - pow(beta1, t));
  EwCtx c = {.p = p, .m = m, .v = v, .g = g, .p2 = p_out, .m2 = m_out, .v2 = v_out, .gscale = gscale, .lr = lr,
             .b1 = (float)beta1, .b2 = (float)beta2, .eps = (float)eps, .wd = (float)weight_decay,
             .bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t)), .step_size = lr / bc1};
  ew_run(tp, n, adamw_chunk, &c);
}
