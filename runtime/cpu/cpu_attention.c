/* runtime/cpu/cpu_attention.c — attention forward and backward, and RoPE, for the CPU runtime.
 *
 * Layout: q[B,T,H,Dh], k,v[B,S,KV,Dh]; query head h reads kv head h/G, G = H/KV.
 * A "row" is one (position t, query head h): a softmax over the keys it sees (0..t when
 * causal).  No [T,S] score matrix is formed: at most RB = 4 rows of scores at a time.
 *
 * Each call first copies the keys (and for the backward the values) transposed, as
 * [B,KV][Dh][ld] with the columns past S zeroed, so that the scores of a row against 8
 * consecutive keys are 8 contiguous floats per d.
 *
 * Forward.  A work item is (b, kv head, block of QB positions).  It takes its rows ((t, h)
 * for the G heads sharing the kv head) four at a time: scores of 4 rows x 8 keys in
 * registers (each 8-key slice loaded once for the 4 rows), the softmax of each row, and
 * the weighted sum of value rows (each value row loaded once for the 4 rows).
 *
 * Backward, in two passes so that no output element is summed by two threads:
 *   1. per item as the forward: recompute the probabilities p, dp = dout.v,
 *      delta = sum p dp, ds = p (dp - delta) scale, dq = sum_s ds k_s; keep each row's
 *      softmax max, sum and delta;
 *   2. per block of KB keys: for every row that sees them, recompute p and ds from the kept
 *      statistics and accumulate dv_s += p dout, dk_s += ds q in row order.
 * Scores are recomputed twice: 7 dot-product passes where a backward given the forward's
 * output (or its row statistics) would need 5; the builtin's inputs are dout q k v only.
 *
 * Order of operations: every score is a sum over d in order, every output a sum over keys
 * in order, dk/dv sums over rows in the reference's (t, h) order; the softmax uses a
 * vectorized exp (cv_exp8) and 8-lane sums, so results are within ~1e-7 relative of the
 * reference and bitwise independent of the thread count.  Work items are taken
 * dynamically (causal rows are uneven), heaviest first.
 */
#include <stdio.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/cpu_vec.h"

#define QB 32   /* positions per work item of the forward and pass 1 */
#define KB 32   /* keys per work item of pass 2 (a multiple of 8) */
#define RB 4    /* rows computed together */

typedef struct {
  const float *q, *k, *v, *dout;
  float *out, *dq, *dk, *dv, *stats;
  /* keys and values of every (b, kv head) transposed: kT + (b*KV + kvh)*Dh*ld is [Dh][ld] */
  float *kT, *vT;
  int64_t ld;
  int64_t B, T, H, Dh, S, KV, G, nqb, nkb;
  bool causal;
  int64_t window;   /* sliding window (ops.def attention); 0: none */
  float scale;
  float *scratch;
  size_t stride;
  const struct Tiles_ *tiles;
} AttnCtx;

/* Up to RB rows of one item; padded rows (r >= nr) repeat row 0 and are never stored. */
typedef struct {
  int nr;
  int64_t row[RB];   /* (b*T + t)*H + h: index of the row's stats; times Dh: its offset */
  int64_t n[RB];     /* keys the row sees in the current key range */
  int64_t t[RB];     /* the row's position */
  int64_t nmin, nmax;
} Rows;

static int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

/* Sliding-window attention: the scores sc[r][0..] of keys s0.. that lie window or more
   before row r's position become -inf (probability 0: cv_exp8 flushes them to 0), so the
   rows keep their prefix shape (n[r] keys from s0) and the tiles stay as they are; the
   keys before the window are still multiplied, not skipped. */
static void mask_window(const AttnCtx *a, const Rows *g, float *const *sc, int64_t s0) {
  if (a->window <= 0) return;
  for (int r = 0; r < g->nr; r++) {
    int64_t lo = g->t[r] - a->window + 1 - s0, n = lo < g->n[r] ? lo : g->n[r];
    for (int64_t s = 0; s < n; s++) sc[r][s] = -INFINITY;
  }
}

/* Rows r0.. of the rows (t, j), t >= t_first, j < G, of batch b and kv head kvh, seeing keys
   from s0 on, at most m of them. */
static void rows_at(const AttnCtx *a, int64_t b, int64_t kvh, int64_t t_first, int64_t r0, int64_t R, int64_t s0,
                    int64_t m, Rows *g) {
  g->nr = R - r0 < RB ? (int)(R - r0) : RB;
  g->nmin = INT64_MAX;
  g->nmax = 0;
  for (int r = 0; r < RB; r++) {
    int64_t rr = r0 + (r < g->nr ? r : 0), t = t_first + rr / a->G, h = kvh * a->G + rr % a->G;
    int64_t n = a->causal ? t + 1 - s0 : m;
    g->row[r] = (b * a->T + t) * a->H + h;
    g->t[r] = t;
    g->n[r] = n < m ? n : m;
    if (r < g->nr) {
      g->nmin = g->n[r] < g->nmin ? g->n[r] : g->nmin;
      g->nmax = g->n[r] > g->nmax ? g->n[r] : g->nmax;
    }
  }
}

/* The register-blocked tiles (scores, probabilities times values, row accumulation) come
   in three instances of runtime/cpu/cpu_attention_tiles.h: 4-float vectors for the baseline,
   8-float vectors compiled for AVX2 with FMA (a*b+c contracted: this file is built with
   -ffp-contract=fast, which only matters where the target has FMA) and 16-float vectors for
   AVX-512F, picked at run time.  The FMA instances are ~1.6x faster than the baseline;
   their results differ from the baseline's in the last bits (as OpenBLAS's GEMMs differ
   between CPUs), never with the thread count, and the two FMA instances agree bit for bit
   (each output gets the same FMAs in the same order; a unit test checks it). */
typedef struct Tiles_ {
  void (*scores4)(float *const *sc, const float *const *q, const float *restrict kt, int64_t ld, int64_t Dh,
                  int64_t npad);
  void (*pv4)(float *const *o, const float *const *p, const Rows *g, const float *restrict rows, int64_t rs,
              int64_t Dh);
  void (*accumulate_rows)(float *acc, const float *const *w, const float *const *x, const Rows *g, int64_t Dh);
} Tiles;

#define TILE_V cv_f4
#define TILE_W 4
#define TILE(name) name##_base
#define TILE_ATTR CV_HOT   /* its AVX2 clone has no FMA: the same bits, faster broadcasts */
#include "runtime/cpu/cpu_attention_tiles.h"
#undef TILE_V
#undef TILE_W
#undef TILE
#undef TILE_ATTR

#if defined(__GNUC__) && defined(__x86_64__)
#define HAVE_FMA_TILES 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#define TILE_V cv_f8
#define TILE_W 8
#define TILE(name) name##_fma
#define TILE_ATTR __attribute__((target("avx2,fma")))
#include "runtime/cpu/cpu_attention_tiles.h"
#undef TILE_V
#undef TILE_W
#undef TILE
#undef TILE_ATTR
#define HAVE_AVX512_TILES 1
typedef float cv_f16 __attribute__((vector_size(64)));
#define TILE_V cv_f16
#define TILE_VH cv_f8
#define TILE_W 16
#define TILE(name) name##_avx512
#define TILE_ATTR __attribute__((target("avx512f,avx2,fma")))
#include "runtime/cpu/cpu_attention_tiles.h"
#undef TILE_V
#undef TILE_VH
#undef TILE_W
#undef TILE
#undef TILE_ATTR
#pragma GCC diagnostic pop
#endif

/* LOOM_CPU_NOFMA=1 keeps the baseline tiles (to compare, or to match a machine without FMA);
   LOOM_CPU_AVX512=0 the AVX2 ones. */
static const Tiles *pick_tiles(void) {
#ifdef HAVE_FMA_TILES
  const char *no = getenv("LOOM_CPU_NOFMA");
  __builtin_cpu_init();
  if (no && *no && *no != '0') return &tiles_base;
  const char *w = getenv("LOOM_CPU_AVX512");
  if (!(w && *w == '0') && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return &tiles_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &tiles_fma;
#endif
  return &tiles_base;
}

/* The softmax of p[0..n) * scale, in place; returns its max and sum. */
CV_HOT static void softmax_scaled(float *p, int64_t n, float scale, float *mx_out, float *sum_out) {
  for (int64_t s = 0; s < n; s++) p[s] *= scale;
  float mx = cv_max(p, n), sum = cv_exp_sub_sum(p, p, mx, n);
  cv_div(p, p, sum, n);
  *mx_out = mx;
  *sum_out = sum;
}

/* The transposed copies kT/vT: item i is (b, kv head, block of 64 keys); the columns past S
   (up to ld) are zeroed, so 8-key slices never read past the keys or read garbage. */
typedef struct {
  const AttnCtx *a;
  const float *src;
  float *dst;
} TransCtx;

static void transpose_items(void *ctx, int64_t ib, int64_t ie) {
  const TransCtx *c = ctx;
  const AttnCtx *a = c->a;
  int64_t Dh = a->Dh, ld = a->ld, nsb = (a->S + 63) / 64;
  for (int64_t i = ib; i < ie; i++) {
    int64_t sb = i % nsb, bk = i / nsb, b = bk / a->KV, kvh = bk % a->KV;
    int64_t s0 = sb * 64, s1 = s0 + 64 < a->S ? s0 + 64 : a->S;
    float *dst = c->dst + bk * Dh * ld;
    for (int64_t s = s0; s < s1; s++) {
      const float *r = c->src + ((b * a->S + s) * a->KV + kvh) * Dh;
      for (int64_t d = 0; d < Dh; d++) dst[d * ld + s] = r[d];
    }
    if (s1 == a->S)
      for (int64_t d = 0; d < Dh; d++) memset(dst + d * ld + a->S, 0, sizeof(float) * (size_t)(ld - a->S));
  }
}

static void transpose_kv(ThreadPool *tp, const AttnCtx *a, const float *src, float *dst) {
  TransCtx c = {a, src, dst};
  tp_run(tp, a->B * a->KV * ((a->S + 63) / 64), transpose_items, &c);
}

/* Row stride ld of the transposed copies: a multiple of 16 floats (whole cache lines) that is
   an odd number of 64-byte lines, so the Dh rows of a tile do not all fall into the same
   few cache sets (as a power-of-two stride would). */
static int64_t pick_ld(int64_t S) {
  int64_t ld = (S + 15) / 16 * 16;
  return (ld / 16) % 2 ? ld : ld + 16;
}

/* Item i -> (b, kv head, first position), the last positions (the heaviest when causal) first. */
static void item_q(const AttnCtx *a, int64_t i, int64_t *b, int64_t *kvh, int64_t *t0, int64_t *t1) {
  int64_t qb = a->nqb - 1 - i % a->nqb, rest = i / a->nqb;
  *kvh = rest % a->KV;
  *b = rest / a->KV;
  *t0 = qb * QB;
  *t1 = *t0 + QB < a->T ? *t0 + QB : a->T;
}

static void fwd_items(void *ctx, int thread, int64_t ib, int64_t ie) {
  const AttnCtx *a = ctx;
  int64_t Dh = a->Dh, ld = a->ld, rs = a->KV * Dh;
  float *sc = a->scratch + (size_t)thread * a->stride;
  for (int64_t i = ib; i < ie; i++) {
    int64_t b, kvh, t0, t1;
    item_q(a, i, &b, &kvh, &t0, &t1);
    int64_t R = (t1 - t0) * a->G;
    const float *kt = a->kT + (b * a->KV + kvh) * Dh * ld, *vr = a->v + (b * a->S * a->KV + kvh) * Dh;
    for (int64_t r0 = 0; r0 < R; r0 += RB) {
      Rows g;
      rows_at(a, b, kvh, t0, r0, R, 0, a->S, &g);
      const float *q[RB];
      float *p[RB], *o[RB];
      for (int r = 0; r < RB; r++) {
        q[r] = a->q + g.row[r] * Dh;
        o[r] = a->out + g.row[r] * Dh;
        p[r] = sc + r * ld;
      }
      a->tiles->scores4(p, q, kt, ld, Dh, round8(g.nmax));
      mask_window(a, &g, p, 0);
      for (int r = 0; r < g.nr; r++) {
        float mx, sum;
        softmax_scaled(p[r], g.n[r], a->scale, &mx, &sum);
      }
      for (int r = g.nr; r < RB; r++) p[r] = p[0];
      a->tiles->pv4(o, (const float *const *)p, &g, vr, rs, Dh);
    }
  }
}

static int check_shape(int64_t T, int64_t H, int64_t S, int64_t KV, bool causal, char *err, size_t errlen) {
  if (KV <= 0 || H % KV) {
    snprintf(err, errlen, "attention: %lld query heads are not a multiple of %lld kv heads", (long long)H,
             (long long)KV);
    return 2;
  }
  if (causal && T > S) {
    snprintf(err, errlen, "causal attention: %lld queries but only %lld keys", (long long)T, (long long)S);
    return 2;
  }
  return 0;
}

int cpu_attention(ThreadPool *tp, const float *q, const float *k, const float *v, float *out, int64_t B,
                  int64_t T, int64_t H, int64_t Dh, int64_t S, int64_t KV, bool causal, int64_t window, float scale,
                  char *err, size_t errlen) {
  int rc = check_shape(T, H, S, KV, causal, err, errlen);
  if (rc) return rc;
  if (B * T * H * Dh == 0) return 0;
  if (S == 0) {   /* nothing to attend to: the reference leaves the output zero */
    memset(out, 0, sizeof(float) * (size_t)(B * T * H * Dh));
    return 0;
  }
  AttnCtx a = {.q = q, .k = k, .v = v, .out = out, .B = B, .T = T, .H = H, .Dh = Dh, .S = S, .KV = KV,
               .G = H / KV, .nqb = (T + QB - 1) / QB, .causal = causal, .window = window, .scale = scale, .ld = pick_ld(S),
               .tiles = pick_tiles()};
  a.stride = cv_stride(RB * (size_t)a.ld);
  a.scratch = cv_alloc(a.stride * (size_t)tp_size(tp));
  a.kT = cv_alloc((size_t)(B * KV * Dh * a.ld));
  if (!a.scratch || !a.kT) {
    free(a.scratch);
    free(a.kT);
    snprintf(err, errlen, "out of memory in attention");
    return 1;
  }
  transpose_kv(tp, &a, k, a.kT);
  tp_run_dynamic(tp, B * KV * a.nqb, 1, fwd_items, &a);
  free(a.scratch);
  free(a.kT);
  return 0;
}

/* ---------------------------------------------------------------- backward */

/* One block of rows: P = softmax(scale q·kᵀ) into p and dP = dout·vᵀ into dp, the rows'
   statistics (max, sum, delta = P·dP), dS = scale P (dP - delta) into ds (p or dp: the
   two-pass form overwrites P, the one-pass form keeps it), then dq += dS·k.  Rows past
   g->nr read row 0's dS. */
static void rows_dq(const AttnCtx *a, const Rows *g, const float *const *q, const float *const *dout, const float *kt,
                    const float *vt, const float *kr, float **p, float **dp, float **ds, float *const *dq) {
  int64_t npad = round8(g->nmax);
  a->tiles->scores4(p, q, kt, a->ld, a->Dh, npad);
  a->tiles->scores4(dp, dout, vt, a->ld, a->Dh, npad);
  mask_window(a, g, p, 0);
  for (int r = 0; r < g->nr; r++) {
    float *st = a->stats + 3 * g->row[r], *pr = p[r], *dsr = ds[r];
    const float *dpr = dp[r];
    int64_t n = g->n[r];
    softmax_scaled(pr, n, a->scale, &st[0], &st[1]);
    float delta = cv_dot(pr, dpr, n);
    st[2] = delta;
    for (int64_t s = 0; s < n; s++) dsr[s] = pr[s] * (dpr[s] - delta) * a->scale;
  }
  for (int r = g->nr; r < RB; r++) ds[r] = ds[0];
  a->tiles->pv4(dq, (const float *const *)ds, g, kr, a->KV * a->Dh, a->Dh);
}

static void bwd_q_items(void *ctx, int thread, int64_t ib, int64_t ie) {
  const AttnCtx *a = ctx;
  int64_t Dh = a->Dh, ld = a->ld;
  float *pb = a->scratch + (size_t)thread * a->stride, *dpb = pb + RB * ld;
  for (int64_t i = ib; i < ie; i++) {
    int64_t b, kvh, t0, t1;
    item_q(a, i, &b, &kvh, &t0, &t1);
    int64_t R = (t1 - t0) * a->G, bk = (b * a->KV + kvh) * Dh * ld;
    const float *kt = a->kT + bk, *vt = a->vT + bk, *kr = a->k + (b * a->S * a->KV + kvh) * Dh;
    for (int64_t r0 = 0; r0 < R; r0 += RB) {
      Rows g;
      rows_at(a, b, kvh, t0, r0, R, 0, a->S, &g);
      const float *q[RB], *dout[RB];
      float *p[RB], *dp[RB], *dq[RB];
      for (int r = 0; r < RB; r++) {
        q[r] = a->q + g.row[r] * Dh;
        dout[r] = a->dout + g.row[r] * Dh;
        dq[r] = a->dq + g.row[r] * Dh;
        p[r] = pb + r * ld;
        dp[r] = dpb + r * ld;
      }
      rows_dq(a, &g, q, dout, kt, vt, kr, p, dp, p, dq);
    }
  }
}

static void bwd_kv_items(void *ctx, int thread, int64_t ib, int64_t ie) {
  const AttnCtx *a = ctx;
  int64_t Dh = a->Dh, ld = a->ld;
  float *dK = a->scratch + (size_t)thread * a->stride, *dV = dK + Dh * KB, *pb = dV + Dh * KB, *dpb = pb + RB * KB;
  for (int64_t i = ib; i < ie; i++) {
    /* key blocks in order: the first are the heaviest when causal */
    int64_t kb = i % a->nkb, rest = i / a->nkb, kvh = rest % a->KV, b = rest / a->KV;
    int64_t s0 = kb * KB, m = s0 + KB < a->S ? KB : a->S - s0, bk = (b * a->KV + kvh) * Dh * ld;
    const float *kt = a->kT + bk + s0, *vt = a->vT + bk + s0;
    memset(dK, 0, sizeof(float) * (size_t)(KB * Dh));
    memset(dV, 0, sizeof(float) * (size_t)(KB * Dh));
    int64_t t_first = a->causal ? s0 : 0, R = (a->T - t_first) * a->G;
    for (int64_t r0 = 0; r0 < R; r0 += RB) {
      Rows g;
      rows_at(a, b, kvh, t_first, r0, R, s0, m, &g);
      const float *q[RB], *dout[RB];
      float *p[RB], *dp[RB];
      for (int r = 0; r < RB; r++) {
        q[r] = a->q + g.row[r] * Dh;
        dout[r] = a->dout + g.row[r] * Dh;
        p[r] = pb + r * KB;
        dp[r] = dpb + r * KB;
      }
      int64_t npad = round8(g.nmax);
      a->tiles->scores4(p, q, kt, ld, Dh, npad);
      a->tiles->scores4(dp, dout, vt, ld, Dh, npad);
      mask_window(a, &g, p, s0);
      for (int r = 0; r < g.nr; r++) {
        const float *st = a->stats + 3 * g.row[r];
        float *pr = p[r], *dpr = dp[r], delta = st[2];
        int64_t n = g.n[r];
        /* the probabilities exactly as pass 1 computed them */
        for (int64_t s = 0; s < n; s++) pr[s] *= a->scale;
        cv_exp_sub_sum(pr, pr, st[0], n);
        cv_div(pr, pr, st[1], n);
        for (int64_t s = 0; s < n; s++) dpr[s] = pr[s] * (dpr[s] - delta) * a->scale;   /* ds */
      }
      a->tiles->accumulate_rows(dV, (const float *const *)p, dout, &g, Dh);
      a->tiles->accumulate_rows(dK, (const float *const *)dp, q, &g, Dh);
    }
    for (int64_t s = 0; s < m; s++) {
      int64_t off = ((b * a->S + s0 + s) * a->KV + kvh) * Dh;
      memcpy(a->dk + off, dK + s * Dh, sizeof(float) * (size_t)Dh);
      memcpy(a->dv + off, dV + s * Dh, sizeof(float) * (size_t)Dh);
    }
  }
}

/* The backward in one pass per (b, kv head) when its probabilities and their gradients fit
   in a thread's scratch: the rows' pass (as bwd_q_items) keeps P and dS for every (row, key)
   of the item, and the key blocks' pass (as bwd_kv_items) reads them instead of computing
   q·kᵀ, dout·vᵀ and the exponentials again: 5 matmul-sized products instead of 7.  Every
   value is formed by the same operations in the same order as in the two-pass form, so the
   results are the same bits (a unit test checks it; LOOM_CPU_ATTN_TWO_PASS=1 forces the
   two-pass form). */
static void bwd_item_rows(const AttnCtx *a, int64_t b, int64_t kvh, float *P, float *DS) {
  int64_t Dh = a->Dh, ld = a->ld, R = a->T * a->G, bk = (b * a->KV + kvh) * Dh * ld;
  const float *kt = a->kT + bk, *vt = a->vT + bk, *kr = a->k + (b * a->S * a->KV + kvh) * Dh;
  for (int64_t r0 = 0; r0 < R; r0 += RB) {
    Rows g;
    rows_at(a, b, kvh, 0, r0, R, 0, a->S, &g);
    const float *q[RB], *dout[RB];
    float *p[RB], *dp[RB], *dq[RB];
    for (int r = 0; r < RB; r++) {
      q[r] = a->q + g.row[r] * Dh;
      dout[r] = a->dout + g.row[r] * Dh;
      dq[r] = a->dq + g.row[r] * Dh;
      p[r] = P + (r0 + r) * ld;   /* P and DS have R rounded up to RB rows */
      dp[r] = DS + (r0 + r) * ld;
    }
    rows_dq(a, &g, q, dout, kt, vt, kr, p, dp, dp, dq);   /* keeps P, and dS in DS */
  }
}

static void bwd_item_keys(const AttnCtx *a, int64_t b, int64_t kvh, const float *P, const float *DS, float *dK,
                          float *dV) {
  int64_t Dh = a->Dh, ld = a->ld;
  for (int64_t kb = 0; kb < a->nkb; kb++) {
    int64_t s0 = kb * KB, m = s0 + KB < a->S ? KB : a->S - s0;
    memset(dK, 0, sizeof(float) * (size_t)(KB * Dh));
    memset(dV, 0, sizeof(float) * (size_t)(KB * Dh));
    int64_t t_first = a->causal ? s0 : 0, R = (a->T - t_first) * a->G, base = t_first * a->G;
    for (int64_t r0 = 0; r0 < R; r0 += RB) {
      Rows g;
      rows_at(a, b, kvh, t_first, r0, R, s0, m, &g);
      const float *q[RB], *dout[RB], *p[RB], *dp[RB];
      for (int r = 0; r < RB; r++) {
        int64_t rr = base + r0 + (r < g.nr ? r : 0);
        q[r] = a->q + g.row[r] * Dh;
        dout[r] = a->dout + g.row[r] * Dh;
        p[r] = P + rr * ld + s0;
        dp[r] = DS + rr * ld + s0;
      }
      a->tiles->accumulate_rows(dV, p, dout, &g, Dh);
      a->tiles->accumulate_rows(dK, dp, q, &g, Dh);
    }
    for (int64_t s = 0; s < m; s++) {
      int64_t off = ((b * a->S + s0 + s) * a->KV + kvh) * Dh;
      memcpy(a->dk + off, dK + s * Dh, sizeof(float) * (size_t)Dh);
      memcpy(a->dv + off, dV + s * Dh, sizeof(float) * (size_t)Dh);
    }
  }
}

static void bwd_items(void *ctx, int thread, int64_t ib, int64_t ie) {
  const AttnCtx *a = ctx;
  int64_t rows = (a->T * a->G + RB - 1) / RB * RB;
  float *P = a->scratch + (size_t)thread * a->stride, *DS = P + rows * a->ld, *dK = DS + rows * a->ld,
        *dV = dK + a->Dh * KB;
  for (int64_t i = ib; i < ie; i++) {
    int64_t kvh = i % a->KV, b = i / a->KV;
    bwd_item_rows(a, b, kvh, P, DS);
    bwd_item_keys(a, b, kvh, P, DS, dK, dV);
  }
}

/* Per-thread scratch of the one-pass backward, in floats (0: too big, use two passes). */
static size_t one_pass_scratch(const AttnCtx *a, int threads) {
  const char *two = getenv("LOOM_CPU_ATTN_TWO_PASS");
  if (two && *two && *two != '0') return 0;
  if (a->B * a->KV < 4 * (int64_t)threads) return 0;   /* too few items to keep the threads busy */
  size_t rows = (size_t)((a->T * a->G + RB - 1) / RB * RB);
  size_t n = 2 * rows * (size_t)a->ld + 2 * (size_t)a->Dh * KB;
  return n * sizeof(float) <= ((size_t)16 << 20) ? cv_stride(n) : 0;   /* 16 MiB a thread */
}

int cpu_attention_grad(ThreadPool *tp, const float *dout, const float *q, const float *k, const float *v,
                       float *dq, float *dk, float *dv, int64_t B, int64_t T, int64_t H, int64_t Dh, int64_t S,
                       int64_t KV, bool causal, int64_t window, float scale, char *err, size_t errlen) {
  int rc = check_shape(T, H, S, KV, causal, err, errlen);
  if (rc) return rc;
  memset(dq, 0, sizeof(float) * (size_t)(B * T * H * Dh));
  memset(dk, 0, sizeof(float) * (size_t)(B * S * KV * Dh));
  memset(dv, 0, sizeof(float) * (size_t)(B * S * KV * Dh));
  if (B * T * H * Dh == 0 || S == 0) return 0;
  AttnCtx a = {.q = q, .k = k, .v = v, .dout = dout, .dq = dq, .dk = dk, .dv = dv, .B = B, .T = T, .H = H,
               .Dh = Dh, .S = S, .KV = KV, .G = H / KV, .nqb = (T + QB - 1) / QB, .nkb = (S + KB - 1) / KB,
               .causal = causal, .window = window, .scale = scale, .tiles = pick_tiles()};
  a.ld = pick_ld(S);
  size_t n1 = 2 * RB * (size_t)a.ld, n2 = 2 * (size_t)Dh * KB + 2 * RB * KB, one = one_pass_scratch(&a, tp_size(tp));
  a.stride = one ? one : cv_stride(n1 > n2 ? n1 : n2);
  a.scratch = cv_alloc(a.stride * (size_t)tp_size(tp));
  a.stats = cv_alloc(3 * (size_t)(B * T * H));
  a.kT = cv_alloc((size_t)(B * KV * Dh * a.ld));
  a.vT = cv_alloc((size_t)(B * KV * Dh * a.ld));
  if (!a.scratch || !a.stats || !a.kT || !a.vT) {
    free(a.scratch);
    free(a.stats);
    free(a.kT);
    free(a.vT);
    snprintf(err, errlen, "out of memory in attention_grad");
    return 1;
  }
  transpose_kv(tp, &a, k, a.kT);
  transpose_kv(tp, &a, v, a.vT);
  if (one) {
    tp_run_dynamic(tp, B * KV, 1, bwd_items, &a);
  } else {
    tp_run_dynamic(tp, B * KV * a.nqb, 1, bwd_q_items, &a);
    tp_run_dynamic(tp, B * KV * a.nkb, 1, bwd_kv_items, &a);
  }
  free(a.scratch);
  free(a.stats);
  free(a.kT);
  free(a.vT);
  return 0;
}

/* ---------------------------------------------------------------- rope */

typedef struct {
  const float *x;
  float *y, *cs;
  const double *inv_freq;
  int64_t T, H, Dh, half, offset, rows;
  int64_t seq_c, seq_n;   /* context parallelism: positions of the rank's rows (rt_seq_pos) */
  bool zigzag;
  double sign;
} RopeCtx;

/* cos/sin table [T][2][half], with the reference's angle: (pos(t) + offset) * theta^(-2i/Dh)
   (or its Llama 3.1 scaling: rt_rope_inv_freq) in double, then rounded to float. */
static void rope_table(void *c, int64_t t0, int64_t t1) {
  const RopeCtx *r = c;
  for (int64_t t = t0; t < t1; t++)
    for (int64_t i = 0; i < r->half; i++) {
      double angle = (double)(rt_seq_pos(r->seq_c, t, r->T, r->seq_n, r->zigzag) + r->offset) * r->inv_freq[i];
      r->cs[2 * t * r->half + i] = (float)cos(angle);
      r->cs[(2 * t + 1) * r->half + i] = (float)(r->sign * sin(angle));
    }
}

static void rope_rows(void *c, int64_t r0, int64_t r1) {
  const RopeCtx *r = c;
  int64_t half = r->half, Dh = r->Dh;
  for (int64_t row = r0; row < r1; row++) {
    const float *x = r->x + row * Dh, *cs = r->cs + 2 * (((row / r->H) % r->T) * half), *sn = cs + half;
    float *y = r->y + row * Dh;
    /* both halves are read before either is written: x and y may be the same buffer */
    int64_t i = 0;
    for (; i + CV_W <= half; i += CV_W) {
      float a[CV_W], b[CV_W], c[CV_W], s[CV_W], lo[CV_W], hi[CV_W];
      for (int j = 0; j < CV_W; j++) {
        a[j] = x[i + j];
        b[j] = x[i + half + j];
        c[j] = cs[i + j];
        s[j] = sn[i + j];
      }
      for (int j = 0; j < CV_W; j++) {
        lo[j] = a[j] * c[j] - b[j] * s[j];
        hi[j] = b[j] * c[j] + a[j] * s[j];
      }
      for (int j = 0; j < CV_W; j++) y[i + j] = lo[j];
      for (int j = 0; j < CV_W; j++) y[i + half + j] = hi[j];
    }
    for (; i < half; i++) {
      float a = x[i], b = x[i + half];
      y[i] = a * cs[i] - b * sn[i];
      y[i + half] = b * cs[i] + a * sn[i];
    }
    if (Dh % 2) y[Dh - 1] = 0;   /* the reference leaves an odd last element zero */
  }
}

int cpu_rope(ThreadPool *tp, const float *x, float *y, int64_t B, int64_t T, int64_t H, int64_t Dh,
             int64_t offset, bool inverse, const double *f, int64_t seq_c, int64_t seq_n, bool zigzag, char *err,
             size_t errlen) {
  int64_t half = Dh / 2;
  RopeCtx r = {.x = x, .y = y, .T = T, .H = H, .Dh = Dh, .half = half, .offset = offset, .rows = B * T * H,
               .sign = inverse ? -1.0 : 1.0, .seq_c = seq_c, .seq_n = seq_n ? seq_n : 1, .zigzag = zigzag};
  double *inv = malloc(sizeof(double) * (size_t)(half ? half : 1));
  r.cs = cv_alloc(2 * (size_t)(T * half));
  if (!inv || !r.cs) {
    free(inv);
    free(r.cs);
    snprintf(err, errlen, "out of memory in rope");
    return 1;
  }
  for (int64_t i = 0; i < half; i++) inv[i] = rt_rope_inv_freq(f, i, Dh);
  r.inv_freq = inv;
  if (T * half < 4096) rope_table(&r, 0, T);
  else tp_run(tp, T, rope_table, &r);
  if (r.rows * Dh < 16384) rope_rows(&r, 0, r.rows);
  else tp_run(tp, r.rows, rope_rows, &r);
  free(inv);
  free(r.cs);
  return 0;
}
