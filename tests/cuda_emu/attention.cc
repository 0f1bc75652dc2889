/* tests/cuda_emu/attention.cc — the flash-attention kernels of codegen/cuda/kernels/attention*.cuh on the
 * emulated device against a double-precision reference: forward (out) and backward (dq; dk,
 * dv) on tensor cores (loom_attn_*_tc, bf16 and f16) and on CUDA cores, causal and not,
 * grouped KV heads, query and key lengths that are not multiples of the tiles, head sizes
 * 16, 64 and 128, sliding windows (causal and not); and on tensor cores the one-pass backward
 * from the forward's saved L2 and O (against the reference and the two-pass kernels), and the
 * Hopper kernels (attention_sm90.cuh's forward, dq and dk dv, on emu_sm90.h's wgmma, mbarriers and
 * bulk copies).  Built by run.sh: `g++ -include emu.h attention.cc` with TU naming a
 * translation unit from `loom ir --emit=cuda` (the templates come from its prelude).
 * Exit 0 when every result of every case is within 2e-5 of its largest element. */
#include TU
#include "emu_tail.h"

#ifndef ATT_TOL   /* -DLOOM_ATTN_SPLIT=0 (P and dS rounded once, as FlashAttention) with -DATT_TOL=5e-3 */
#define ATT_TOL 2e-5
#endif

#include <random>
#include <vector>

typedef unsigned short u16;

struct Case {
  int B, T, H, KV, D, S;
  bool causal, bf16;
  int W;   /* a sliding window: key j visible from query t when t - j < W; 0: none */
};

static u16 to16(float x, bool bf) { return bf ? loom_f32_to_bf16(x) : loom_f32_to_f16(x); }
static float from16(u16 h, bool bf) { return bf ? loom_bf16_to_f32(h) : loom_f16_to_f32(h); }

template <class S, int D>
static void fwd_tc(LoomArgs a) { loom_attn_fwd_tc<S, S, S, loom_sf32, D>(a); }
/* The Hopper kernels' tensor maps, as the runtime encodes them from lower_attn.c's fields
   (program.h's RT_TMAP_INT; runtime/cuda/cuda_tmap.c): map m of buffer m, [B][rows][heads][D]
   16-bit, a box of {64, 1, box rows, 1}, the 128-byte swizzle, zeros out of bounds; through
   the emulator's cuTensorMapEncodeTiled (emu_tmap.h), which checks them as the driver would. */
static LoomTmaps fwd_maps, dq_maps, kv_maps;
static int encode_maps(LoomTmaps *t, const LoomArgs &a, int n, const int *box, bool bf) {
  memset(t, 0, sizeof *t);
  const long long B = a.i[0], T = a.i[1], H = a.i[2], D = a.i[3], S = a.i[4], KV = a.i[5];
  for (int m = 0; m < n; m++) {
    const bool kv = n == 3 ? m > 0 : m > 1;
    const uint64_t dim[4] = {(uint64_t)D, (uint64_t)(kv ? KV : H), (uint64_t)(kv ? S : T), (uint64_t)B};
    const uint64_t stride[3] = {dim[0] * 2, dim[0] * dim[1] * 2, dim[0] * dim[1] * dim[2] * 2};
    const uint32_t bx[4] = {64, 1, (uint32_t)box[m], 1}, es[4] = {1, 1, 1, 1};
    char why[200];
    if (loom_emu_tmap_encode(&t->m[m], bf ? 9 : 6, 4, a.buf[m], dim, stride, bx, es, 0, 3, 3, 0, why, sizeof why)) {
      printf("FAIL tensor map %d: %s\n", m, why);
      return 1;
    }
  }
  return 0;
}
template <class S, int D>
static void fwd_wg(LoomArgs a) {
  if constexpr (D == 64 || D == 128) loom_attn_fwd_wg<S, S, S, loom_sf32, D>(a, fwd_maps);
}
template <class S, int D>
static void dq_wg(LoomArgs a) {
  if constexpr (D == 64 || D == 128) loom_attn_bwd_dq_wg<S, S, S, S, loom_sf32, D>(a, dq_maps);
}
template <class S, int D>
static void dkdv_wg(LoomArgs a) {
  if constexpr (D == 64 || D == 128) loom_attn_bwd_dkdv_wg<S, S, S, S, loom_sf32, loom_sf32, D>(a, kv_maps);
}
template <class S, int D>
static void fwd(LoomArgs a) { loom_attn_fwd<S, S, S, loom_sf32, D>(a); }
template <class S, int D>
static void dq_tc(LoomArgs a) { loom_attn_bwd_dq_tc<S, S, S, S, loom_sf32, D>(a); }
template <class S, int D>
static void dq(LoomArgs a) { loom_attn_bwd_dq<S, S, S, S, loom_sf32, D>(a); }
template <class S, int D>
static void dkdv_tc(LoomArgs a) { loom_attn_bwd_dkdv_tc<S, S, S, S, loom_sf32, loom_sf32, D>(a); }
template <class S, int D>
static void dkdv(LoomArgs a) { loom_attn_bwd_dkdv<S, S, S, S, loom_sf32, loom_sf32, D>(a); }

static int launch(void (*fn)(LoomArgs), LoomArgs *a, unsigned gx, unsigned gy, unsigned smem, const char *what,
                  unsigned threads = 128) {
  unsigned grid[3] = {gx, gy, 1}, block[3] = {threads, 1, 1};
  char err[600];
  if (!loom_emu_launch((void *)fn, a, grid, block, smem, err, sizeof err)) return 0;
  printf("FAIL launch of %s: %s\n", what, err);
  return 1;
}

/* Forward, then backward (dq, L, Dsum; then dk, dv), with the launch shapes of
   codegen/cuda/lower_attn.c. */
template <class S, int D>
static int kernels(const Case &c, bool tcore, LoomArgs *f, LoomArgs *q, LoomArgs *kv, bool wgmma = false) {
  const unsigned bh = (unsigned)(c.B * c.H), tq = (unsigned)((c.T + 63) / 64), L1 = D + 1, L8 = D + 8;
  const unsigned bn = D <= 64 ? 64 : 32;
  static const int fbox[3] = {128, 64, 64}, kbox[4] = {64, 64, 64, 64};
  if (wgmma && (encode_maps(&fwd_maps, *f, 3, fbox, c.bf16) || encode_maps(&dq_maps, *q, 4, kbox, c.bf16) ||
                encode_maps(&kv_maps, *kv, 4, kbox, c.bf16)))
    return 1;
  if (tcore)
    return (wgmma ? launch(fwd_wg<S, D>, f, bh, (unsigned)((c.T + 127) / 128), 1024 + 128 * D * 2 + 3 * 2 * 64 * D * 2 + 56,
                           "wgmma forward", 384)
                  : launch(fwd_tc<S, D>, f, bh, tq, 2 * 2 * 64 * L8 * 2, "forward")) ||
           (wgmma ? launch(dq_wg<S, D>, q, bh, tq, 1024 + 2 * 64 * D * 2 + (D == 128 ? 3 : 2) * (2 * 64 * D * 2 + 16) + 8, "wgmma dq", 256)
                  : launch(dq_tc<S, D>, q, bh, tq, 8 * bn * L8, "dq")) ||
           (wgmma ? launch(dkdv_wg<S, D>, kv, (unsigned)(c.B * c.KV), (unsigned)((c.S + 63) / 64),
                           1024 + 2 * 64 * D * 2 + 3 * (2 * 64 * D * 2 + 16) + 8, "wgmma dk dv", 256)
                  : launch(dkdv_tc<S, D>, kv, (unsigned)(c.B * c.KV), (unsigned)((c.S + 63) / 64),
                           4 * 64 * L8 + 4 * (2 * bn * L8 + 4 * bn), "dk dv"));
  return launch(fwd<S, D>, f, bh, tq, 4 * (3 * 64 * L1 + 64 * 65), "forward") ||
         launch(dq<S, D>, q, bh, tq, 4 * (2 * 64 * L1 + 2 * 32 * L1 + 64 * 33), "dq") ||
         launch(dkdv<S, D>, kv, (unsigned)(c.B * c.KV), (unsigned)((c.S + 31) / 32),
                4 * (2 * 32 * L1 + 2 * 64 * L1 + 2 * 32 * 65 + 128), "dk dv");
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

/* mode 0: CUDA cores; 1: tensor cores; 2: tensor cores, the forward saving L2 and O (f32)
   for the one-pass dq (lower_attn.c's saved log-sum-exp), checked against the reference
   and against mode 1's results of the same case (out bit for bit: the same arithmetic);
   3: mode 2 with the Hopper kernels (loom_attn_fwd_wg, loom_attn_bwd_dq_wg and
   loom_attn_bwd_dkdv_wg: wgmma, bulk copies, mbarriers) in place of loom_attn_fwd_tc,
   loom_attn_bwd_dq_tc and loom_attn_bwd_dkdv_tc, against the
   reference and mode 2's results: the same bits in out, L2, O and the gradients (the
   emulator's wgmma sums each k16 step's products as its mma.sync does, and the kernels share
   the rest of their arithmetic and its order). */
static std::vector<float> prev_o, prev_dq, prev_dk, prev_dv, saved_o, saved_dq, saved_dk, saved_dv, saved_L, saved_O;

static double rel_f(const std::vector<float> &got, const std::vector<float> &want) {
  return rel(got, std::vector<double>(want.begin(), want.end()));
}

static int run(const Case &c, int mode) {
  const bool tcore = mode > 0, saved = mode >= 2, wg = mode == 3;
  std::mt19937 rng(c.T * 131 + c.D);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t nq = (size_t)c.B * c.T * c.H * c.D, nk = (size_t)c.B * c.S * c.KV * c.D;
  std::vector<u16> q(nq), k(nk), v(nk), go(nq);
  for (auto &x : q) x = to16(2.0f * nd(rng), c.bf16);
  for (auto &x : k) x = to16(2.0f * nd(rng), c.bf16);
  for (auto &x : v) x = to16(nd(rng), c.bf16);
  for (auto &x : go) x = to16(nd(rng), c.bf16);
  std::vector<float> o(nq, NAN), dq_(nq, NAN), dk_(nk, NAN), dv_(nk, NAN), Ls((size_t)c.B * c.H * c.T, NAN),
      Ds(Ls.size(), NAN), Os(saved ? nq : 0, NAN);
  const double scale = 1.0 / sqrt((double)c.D);
  LoomArgs f, bq, bkv;
  memset(&f, 0, sizeof f);
  const long long ints[8] = {c.B, c.T, c.H, c.D, c.S, c.KV, c.causal, c.W};
  for (int i = 0; i < 8; i++) f.i[i] = ints[i];
  f.f[0] = scale;
  bq = bkv = f;
  void *fb[4] = {q.data(), k.data(), v.data(), o.data()};
  void *qb[7] = {go.data(), q.data(), k.data(), v.data(), dq_.data(), Ls.data(), Ds.data()};
  void *kb[8] = {go.data(), q.data(), k.data(), v.data(), Ls.data(), Ds.data(), dk_.data(), dv_.data()};
  memcpy(f.buf, fb, sizeof fb), memcpy(bq.buf, qb, sizeof qb), memcpy(bkv.buf, kb, sizeof kb);
  if (saved) {   /* forward: q k v -> out L2 O;  dq: dout q k v L2 O -> dq Dsum */
    f.i[8] = bq.i[8] = 1;
    f.buf[4] = Ls.data(), f.buf[5] = Os.data();
    void *sb[8] = {go.data(), q.data(), k.data(), v.data(), Ls.data(), Os.data(), dq_.data(), Ds.data()};
    memcpy(bq.buf, sb, sizeof sb);
  }
  int rc;
  if (c.bf16) rc = c.D == 16 ? kernels<loom_sbf16, 16>(c, tcore, &f, &bq, &bkv)
                 : c.D == 64 ? kernels<loom_sbf16, 64>(c, tcore, &f, &bq, &bkv, wg)
                             : kernels<loom_sbf16, 128>(c, tcore, &f, &bq, &bkv, wg);
  else rc = c.D == 16 ? kernels<loom_sf16, 16>(c, tcore, &f, &bq, &bkv)
            : c.D == 64 ? kernels<loom_sf16, 64>(c, tcore, &f, &bq, &bkv, wg)
                        : kernels<loom_sf16, 128>(c, tcore, &f, &bq, &bkv, wg);
  if (rc) return 1;
  /* the reference: P = softmax(scale q k^T), dP = dout v^T, dS = P (dP - rowsum(P dP)); the
     modes of a case draw the same inputs (the generator's seed is the case's), so it is
     computed once per case and shared */
  static const Case *ref_of = nullptr;
  static std::vector<double> O, dQ, dK, dV;
  if (ref_of != &c) {
    ref_of = &c;
    O.assign(nq, 0), dQ.assign(nq, 0), dK.assign(nk, 0), dV.assign(nk, 0);
    auto at_q = [&](int b, int t, int h) { return (((size_t)b * c.T + t) * c.H + h) * c.D; };
    auto at_k = [&](int b, int j, int h) { return (((size_t)b * c.S + j) * c.KV + h) * c.D; };
    for (int b = 0; b < c.B; b++)
      for (int t = 0; t < c.T; t++)
        for (int h = 0; h < c.H; h++) {
          const int kh = h / (c.H / c.KV);
          std::vector<double> p(c.S, 0.0), dp(c.S, 0.0);
          double m = -INFINITY, l = 0, dsum = 0;
          for (int j = 0; j < c.S; j++) {
            p[j] = -INFINITY;
            if ((c.causal && j > t) || (c.W > 0 && t - j >= c.W)) continue;
            double d = 0;
            for (int e = 0; e < c.D; e++) d += (double)from16(q[at_q(b, t, h) + e], c.bf16) * from16(k[at_k(b, j, kh) + e], c.bf16);
            p[j] = d * scale;
            m = fmax(m, p[j]);
          }
          for (int j = 0; j < c.S; j++) l += p[j] == -INFINITY ? 0 : exp(p[j] - m);
          for (int j = 0; j < c.S; j++) {
            p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - m) / l;
            for (int e = 0; e < c.D; e++) dp[j] += (double)from16(go[at_q(b, t, h) + e], c.bf16) * from16(v[at_k(b, j, kh) + e], c.bf16);
            dsum += p[j] * dp[j];
          }
          for (int j = 0; j < c.S; j++) {
            const double ds = p[j] * (dp[j] - dsum) * scale;
            for (int e = 0; e < c.D; e++) {
              O[at_q(b, t, h) + e] += p[j] * from16(v[at_k(b, j, kh) + e], c.bf16);
              dQ[at_q(b, t, h) + e] += ds * from16(k[at_k(b, j, kh) + e], c.bf16);
              dK[at_k(b, j, kh) + e] += ds * from16(q[at_q(b, t, h) + e], c.bf16);
              dV[at_k(b, j, kh) + e] += p[j] * from16(go[at_q(b, t, h) + e], c.bf16);
            }
          }
        }
  }
  const double eo = rel(o, O), eq = rel(dq_, dQ), ek = rel(dk_, dK), ev = rel(dv_, dV);
  bool ok = eo <= ATT_TOL && eq <= ATT_TOL && ek <= ATT_TOL && ev <= ATT_TOL;
  char win[32] = "", vs[160] = "";
  if (c.W) snprintf(win, sizeof win, ", window %d", c.W);
  if (wg) {   /* against mode 2 (the case before): the same bits */
    auto same = [](const std::vector<float> &x, const std::vector<float> &y) {
      return x.size() == y.size() && memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    const bool so = same(o, saved_o), sl = same(Ls, saved_L), sO = same(Os, saved_O),
               sg = same(dq_, saved_dq) && same(dk_, saved_dk) && same(dv_, saved_dv);
    ok = ok && so && sl && sO && sg;
    snprintf(vs, sizeof vs, "; against mma.sync's kernels: out %s, L2 %s, O %s, gradients %s", so ? "the same bits" : "DIFFERS",
             sl ? "the same" : "DIFFERS", sO ? "the same" : "DIFFERS", sg ? "the same bits" : "DIFFER");
  } else if (saved) {   /* against the two-pass kernels (mode 1, the case before): 1e-5 of the largest */
    const bool same_o = memcmp(o.data(), prev_o.data(), nq * sizeof(float)) == 0;
    const double dq2 = rel_f(dq_, prev_dq), dk2 = rel_f(dk_, prev_dk), dv2 = rel_f(dv_, prev_dv);
    const double vt = LOOM_ATTN_SPLIT ? 1e-5 : ATT_TOL;   /* rounded P: a changed L2 may round P elsewhere */
    ok = ok && same_o && dq2 <= vt && dk2 <= vt && dv2 <= vt;
    snprintf(vs, sizeof vs, "; against two passes: out %s, dq %.1e dk %.1e dv %.1e", same_o ? "the same bits" : "DIFFERS",
             dq2, dk2, dv2);
    saved_o = o, saved_dq = dq_, saved_dk = dk_, saved_dv = dv_, saved_L = Ls, saved_O = Os;
  } else if (tcore) {
    prev_o = o, prev_dq = dq_, prev_dk = dk_, prev_dv = dv_;
  }
  printf("%s %s %s D %d, B %d T %d S %d, H %d KV %d%s%s: relative errors out %.1e dq %.1e dk %.1e dv %.1e%s\n",
         ok ? "ok  " : "FAIL", wg ? "wgmma        " : saved ? "saved L2, O  " : tcore ? "tensor cores " : "CUDA cores   ", c.bf16 ? "bf16" : "f16 ", c.D,
         c.B, c.T, c.S, c.H, c.KV, c.causal ? ", causal" : "", win, eo, eq, ek, ev, vs);
  return ok ? 0 : 1;
}

/* The emulator's cuTensorMapEncodeTiled refuses what the driver API's documentation rules
   out (and what it does not model): each of these must fail, and the good one pass. */
static int tmap_refusals() {
  static unsigned short buf[64 * 64 * 4] __attribute__((aligned(64)));
  alignas(64) unsigned char map[129];
  const uint64_t dim[4] = {64, 2, 64, 2}, st[3] = {128, 256, 256 * 64};
  const uint32_t box[4] = {64, 1, 64, 1}, es[4] = {1, 1, 1, 1};
  struct Bad {
    const char *what;
    void *map;
    const void *addr;
    uint64_t st0, dim0;
    uint32_t box0, box2, es1;
    int swizzle;
  } bad[] = {
      {"the good one", map, buf, 128, 64, 64, 64, 1, 3},
      {"map not 64-byte aligned", map + 1, buf, 128, 64, 64, 64, 1, 3},
      {"address not 16-byte aligned", map, (const char *)buf + 8, 128, 64, 64, 64, 1, 3},
      {"stride not a multiple of 16", map, buf, 136, 64, 64, 64, 1, 3},
      {"stride under the row", map, buf, 112, 64, 64, 64, 1, 3},
      {"box dim over 256", map, buf, 128, 64, 64, 257, 1, 3},
      {"inner box over the 128-byte swizzle", map, buf, 256, 128, 128, 64, 1, 3},
      {"inner box not a multiple of 16 bytes", map, buf, 128, 64, 4, 64, 1, 0},
      {"element stride 9", map, buf, 128, 64, 64, 64, 9, 3},
      {"a zero dim", map, buf, 128, 0, 64, 64, 1, 3},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const Bad &b = bad[i];
    uint64_t d[4] = {b.dim0, dim[1], dim[2], dim[3]}, s[3] = {b.st0, st[1], st[2]};
    uint32_t bx[4] = {b.box0, box[1], b.box2, box[3]}, e[4] = {es[0], b.es1, es[2], es[3]};
    char why[200] = "";
    const int rc = loom_emu_tmap_encode(b.map, 9, 4, b.addr, d, s, bx, e, 0, b.swizzle, 0, 0, why, sizeof why);
    if (rc != (i > 0)) {
      printf("FAIL cuTensorMapEncodeTiled, %s: %s\n", b.what, rc ? why : "accepted");
      failed++;
    }
  }
  printf("%s cuTensorMapEncodeTiled (emulated): %zu bad arguments refused, the good ones accepted\n", failed ? "FAIL" : "ok  ",
         sizeof bad / sizeof *bad - 1);
  return failed;
}

/* The emulated device's named barriers (emu.h's loom_emu_bar, bar.sync / bar.arrive a, b):
   two warpgroups hand a value back and forth, warpgroup 0 writing round r's and arriving at
   barrier 1, warpgroup 1 syncing there, reading it, arriving at barrier 2, where warpgroup 0
   syncs before the next round; every read must see its round's value (in either order of the
   fibers).  Then the wrong uses, each of which must fail the launch with its message: a count
   of 384 (deadlock: the third warpgroup has left), a count the other side does not give (192
   against 256), a count not a multiple of 32, barrier 0, a warp arriving twice in one phase,
   and a count past the block's threads. */
static void nb_kernel(LoomArgs a) {
  const int mode = (int)a.i[0], wg = threadIdx.x / 128;
  const unsigned n = (unsigned)a.i[1];
  volatile int *box = (volatile int *)loom_emu_dyn_smem(), *seen = (int *)a.buf[0];
  if (wg == 2) return;   /* (a third warpgroup, which leaves: a count of 384 fits the block) */
  for (int r = 0; r < 4; r++) {
    if (wg == 0) {
      if (r > 0) loom_emu_bar(2, n, true);
      *box = r;
      loom_emu_bar(mode == 4 ? 0 : 1, mode == 3 ? 100 : n, false);
      if (mode == 5) loom_emu_bar(3, n, false), loom_emu_bar(3, n, false);   /* no one else at 3: one phase */
    } else {
      loom_emu_bar(1, mode == 2 ? 192 : n, true);   /* (192: neither side completes a phase alone) */
      seen[4 * (threadIdx.x - 128) + r] = *box;
      if (r < 3) loom_emu_bar(2, n, false);
    }
  }
}
static int named_barriers() {
  static int seen[128 * 4];
  struct Use {
    int mode, count;
    const char *msg;
  } uses[] = {{0, 256, nullptr},
              {0, 384, "deadlock"},
              {2, 256, "arrived at with thread count"},
              {3, 256, "not a non-zero multiple of 32"},
              {4, 256, "not in 1-15"},
              {5, 256, "arrives again before the barrier completed"},
              {0, 416, "within the block's 384 threads"}};
  int failed = 0;
  for (const Use &u : uses) {
    LoomArgs a;
    memset(&a, 0, sizeof a);
    a.i[0] = u.mode, a.i[1] = u.count, a.buf[0] = seen;
    memset(seen, 0xff, sizeof seen);
    unsigned grid[3] = {1, 1, 1}, block[3] = {384, 1, 1};
    char err[600] = "";
    const int rc = loom_emu_launch((void *)nb_kernel, &a, grid, block, 64, err, sizeof err);
    bool ok = u.msg ? rc && strstr(err, u.msg) : !rc;
    for (int i = 0; !u.msg && i < 128 * 4; i++) ok = ok && seen[i] == i % 4;
    if (!ok) {
      printf("FAIL named barriers, mode %d count %d: %s\n", u.mode, u.count, rc ? err : "the launch ran");
      failed++;
    }
  }
  printf("%s named barriers (emulated bar.sync / bar.arrive): a hand-off in turns, and %zu wrong uses refused\n",
         failed ? "FAIL" : "ok  ", sizeof uses / sizeof *uses - 1);
  return failed;
}

/* FlashAttention-3's ping-pong in loom_attn_fwd_wg: the consumer warpgroups (1 and 2) issue
   their wgmmas in turns, warpgroup 1's first, each turn whole: tile it's S (D / 16 wgmmas)
   and tile it-1's P V (4, 8 with the split of P), the last P V alone, then empty turns for
   a warpgroup whose rows see fewer tiles.  The emulator records the issuing warpgroup of each
   wgmma (wg_trace); this is the sequence the turns give, for one head, T = S = 256 (two
   blocks, the later rows' first), causal and not.  Without the named barriers' order the
   warpgroups' wgmmas interleave one by one. */
template <int D>
static int pingpong(bool causal) {
  const int T = 256, BM = 128, BN = 64, KD = D / 16, KN = (LOOM_ATTN_SPLIT ? 2 : 1) * BN / 16;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<u16> q((size_t)T * D), k(q.size()), v(q.size());
  for (auto *x : {&q, &k, &v})
    for (auto &e : *x) e = to16(nd(rng), true);
  std::vector<float> o(q.size(), NAN);
  LoomArgs f;
  memset(&f, 0, sizeof f);
  const long long ints[8] = {1, T, 1, D, T, 1, causal, 0};
  for (int i = 0; i < 8; i++) f.i[i] = ints[i];
  f.f[0] = 1.0 / sqrt((double)D);
  void *fb[4] = {q.data(), k.data(), v.data(), o.data()};
  memcpy(f.buf, fb, sizeof fb);
  static const int fbox[3] = {128, 64, 64};
  if (encode_maps(&fwd_maps, f, 3, fbox, true)) return 1;
  std::vector<int> got(4096), want;
  loom_emu::wg_trace = got.data(), loom_emu::wg_trace_n = 0, loom_emu::wg_trace_max = (int)got.size();
  const int rc = launch(fwd_wg<loom_sbf16, D>, &f, 1, T / BM, 1024 + 128 * D * 2 + 3 * 2 * 64 * D * 2 + 56,
                        "wgmma forward (ping-pong)", 384);
  got.resize(loom_emu::wg_trace_n);
  loom_emu::wg_trace = nullptr;
  if (rc) return 1;
  for (int y = 0; y < T / BM; y++) {   /* the blocks in launch order: rows m0 = T - 128 (y + 1) */
    const int m0 = T - BM * (y + 1), n_end = causal ? std::min(T, m0 + BM) : T, nk = (n_end + BN - 1) / BN;
    int nkw[2];
    for (int cw = 0; cw < 2; cw++) nkw[cw] = causal ? std::min((m0 + 64 * cw + 63) / BN + 1, nk) : nk;
    for (int it = 0; it <= nk; it++)
      for (int cw = 0; cw < 2; cw++) {
        const int n = it < nkw[cw] ? KD + (it > 0 ? KN : 0) : it == nkw[cw] ? KN : 0;
        want.insert(want.end(), n, 1 + cw);
      }
  }
  const bool ok = got == want;
  printf("%s wgmma forward's ping-pong, D %d%s: %zu wgmmas in the order of the two warpgroups' turns%s\n", ok ? "ok  " : "FAIL",
         D, causal ? ", causal" : "", want.size(), ok ? "" : " (they are not)");
  return ok ? 0 : 1;
}

int main() {
  const Case cases[] = {
      {1, 130, 4, 2, 64, 130, true, true},    /* 3 query tiles, the last partial; GQA */
      {2, 70, 2, 1, 128, 100, false, true},   /* S != T, keys past S masked, D 128 */
      {1, 64, 2, 2, 64, 64, true, false},     /* f16 */
      {1, 33, 4, 4, 16, 33, true, true},      /* the tiny models' head size */
      {1, 300, 4, 2, 64, 300, true, true, 100}, /* a sliding window: tiles skipped, tiles crossing its edge masked */
      {1, 200, 2, 1, 128, 200, true, true, 64}, /* a window of one tile, D 128 (dk dv: query tiles of 32) */
      {1, 150, 2, 2, 64, 150, false, true, 40}, /* a window without causality (later keys stay visible) */
      {1, 200, 2, 1, 64, 200, true, true, 40},   /* window 40: key tiles before it and query tiles past it skipped */
      {1, 130, 4, 2, 16, 130, true, true, 1},    /* window 1: each query sees only itself */
      {1, 150, 2, 2, 128, 150, true, false, 70}, /* f16, D 128 (32-row tiles), a window across tiles */
      {2, 100, 6, 2, 128, 100, true, false},    /* wgmma's tensor maps: batch 2, 3 query heads a kv head, one
                                                   partial tile each way (zero fill), f16, D 128 (two copies a tile) */
      {1, 260, 2, 1, 64, 260, false, true},     /* 5 key tiles: the wgmma forward's ring of 3 refilled (a stage
                                                   released before its products retire fails) */
  };
  int failed = tmap_refusals() + named_barriers() + pingpong<64>(true) + pingpong<64>(false) + pingpong<128>(true);
  /* LOOM_ATTN_SPLIT 0 changes the tensor-core kernels only: that build skips mode 0, whose
     CUDA-core kernels the default build has checked */
  for (const Case &c : cases) {
    failed += run(c, 1) + run(c, 2) + (c.D >= 64 && !c.W ? run(c, 3) : 0);
    if (&c == cases) {   /* (a stage of the ring used twice) again with the bulk copies landing as they are
                            issued: a producer that refills a stage before its consumers release it shows */
      loom_emu::bulk_eager = true;
      failed += run(c, 3);
      loom_emu::bulk_eager = false;
    }
    failed += LOOM_ATTN_SPLIT ? run(c, 0) : 0;
  }
  return failed ? 1 : 0;
}
