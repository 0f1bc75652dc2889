/* tests/cuda_emu/attention.cc — the flash-attention kernels of codegen/cuda/prelude.h on the
 * emulated device against a double-precision reference: the tensor-core forward
 * (loom_attn_fwd_tc, bf16 and f16) and the CUDA-core one (loom_attn_fwd), causal and not,
 * grouped KV heads, query and key lengths that are not multiples of the tiles, head sizes
 * 16, 64 and 128.  Built by run.sh: `g++ -include emu.h attention.cc` with TU naming a
 * translation unit from `loom ir --emit=cuda` (the templates come from its prelude).
 * Exit 0 when every case is within 2e-5 of the largest output. */
#include TU
#include "emu_tail.h"

#include <random>
#include <vector>

typedef unsigned short u16;

struct Case {
  int B, T, H, KV, D, S;
  bool causal, bf16;
};

static u16 to16(float x, bool bf) { return bf ? loom_f32_to_bf16(x) : loom_f32_to_f16(x); }
static float from16(u16 h, bool bf) { return bf ? loom_bf16_to_f32(h) : loom_f16_to_f32(h); }

template <class S16, int D>
static void tc(LoomArgs a) { loom_attn_fwd_tc<S16, S16, S16, loom_sf32, D>(a); }
template <class S16, int D>
static void simt(LoomArgs a) { loom_attn_fwd<S16, S16, S16, loom_sf32, D>(a); }

template <int D>
static int launch(const Case &c, bool tensor_cores, LoomArgs *a) {
  unsigned grid[3] = {(unsigned)(c.B * c.H), (unsigned)((c.T + 63) / 64), 1}, block[3] = {128, 1, 1};
  unsigned smem = tensor_cores ? 2 * (64 * (D + 8) + D * 72) : 4 * (3 * 64 * (D + 1) + 64 * 65);
  void (*fn)(LoomArgs);
  if (tensor_cores) fn = c.bf16 ? tc<loom_sbf16, D> : tc<loom_sf16, D>;
  else fn = c.bf16 ? simt<loom_sbf16, D> : simt<loom_sf16, D>;
  char err[600];
  if (loom_emu_launch((void *)fn, a, grid, block, smem, err, sizeof err)) {
    printf("FAIL launch: %s\n", err);
    return 1;
  }
  return 0;
}

static int run(const Case &c, bool tensor_cores) {
  std::mt19937 rng(c.T * 131 + c.D);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<u16> q((size_t)c.B * c.T * c.H * c.D), k((size_t)c.B * c.S * c.KV * c.D), v(k.size());
  std::vector<float> o(q.size(), NAN);
  for (auto &x : q) x = to16(2.0f * nd(rng), c.bf16);
  for (auto &x : k) x = to16(2.0f * nd(rng), c.bf16);
  for (auto &x : v) x = to16(nd(rng), c.bf16);
  LoomArgs a;
  memset(&a, 0, sizeof a);
  a.buf[0] = q.data(), a.buf[1] = k.data(), a.buf[2] = v.data(), a.buf[3] = o.data();
  const long long ints[7] = {c.B, c.T, c.H, c.D, c.S, c.KV, c.causal};
  for (int i = 0; i < 7; i++) a.i[i] = ints[i];
  const double scale = 1.0 / sqrt((double)c.D);
  a.f[0] = scale;
  int rc = c.D == 16 ? launch<16>(c, tensor_cores, &a) : c.D == 64 ? launch<64>(c, tensor_cores, &a) : launch<128>(c, tensor_cores, &a);
  if (rc) return 1;
  double err = 0, big = 0;
  for (int b = 0; b < c.B; b++)
    for (int t = 0; t < c.T; t++)
      for (int h = 0; h < c.H; h++) {
        const int kh = h / (c.H / c.KV);
        std::vector<double> s(c.S);
        double m = -INFINITY, l = 0;
        for (int j = 0; j < c.S; j++) {
          s[j] = -INFINITY;
          if (c.causal && j > t) continue;
          double d = 0;
          for (int e = 0; e < c.D; e++)
            d += (double)from16(q[(((size_t)b * c.T + t) * c.H + h) * c.D + e], c.bf16) *
                 from16(k[(((size_t)b * c.S + j) * c.KV + kh) * c.D + e], c.bf16);
          s[j] = d * scale;
          m = fmax(m, s[j]);
        }
        for (int j = 0; j < c.S; j++) l += s[j] == -INFINITY ? 0 : exp(s[j] - m);
        for (int e = 0; e < c.D; e++) {
          double acc = 0;
          for (int j = 0; j < c.S; j++)
            if (s[j] != -INFINITY) acc += exp(s[j] - m) * from16(v[(((size_t)b * c.S + j) * c.KV + kh) * c.D + e], c.bf16);
          const double ref = acc / l, got = o[(((size_t)b * c.T + t) * c.H + h) * c.D + e];
          err = fmax(err, fabs(got - ref));   /* NaN (an unwritten output) fails below */
          if (got != got) err = INFINITY;
          big = fmax(big, fabs(ref));
        }
      }
  const bool ok = err <= 2e-5 * big;
  printf("%s %s %s D %d, B %d T %d S %d, H %d KV %d%s: max error %.2e of max |out| %.3f\n", ok ? "ok  " : "FAIL",
         tensor_cores ? "tensor cores" : "CUDA cores  ", c.bf16 ? "bf16" : "f16 ", c.D, c.B, c.T, c.S, c.H, c.KV,
         c.causal ? ", causal" : "", err, big);
  return ok ? 0 : 1;
}

int main() {
  const Case cases[] = {
      {1, 130, 4, 2, 64, 130, true, true},    /* 3 query tiles, the last partial; GQA */
      {2, 70, 2, 1, 128, 100, false, true},   /* S != T, keys past S masked, D 128 */
      {1, 64, 2, 2, 64, 64, true, false},     /* f16 */
      {1, 33, 4, 4, 16, 33, true, true},      /* the tiny models' head size */
  };
  int failed = 0;
  for (const Case &c : cases) failed += run(c, true) + run(c, false);
  return failed ? 1 : 0;
}
