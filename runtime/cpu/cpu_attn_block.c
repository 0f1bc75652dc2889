/* runtime/cpu/cpu_attn_block.c — ring attention's blocks on the CPU: the ops attention_block
 * and attention_block_grad (ir/ops.def; ir/interp_ops.c is the definition).
 *
 * A block is this rank's queries q[B,Tq,H,Dh] against one block of keys k,v[B,Tk,KV,Dh]
 * whose positions come from the rank coordinates (rt_seq_pos).  The work is by GEMMs: per
 * item the scores S = scale Q K^T ([Tq,Tk]) are formed, masked, turned into probabilities,
 * and multiplied back by single-threaded cblas_sgemm calls, items spread over loom's pool.
 * An item is (b, query head) in the forward and (b, kv head) in the backward, whose query
 * heads run in order so that dk and dv are summed in one order: the bits do not depend on
 * the thread count.
 *
 * Positions are piecewise contiguous: one run per rank's chunk, two under zigzag.  Scores
 * are computed by sub-blocks, one (query run, key run) pair at a time, and a pair that the
 * causal mask hides entirely is skipped (not computed; its probabilities are zero): under
 * zigzag half of an off-diagonal block's pairs are skipped, and with a contiguous split a
 * block from a later rank is skipped whole.  Scores are materialized per item ([Tq,Tk]
 * floats, 1 MiB at Tq = Tk = 512): a flash-style tiling would keep them in registers, but
 * a block is already T/cp long, and the GEMMs keep the arithmetic in OpenBLAS's kernels.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

#define LSE_NONE (-1e30f)   /* a row that sees no key of the block (the reference's value) */

typedef struct {
  int64_t idx, len, pos;   /* rows [idx, idx+len) hold positions [pos, pos+len) */
} Run;

/* The runs of rank r's L rows, placed from row `base` on. */
static int runs_of(const CpuAttnBlock *a, int64_t r, int64_t L, int64_t base, Run *out) {
  if (!a->zigzag) {
    out[0] = (Run){base, L, rt_seq_pos(r, 0, L, a->n, false)};
    return 1;
  }
  int64_t h = L / 2;
  out[0] = (Run){base, h, rt_seq_pos(r, 0, L, a->n, true)};
  out[1] = (Run){base + h, h, rt_seq_pos(r, h, L, a->n, true)};
  return 2;
}

typedef struct {
  const CpuAttnBlock *a;
  const float *q, *k, *v, *dout, *lse_in, *delta;
  float *o, *lse, *dq, *dk, *dv;
  Run qr[2], kr[512];
  int nq, nk;
  int failed;
} Ctx;

static void runs(Ctx *x) {
  const CpuAttnBlock *a = x->a;
  int64_t n = a->n > 0 ? a->n : 1, c = a->c;
  x->nq = runs_of(a, c, a->Tq, 0, x->qr);
  x->nk = 0;
  if (a->kv_shift < 0) {
    for (int64_t r = 0; r < n && x->nk + 2 <= 512; r++) x->nk += runs_of(a, r, a->Tq, r * a->Tq, x->kr + x->nk);
  } else {
    int64_t r = ((c - a->kv_shift) % n + n) % n;
    x->nk = runs_of(a, r, a->Tk, 0, x->kr);
  }
}

/* 0: the pair is hidden (past the causal diagonal, or with a sliding window every key
   window or more before every query), 1: partly seen (mask per element), 2: wholly seen. */
static int seen(const CpuAttnBlock *a, const Run *qr, const Run *kr) {
  int64_t W = a->window, qlo = qr->pos, qhi = qr->pos + qr->len - 1, klo = kr->pos, khi = kr->pos + kr->len - 1;
  if (a->causal && klo > qhi) return 0;
  if (W > 0 && qlo - khi >= W) return 0;
  return (!a->causal || khi <= qlo) && (W <= 0 || qhi - klo < W) ? 2 : 1;
}

/* Key u of run kr is hidden from query t of run qr (s == 1 of seen). */
static bool hidden(const CpuAttnBlock *a, const Run *qr, int64_t t, const Run *kr, int64_t u) {
  int64_t qp = qr->pos + t, kp = kr->pos + u;
  return (a->causal && kp > qp) || (a->window > 0 && qp - kp >= a->window);
}

/* S[Tq,Tk] = scale A B^T over the seen pairs (A rows of stride lda, B rows of stride ldb),
   masked entries -inf (mask) or 0; returns whether any pair was seen. */
static bool pair_gemms(const Ctx *x, const float *A, int64_t lda, const float *B, int64_t ldb, float alpha, float *S,
                       bool mask) {
  const CpuAttnBlock *a = x->a;
  int64_t Tk = a->Tk;
  bool any = false;
  for (int i = 0; i < x->nq; i++)
    for (int j = 0; j < x->nk; j++) {
      const Run *qr = &x->qr[i], *kr = &x->kr[j];
      int s = seen(a, qr, kr);
      float *blk = S + qr->idx * Tk + kr->idx;
      if (!s) {
        for (int64_t t = 0; t < qr->len; t++)
          for (int64_t u = 0; u < kr->len; u++) blk[t * Tk + u] = mask ? -INFINITY : 0.0f;
        continue;
      }
      any = true;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qr->len, (int)kr->len, (int)a->Dh, alpha,
                  A + qr->idx * lda, (int)lda, B + kr->idx * ldb, (int)ldb, 0.0f, blk, (int)Tk);
      if (s == 1 && mask)
        for (int64_t t = 0; t < qr->len; t++)
          for (int64_t u = 0; u < kr->len; u++)
            if (hidden(a, qr, t, kr, u)) blk[t * Tk + u] = -INFINITY;
    }
  return any;
}

static void fwd_items(void *ctx, int64_t i0, int64_t i1) {
  Ctx *x = ctx;
  const CpuAttnBlock *a = x->a;
  int64_t Tq = a->Tq, Tk = a->Tk, H = a->H, Dh = a->Dh, KV = a->KV, G = H / KV;
  float *S = malloc(sizeof(float) * (size_t)(Tq * Tk > 0 ? Tq * Tk : 1));
  if (!S) {
    x->failed = 1;
    return;
  }
  for (int64_t it = i0; it < i1; it++) {
    int64_t b = it / H, h = it % H, kvh = h / G;
    const float *Q = x->q + (b * Tq * H + h) * Dh, *K = x->k + (b * Tk * KV + kvh) * Dh, *V = x->v + (b * Tk * KV + kvh) * Dh;
    float *O = x->o + (b * Tq * H + h) * Dh, *lse = x->lse + b * Tq * H + h;
    bool any = pair_gemms(x, Q, H * Dh, K, KV * Dh, a->scale, S, true);
    for (int64_t t = 0; t < Tq; t++) {
      float *row = S + t * Tk, mx = -INFINITY, sum = 0;
      for (int64_t u = 0; u < Tk; u++) mx = row[u] > mx ? row[u] : mx;
      if (mx == -INFINITY) {   /* nothing seen: o = 0, lse = LSE_NONE */
        for (int64_t u = 0; u < Tk; u++) row[u] = 0;
        lse[t * H] = LSE_NONE;
        continue;
      }
      for (int64_t u = 0; u < Tk; u++) {
        row[u] = row[u] == -INFINITY ? 0.0f : expf(row[u] - mx);
        sum += row[u];
      }
      float inv = 1.0f / sum;
      for (int64_t u = 0; u < Tk; u++) row[u] *= inv;
      lse[t * H] = mx + logf(sum);
    }
    if (any)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Tq, (int)Dh, (int)Tk, 1.0f, S, (int)Tk, V,
                  (int)(KV * Dh), 0.0f, O, (int)(H * Dh));
    else
      for (int64_t t = 0; t < Tq; t++) memset(O + t * H * Dh, 0, sizeof(float) * (size_t)Dh);
  }
  free(S);
}

static void bwd_items(void *ctx, int64_t i0, int64_t i1) {
  Ctx *x = ctx;
  const CpuAttnBlock *a = x->a;
  int64_t Tq = a->Tq, Tk = a->Tk, H = a->H, Dh = a->Dh, KV = a->KV, G = H / KV;
  float *P = malloc(sizeof(float) * 2 * (size_t)(Tq * Tk > 0 ? Tq * Tk : 1)), *dS = P + Tq * Tk;
  if (!P) {
    x->failed = 1;
    return;
  }
  for (int64_t it = i0; it < i1; it++) {
    int64_t b = it / KV, kvh = it % KV;
    const float *K = x->k + (b * Tk * KV + kvh) * Dh, *V = x->v + (b * Tk * KV + kvh) * Dh;
    float *dK = x->dk + (b * Tk * KV + kvh) * Dh, *dV = x->dv + (b * Tk * KV + kvh) * Dh;
    for (int64_t g = 0; g < G; g++) {   /* the group's query heads in order: one summation order for dk, dv */
      int64_t h = kvh * G + g;
      const float *Q = x->q + (b * Tq * H + h) * Dh, *dO = x->dout + (b * Tq * H + h) * Dh;
      const float *lse = x->lse_in + b * Tq * H + h, *delta = x->delta + b * Tq * H + h;
      float *dQ = x->dq + (b * Tq * H + h) * Dh;
      pair_gemms(x, Q, H * Dh, K, KV * Dh, a->scale, P, true);   /* scores */
      pair_gemms(x, dO, H * Dh, V, KV * Dh, 1.0f, dS, false);    /* dp = dout . v */
      for (int64_t t = 0; t < Tq; t++) {
        float l = lse[t * H], d = delta[t * H], *p = P + t * Tk, *ds = dS + t * Tk;
        for (int64_t u = 0; u < Tk; u++) {
          p[u] = p[u] == -INFINITY ? 0.0f : expf(p[u] - l);
          ds[u] = p[u] * (ds[u] - d) * a->scale;
        }
      }
      float beta = g ? 1.0f : 0.0f;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Tq, (int)Dh, (int)Tk, 1.0f, dS, (int)Tk, K,
                  (int)(KV * Dh), 0.0f, dQ, (int)(H * Dh));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Tk, (int)Dh, (int)Tq, 1.0f, dS, (int)Tk, Q, (int)(H * Dh),
                  beta, dK, (int)(KV * Dh));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Tk, (int)Dh, (int)Tq, 1.0f, P, (int)Tk, dO, (int)(H * Dh),
                  beta, dV, (int)(KV * Dh));
    }
  }
  free(P);
}

static int check(const CpuAttnBlock *a, char *err, size_t errlen) {
  if (a->KV <= 0 || a->H % a->KV || a->n < 1 || (a->zigzag && a->Tq % 2) || a->kv_shift < -1 || a->kv_shift >= a->n ||
      a->Tk != (a->kv_shift < 0 ? a->n * a->Tq : a->Tq) || a->n > 256 || a->Tq > INT32_MAX / 2 || a->Tk > INT32_MAX / 2) {
    snprintf(err, errlen, "attention block: shapes or sequence split not valid (Tq %lld, Tk %lld, H %lld, KV %lld, n %lld, "
             "kv_shift %lld)", (long long)a->Tq, (long long)a->Tk, (long long)a->H, (long long)a->KV, (long long)a->n,
             (long long)a->kv_shift);
    return 1;
  }
  return 0;
}

int cpu_attn_block(ThreadPool *tp, const CpuAttnBlock *a, const float *q, const float *k, const float *v, float *o,
                   float *lse, char *err, size_t errlen) {
  if (check(a, err, errlen)) return 1;
  Ctx x = {.a = a, .q = q, .k = k, .v = v, .o = o, .lse = lse};
  runs(&x);
  tp_run(tp, a->B * a->H, fwd_items, &x);
  if (x.failed) snprintf(err, errlen, "out of memory in attention_block");
  return x.failed;
}

int cpu_attn_block_grad(ThreadPool *tp, const CpuAttnBlock *a, const float *dout, const float *q, const float *k,
                        const float *v, const float *lse, const float *delta, float *dq, float *dk, float *dv, char *err,
                        size_t errlen) {
  if (check(a, err, errlen)) return 1;
  Ctx x = {.a = a, .q = q, .k = k, .v = v, .dout = dout, .lse_in = lse, .delta = delta, .dq = dq, .dk = dk, .dv = dv};
  runs(&x);
  tp_run(tp, a->B * a->KV, bwd_items, &x);
  if (x.failed) snprintf(err, errlen, "out of memory in attention_block_grad");
  return x.failed;
}
