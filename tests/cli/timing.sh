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

# ep (a mixture of experts; Mixtral-8x7B's shape with 2 layers): the same sum for the ep
# axis, all_to_allv included: the time model and --collectives both count the rank's own rows
# each way (balanced routing), not expert space's worst-case buffer.
sed 's/"num_hidden_layers": [0-9]*/"num_hidden_layers": 2/' models/mixtral-8x7B.json > "$TMP/mx2.json"
"$LOOM" ir "$TMP/mx2.json" --passes=train --precision bf16 --seq 4096 --batch 16 --mesh ep=8 --collectives > "$TMP/coll" 2>&1
"$LOOM" ir "$TMP/mx2.json" --passes=train --precision bf16 --seq 4096 --batch 16 --mesh ep=8 --time > "$TMP/time" 2>&1
check "ep=8: comm ep = sum over --collectives (all_to_allv, all_to_all, all_reduce) of sent/bandwidth + ring steps x latency" \
  awk -v n=8 -v bw=450e9 -v lat=3e-6 '
  FNR == NR { if (($1 == "@grad_step" || $1 == "@optimizer_step") && $3 == "ep") { c = substr($4, 2) + 0;
              steps = ($2 == "all_reduce" ? 2 : 1) * (n - 1); want += $(NF - 1) / bw + c * steps * lat; k[$2] = 1 } next }
  /comm ep/ { seen = 1; got = $4 / 1e3; d = got - want; if (d < 0) d = -d }
  END { if (!seen || !k["all_to_allv"] || d > 1e-6 + 1e-3 * want) { print "got", got, "want", want; exit 1 } }
' "$TMP/coll" "$TMP/time"

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
# per-category efficiencies of the memory-bound ops: norm at 0.5 doubles the norm line and
# adds what it doubled to the step; the other categories keep memory's
hwfile 's/"memory": 1,/"memory": 1, "norm": 0.5,/'
ir --batch 16 --time > "$TMP/time1" 2>&1
ir --batch 16 --time --hw "$TMP/hw.json" > "$TMP/time2" 2>&1
check "efficiency.norm 0.5: the norm ops' time doubles, the step grows by as much, elementwise unchanged" awk '
  FNR == NR { if ($1 == "norm") n1 = $2; if ($1 == "elementwise") e1 = $2; if ($1 == "step") s1 = $2; next }
  { if ($1 == "norm") n2 = $2; if ($1 == "elementwise") e2 = $2; if ($1 == "step") s2 = $2 }
  END { d = n2 - 2 * n1; ds = (s2 - s1) - n1; if (d < 0) d = -d; if (ds < 0) ds = -ds
        exit !(n1 > 0 && d < 0.002 && ds < 0.003 && e1 == e2) }' "$TMP/time1" "$TMP/time2"
hwfile 's/"memory": 1,/"memory": 1, "nrom": 0.5,/'
expect_exit 2 "an unknown efficiency" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "efficiency: unknown key 'nrom'; the keys are matmul, attention, memory, link and the memory-bound categories norm"
hwfile 's/"memory": 1,/"memory": 1, "loss": 0,/'
expect_exit 2 "a zero efficiency" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "in (0, 1]"
# bench/hw_from_profile.py: two LOOM_PROFILE tables (as cost.c prints them) into per-category
# efficiencies, launches-weighted over the tables; a category timed at 0.0% keeps the file's
prof() { printf 'CUDA profile of one step (%s); roofline on NVIDIA H100 SXM5 80GB\n' "$1"
  printf 'category                           launches         ms   TFLOP/s      GB/s roofline\n'
  printf 'gemm                                     %s     10.000     600.0       0.0    %s%%\n' "$2" "$3"
  printf 'norm                                     %s      1.000       0.0    2000.0    %s%%\n' "$4" "$5"
  printf 'copy                                      5      1.000       0.0       0.0     0.0%%\n'
  printf 'total                                    99     12.000       0.0       0.0    50.0%%\n\n'; }
prof a 100 60.0 30 50.0 > "$TMP/prof1"
prof b 300 70.0 10 90.0 > "$TMP/prof2"
if python3 bench/hw_from_profile.py "$TMP/prof1" models/hardware/h100-sxm.json "$TMP/hwp.json" "$TMP/prof2" > "$TMP/conv" 2>&1; then
  check "hw_from_profile: matmul (100 x 0.6 + 300 x 0.7) / 400 = 0.675, norm (30 x 0.5 + 10 x 0.9) / 40 = 0.6, copy kept" \
    python3 -c "import json, sys; e = json.load(open('$TMP/hwp.json'))['efficiency']
sys.exit(not (e['matmul'] == 0.675 and e['norm'] == 0.6 and e['copy' if 'copy' in e else 'memory'] == 1 and 'copy' not in e))"
  expect_exit 0 "loom ir --time takes the measured file" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hwp.json"
else
  check "bench/hw_from_profile.py runs" false; cat "$TMP/conv"
fi
head -c 200 models/hardware/h100-sxm.json > "$TMP/hw.json"
expect_exit 2 "a truncated file" "$LOOM" ir models/gpt2-tiny.json --passes=train --time --hw "$TMP/hw.json"
expect_stderr_contains "hw.json"
expect_exit 2 "--time without training passes" "$LOOM" ir models/gpt2-tiny.json --time
expect_stderr_contains "--passes=train"
finish
