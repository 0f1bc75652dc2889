/* tests/unit/test_timing.c — passes/timing.h: the time model's collective and placement
 * rules against the playbook's formulas (appendix A0 and the DP/ZeRO cheatsheet).
 *
 *   - ring all-reduce = reduce-scatter + all-gather, to the last bit of the formula;
 *   - bandwidth terms: all-reduce sends 2(n-1)/n of the buffer, all-gather and
 *     reduce-scatter (n-1)/n; latency terms: 2(n-1) and (n-1) steps; a transfer is one step;
 *   - ZeRO volumes: DP and ZeRO-1/2 move 2 psi per step (an all-reduce of the gradients, or
 *     a reduce-scatter of them plus an all-gather of the parameters), ZeRO-3 3 psi (one more
 *     all-gather of the parameters in the backward);
 *   - placement: tp innermost inside a node, then cp, ep, dp, pp; groups spanning more than
 *     a node take the inter-node link; another placement moves them.
 */
#include <math.h>
#include <stdio.h>

#include "passes/timing.h"

#include "tests/unit/check.h"

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * fabs(b) + 1e-300; }

int main(void) {
  const double beta = 450e9, alpha = 3e-6;
  for (int64_t n = 2; n <= 4096; n *= 2) {
    for (double S = 1e3; S <= 1e10; S *= 100) {
      double ar = timing_collective(OP_ALL_REDUCE, n, S, beta, alpha);
      double rs = timing_collective(OP_REDUCE_SCATTER, n, S, beta, alpha);
      double ag = timing_collective(OP_ALL_GATHER, n, S, beta, alpha);
      check(near(ar, rs + ag), "n=%lld S=%g: all_reduce %g != reduce_scatter %g + all_gather %g", (long long)n, S, ar, rs, ag);
      check(near(timing_collective(OP_ALL_REDUCE, n, S, beta, 0), 2.0 * (double)(n - 1) / (double)n * S / beta),
            "n=%lld: all_reduce bandwidth term 2(n-1)/n S/beta", (long long)n);
      check(near(timing_collective(OP_ALL_GATHER, n, S, beta, 0), (double)(n - 1) / (double)n * S / beta),
            "n=%lld: all_gather bandwidth term (n-1)/n S/beta", (long long)n);
      check(near(timing_collective(OP_ALL_REDUCE, n, 0, beta, alpha), 2.0 * (double)(n - 1) * alpha),
            "n=%lld: all_reduce latency 2(n-1) alpha", (long long)n);
      check(near(timing_collective(OP_ALL_TO_ALL, n, 0, beta, alpha), (double)(n - 1) * alpha),
            "n=%lld: all_to_all latency (n-1) alpha", (long long)n);
    }
  }
  check(near(timing_collective(OP_SEND, 8, 1e6, beta, alpha), alpha + 1e6 / beta), "send: alpha + bytes/beta");
  check(timing_collective(OP_ALL_REDUCE, 1, 1e6, beta, alpha) == 0, "one rank: no time");

  /* ZeRO volumes (bandwidth terms, psi parameters of b bytes, dp = n): DP all-reduces the
     gradients (2 psi); ZeRO-1/2 reduce-scatter them and all-gather the parameters (2 psi);
     ZeRO-3 gathers the parameters twice (forward and backward) and reduce-scatters (3 psi). */
  const double psi = 124e6 * 2;   /* bf16 */
  for (int64_t n = 2; n <= 512; n *= 2) {
    double f = (double)(n - 1) / (double)n;
    double dp = timing_collective(OP_ALL_REDUCE, n, psi, beta, 0);
    double z1 = timing_collective(OP_REDUCE_SCATTER, n, psi, beta, 0) + timing_collective(OP_ALL_GATHER, n, psi, beta, 0);
    double z3 = z1 + timing_collective(OP_ALL_GATHER, n, psi, beta, 0);
    check(near(dp, 2 * f * psi / beta) && near(z1, dp) && near(z3, 3 * f * psi / beta),
          "dp=%lld: ZeRO volumes 2 psi (DP, ZeRO-1/2) and 3 psi (ZeRO-3)", (long long)n);
  }

  Hardware hw = {.devices_per_node = 8};
  hardware_default_order(hw.axis_order);
  Mesh m = {{1, 1, 1, 1, 1}};
  m.size[AX_TP] = 8, m.size[AX_DP] = 2;
  check(timing_axis_link(&hw, &m, AX_TP) == LINK_INTRA && timing_axis_link(&hw, &m, AX_DP) == LINK_INTER,
        "tp=8 x dp=2 on 8-GPU nodes: tp inside a node, dp across nodes");
  m.size[AX_TP] = 4;
  check(timing_axis_link(&hw, &m, AX_TP) == LINK_INTRA && timing_axis_link(&hw, &m, AX_DP) == LINK_INTRA,
        "tp=4 x dp=2: both inside one node");
  m.size[AX_PP] = 4;
  check(timing_axis_link(&hw, &m, AX_PP) == LINK_INTER, "pp outermost: across nodes");
  int order[AX_COUNT] = {AX_DP, AX_TP, AX_CP, AX_EP, AX_PP};
  for (int k = 0; k < AX_COUNT; k++) hw.axis_order[k] = order[k];
  m.size[AX_TP] = 8, m.size[AX_PP] = 1;
  check(timing_axis_link(&hw, &m, AX_DP) == LINK_INTRA && timing_axis_link(&hw, &m, AX_TP) == LINK_INTER,
        "placement dp innermost: dp=2 inside a node, tp=8 spans two");
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
