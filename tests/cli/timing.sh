#!/usr/bin/env bash
# tests/cli/timing.sh — `loom ir --time --hw H` (passes/timing.c, driver/hardware.c): the
# predicted step against figures computed here from loom's other reports, and bad hardware
# descriptions refused with the file, the key and the fix.
#   - compute: GPT-2 124M at 16 x 1024 in bf16 on one H100: every matmul is compute-bound, so
#     the compute time is @grad_step's FLOPs (`--flops`) over the bf16 peak of the file;
#   - collectives: dp=8 (one node) and dp=16 (two nodes: the inter-node link): the dp time is,
#     summed over `--collectives`' lines, bytes sent / bandwidth + ring steps x latency, with
#     the link the placement gives;
#   - every shipped description loads; a pipelined module reports its bubble.
LOOM=$1
. "$(dirname "$0")/lib.sh"

ir() { "$LOOM" ir models/gpt2-124M.json --passes=train,lower --seq 1024 --precision bf16 --target cuda "$@"; }

ir --batch 16 --flops > "$TMP/flops" 2>&1
ir --batch 16 --time > "$TMP/time" 2>&1
check "compute = @grad_step's FLOPs / 989.5 TFLOP/s ($(awk '$1 == "compute" { print $2, $3 }' "$TMP/time"))" awk '
  FNR == NR { if ($1 == "@grad_step") f = $2; next }
  $1 == "compute" { want = f / 989.5e12 * 1e3; got = $2; d = got - want; if (d < 0) d = -d; exit !(f > 0 && d < 0.002) }
' "$TMP/flops" "$TMP/time"

for dp in 8 16; do
  ir --batch 16 --mesh dp=$dp --collectives > "$TMP/coll" 2>&1
  ir --batch 16 --mesh dp=$dp --time > "$TMP/time" 2>&1
  if [ $dp = 8 ]; then bw=450e9; link=intra-node; else bw=50e9; link=inter-node; fi
  lat=$([ $dp = 8 ] && echo 3e-6 || echo 10e-6)
  check "dp=$dp ($link): comm dp = sum over --collectives of sent/bandwidth + ring steps x latency" awk -v n=$dp -v bw=$bw \
    -v lat=$lat -v link=$link '
    FNR == NR { if ($1 == "@grad_step" || $1 == "@optimizer_step") { c = substr($4, 2) + 0; steps = ($2 == "all_reduce" ? 2 : 1) * (n - 1);
                want += $(NF - 1) / bw + c * steps * lat } next }
    /comm dp/ { seen = 1; got = $4 / 1e3; ok = index($0, link) > 0; d = got - want; if (d < 0) d = -d }
    END { if (!seen || !ok || d > 1e-6 + 1e-3 * want) { print "got", got, "want", want, "link ok", ok; exit 1 } }
  ' "$TMP/coll" "$TMP/time"
done

for hw in h100 h200 a100 b200 models/hardware/h100-sxm.json; do
  expect_exit 0 "--hw $hw loads" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --time --hw $hw
  expect_stdout_contains "MFU"
done
expect_exit 0 "a pipeline's step" "$LOOM" ir models/gpt2-tiny-4l.json --passes=train,lower --mesh pp=2 --grad-accum 4 --time
expect_stdout_contains "pipeline bubble"

expect_exit 2 "an unknown hardware name" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw h300
expect_stderr_contains "shipped: h100"
hwfile() { sed "$1" models/hardware/h100-sxm.json > "$TMP/hw.json"; }
hwfile 's/"peak_tflops"/"peak_tflop"/'
expect_exit 2 "a misspelt key" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "peak_tflop: unknown key (did you mean 'peak_tflops'?)"
hwfile 's/"fp32": 67, //'
expect_exit 2 "no fp32 peak" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "peak_tflops.fp32"
hwfile 's/"memory_tb_s": 3.35/"memory_tb_s": -1/'
expect_exit 2 "a negative bandwidth" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "memory_tb_s: expected a non-negative number"
hwfile 's/"op_overhead_us": 0/"op_overhead_us": 0, "placement": ["tp","tp","ep","dp","pp"]/'
expect_exit 2 "a placement naming tp twice" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "each of tp, cp, ep, dp, pp exactly once"
hwfile 's/"matmul": 1,/"matmul": 1.5,/'
expect_exit 2 "an efficiency above 1" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "in (0, 1]"
head -c 200 models/hardware/h100-sxm.json > "$TMP/hw.json"
expect_exit 2 "a truncated file" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "hw.json"
expect_exit 2 "--time without training passes" "$LOOM" ir models/gpt2-tiny.json --time
expect_stderr_contains "--passes=train"
finish
