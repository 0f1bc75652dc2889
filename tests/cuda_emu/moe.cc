/* tests/cuda_emu/moe.cc — the mixture-of-experts kernels of codegen/cuda/kernels/moe.cuh
 * (loom_topk, loom_gather_last, loom_scatter_last, loom_moe_hist/offsets/place (moe_sort and
 * moe_count), loom_moe_dispatch, loom_moe_combine, loom_moe_wgrad (moe_weight_grad),
 * loom_grouped_mm, loom_grouped_wgrad) on the emulated device, against references written here
 * from ir/interp_moe.c's definitions (the loops runtime/cpu/cpu_moe.c runs too): routing with
 * ties, with and without a capacity that drops assignments, an expert no token chooses (an
 * empty group), more than one chunk of the counting sort (1400 assignments), extra rows past
 * the assignments, 6 groups on 3 experts with empty ones, sizes that are not multiples of the
 * tiles, f32, bf16, and bf16 rows with f32 routing weights.  Each launch runs twice, the second
 * time with every block's threads in reverse order and small grids (the grid-stride loops):
 * the results must be the same bits.  Indices, positions and counts out of range must make the
 * launch fail (a trap on a GPU).
 * Built by run.sh like decode.cc: `g++ -include emu.h moe.cc` with TU naming the translation
 * unit of moe.ir (the templates come from its prelude).
 * Exit 0 when topk, gather_last, scatter_last, moe_sort, moe_count, moe_dispatch and
 * moe_combine give exactly the reference's results (the same f32 operations in the same order),
 * moe_weight_grad and the grouped matmuls are within 1e-5 of the sum of the magnitudes of each
 * output's products (a double reference; bf16 outputs: 2^-8 more, their rounding), every element is
 * written, every second run gives the same bits, and the bad inputs fail. */
#include TU
#include "emu_tail.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

/* A tensor as the kernels read it (storage S) and its exact values. */
template <class S>
struct Buf {
  std::vector<typename S::T> raw;
  std::vector<double> val;
  Buf() {}
  Buf(size_t n, std::mt19937 &rng, float sd) : raw(n), val(n) {
    std::normal_distribution<float> nd(0.0f, sd);
    for (size_t i = 0; i < n; i++) {
      S::st(raw.data(), (long long)i, nd(rng));
      val[i] = S::ld(raw.data(), (long long)i);
    }
  }
};

template <class SX>
static void topk(LoomArgs a) { loom_topk<SX, loom_si32>(a); }
static void gather(LoomArgs a) { loom_gather_last<loom_sf32, loom_sf32>(a); }
static void scatter(LoomArgs a) { loom_scatter_last<loom_sf32, loom_sf32>(a); }
static void hist(LoomArgs a) { loom_moe_hist<loom_si32>(a); }
static void offsets(LoomArgs a) { loom_moe_offsets<loom_si32>(a); }
static void place(LoomArgs a) { loom_moe_place<loom_si32>(a); }
template <class S>
static void fill(LoomArgs a) { loom_fill<S>(a); }
template <class SX, class SW, class SY>
static void dispatch(LoomArgs a) { loom_moe_dispatch<SX, SW, SY>(a); }
template <class SY, class SW, class SO>
static void combine(LoomArgs a) { loom_moe_combine<SY, SW, SO>(a); }
template <class SR, class SX>
static void weight_grad(LoomArgs a) { loom_moe_wgrad<SR, SX, loom_sf32>(a); }
template <class SX, class SW, class SY, bool TB>
static void gmm(LoomArgs a) { loom_grouped_mm<SX, SW, SY, TB>(a); }
template <class SD, class SX, class SO>
static void gwgrad(LoomArgs a) { loom_grouped_wgrad<SD, SX, SO>(a); }

static std::string last_err;
static int failures;

static int launch(void (*fn)(LoomArgs), LoomArgs *a, const unsigned grid[3], unsigned block, const char *what,
                  bool quiet = false, unsigned smem = 0) {
  unsigned b[3] = {block, 1, 1};
  char err[600];
  if (!loom_emu_launch((void *)fn, a, grid, b, smem, err, sizeof err)) return 0;
  last_err = err;
  if (!quiet) printf("FAIL launch of %s: %s\n", what, err);
  return 1;
}

/* Pass 0: codegen/cuda/lower.c's launch shapes; pass 1: every block's threads in reverse order
   and the grid cut to `small` blocks per dimension (at most the lowering's). */
struct Grid {
  unsigned g[3];
};
static Grid grid_of(long long x, long long y, long long z, int pass, unsigned small) {
  Grid r;
  const long long d[3] = {x, y, z};
  for (int i = 0; i < 3; i++) {
    const long long v = d[i] < 1 ? 1 : d[i];
    r.g[i] = pass && v > small ? small : (unsigned)v;
  }
  return r;
}
static Grid ew(long long n, int pass) { return grid_of((n + 255) / 256, 1, 1, pass, 3); }
static void set_pass(int pass) { loom_emu::reverse_order = pass; }

static LoomArgs args(std::initializer_list<void *> bufs, std::initializer_list<long long> ints) {
  LoomArgs a;
  memset(&a, 0, sizeof a);
  int k = 0;
  for (void *b : bufs) a.buf[k++] = b;
  k = 0;
  for (long long v : ints) a.i[k++] = v;
  return a;
}

template <class S>
static std::vector<typename S::T> nans(size_t n) {
  std::vector<typename S::T> v(n);
  for (size_t i = 0; i < n; i++) S::st(v.data(), (long long)i, NAN);
  return v;
}

template <class T>
static bool same(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && (a.empty() || !memcmp(a.data(), b.data(), sizeof(T) * a.size()));
}

static void report(bool ok, const std::string &what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  failures += !ok;
}

/* ---------------------------------------------------------------- references (ir/interp_moe.c) */

static std::vector<int> ref_topk(const std::vector<float> &x, int rows, int E, int k) {
  std::vector<int> o((size_t)rows * k);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int i = 0; i < j && !taken; i++) taken = o[(size_t)r * k + i] == e;
        if (!taken && (best < 0 || x[(size_t)r * E + e] > x[(size_t)r * E + best])) best = e;
      }
      o[(size_t)r * k + j] = best;
    }
  return o;
}

static void ref_sort(const std::vector<int> &idx, int E, int cap, std::vector<int> &pos, std::vector<int> &count) {
  std::vector<long long> seen(E, 0), start(E + 1, 0);
  for (int e : idx) seen[e]++;
  count.assign(E, 0);
  for (int e = 0; e < E; e++) {
    count[e] = (int)(cap > 0 && seen[e] > cap ? cap : seen[e]);
    start[e + 1] = start[e] + count[e];
    seen[e] = 0;
  }
  pos.assign(idx.size(), 0);
  for (size_t a = 0; a < idx.size(); a++) {
    const int e = idx[a];
    pos[a] = seen[e] < count[e] ? (int)(start[e] + seen[e]) : -1;
    seen[e]++;
  }
}

/* ---------------------------------------------------------------- routing */

struct Routing {
  int N, E, k, cap;
  bool ties, empty;   /* logits on a few values (ties); the last expert never chosen */
};

/* topk, gather_last, scatter_last, moe_sort and moe_count of one case; the assignments'
   positions and counts (the reference's, checked equal) go to the permutations. */
static void run_routing(const Routing &c, unsigned seed, std::vector<int> &pos_out, std::vector<int> &count_out) {
  const int N = c.N, E = c.E, k = c.k, n = N * k;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> logits((size_t)N * E), dy((size_t)n);
  for (size_t i = 0; i < logits.size(); i++) {
    logits[i] = c.ties ? (float)(rng() % 4) * 0.25f : nd(rng);
    if (c.empty && (int)(i % E) == E - 1) logits[i] = -100.0f;
  }
  for (float &v : dy) v = nd(rng);
  const std::vector<int> idx = ref_topk(logits, N, E, k);
  char what[200];
  snprintf(what, sizeof what, "N %d, E %d, k %d, capacity %d%s%s", N, E, k, c.cap, c.ties ? ", ties" : "",
           c.empty ? ", an expert never chosen" : "");

  bool ok = true, order = true;
  std::vector<int> got_idx[2];
  std::vector<float> got_g[2], got_s[2];
  for (int pass = 0; pass < 2; pass++) {
    set_pass(pass);
    got_idx[pass].assign((size_t)n, -7);
    LoomArgs a = args({logits.data(), got_idx[pass].data()}, {N, E, k});
    Grid g = ew(N, pass);
    ok &= !launch(topk<loom_sf32>, &a, g.g, 256, "topk");
    /* gather_last and scatter_last with the reference's indices */
    got_g[pass] = nans<loom_sf32>((size_t)n);
    a = args({logits.data(), (void *)idx.data(), got_g[pass].data()}, {N, E, k});
    g = ew(n, pass);
    ok &= !launch(gather, &a, g.g, 256, "gather_last");
    got_s[pass] = nans<loom_sf32>((size_t)N * E);
    a = args({dy.data(), (void *)idx.data(), got_s[pass].data()}, {N, E, k});
    g = ew((long long)N * E, pass);
    ok &= !launch(scatter, &a, g.g, 256, "scatter_last");
  }
  set_pass(0);
  std::vector<float> want_g((size_t)n), want_s((size_t)N * E, 0.0f);
  for (int t = 0; t < n; t++) {
    want_g[t] = logits[(size_t)(t / k) * E + idx[t]];
    want_s[(size_t)(t / k) * E + idx[t]] += dy[t];
  }
  order &= same(got_idx[0], got_idx[1]) && same(got_g[0], got_g[1]) && same(got_s[0], got_s[1]);
  const bool t_ok = got_idx[0] == idx, g_ok = same(got_g[0], want_g), s_ok = same(got_s[0], want_s);

  /* moe_sort (three kernels) and moe_count (the first two) */
  const long long chunk = 1024, P = (n + chunk - 1) / chunk;
  std::vector<int> want_pos, want_count;
  ref_sort(idx, E, c.cap, want_pos, want_count);
  std::vector<int> got_pos[2], got_count[2];
  for (int pass = 0; pass < 2; pass++) {
    set_pass(pass);
    std::vector<int> parts((size_t)(P * E), -9), offs((size_t)(P * E), -9), start((size_t)E, -9);
    got_count[pass].assign((size_t)E, -9);
    got_pos[pass].assign((size_t)n, -9);
    LoomArgs a = args({(void *)idx.data(), parts.data()}, {n, E, c.cap, chunk});
    Grid g = grid_of(P, 1, 1, pass, 1);
    ok &= !launch(hist, &a, g.g, 256, "moe_hist");
    a = args({parts.data(), got_count[pass].data(), start.data(), offs.data()}, {n, E, c.cap, chunk});
    g = grid_of(1, 1, 1, 0, 1);
    ok &= !launch(offsets, &a, g.g, 256, "moe_offsets");
    a = args({(void *)idx.data(), got_count[pass].data(), start.data(), offs.data(), got_pos[pass].data()},
             {n, E, c.cap, chunk});
    g = grid_of(P, 1, 1, pass, 1);
    ok &= !launch(place, &a, g.g, 256, "moe_place");
  }
  set_pass(0);
  order &= got_pos[0] == got_pos[1] && got_count[0] == got_count[1];
  const bool p_ok = got_pos[0] == want_pos, c_ok = got_count[0] == want_count;
  int dropped = 0, empty = 0;
  for (int p : want_pos) dropped += p < 0;
  for (int v : want_count) empty += v == 0;
  std::string msg = std::string("routing, ") + what + ": topk " + (t_ok ? "exact" : "NOT THE REFERENCE'S") +
                    ", gather_last " + (g_ok ? "exact" : "NOT EXACT") + ", scatter_last " + (s_ok ? "exact" : "NOT EXACT") +
                    ", moe_sort " + (p_ok ? "exact" : "NOT THE REFERENCE'S") + ", moe_count " +
                    (c_ok ? "exact" : "NOT THE REFERENCE'S") + " (" + std::to_string(P) + " chunks, " +
                    std::to_string(dropped) + " dropped, " + std::to_string(empty) + " empty experts)" +
                    (order ? "" : ", OTHER BITS IN REVERSE THREAD ORDER OR ANOTHER GRID");
  report(ok && order && t_ok && g_ok && s_ok && p_ok && c_ok, msg);
  pos_out = want_pos;
  count_out = want_count;
}

/* ---------------------------------------------------------------- permutations */

/* max over elements of |got - want| / mag, mag: the sum of the |products| of the element (an
   element without products must be exactly 0) */
struct Err {
  double worst = 0;
  bool unwritten = false;
  void add(double got, double want, double mag) {
    if (got != got) unwritten = true;
    else if (mag > 0) worst = fmax(worst, fabs(got - want) / mag);
    else if (got != want || signbit(got)) worst = INFINITY;
  }
};

/* moe_dispatch, moe_combine and moe_weight_grad with storage SX for the tokens and rows, SW for
   the routing weights. */
template <class SX, class SW>
static void run_perm(const char *prec, int N, int k, int D, int R, const std::vector<int> &pos, unsigned seed) {
  std::mt19937 rng(seed);
  const int n = N * k;
  Buf<SX> x((size_t)N * D, rng, 1.0f), rows((size_t)R * D, rng, 1.0f);
  Buf<SW> w((size_t)n, rng, 0.5f);
  bool ok = true, order = true;
  std::vector<typename SX::T> y[2], out[2];
  std::vector<float> dw[2];
  for (int pass = 0; pass < 2; pass++) {
    set_pass(pass);
    y[pass] = nans<SX>((size_t)R * D);
    LoomArgs a = args({y[pass].data()}, {(long long)R * D});   /* step 1 of the lowering: zeros */
    Grid g = ew((long long)R * D, pass);
    ok &= !launch(fill<SX>, &a, g.g, 256, "fill");
    a = args({x.raw.data(), (void *)pos.data(), w.raw.data(), y[pass].data()}, {N, k, D, R});
    g = ew((long long)n * D, pass);
    ok &= !launch(dispatch<SX, SW, SX>, &a, g.g, 256, "moe_dispatch");
    out[pass] = nans<SX>((size_t)N * D);
    a = args({rows.raw.data(), (void *)pos.data(), w.raw.data(), out[pass].data()}, {N, k, D, R});
    g = ew((long long)N * D, pass);
    ok &= !launch(combine<SX, SW, SX>, &a, g.g, 256, "moe_combine");
    dw[pass] = nans<loom_sf32>((size_t)n);
    a = args({rows.raw.data(), x.raw.data(), (void *)pos.data(), dw[pass].data()}, {N, k, D, R});
    g = grid_of((n + 7) / 8, 1, 1, pass, 2);
    ok &= !launch(weight_grad<SX, SX>, &a, g.g, 256, "moe_weight_grad");
  }
  set_pass(0);
  order = same(y[0], y[1]) && same(out[0], out[1]) && same(dw[0], dw[1]);
  /* the reference: the same f32 operations (dispatch, combine), a double dot (weight grad) */
  std::vector<typename SX::T> want_y((size_t)R * D), want_out((size_t)N * D);
  for (size_t i = 0; i < want_y.size(); i++) SX::st(want_y.data(), (long long)i, 0.0f);
  Err e;
  for (int t = 0; t < N; t++) {
    for (int d = 0; d < D; d++) {
      float acc = 0.0f;
      for (int j = 0; j < k; j++) {
        const int as = t * k + j, p = pos[as];
        if (p < 0) continue;
        const float wa = (float)w.val[as];
        SX::st(want_y.data(), (long long)p * D + d, wa * (float)x.val[(size_t)t * D + d]);
        acc += wa * (float)rows.val[(size_t)p * D + d];
      }
      SX::st(want_out.data(), (long long)t * D + d, acc);
    }
    for (int j = 0; j < k; j++) {
      const int as = t * k + j, p = pos[as];
      double dot = 0, mag = 0;
      for (int d = 0; p >= 0 && d < D; d++) {
        dot += rows.val[(size_t)p * D + d] * x.val[(size_t)t * D + d];
        mag += fabs(rows.val[(size_t)p * D + d] * x.val[(size_t)t * D + d]);
      }
      e.add(dw[0][as], dot, mag);
    }
  }
  const bool y_ok = same(y[0], want_y), o_ok = same(out[0], want_out), w_ok = !e.unwritten && e.worst <= 1e-5;
  char msg[400];
  snprintf(msg, sizeof msg,
           "permutations, %s, N %d k %d D %d R %d: moe_dispatch %s, moe_combine %s, moe_weight_grad %.1e%s%s", prec, N,
           k, D, R, y_ok ? "exact" : "NOT EXACT", o_ok ? "exact" : "NOT EXACT", e.worst,
           e.unwritten ? " (UNWRITTEN ELEMENTS)" : "", order ? "" : ", OTHER BITS IN REVERSE THREAD ORDER OR ANOTHER GRID");
  report(ok && order && y_ok && o_ok && w_ok, msg);
}

/* ---------------------------------------------------------------- grouped matmuls */

/* grouped_matmul (both layouts) and grouped_matmul_wgrad of x[R,K] on E experts' [N,K] weights
   with counts[G]; S the storage of every float operand. */
template <class S>
static void run_grouped(const char *prec, int R, int K, int N, int E, const std::vector<int> &counts, unsigned seed) {
  std::mt19937 rng(seed);
  const int G = (int)counts.size();
  Buf<S> x((size_t)R * K, rng, 1.0f), w((size_t)E * N * K, rng, 0.3f), wt((size_t)E * K * N, rng, 0.3f),
      dy((size_t)R * N, rng, 1.0f);
  std::vector<int> start(G + 1, 0);
  for (int g = 0; g < G; g++) start[g + 1] = start[g] + counts[g];
  const int total = start[G];
  bool ok = true, order = true;
  std::vector<typename S::T> yt[2], yn[2], dw[2];
  for (int pass = 0; pass < 2; pass++) {
    set_pass(pass);
    const bool tc = sizeof(typename S::T) == 2;   /* bf16: the tensor cores' tiles and dynamic shared memory */
    const int tm = tc ? 128 : 64;
    Grid g = grid_of((N + tm - 1) / tm, (R + tm - 1) / tm + G + 1, 1, pass, 2);
    if (pass) g.g[0] = 1;   /* fewer blocks than tiles: both loops */
    yt[pass] = nans<S>((size_t)R * N);
    LoomArgs a = args({x.raw.data(), w.raw.data(), (void *)counts.data(), yt[pass].data()}, {R, K, N, E, G, 1});
    ok &= !launch(gmm<S, S, S, true>, &a, g.g, 256, "grouped_matmul (tb)", false, tc ? loom_gm_tc_smem<true>::bytes : 0);
    yn[pass] = nans<S>((size_t)R * N);
    a = args({x.raw.data(), wt.raw.data(), (void *)counts.data(), yn[pass].data()}, {R, K, N, E, G, 0});
    ok &= !launch(gmm<S, S, S, false>, &a, g.g, 256, "grouped_matmul (tb=0)", false, tc ? loom_gm_tc_smem<false>::bytes : 0);
    dw[pass] = nans<S>((size_t)E * N * K);
    a = args({dy.raw.data(), x.raw.data(), (void *)counts.data(), dw[pass].data()}, {R, K, N, E, G, 1});
    g = grid_of((K + 63) / 64, (N + tm - 1) / tm, E, pass, 1);
    ok &= !launch(gwgrad<S, S, S>, &a, g.g, 256, "grouped_matmul_wgrad");
  }
  set_pass(0);
  order = same(yt[0], yt[1]) && same(yn[0], yn[1]) && same(dw[0], dw[1]);
  /* the f32 arithmetic within 1e-5 of each output's sum of |products|, and a bf16 output's
     rounding (half an ulp: at most 2^-8 of the value, which is at most that sum) */
  const double tol = 1e-5 + (sizeof(typename S::T) == 2 ? 1.0 / 256 : 0.0);
  Err et, en, ew_;
  bool zeros = true;
  for (int r = 0; r < R; r++) {
    int g = 0;
    while (g < G && r >= start[g + 1]) g++;
    for (int c = 0; c < N; c++) {
      double st = 0, sn = 0, mt = 0, mn = 0;
      if (r < total) {
        const int e = g % E;
        for (int kk = 0; kk < K; kk++) {
          const double xv = x.val[(size_t)r * K + kk], a1 = w.val[((size_t)e * N + c) * K + kk],
                       a2 = wt.val[((size_t)e * K + kk) * N + c];
          st += xv * a1, mt += fabs(xv * a1);
          sn += xv * a2, mn += fabs(xv * a2);
        }
      }
      const double gt = S::ld(yt[0].data(), (long long)r * N + c), gn = S::ld(yn[0].data(), (long long)r * N + c);
      if (r >= total) zeros &= gt == 0 && gn == 0 && !signbit(gt) && !signbit(gn);
      et.add(gt, st, mt);
      en.add(gn, sn, mn);
    }
  }
  for (int e = 0; e < E; e++)
    for (int c = 0; c < N; c++)
      for (int kk = 0; kk < K; kk++) {
        double s = 0, m = 0;
        for (int g = e; g < G; g += E)
          for (int r = start[g]; r < start[g + 1]; r++) {
            const double p = dy.val[(size_t)r * N + c] * x.val[(size_t)r * K + kk];
            s += p, m += fabs(p);
          }
        ew_.add(S::ld(dw[0].data(), ((long long)e * N + c) * K + kk), s, m);
      }
  const bool res_ok = !et.unwritten && !en.unwritten && !ew_.unwritten && et.worst <= tol && en.worst <= tol &&
                      ew_.worst <= tol && zeros;
  std::string cs;
  for (int g = 0; g < G; g++) cs += (g ? "," : "") + std::to_string(counts[g]);
  char msg[500];
  snprintf(msg, sizeof msg,
           "grouped matmuls, %s, R %d K %d N %d, %d experts, counts [%s]: tb %.1e, tb=0 %.1e, wgrad %.1e (of each "
           "output's sum of |products|)%s%s%s",
           prec, R, K, N, E, cs.c_str(), et.worst, en.worst, ew_.worst,
           et.unwritten || en.unwritten || ew_.unwritten ? ", UNWRITTEN ELEMENTS" : "",
           zeros ? ", rows past the groups 0" : ", ROWS PAST THE GROUPS NOT 0",
           order ? "" : ", OTHER BITS IN REVERSE THREAD ORDER OR ANOTHER GRID");
  report(ok && order && res_ok, msg);
}

/* ---------------------------------------------------------------- bad inputs */

static bool fails(void (*fn)(LoomArgs), LoomArgs a, unsigned gx, unsigned gy, const char *needle) {
  const unsigned g[3] = {gx, gy, 1};
  return launch(fn, &a, g, 256, "", true) && last_err.find(needle) != std::string::npos;
}

static void run_bad() {
  const int N = 4, E = 3, k = 2, D = 8, R = 8;
  std::vector<float> logits(N * E, 1.0f), y(N * k, 0.0f), big(N * E, 0.0f), rows(R * D, 1.0f), x(N * D, 1.0f),
      out(N * D, 0.0f), w(N * k, 1.0f), mm(R * D, 0.0f), wts(E * D * D, 1.0f);
  std::vector<int> idx = {0, 1, 2, 3, 1, 0, 2, 1}, parts(E, 0), pos = {0, 1, 2, 3, -1, 5, 8, 4},
                   pos2 = {0, 1, -2, 3, 4, 5, 6, 7};
  std::string why;
  bool ok = true;
  /* an expert index of E: gather_last, scatter_last and moe_sort's count */
  ok &= fails(gather, args({logits.data(), idx.data(), y.data()}, {N, E, k}), 1, 1, "expert index is out of range");
  why = last_err;
  ok &= fails(scatter, args({y.data(), idx.data(), big.data()}, {N, E, k}), 1, 1, "expert index is out of range");
  ok &= fails(hist, args({idx.data(), parts.data()}, {N * k, E, 0, 1024}), 1, 1, "expert index is out of range");
  /* a position of R (combine, weight grad) or -2 (dispatch) */
  ok &= fails(combine<loom_sf32, loom_sf32, loom_sf32>, args({rows.data(), pos.data(), w.data(), out.data()}, {N, k, D, R}),
              1, 1, "position is out of range");
  ok &= fails(weight_grad<loom_sf32, loom_sf32>, args({rows.data(), x.data(), pos.data(), y.data()}, {N, k, D, R}), 1, 1,
              "position is out of range");
  ok &= fails(dispatch<loom_sf32, loom_sf32, loom_sf32>, args({x.data(), pos2.data(), w.data(), rows.data()}, {N, k, D, R}),
              1, 1, "position is out of range");
  /* counts past the rows, or negative */
  std::vector<int> over = {3, 0, 6}, neg = {3, -1, 2};
  ok &= fails(gmm<loom_sf32, loom_sf32, loom_sf32, true>,
              args({rows.data(), wts.data(), over.data(), mm.data()}, {R, D, D, E, E, 1}), 1, 3,
              "group counts exceed the rows");
  ok &= fails(gmm<loom_sf32, loom_sf32, loom_sf32, false>,
              args({rows.data(), wts.data(), neg.data(), mm.data()}, {R, D, D, E, E, 0}), 1, 3,
              "group counts exceed the rows");
  ok &= fails(gwgrad<loom_sf32, loom_sf32, loom_sf32>,
              args({mm.data(), rows.data(), over.data(), wts.data()}, {R, D, D, E, E, 1}), 1, 1,
              "group counts exceed the rows");
  report(ok, "bad inputs (an expert index of E, positions R and -2, counts past the rows or negative): every launch fails (\"" +
                 why + "\")");
}

int main() {
  std::vector<int> pos, count;
  /* routing; each case's positions and counts feed the permutations and grouped matmuls */
  const Routing small = {40, 5, 2, 12, false, true}, nocap = {40, 5, 2, 0, false, false},
                ties = {50, 8, 3, 0, true, true}, chunks = {700, 6, 2, 0, false, false},
                chunks_cap = {700, 6, 2, 200, false, true};
  run_routing(nocap, 1, pos, count);
  run_routing(ties, 2, pos, count);
  run_routing(chunks, 3, pos, count);
  run_routing(chunks_cap, 4, pos, count);
  run_routing(small, 5, pos, count);   /* capacity 12 of ~16 per expert: drops; expert 4 empty */
  /* the permutations on small's positions (drops), 7 rows more than the assignments */
  run_perm<loom_sf32, loom_sf32>("f32", 40, 2, 24, 87, pos, 11);
  run_perm<loom_sbf16, loom_sbf16>("bf16", 40, 2, 24, 87, pos, 12);
  run_perm<loom_sbf16, loom_sf32>("bf16 rows, f32 weights", 40, 2, 40, 87, pos, 13);
  /* the grouped matmuls on small's counts (an empty expert; rows past the kept ones) */
  run_grouped<loom_sf32>("f32", 80, 24, 40, 5, count, 21);
  run_grouped<loom_sbf16>("bf16", 80, 24, 40, 5, count, 22);
  /* 6 groups on 3 experts, empty ones, groups across tiles, sizes off the tiles */
  const std::vector<int> six = {70, 0, 45, 9, 0, 130};
  run_grouped<loom_sf32>("f32", 270, 80, 72, 3, six, 23);
  run_grouped<loom_sbf16>("bf16", 260, 80, 72, 3, six, 24);
  /* bf16's tensor-core tiles (128 x 128 outputs, k in stages of 32; the weight gradient 128 x 64):
     groups over two row tiles and of one row, an empty one, two column tiles, a last stage of
     one k-step of 16; then rows of 37 and 45 elements (not 16-byte multiples: copied element by
     element, zeros past the ends) */
  const std::vector<int> big = {150, 0, 1, 131};
  run_grouped<loom_sbf16>("bf16", 300, 144, 200, 2, big, 25);
  run_grouped<loom_sbf16>("bf16", 170, 37, 45, 3, {70, 0, 45, 9, 0, 30}, 26);
  run_bad();
  return failures ? 1 : 0;
}
