/* tests/cuda_emu/decode.cc — the kernels of generation with a KV cache (loom_rope_at,
 * loom_kv_write, loom_attn_cached of codegen/cuda/kernels/decode.cuh) on the emulated device,
 * against references written here from ops.def's definitions of rope_at, kv_write and
 * attention_cached (ir/interp_ops.c): attention in double precision, grouped KV heads (H 4 on
 * KV 2) and H = KV, head sizes 16 and 64, one and three new tokens per batch row, positions 0,
 * Tmax-1 and both sides of the 128-key tiles, f32, bf16 and f32 queries on bf16 caches.  Each
 * launch runs twice, the second time with every block's threads in reverse order and a grid of
 * 3 blocks (the grid-stride loops): the results must be the same bits.  A position outside the
 * cache must make the launch fail (a trap on a GPU).
 * Built by run.sh like attn_block.cc: `g++ -include emu.h decode.cc` with TU naming the
 * translation unit of decode.ir (the templates come from its prelude).
 * Exit 0 when kv_write leaves exactly the reference's caches, rope_at is within 1e-6 (f32) or
 * 2^-8 (bf16: its rounding) of the largest element of a double reference, attention_cached's
 * results in f32 are within 2e-5 of the largest element of the double reference (bf16 outputs:
 * 2^-8 more), every second run gives the same bits, and the bad positions fail. */
#include TU
#include "emu_tail.h"

#ifndef DEC_TOL
/* The attention's arithmetic is f32 on inputs that f32 holds exactly (bf16 included), as in
   loom_attn_fwd, which attention.cc holds to 2e-5 of its largest element: dots of <= 64
   products, an online softmax over <= 300 keys and a weighted sum of as many rows. */
#define DEC_TOL 2e-5
#endif

#include <random>
#include <string>
#include <vector>

/* A tensor as the kernels read it (storage S) and its exact values for the reference. */
template <class S>
struct Buf {
  std::vector<typename S::T> raw;
  std::vector<double> val;
  Buf(size_t n, std::mt19937 &rng, float sd) : raw(n), val(n) {
    std::normal_distribution<float> nd(0.0f, sd);
    for (size_t i = 0; i < n; i++) {
      S::st(raw.data(), (long long)i, nd(rng));
      val[i] = S::ld(raw.data(), (long long)i);
    }
  }
};

template <class SX, class SY>
static void rope_at(LoomArgs a) { loom_rope_at<SX, SY>(a); }
template <class SC, class SX>
static void kv_write(LoomArgs a) { loom_kv_write<SC, SX>(a); }
template <class SQ, class SK, class SV, class SO>
static void attn_cached(LoomArgs a) { loom_attn_cached<SQ, SK, SV, SO>(a); }

static std::string last_err;
static int launch(void (*fn)(LoomArgs), LoomArgs *a, unsigned grid, unsigned block, unsigned smem, const char *what,
                  bool quiet = false) {
  unsigned g[3] = {grid, 1, 1}, b[3] = {block, 1, 1};
  char err[600];
  if (!loom_emu_launch((void *)fn, a, g, b, smem, err, sizeof err)) return 0;
  last_err = err;
  if (!quiet) printf("FAIL launch of %s: %s\n", what, err);
  return 1;
}

/* The launch shapes of codegen/cuda/lower.c (grid pass 0), or a grid of 3 in reverse order
   (pass 1). */
static unsigned ew_grid(long long n, int pass) { return pass ? 3 : (unsigned)((n + 255) / 256); }
static void set_pass(int pass) { loom_emu::reverse_order = pass; }

/* max |got - want| / max |want| (infinite when got holds a NaN: an unwritten element) */
template <class S>
static double rel(const std::vector<typename S::T> &got, const std::vector<double> &want) {
  double err = 0, big = 0;
  for (size_t i = 0; i < want.size(); i++) {
    const double g = S::ld(got.data(), (long long)i);
    err = g != g ? INFINITY : fmax(err, fabs(g - want[i]));
    big = fmax(big, fabs(want[i]));
  }
  return big > 0 ? err / big : err;
}

struct Case {
  int B, C, H, KV, D, Tmax;
  std::vector<std::vector<int>> pos;   /* sets of B*C positions */
};

struct Result {
  double rope = 0, att = 0, att_out = 0;
  int sets = 0, bad_cache = 0, order = 0;
};

/* One case, one storage combination: SQ queries (and rope's x and y), SC the caches and the
   new rows, SO attention_cached's output (SQ in a program: ops.def gives it q's dtype; f32
   here measures the f32 arithmetic alone). */
template <class SQ, class SC, class SO>
static int run_case(const Case &cs, Result &res) {
  const int B = cs.B, C = cs.C, H = cs.H, KV = cs.KV, D = cs.D, S = cs.Tmax, half = D / 2;
  const size_t nq = (size_t)B * C * H * D, nx = (size_t)B * C * KV * D, nc = (size_t)B * S * KV * D;
  const double theta = 10000.0, scale = 1.0 / sqrt((double)D);
  for (const std::vector<int> &pos : cs.pos) {
    std::mt19937 rng(1000u * (unsigned)res.sets + (unsigned)D + (unsigned)C);
    Buf<SQ> q(nq, rng, 1.0f);
    Buf<SC> kc(nc, rng, 2.0f), vc(nc, rng, 1.0f), kx(nx, rng, 2.0f), vx(nx, rng, 1.0f);

    /* rope_at on the queries */
    std::vector<typename SQ::T> qr[2];
    std::vector<double> QR(nq);
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++)
        for (int i = 0; i < half; i++) {
          const double ang = (double)pos[b * C + c] * pow(theta, -2.0 * i / D), cs_ = cos(ang), sn = sin(ang);
          for (int h = 0; h < H; h++) {
            const size_t at = (((size_t)b * C + c) * H + h) * D;
            QR[at + i] = q.val[at + i] * cs_ - q.val[at + i + half] * sn;
            QR[at + i + half] = q.val[at + i + half] * cs_ + q.val[at + i] * sn;
          }
        }
    LoomArgs ra;
    memset(&ra, 0, sizeof ra);
    const long long ri[4] = {B, C, H, D};
    for (int i = 0; i < 4; i++) ra.i[i] = ri[i];
    ra.f[0] = theta;
    for (int pass = 0; pass < 2; pass++) {
      set_pass(pass);
      qr[pass].assign(nq, 0);
      SQ::st(qr[pass].data(), 0, NAN);
      for (size_t i = 1; i < nq; i++) qr[pass][i] = qr[pass][0];
      ra.buf[0] = q.raw.data(), ra.buf[1] = (void *)pos.data(), ra.buf[2] = qr[pass].data();
      if (launch(rope_at<SQ, SQ>, &ra, ew_grid((long long)nq / 2, pass), 256, 0, "rope_at")) return 1;
    }
    res.order += memcmp(qr[0].data(), qr[1].data(), sizeof(typename SQ::T) * nq) != 0;
    res.rope = fmax(res.rope, rel<SQ>(qr[0], QR));

    /* kv_write of the new keys and values: the reference writes the rows in order */
    std::vector<typename SC::T> kref = kc.raw, vref = vc.raw;
    const size_t row = (size_t)KV * D;
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++) {
        const size_t to = ((size_t)b * S + pos[b * C + c]) * row, from = ((size_t)b * C + c) * row;
        memcpy(&kref[to], &kx.raw[from], sizeof(typename SC::T) * row);
        memcpy(&vref[to], &vx.raw[from], sizeof(typename SC::T) * row);
      }
    LoomArgs wa;
    memset(&wa, 0, sizeof wa);
    const long long wi[4] = {B, C, S, (long long)row};
    for (int i = 0; i < 4; i++) wa.i[i] = wi[i];
    std::vector<typename SC::T> kdev[2], vdev[2];
    for (int pass = 0; pass < 2; pass++) {
      set_pass(pass);
      kdev[pass] = kc.raw, vdev[pass] = vc.raw;
      wa.buf[1] = kx.raw.data(), wa.buf[2] = (void *)pos.data(), wa.buf[0] = kdev[pass].data();
      if (launch(kv_write<SC, SC>, &wa, ew_grid((long long)nx, pass), 256, 0, "kv_write")) return 1;
      wa.buf[1] = vx.raw.data(), wa.buf[0] = vdev[pass].data();
      if (launch(kv_write<SC, SC>, &wa, ew_grid((long long)nx, pass), 256, 0, "kv_write")) return 1;
    }
    const size_t cb = sizeof(typename SC::T) * nc;
    res.bad_cache += memcmp(kdev[0].data(), kref.data(), cb) || memcmp(vdev[0].data(), vref.data(), cb) ||
                     memcmp(kdev[1].data(), kref.data(), cb) || memcmp(vdev[1].data(), vref.data(), cb);

    /* attention_cached of the roped queries (as the device rounded them) on the written caches */
    std::vector<double> qv(nq), kv_(nc), vv(nc), O(nq, 0), sc(S);
    for (size_t i = 0; i < nq; i++) qv[i] = SQ::ld(qr[0].data(), (long long)i);
    for (size_t i = 0; i < nc; i++) kv_[i] = SC::ld(kref.data(), (long long)i), vv[i] = SC::ld(vref.data(), (long long)i);
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++)
        for (int h = 0; h < H; h++) {
          const int kh = h / (H / KV), n = pos[b * C + c] + 1;
          const size_t at = (((size_t)b * C + c) * H + h) * D;
          double m = -INFINITY, l = 0;
          for (int s = 0; s < n; s++) {
            double d = 0;
            for (int x = 0; x < D; x++) d += qv[at + x] * kv_[(((size_t)b * S + s) * KV + kh) * D + x];
            sc[s] = d * scale;
            m = fmax(m, sc[s]);
          }
          for (int s = 0; s < n; s++) l += exp(sc[s] - m);
          for (int s = 0; s < n; s++)
            for (int x = 0; x < D; x++) O[at + x] += exp(sc[s] - m) / l * vv[(((size_t)b * S + s) * KV + kh) * D + x];
        }
    LoomArgs aa;
    memset(&aa, 0, sizeof aa);
    const long long ai[6] = {B, C, H, D, S, KV};
    for (int i = 0; i < 6; i++) aa.i[i] = ai[i];
    aa.f[0] = scale;
    std::vector<float> o32[2];
    std::vector<typename SO::T> o[2];
    const unsigned rows = (unsigned)(B * C * H), smem = 4 * (2 * D + 128);
    for (int pass = 0; pass < 2; pass++) {
      set_pass(pass);
      o[pass].assign(nq, 0);
      SO::st(o[pass].data(), 0, NAN);
      for (size_t i = 1; i < nq; i++) o[pass][i] = o[pass][0];
      void *bufs[5] = {qr[0].data(), kdev[0].data(), vdev[0].data(), (void *)pos.data(), o[pass].data()};
      memcpy(aa.buf, bufs, sizeof bufs);
      if (launch(attn_cached<SQ, SC, SC, SO>, &aa, pass ? 3 : rows, 128, smem, "attention_cached")) return 1;
      /* and with the f32 output alone (the arithmetic) */
      o32[pass].assign(nq, NAN);
      aa.buf[4] = o32[pass].data();
      if (launch(attn_cached<SQ, SC, SC, loom_sf32>, &aa, pass ? 3 : rows, 128, smem, "attention_cached (f32 out)")) return 1;
    }
    set_pass(0);
    res.order += memcmp(o[0].data(), o[1].data(), sizeof(typename SO::T) * nq) != 0 ||
                 memcmp(o32[0].data(), o32[1].data(), 4 * nq) != 0;
    res.att = fmax(res.att, rel<loom_sf32>(o32[0], O));
    res.att_out = fmax(res.att_out, rel<SO>(o[0], O));
    res.sets++;
  }
  return 0;
}

static const char *name_of(int prec) { return prec == 0 ? "f32" : prec == 1 ? "bf16" : "mixed"; }

/* prec 0: f32; 1: bf16 (queries, caches, outputs); 2: f32 queries and outputs on bf16 caches */
static int run(const Case &cs, int prec) {
  Result r;
  int rc = prec == 0   ? run_case<loom_sf32, loom_sf32, loom_sf32>(cs, r)
           : prec == 1 ? run_case<loom_sbf16, loom_sbf16, loom_sbf16>(cs, r)
                       : run_case<loom_sf32, loom_sbf16, loom_sf32>(cs, r);
  if (rc) return 1;
  /* rope_at's f32 rotation with cos and sin rounded to float stays within 1e-6 of the largest
     element; a bf16 output adds its rounding, half an ulp: 2^-8 of the element at most */
  const double rope_tol = prec == 1 ? 1.0 / 256 + 1e-6 : 1e-6, out_tol = DEC_TOL + (prec == 1 ? 1.0 / 256 : 0);
  const bool ok = !r.bad_cache && !r.order && r.rope <= rope_tol && r.att <= DEC_TOL && r.att_out <= out_tol;
  char out16[64] = "";
  if (prec == 1) snprintf(out16, sizeof out16, " (its bf16 output: %.1e)", r.att_out);
  printf("%s %-5s D %d, B %d C %d, H %d KV %d, Tmax %d: %d position sets, caches %s%s; relative errors "
         "rope_at %.1e, attention_cached %.1e%s\n",
         ok ? "ok  " : "FAIL", name_of(prec), cs.D, cs.B, cs.C, cs.H, cs.KV, cs.Tmax, r.sets,
         r.bad_cache ? "NOT THE REFERENCE'S" : "exact",
         r.order ? ", OTHER BITS IN REVERSE THREAD ORDER OR ANOTHER GRID" : "", r.rope, r.att, out16);
  return ok ? 0 : 1;
}

/* A position outside the cache: the launches of attention_cached and kv_write fail (a trap on
   a GPU), rope_at's for a negative one. */
static int run_bad() {
  const int B = 1, C = 2, H = 2, KV = 1, D = 16, S = 8;
  std::vector<float> x((size_t)B * C * H * D, 1.0f), y(x.size(), 0.0f), cache((size_t)B * S * KV * D, 0.0f);
  int failed = 0;
  const int sets[3][2] = {{3, -1}, {S, 0}, {-5, 2}};
  for (const auto &set : sets) {
    const int pos[2] = {set[0], set[1]};
    LoomArgs a;
    memset(&a, 0, sizeof a);
    /* attention_cached */
    const long long ai[6] = {B, C, H, D, S, KV};
    for (int i = 0; i < 6; i++) a.i[i] = ai[i];
    a.f[0] = 0.25;
    void *ab[5] = {x.data(), cache.data(), cache.data(), (void *)pos, y.data()};
    memcpy(a.buf, ab, sizeof ab);
    bool att = launch(attn_cached<loom_sf32, loom_sf32, loom_sf32, loom_sf32>, &a, 4, 128, 4 * (2 * D + 128), "", true) &&
               last_err.find("outside the KV cache") != std::string::npos;
    /* kv_write */
    memset(&a, 0, sizeof a);
    const long long wi[4] = {B, C, S, (long long)KV * D};
    for (int i = 0; i < 4; i++) a.i[i] = wi[i];
    void *wb[3] = {cache.data(), x.data(), (void *)pos};
    memcpy(a.buf, wb, sizeof wb);
    bool kw = launch(kv_write<loom_sf32, loom_sf32>, &a, 1, 256, 0, "", true) &&
              last_err.find("outside the KV cache") != std::string::npos;
    /* rope_at: only a negative position is outside (it has no cache) */
    memset(&a, 0, sizeof a);
    const long long ri[4] = {B, C, H, D};
    for (int i = 0; i < 4; i++) a.i[i] = ri[i];
    a.f[0] = 10000.0;
    void *rb[3] = {x.data(), (void *)pos, y.data()};
    memcpy(a.buf, rb, sizeof rb);
    const bool neg = pos[0] < 0 || pos[1] < 0, rope_failed = launch(rope_at<loom_sf32, loom_sf32>, &a, 1, 256, 0, "", true);
    bool rp = neg ? rope_failed && last_err.find("outside the KV cache") != std::string::npos : !rope_failed;
    failed += !att || !kw || !rp;
    if (!att || !kw || !rp)
      printf("FAIL positions {%d, %d}: attention_cached %s, kv_write %s, rope_at %s\n", pos[0], pos[1],
             att ? "failed" : "DID NOT FAIL", kw ? "failed" : "DID NOT FAIL", rp ? "as expected" : "NOT AS EXPECTED");
  }
  if (!failed)
    printf("ok   positions outside the cache ({3, -1}, {Tmax, 0}, {-5, 2}): attention_cached and kv_write launches fail "
           "(\"%s\"), rope_at's only for negative ones\n", last_err.c_str());
  return failed ? 1 : 0;
}

int main() {
  const std::vector<std::vector<int>> one = {{0, 299}, {127, 128}, {5, 256}}, three = {
      {0, 1, 2, 297, 298, 299},      /* a prompt's first tokens; the cache's last rows */
      {126, 127, 128, 7, 7, 9},      /* across a tile edge; two new tokens at one position */
      {40, 0, 41, 255, 256, 254},    /* out of order */
  };
  const Case cases[] = {
      {2, 1, 4, 2, 16, 300, one},   /* GQA */
      {2, 1, 4, 2, 64, 300, one},
      {2, 3, 4, 2, 16, 300, three},
      {2, 3, 2, 2, 64, 300, three}, /* H = KV */
      {2, 1, 2, 2, 16, 300, one},
  };
  int failed = 0;
  for (const Case &c : cases)
    for (int prec = 0; prec < 3; prec++) failed += run(c, prec);
  failed += run_bad();
  return failed ? 1 : 0;
}
