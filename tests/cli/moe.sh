# tests/cli/moe.sh — mixture of experts (Mixtral, Qwen3-MoE) and expert parallelism.
#   - equivalence: every layout trains the golden run spec (batch 4, 5 steps, grad_accum 2,
#     clipping) within 1e-5 of the single-rank run, on the cpu backend: ep=2, ep=4,
#     dp=2 x ep=2 with ZeRO-1, ep=2 x tp=2 (and with sequence parallel), tp=2 with sequence
#     parallel and cp=2 (the experts on the rank's share of the sequence: passes/shard_rows.c),
#     for mixtral-tiny (4 experts, top-2) and qwen3-moe-tiny (8 experts, a dense layer, q/k norms);
#   - under sequence or context parallelism each rank runs the experts on its own tokens only:
#     a rank's FLOPs are half the step's at tp=2 (sp) and at cp=2;
#   - the expert-parallel program: all_to_allv in `--collectives`, the experts' stacks split;
#   - --flops: active-parameter FLOPs (6 x active parameters x tokens);
#   - capacity_factor: drops tokens, trains, and is a different model (the loss moves);
#   - refusals: ep not dividing the experts, a dense model with ep, top-k above the experts,
#     unknown router settings, a sliding window shorter than seq;
#   - pipeline parallelism with experts: schedules of 2 and 4 chunks (with ep too) within 1e-5
#     of one rank, with and without the load-balancing loss (whose gradient is relayed down the
#     backward); --log-experts the same counts.
# usage: bash tests/cli/moe.sh PATH-TO-LOOM PATH-TO-ST_DIFF   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

for m in mixtral-tiny qwen3-moe-tiny; do
  G=tests/golden/$m
  BASE=($G/train_spec.json --batch 4 --steps 5 -q)
  expect_exit 0 "$m: one rank, batch 4, 5 steps" "$LOOM" train "${BASE[@]}" --out "$TMP/$m.1.safetensors"
  layouts=("ep=2" "ep=4" "dp=2,ep=2 --zero 1" "ep=2,tp=2" "tp=2 --sequence-parallel true")
  [ $m = mixtral-tiny ] && layouts+=("ep=2,tp=2 --sequence-parallel true" "dp=2,ep=2 --zero 3" "cp=2,ep=2")
  [ $m = qwen3-moe-tiny ] && layouts+=("cp=2" "cp=2,tp=2 --sequence-parallel true")
  for mesh in "${layouts[@]}"; do
    # shellcheck disable=SC2086
    expect_exit 0 "$m --mesh $mesh" "$LOOM" train "${BASE[@]}" --mesh $mesh --out "$TMP/$m.m.safetensors"
    expect_exit 0 "  within 1e-5 of one rank (parameters, losses, grad norms)" "$ST_DIFF" "$TMP/$m.m.safetensors" \
      "$TMP/$m.1.safetensors" --rtol 1e-5
  done
done

# The sequence split over both tp (sp) and cp, one sequence a dp rank: the rows are merged on
# two axes, and a replicated operand (the dispatch's weights) is split in their order on both
# (it was split along the batch on the second axis: a rank of 0 rows, refused by moe_dispatch).
G=tests/golden/mixtral-tiny
expect_exit 0 "mixtral-tiny, batch 2, one rank" "$LOOM" train $G/train_spec.json --batch 2 --steps 3 -q --out "$TMP/b2.1.st"
expect_exit 0 "mixtral-tiny, batch 2, dp=2 x tp=4 (sp) x cp=2" "$LOOM" train $G/train_spec.json --batch 2 --steps 3 -q \
  --mesh dp=2,tp=4,cp=2 --sequence-parallel true --out "$TMP/b2.m.st"
expect_exit 0 "  within 1e-5 of one rank" "$ST_DIFF" "$TMP/b2.m.st" "$TMP/b2.1.st" --rtol 1e-5

# Pipeline parallelism with experts (4 layers of mixtral-tiny; 8 sequences in 4 micro-batches).
# The load-balancing loss sums every layer's routing at the loss, so its backward reads the
# routing counts of every layer, summed in the last chunk, in every chunk: values the pipeline
# pass relays down the backward, chunk by chunk (passes/pipeline_chunks.c; it refused any value
# crossing more than one boundary before). Without the loss (the published configs'
# "output_router_logits": false) there is nothing to relay. The expert load of each layer is
# counted on the pp rank that runs it (ir/schedule.c: the state's owner).
"$LOOM" data data/shakespeare.txt -o "$TMP/pp.bin" > /dev/null 2>&1
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 4/' models/mixtral-tiny.json > "$TMP/mx4.json"
sed 's/"output_router_logits": true/"output_router_logits": false/' "$TMP/mx4.json" > "$TMP/mx4-noaux.json"
PPRUN=(--data "$TMP/pp.bin" --steps 3 --batch 8 --grad-accum 4 --log-experts)
for cfg in mx4 mx4-noaux; do
  "$LOOM" train "$TMP/$cfg.json" "${PPRUN[@]}" --out "$TMP/$cfg.1.st" > "$TMP/$cfg.1.log" 2>&1
  check "$cfg: one rank" test -s "$TMP/$cfg.1.st"
  if [ $cfg = mx4 ]; then layouts=("pp=2 --pp-schedule 1f1b" "pp=2,ep=2 --pp-schedule zb-h1" "pp=4 --pp-schedule 1f1b"
                                   "pp=2 --pp-schedule interleaved" "pp=2,ep=2 --pp-schedule dualpipev")
  else layouts=("pp=2 --pp-schedule interleaved" "pp=4 --pp-schedule zb-h1"); fi
  for mesh in "${layouts[@]}"; do
    # shellcheck disable=SC2086
    expect_exit 0 "$cfg --mesh $mesh" "$LOOM" train "$TMP/$cfg.json" "${PPRUN[@]}" --mesh $mesh --out "$TMP/$cfg.m.st"
    grep -E '^  experts l' "$OUT" > "$TMP/$cfg.m.loads"
    expect_exit 0 "  within 1e-5 of one rank" "$ST_DIFF" "$TMP/$cfg.m.st" "$TMP/$cfg.1.st" --rtol 1e-5
    check "  the same expert load per layer as one rank ($(wc -l < "$TMP/$cfg.m.loads") lines)" \
      sh -c "test -s '$TMP/$cfg.m.loads' && grep -E '^  experts l' '$TMP/$cfg.1.log' | cmp -s - '$TMP/$cfg.m.loads'"
  done
done

# A compiled executable of the ep=2 layout trains the golden run (the program, its experts'
# stacks in the hub's names, the expert load).
expect_exit 0 "loom compile --mesh ep=2" "$LOOM" compile tests/golden/mixtral-tiny/train_spec.json --mesh ep=2 -o "$TMP/trainer"
expect_exit 0 "  ./trainer --log-experts" "$TMP/trainer" --out "$TMP/ct.safetensors" --log-experts
expect_stdout_contains "experts l1    71 49 74 62 | max/mean 1.16"
expect_exit 0 "  within 1e-5 of PyTorch's 3 steps" "$ST_DIFF" "$TMP/ct.safetensors" tests/golden/mixtral-tiny/train.safetensors \
  --rtol 1e-5

# Recomputation does not change the bits (the MoE ops are cloned like the rest), on one rank
# and on ep=2.
for mesh in "" "--mesh ep=2"; do
  # shellcheck disable=SC2086
  expect_exit 0 "mixtral-tiny ${mesh:-one rank}, recompute none" "$LOOM" train tests/golden/mixtral-tiny/train_spec.json -q \
    $mesh --out "$TMP/rc.none.safetensors"
  for rc in selective full; do
    # shellcheck disable=SC2086
    expect_exit 0 "mixtral-tiny ${mesh:-one rank}, recompute $rc" "$LOOM" train tests/golden/mixtral-tiny/train_spec.json -q \
      $mesh --recompute $rc --out "$TMP/rc.$rc.safetensors"
    expect_exit 0 "  bitwise equal to none" "$ST_DIFF" "$TMP/rc.$rc.safetensors" "$TMP/rc.none.safetensors" --rtol 0
  done
done

# Full recomputation of a mixture of experts runs each layer again in the backward only: the
# experts' load counted into state (moe_load.l<N>, off the loss's path, in the forward) reads
# the forward's values where it stands. It used to pull every layer's clones into the forward,
# kept to the backward: the arena grew by a layer's activations a layer (mixtral-8x7B dp=8 ep=8
# full: 6.5 GiB a layer). So: no clone before the loss, and the activations kept by 8 layers
# under full within a few KiB of 2 layers' (each keeps its input: 64 tokens x 64 x 4 bytes).
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 8/' models/mixtral-tiny.json > "$TMP/mixtral-8l.json"
expect_exit 0 "loom ir --recompute full (mixtral-tiny, 8 layers)" "$LOOM" ir "$TMP/mixtral-8l.json" --passes=train --recompute full
check "  every clone after the loss (in the backward)" awk '/func @grad_step/{g=1} g && /= cross_entropy /{s=1} g && /%rc\./ && !s{bad=1} g && /^  }/{exit} END{exit bad || !s}' "$OUT"
act_bytes() { "$LOOM" ir "$1" --passes=train,lower --recompute full --memory 2> /dev/null | grep "@grad_step" | sed -E 's/.*activations ([0-9.]+) KiB.*/\1/'; }
a2=$(act_bytes models/mixtral-tiny.json); a8=$(act_bytes "$TMP/mixtral-8l.json")
check "  activations kept under full: 8 layers ($a8 KiB) within 6 layers' inputs of 2 layers' ($a2 KiB)" \
  awk -v a="$a2" -v b="$a8" 'BEGIN{exit !(a > 0 && b > 0 && b - a <= 6 * 16 + 1)}'

# and what the plan says is what the cpu backend uses: planned arena = measured under full.
"$LOOM" data data/shakespeare.txt -o "$TMP/d.bin" > /dev/null 2>&1
expect_exit 0 "mixtral-tiny --recompute full --verbose" "$LOOM" train models/mixtral-tiny.json --data "$TMP/d.bin" --steps 2 \
  --recompute full --verbose
check "  planned arena = measured" sh -c "grep '^memory @grad_step:' '$OUT' '$ERR' | sed -E 's/.*planned arena ([0-9]+) bytes, measured ([0-9]+) .*/\\1 \\2/' | awk '{n++; ok = \$1 > 0 && \$1 == \$2} END {exit !(n == 1 && ok)}'"

# Under sequence parallelism (and cp) the router and the experts take the rank's own tokens, a
# flattened [B*T/n, D] kept split (shard_rows.c): no rank runs another's tokens through its
# experts. Before, the tokens were gathered first and each tp rank ran the whole micro-batch
# (mixtral-tiny tp=2 sp: 37,945,344 FLOPs a rank, where the step is 47,382,528).
flops_of() { "$LOOM" ir models/mixtral-tiny.json --passes=train "$@" --flops 2> /dev/null | awk '/@grad_step/{print $2}'; }
f1=$(flops_of); ftp=$(flops_of --mesh tp=2 --sequence-parallel true); fcp=$(flops_of --mesh cp=2)
check "  a rank's FLOPs at tp=2 sp ($ftp) and cp=2 ($fcp) are half the step's ($f1)" \
  awk -v a="$f1" -v b="$ftp" -v c="$fcp" 'BEGIN{exit !(a > 0 && 2 * b == a && 2 * c == a)}'
expect_exit 0 "loom ir, tp=2 sp" "$LOOM" ir models/mixtral-tiny.json --passes=train --mesh tp=2 --sequence-parallel true
check "  the experts' gradients summed over tp (partial: each rank saw its tokens)" \
  grep -qE 'all_reduce_start [$]grad[.]model[.]layers[.]0[.]block_sparse_moe[.]experts[.]w1 [{]axis="tp"' "$OUT"

# The time model under ep: expert space is sized for the worst case (ep x a rank's rows) but
# balanced routing fills 1/ep of it. all_to_allv moves the rank's own rows each way, and the
# experts' elementwise work is a rank's routed rows (passes/timing.c). Both used to count the
# whole buffer: the exchange back and the expert MLPs' activations ep times too slow. Checked
# by differences, which cancel what does not grow with the tokens (the gradients' reductions,
# latencies, the optimizer): Mixtral-8x7B's shape with 2 layers, seq 4096, bf16, on h100.
sed 's/"num_hidden_layers": [0-9]*/"num_hidden_layers": 2/' models/mixtral-8x7B.json > "$TMP/mx2.json"
tm() { "$LOOM" ir "$TMP/mx2.json" --passes=train --precision bf16 --seq 4096 --time --hw h100 "$@" 2> /dev/null |
       awk -v k="$1" '$1 == "comm" && $2 == "ep" {print $4} $1 == "elementwise" {print $2}' | tr '\n' ' '; }
read -r e1 <<< "$(tm --batch 1 | awk '{print $1}')"; read -r e2 <<< "$(tm --batch 2 | awk '{print $1}')"
read -r w8 c8 <<< "$(tm --batch 8 --mesh ep=8)"; read -r w16 c16 <<< "$(tm --batch 16 --mesh ep=8)"
# 8 all_to_allv a micro-batch (2 layers x 4), each (ep-1) steps of S/ep at 450 GB/s, S = one
# sequence's 4096 tokens x top-2 x 4096 x 2 bytes: another sequence a rank adds 1.044 ms
check "  all_to_allv: a sequence more a rank adds $(awk -v a="$c8" -v b="$c16" 'BEGIN{printf "%.3f", b - a}') ms of ep time (balanced: 1.044)" \
  awk -v a="$c8" -v b="$c16" 'BEGIN{x = 8 * 7 * (4096 * 2 * 4096 * 2 / 8) / 450e9 * 1e3; d = b - a; exit !(d > 0.99 * x && d < 1.01 * x)}'
check "  the experts' elementwise work: a sequence more a rank costs at ep=8 what it costs one rank ($e1 -> $e2 ms; $w8 -> $w16 ms)" \
  awk -v a="$e1" -v b="$e2" -v c="$w8" -v d="$w16" 'BEGIN{x = b - a; y = d - c; exit !(x > 0 && y > 0.99 * x && y < 1.01 * x)}'

# The planner searches ep for a mixture of experts (with dp, tp, cp and pp).
expect_exit 0 "loom plan mixtral-tiny on 4 devices" "$LOOM" plan models/mixtral-tiny.json --gpus 4 --hw h100 \
  --global-batch-tokens 256 --json
check "  candidates with ep=2 among the best" grep -q '"ep": 2' "$OUT"
check "  pipelines among them" grep -q '"pp": 2' "$OUT"
expect_exit 0 "loom plan --mesh ep=4" "$LOOM" plan models/mixtral-tiny.json --gpus 4 --hw h100 --global-batch-tokens 256 \
  --mesh ep=4 --json
check "  every layout it ranks has ep=4" sh -c "grep -q '\"ep\": 4' '$OUT' && ! grep -qE '\"ep\": [123],' '$OUT'"

# The per-rank program of ep=2: rows to the experts' ranks and back, experts split.
expect_exit 0 "loom ir --mesh ep=2" "$LOOM" ir models/mixtral-tiny.json --passes=train --mesh ep=2
cat "$OUT" "$ERR" > "$TMP/ep.ir"
check "  the experts' stacks split over ep: 2 of 4 experts a rank" grep -q "experts.w1 : f32\[2,96,64\]<ep:s0>" "$TMP/ep.ir"
check "  rows to the experts' ranks and back: 8 all_to_allv (2 layers x forward, back, and the backward's pair)" \
  test "$(grep -c '= all_to_allv' "$TMP/ep.ir")" -ge 8
expect_exit 0 "loom ir --mesh ep=2 --collectives" "$LOOM" ir models/mixtral-tiny.json --passes=train --mesh ep=2 --collectives
expect_stdout_contains "all_to_allv"

# Active-parameter FLOPs: mixtral-tiny has 115,200 matmul parameters active per token (the
# LM head, attention, the router, 2 of 4 experts), 64 tokens: 6 x 115200 x 64 = 44,236,800.
expect_exit 0 "loom ir --flops (mixtral-tiny)" "$LOOM" ir models/mixtral-tiny.json --passes=train --flops
check "  matmul FLOPs of a step = 6 x active parameters x tokens" grep -q "matmul 4.424e-05" "$OUT" "$ERR"
# Per rank under ep=2 with a capacity: half of that (balanced routing: a rank's experts get as
# many rows as it sends), though its expert-space buffers hold E x capacity rows (80, not 64).
expect_exit 0 "loom ir --flops --mesh ep=2 --capacity-factor 1.25" "$LOOM" ir models/mixtral-tiny.json --passes=train \
  --flops --mesh ep=2 --capacity-factor 1.25
check "  per-rank matmul FLOPs half the step's" grep -q "matmul 2.212e-05" "$OUT" "$ERR"

# capacity_factor: GShard-style drops (a different model than Hugging Face's dropless one).
expect_exit 0 "capacity_factor 0.5 trains" "$LOOM" train tests/golden/mixtral-tiny/train_spec.json -q \
  --capacity-factor 0.5 --out "$TMP/cap.safetensors"
expect_exit 1 "  and changes the result (tokens were dropped)" "$ST_DIFF" "$TMP/cap.safetensors" \
  tests/golden/mixtral-tiny/train.safetensors --rtol 1e-3 --only losses

# The expert load: the golden forward's batch routes 43 26 30 29 tokens to layer 0's experts
# and 25 30 40 33 to layer 1's (PyTorch: router.l<N>.tokens_per_expert); one step on that
# batch reports them, on one rank and on ep=2 (gathered), and in the metrics log.
for mesh in "" "--mesh ep=2 --batch 2"; do
  # shellcheck disable=SC2086
  expect_exit 0 "--log-experts ${mesh:-(one rank)}" "$LOOM" train tests/golden/mixtral-tiny/train_spec.json --steps 1 \
    --grad-accum 1 --data tests/golden/mixtral-tiny/tokens.bin --log-experts --log "$TMP/x.jsonl" $mesh
  expect_stdout_contains "experts l0    43 26 30 29 | max/mean 1.34"
  expect_stdout_contains "experts l1    25 30 40 33 | max/mean 1.25"
  expect_stdout_contains "| experts max/mean 1.34"
  check "  the metrics log has expert_load" grep -q '"expert_load":\[\[43,26,30,29\],\[25,30,40,33\]\]' "$TMP/x.jsonl"
done

# Refusals.
expect_exit 2 "ep=3 with 4 experts" "$LOOM" train models/mixtral-tiny.json --mesh ep=3
expect_stderr_contains "choose an ep that divides 4"
expect_exit 2 "ep=2 with a dense model" "$LOOM" train models/llama-tiny.json --mesh ep=2
expect_stderr_contains "dense"
expect_exit 2 "ep=4 with batch 2 (the batch splits over dp x ep)" "$LOOM" train models/mixtral-tiny.json --mesh ep=4
expect_stderr_contains "does not split over dp x ep = 4"
for edit in 's/"num_experts_per_tok": 2/"num_experts_per_tok": 5/|each token goes to 5 experts but a layer has only 4' \
            's/"router_jitter_noise": 0.0/"router_jitter_noise": 0.1/|router_jitter_noise' \
            's/"router_jitter_noise": 0.0/"scoring_func": "sigmoid"/|scoring_func' \
            's/"sliding_window": null/"sliding_window": 16/|window of 16 tokens'; do
  sed "${edit%%|*}" models/mixtral-tiny.json > "$TMP/bad.json"
  expect_exit 2 "refused: ${edit#*|}" "$LOOM" train "$TMP/bad.json"
  expect_stderr_contains "${edit#*|}"
done
# qwen3-moe-tiny: its dense middle layer puts two chunks between the sparse layers' sums
# (relayed up the forward too)
QG=tests/golden/qwen3-moe-tiny/train_spec.json
"$LOOM" train $QG --batch 4 --steps 3 -q --out "$TMP/q.1.st" 2> /dev/null
for sched in 1f1b zb-h1; do
  expect_exit 0 "qwen3-moe-tiny --mesh pp=3 --pp-schedule $sched" "$LOOM" train $QG --batch 4 --steps 3 -q --mesh pp=3 \
    --pp-schedule $sched --out "$TMP/q.m.st"
  expect_exit 0 "  within 1e-5 of one rank" "$ST_DIFF" "$TMP/q.m.st" "$TMP/q.1.st" --rtol 1e-5
done
expect_exit 0 "verify-collectives proves the relays' sends and receives match (qwen3-moe-tiny pp=3 zb-h1)" "$LOOM" ir $QG \
  --passes=train,verify-collectives --mesh pp=3 --pp-schedule zb-h1 --batch 4
expect_exit 0 "the relays of the load-balancing loss in the IR (pp=4)" "$LOOM" ir "$TMP/mx4.json" --passes=train --mesh pp=4 \
  --batch 8 --grad-accum 4
check "  chunk 1's backward receives from chunk 2 and sends on to chunk 0 more values than without the loss" sh -c "
  n() { awk '/func @bwd.c1\(/{f=1} f && /= recv /{r++} f && /^    send /{s++} f && /^  }/{print r + s; exit}' \"\$1\"; }
  a=\$(n '$OUT'); '$LOOM' ir '$TMP/mx4-noaux.json' --passes=train --mesh pp=4 --batch 8 --grad-accum 4 > '$TMP/noaux.ir' 2>&1
  b=\$(n '$TMP/noaux.ir'); test -n \"\$a\" && test -n \"\$b\" && test \"\$a\" -gt \"\$b\""
expect_exit 0 "loom plan --mesh cp=2 (context parallelism with experts)" "$LOOM" plan models/mixtral-tiny.json --gpus 4 \
  --hw h100 --global-batch-tokens 256 --mesh cp=2 --json
check "  every layout it ranks has cp=2" sh -c "grep -q '\"cp\": 2' '$OUT' && ! grep -qE '\"cp\": 1,' '$OUT'"

finish
