/* tests/cuda_emu/attn_block.cc — context parallelism's attention-block kernels
 * (loom_attnblk_fwd, loom_attnblk_dq, loom_attnblk_dkdv of codegen/cuda/kernels/attn_block.cuh)
 * on the emulated device against a double-precision reference written here from ops.def's
 * definition of attention_block and attention_block_grad: global positions (contiguous or
 * zigzag, seq_n 2 and 4, every coordinate c and every kv_shift in [-1, n)), causal or not,
 * grouped KV heads and H = KV, head sizes 16 and 64, f32, bf16 and mixed inputs, query
 * lengths that are not multiples of the tiles (and chunks so short that one tile spans many
 * of them); and rope with the sequence split (loom_rope: rank c's rows at global positions).  Every block is run twice, the second time with each thread block's threads in
 * reverse order: the results must be the same bits (no order between threads decides a sum).
 * Built by run.sh like attention.cc: `g++ -include emu.h attn_block.cc` with TU naming a
 * translation unit from `loom ir --emit=cuda` (the templates come from its prelude).
 * Exit 0 when every result of every case is within 2e-5 of its largest element (o, dq, dk,
 * dv; lse: of the largest |lse| of a row that sees a key), and every row that sees no key
 * of its block has lse = -1e30 and o = 0 exactly. */
#include TU
#include "emu_tail.h"

#ifndef AB_TOL
/* The kernels compute in f32 from inputs that f32 holds exactly (bf16 included), in the
   order of loom_attn_*, which attention.cc holds to 2e-5 of a double reference. */
#define AB_TOL 2e-5
#endif

#include <random>
#include <vector>

enum Prec { F32, BF16, MIXED };   /* MIXED: q and dout bf16, k and v f32 (ops.def: k, v alike; dout as q) */

struct Case {
  int B, Tq, H, KV, D, n;
  bool zigzag, causal;
  Prec prec;
};

/* ops.def: row t of the L rows of rank c of n; zigzag: half-chunks c and 2n-1-c */
static long long pos_of(long long c, long long t, long long L, long long n, bool zz) {
  if (!zz) return c * L + t;
  return t < L / 2 ? c * (L / 2) + t : (2 * n - 1 - c) * (L / 2) + t - L / 2;
}

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

template <class SQ, class SK, class SV, int D>
static void fwd(LoomArgs a) { loom_attnblk_fwd<SQ, SK, SV, D>(a); }
template <class SDO, class SQ, class SK, class SV, int D>
static void dq(LoomArgs a) { loom_attnblk_dq<SDO, SQ, SK, SV, D>(a); }
template <class SDO, class SQ, class SK, class SV, int D>
static void dkdv(LoomArgs a) { loom_attnblk_dkdv<SDO, SQ, SK, SV, D>(a); }

static int launch(void (*fn)(LoomArgs), LoomArgs *a, unsigned gx, unsigned gy, unsigned smem, const char *what) {
  unsigned grid[3] = {gx, gy, 1}, block[3] = {128, 1, 1};
  char err[600];
  if (!loom_emu_launch((void *)fn, a, grid, block, smem, err, sizeof err)) return 0;
  printf("FAIL launch of %s: %s\n", what, err);
  return 1;
}

/* max |got - want| / max |want| (infinite when got holds a NaN: an unwritten element) */
static double rel(const std::vector<float> &got, const std::vector<double> &want) {
  double err = 0, big = 0;
  for (size_t i = 0; i < got.size(); i++) {
    err = got[i] != got[i] ? INFINITY : fmax(err, fabs(got[i] - want[i]));
    big = fmax(big, fabs(want[i]));
  }
  return big > 0 ? err / big : err;
}

struct Errors {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  int blocks = 0, masked_blocks = 0, masked_rows = 0, bad_masked = 0, order = 0;
};

/* One block: rank c's queries against the keys kv_shift selects; forward and backward on
   the device (twice: thread order forward and reversed), then the reference. */
template <class SQ, class SK, class SV, class SDO, int D>
static int run_block(const Case &cs, int c, int shift, Errors &e) {
  const int B = cs.B, Tq = cs.Tq, H = cs.H, KV = cs.KV, n = cs.n, Tk = shift < 0 ? n * Tq : Tq;
  std::mt19937 rng(1000 * c + 10 * (shift + 1) + Tq + D);
  const size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * KV * D, rows = (size_t)B * Tq * H;
  Buf<SQ> q(nq, rng, 2.0f);
  Buf<SK> k(nk, rng, 2.0f);
  Buf<SV> v(nk, rng, 1.0f);
  Buf<SDO> go(nq, rng, 1.0f);
  const double scale = 1.0 / sqrt((double)D);
  std::vector<long long> qpos(Tq), kpos(Tk);
  for (int t = 0; t < Tq; t++) qpos[t] = pos_of(c, t, Tq, n, cs.zigzag);
  for (int j = 0; j < Tk; j++) {
    const int r = shift < 0 ? j / Tq : ((c - shift) % n + n) % n;
    kpos[j] = pos_of(r, shift < 0 ? j % Tq : j, Tq, n, cs.zigzag);
  }
  auto at_q = [&](int b, int t, int h) { return (((size_t)b * Tq + t) * H + h) * D; };
  auto at_k = [&](int b, int j, int h) { return (((size_t)b * Tk + j) * KV + h) * D; };
  auto seen = [&](int t, int j) { return !cs.causal || kpos[j] <= qpos[t]; };

  /* the reference forward: this block's softmax alone */
  std::vector<double> O(nq, 0), LSE(rows, 0);
  std::vector<bool> any(rows, false);
  std::vector<double> sc(Tk);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tq; t++)
      for (int h = 0; h < H; h++) {
        const int kh = h / (H / KV);
        const size_t row = ((size_t)b * Tq + t) * H + h;
        double m = -INFINITY, l = 0;
        for (int j = 0; j < Tk; j++) {
          if (!seen(t, j)) continue;
          double d = 0;
          for (int x = 0; x < D; x++) d += q.val[at_q(b, t, h) + x] * k.val[at_k(b, j, kh) + x];
          sc[j] = d * scale;
          m = fmax(m, sc[j]);
        }
        if (m == -INFINITY) continue;   /* no key of this block: o = 0, lse = -1e30 */
        any[row] = true;
        for (int j = 0; j < Tk; j++)
          if (seen(t, j)) l += exp(sc[j] - m);
        for (int j = 0; j < Tk; j++)
          if (seen(t, j))
            for (int x = 0; x < D; x++) O[at_q(b, t, h) + x] += exp(sc[j] - m) / l * v.val[at_k(b, j, kh) + x];
        LSE[row] = m + log(l);
      }
  /* the backward's lse and delta are the whole row's (merged over every block): here the
     block's own lse plus up to 1.5 (as if other blocks added to the row), any value for a
     row with no key here; delta arbitrary */
  std::uniform_real_distribution<float> ud(0.0f, 1.5f);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> lse_in(rows), delta_in(rows);
  for (size_t r = 0; r < rows; r++) {
    lse_in[r] = (float)(any[r] ? LSE[r] + ud(rng) : ud(rng));
    delta_in[r] = nd(rng);
  }

  /* the device, twice */
  std::vector<float> o[2], lse[2], dq_[2], dk_[2], dv_[2];
  LoomArgs f, g;
  memset(&f, 0, sizeof f);
  const long long ints[12] = {B, Tq, H, D, Tk, KV, cs.causal, 3 /* cp + 1: the kernels only read c */, n, cs.zigzag,
                              shift, c};
  for (int i = 0; i < 12; i++) f.i[i] = ints[i];
  f.f[0] = scale;
  g = f;
  const unsigned L1 = D + 1, bh = (unsigned)(B * H), qt = (unsigned)((Tq + 63) / 64);
  for (int pass = 0; pass < 2; pass++) {
    loom_emu::reverse_order = pass;
    o[pass].assign(nq, NAN), lse[pass].assign(rows, NAN), dq_[pass].assign(nq, NAN);
    dk_[pass].assign(nk, NAN), dv_[pass].assign(nk, NAN);
    void *fb[5] = {q.raw.data(), k.raw.data(), v.raw.data(), o[pass].data(), lse[pass].data()};
    void *gb[9] = {go.raw.data(), q.raw.data(), k.raw.data(), v.raw.data(), lse_in.data(), delta_in.data(),
                   dq_[pass].data(), NULL, NULL};
    memcpy(f.buf, fb, sizeof fb), memcpy(g.buf, gb, sizeof gb);
    /* launch shapes and shared memory as codegen/cuda/lower.c's lower_attention_block */
    if (launch(fwd<SQ, SK, SV, D>, &f, bh, qt, 4 * (3 * 64 * L1 + 64 * 65) + 8 * 64, "forward") ||
        launch(dq<SDO, SQ, SK, SV, D>, &g, bh, qt, 4 * (2 * 64 * L1 + 2 * 32 * L1 + 64 * 33) + 8 * 32, "dq"))
      return 1;
    g.buf[6] = dk_[pass].data();
    g.buf[7] = dv_[pass].data();
    if (launch(dkdv<SDO, SQ, SK, SV, D>, &g, (unsigned)(B * KV), (unsigned)((Tk + 31) / 32),
               4 * (2 * 32 * L1 + 2 * 64 * L1 + 2 * 32 * 65 + 128) + 8 * 64, "dk dv"))
      return 1;
  }
  loom_emu::reverse_order = 0;
  const bool same = !memcmp(o[0].data(), o[1].data(), 4 * nq) && !memcmp(lse[0].data(), lse[1].data(), 4 * rows) &&
                    !memcmp(dq_[0].data(), dq_[1].data(), 4 * nq) && !memcmp(dk_[0].data(), dk_[1].data(), 4 * nk) &&
                    !memcmp(dv_[0].data(), dv_[1].data(), 4 * nk);
  e.order += !same;

  /* the reference backward: p = exp(scale s - lse), ds = p (dout . v - delta) scale */
  std::vector<double> dQ(nq, 0), dK(nk, 0), dV(nk, 0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tq; t++)
      for (int h = 0; h < H; h++) {
        const int kh = h / (H / KV);
        const size_t row = ((size_t)b * Tq + t) * H + h;
        for (int j = 0; j < Tk; j++) {
          if (!seen(t, j)) continue;
          double s = 0, dp = 0;
          for (int x = 0; x < D; x++) {
            s += q.val[at_q(b, t, h) + x] * k.val[at_k(b, j, kh) + x];
            dp += go.val[at_q(b, t, h) + x] * v.val[at_k(b, j, kh) + x];
          }
          const double p = exp(s * scale - lse_in[row]), ds = p * (dp - delta_in[row]) * scale;
          for (int x = 0; x < D; x++) {
            dQ[at_q(b, t, h) + x] += ds * k.val[at_k(b, j, kh) + x];
            dK[at_k(b, j, kh) + x] += ds * q.val[at_q(b, t, h) + x];
            dV[at_k(b, j, kh) + x] += p * go.val[at_q(b, t, h) + x];
          }
        }
      }

  /* lse of the rows that see a key: relative to the largest; the others exactly -1e30 with
     o = 0 (the merge weighs them by exp(-1e30 - m) = 0) */
  double lerr = 0, lbig = 0;
  int masked = 0;
  for (size_t r = 0; r < rows; r++) {
    if (any[r]) {
      lerr = lse[0][r] != lse[0][r] ? INFINITY : fmax(lerr, fabs(lse[0][r] - LSE[r]));
      lbig = fmax(lbig, fabs(LSE[r]));
      continue;
    }
    masked++;
    bool zero = lse[0][r] == -1e30f;
    for (int x = 0; x < D; x++) zero = zero && o[0][r * D + x] == 0.0f;
    e.bad_masked += !zero;
  }
  e.o = fmax(e.o, rel(o[0], O));
  e.lse = fmax(e.lse, lbig > 0 ? lerr / lbig : lerr);
  e.dq = fmax(e.dq, rel(dq_[0], dQ));
  e.dk = fmax(e.dk, rel(dk_[0], dK));
  e.dv = fmax(e.dv, rel(dv_[0], dV));
  e.blocks++;
  e.masked_blocks += masked == (int)rows;
  e.masked_rows += masked;
  return 0;
}

template <class SQ, class SK, class SV, class SDO>
static int run_prec(const Case &cs, int c, int shift, Errors &e) {
  return cs.D == 16 ? run_block<SQ, SK, SV, SDO, 16>(cs, c, shift, e) : run_block<SQ, SK, SV, SDO, 64>(cs, c, shift, e);
}

static int run(const Case &cs) {
  Errors e;
  for (int c = 0; c < cs.n; c++)
    for (int shift = -1; shift < cs.n; shift++) {
      int rc = cs.prec == F32    ? run_prec<loom_sf32, loom_sf32, loom_sf32, loom_sf32>(cs, c, shift, e)
               : cs.prec == BF16 ? run_prec<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16>(cs, c, shift, e)
                                 : run_prec<loom_sbf16, loom_sf32, loom_sf32, loom_sbf16>(cs, c, shift, e);
      if (rc) return 1;
    }
  const bool ok = e.o <= AB_TOL && e.lse <= AB_TOL && e.dq <= AB_TOL && e.dk <= AB_TOL && e.dv <= AB_TOL &&
                  !e.bad_masked && !e.order;
  printf("%s %-5s D %d, B %d Tq %d, H %d KV %d, %s n %d%s: %d blocks (%d fully masked, %d rows without keys%s)%s; "
         "relative errors o %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
         ok ? "ok  " : "FAIL", cs.prec == F32 ? "f32" : cs.prec == BF16 ? "bf16" : "mixed", cs.D, cs.B, cs.Tq, cs.H,
         cs.KV, cs.zigzag ? "zigzag" : "contiguous", cs.n, cs.causal ? ", causal" : "", e.blocks, e.masked_blocks,
         e.masked_rows, e.bad_masked ? ", SOME NOT lse -1e30 AND o 0" : "",
         e.order ? ", OTHER BITS IN REVERSE THREAD ORDER" : "", e.o, e.lse, e.dq, e.dk, e.dv);
  return ok ? 0 : 1;
}

/* rope with the sequence split (ops.def rope: seq_axis, seq_n, zigzag): rank c's rows at
   their global positions, against ir/interp_ops.c's arithmetic (the angle in double, cos and
   sin rounded to float, the rotation in float) */
static void rope_ff(LoomArgs a) { loom_rope<loom_sf32, loom_sf32>(a); }
static int run_rope() {
  const int B = 2, T = 10, H = 3, Dh = 16, half = Dh / 2, off = 5;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x((size_t)B * T * H * Dh), y(x.size());
  for (auto &e : x) e = nd(rng);
  double err = 0, big = 0;
  int blocks = 0;
  for (int n = 2; n <= 4; n += 2)
    for (int zz = 0; zz < 2; zz++)
      for (int inv = 0; inv < 2; inv++)
        for (int c = 0; c < n; c++) {
          LoomArgs a;
          memset(&a, 0, sizeof a);
          const long long ints[10] = {B, T, H, Dh, off, inv, 3, n, zz, c};
          for (int i = 0; i < 10; i++) a.i[i] = ints[i];
          a.f[0] = 10000.0;
          a.buf[0] = x.data();
          a.buf[1] = y.data();
          std::fill(y.begin(), y.end(), NAN);
          const unsigned pairs = (unsigned)(x.size() / 2);
          if (launch(rope_ff, &a, (pairs + 255) / 256, 1, 0, "rope")) return 1;
          for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
              for (int i = 0; i < half; i++) {
                const double ang = (double)(pos_of(c, t, T, n, zz) + off) * pow(10000.0, -2.0 * i / Dh);
                const float cs = (float)cos(ang), sn = (float)((inv ? -1.0 : 1.0) * sin(ang));
                for (int h = 0; h < H; h++) {
                  const size_t at = (((size_t)b * T + t) * H + h) * Dh;
                  const float w0 = x[at + i] * cs - x[at + i + half] * sn, w1 = x[at + i + half] * cs + x[at + i] * sn;
                  err = y[at + i] != y[at + i] ? INFINITY : fmax(err, fmax(fabs(y[at + i] - w0), fabs(y[at + i + half] - w1)));
                  big = fmax(big, fmax(fabs(w0), fabs(w1)));
                }
              }
          blocks++;
        }
  /* the same operations on the same values: equal but for the device's libm in the angle */
  const bool ok = err / big <= 1e-6;
  printf("%s rope, the sequence split over n 2 and 4, contiguous and zigzag, every c, inverse or not: %d cases; "
         "relative error %.1e\n", ok ? "ok  " : "FAIL", blocks, err / big);
  return ok ? 0 : 1;
}

int main() {
  const Case cases[] = {
      {2, 70, 4, 2, 16, 2, true, true, F32},     /* GQA; a query tile across both half-chunks */
      {1, 70, 4, 2, 64, 4, true, true, F32},
      /* H = KV, contiguous: whole blocks masked; 65 = 64 + 1 rows, so the last query tile's
         largest position is its key tile's smallest (the edge of the tile skipping) */
      {1, 65, 2, 2, 64, 4, false, true, F32},
      {1, 70, 4, 2, 64, 4, true, true, BF16},
      {1, 70, 4, 4, 16, 2, false, true, BF16},
      {1, 6, 4, 2, 16, 4, true, true, MIXED},    /* half-chunks of 3: a tile spans many stretches */
      {1, 70, 2, 1, 16, 2, true, false, F32},    /* not causal: every key of the block seen */
      {1, 129, 2, 1, 16, 1, false, true, F32},   /* seq_n 1: plain causal attention; the same edge */
  };
  int failed = run_rope();
  for (const Case &c : cases) failed += run(c);
  return failed ? 1 : 0;
}
