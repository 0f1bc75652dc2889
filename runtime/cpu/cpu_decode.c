/* runtime/cpu/cpu_decode.c — generation with a KV cache on the CPU: the ops rope_at,
 * attention_cached and kv_write (ir/ops.def; ir/interp_ops.c is the definition).
 *
 * A decode step has few new tokens (one, when sampling), so the work is per (batch, new
 * token, head): a dot product against each cached key up to the token's position, a
 * softmax and a weighted sum of the cached values, in the reference's order (every output
 * element is computed by one thread: the bits do not depend on the thread count).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/cpu_vec.h"

static int bad_pos(int64_t p, int64_t tmax, char *err, size_t errlen) {
  snprintf(err, errlen, "position %lld is outside the KV cache's %lld rows", (long long)p, (long long)tmax);
  return 2;
}

typedef struct {
  const float *x;
  const int32_t *pos;
  float *y;
  int64_t C, H, Dh;
  const double *f;   /* theta and the scaling: rt_rope_inv_freq */
} RopeAt;

static void rope_at_rows(void *ctx, int64_t r0, int64_t r1) {   /* a row: one new token (b, c) */
  const RopeAt *r = ctx;
  int64_t half = r->Dh / 2;
  for (int64_t row = r0; row < r1; row++) {
    double p = (double)r->pos[row];
    for (int64_t i = 0; i < half; i++) {
      double angle = p * rt_rope_inv_freq(r->f, i, r->Dh);
      float cs = (float)cos(angle), sn = (float)sin(angle);
      for (int64_t h = 0; h < r->H; h++) {
        const float *x = r->x + (row * r->H + h) * r->Dh;
        float *y = r->y + (row * r->H + h) * r->Dh;
        float a = x[i], b = x[i + half];
        y[i] = a * cs - b * sn;
        y[i + half] = b * cs + a * sn;
      }
    }
  }
}

int cpu_rope_at(ThreadPool *tp, const float *x, const int32_t *pos, float *y, int64_t B, int64_t C, int64_t H,
                int64_t Dh, const double *f, char *err, size_t errlen) {
  for (int64_t k = 0; k < B * C; k++)
    if (pos[k] < 0) return bad_pos(pos[k], INT64_MAX, err, errlen);
  RopeAt r = {x, pos, y, C, H, Dh, f};
  tp_run(tp, B * C, rope_at_rows, &r);
  return 0;
}

typedef struct {
  const float *q, *k, *v;
  const int32_t *pos;
  float *out;
  int64_t C, H, Dh, S, KV, window;
  float scale;
  int failed;
} Cached;

static void cached_rows(void *ctx, int64_t r0, int64_t r1) {   /* a row: (b, c, h) */
  Cached *a = ctx;
  int64_t G = a->H / a->KV;
  float *p = malloc(sizeof(float) * (size_t)(a->S > 0 ? a->S : 1));
  if (!p) {
    a->failed = 1;
    return;
  }
  for (int64_t row = r0; row < r1; row++) {
    int64_t h = row % a->H, bc = row / a->H, b = bc / a->C, kvh = h / G, n = (int64_t)a->pos[bc] + 1;
    int64_t first = a->window > 0 && n - a->window > 0 ? n - a->window : 0;   /* the window's first key */
    const float *q = a->q + row * a->Dh;
    float *o = a->out + row * a->Dh, mx = -INFINITY, sum = 0;
    for (int64_t s = first; s < n; s++) {
      const float *k = a->k + ((b * a->S + s) * a->KV + kvh) * a->Dh;
      float dot = 0;
      for (int64_t d = 0; d < a->Dh; d++) dot += q[d] * k[d];
      p[s] = dot * a->scale;
      mx = p[s] > mx ? p[s] : mx;
    }
    for (int64_t s = first; s < n; s++) sum += p[s] = expf(p[s] - mx);
    memset(o, 0, sizeof(float) * (size_t)a->Dh);
    for (int64_t s = first; s < n; s++) {
      const float *v = a->v + ((b * a->S + s) * a->KV + kvh) * a->Dh;
      float w = p[s] / sum;
      for (int64_t d = 0; d < a->Dh; d++) o[d] += w * v[d];
    }
  }
  free(p);
}

int cpu_attention_cached(ThreadPool *tp, const float *q, const float *k, const float *v, const int32_t *pos, float *out,
                         int64_t B, int64_t C, int64_t H, int64_t Dh, int64_t S, int64_t KV, int64_t window,
                         float scale, char *err, size_t errlen) {
  for (int64_t i = 0; i < B * C; i++)
    if (pos[i] < 0 || pos[i] >= S) return bad_pos(pos[i], S, err, errlen);
  Cached a = {q, k, v, pos, out, C, H, Dh, S, KV, window, scale, 0};
  tp_run(tp, B * C * H, cached_rows, &a);
  if (a.failed) snprintf(err, errlen, "out of memory in attention_cached");
  return a.failed;
}

int cpu_kv_write(float *cache, const float *x, const int32_t *pos, int64_t B, int64_t C, int64_t S, int64_t row,
                 char *err, size_t errlen) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < C; c++) {
      int64_t p = pos[b * C + c];
      if (p < 0 || p >= S) return bad_pos(p, S, err, errlen);
      memcpy(cache + (b * S + p) * row, x + (b * C + c) * row, sizeof(float) * (size_t)row);
    }
  return 0;
}
