#!/usr/bin/env bash
# tests/cli/plan.sh — `loom plan` (tools/cmd_plan.c, driver/plan*.c): the search over layouts.
#   - every candidate printed fits the device, the table is ranked by predicted step, and a
#     fixed axis (--mesh tp=2) holds in every row;
#   - the planner's memory per rank is memory-plan's for that compiled program: for the best
#     layouts (one rank, dp, tp; ZeRO; recompute) `loom ir --memory` with the same flags gives
#     the same bytes (state + the largest arena of @grad_step and @optimizer_step);
#   - --emit-spec writes a run spec `loom train` runs as it is;
#   - impossible requests (nothing fits, a batch no layout reaches, ep) are refused with the fix;
#   - cp is searched: --mesh cp=2 holds in every row, its memory is memory-plan's, its spec trains;
#   - pruning at a lower bound prints the table the unpruned search prints, and the fast
#     search (layer programs) the exhaustive search's;
#   - MFU counts the model's FLOPs (loom ir --flops), the same for every recomputation; a GPU
#     plan in fp32 because the spec names no precision says so;
#   - the fast search's counts are the same on 1 thread and on 3.
LOOM=$1
. "$(dirname "$0")/lib.sh"
"$LOOM" data data/shakespeare.txt -o "$TMP/d.bin" > /dev/null 2>&1
M=models/gpt2-tiny-4l.json
P=(--gpus 4 --target cpu --precision fp32 --seq 32 --global-batch-tokens 1024)

expect_exit 0 "loom plan on 4 ranks (cpu storage)" "$LOOM" plan $M "${P[@]}" --mesh pp=1 --json
cp "$OUT" "$TMP/plan.json"
check "  the table: ranked by step, every row fits, 10 rows" python3 -c "
import json
t = json.load(open('$TMP/plan.json'))
assert len(t) == 10, len(t)
s = [c['step_s'] for c in t]
assert s == sorted(s), s
assert all(c['memory_bytes'] <= 80e9 for c in t)
assert all(c['dp'] * c['tp'] * c['cp'] * c['pp'] == 4 for c in t)
"
# MFU from the model's FLOPs: every row's MFU is tokens/s/device x the model's FLOPs a token
# over the peak, its FLOPs a token are `loom ir --flops`'s @grad_step over the sequence (batch 1,
# the whole model), the same for every recomputation; HFU (the executed FLOPs) is not below it
"$LOOM" ir $M --passes=train --seq 32 --precision fp32 --batch 1 --flops > "$TMP/flops" 2>&1
check "  MFU = tokens/s/device x loom ir --flops's FLOPs a token / peak, in every row" python3 -c "
import json, re
t = json.load(open('$TMP/plan.json'))
g = [float(l.split()[1]) for l in open('$TMP/flops') if l.strip().startswith('@grad_step')][0]
for c in t:
    assert abs(c['model_flops_per_token'] - g / 32) <= 1e-9 * g, (c['model_flops_per_token'], g / 32)
    want = c['tokens_per_s_per_gpu'] * c['model_flops_per_token'] / c['peak_flops']
    assert abs(c['mfu'] - want) <= 1e-6 * want, (c['mfu'], want)
    assert c['hfu'] >= c['mfu'] * (1 - 1e-4), (c['hfu'], c['mfu'])
"
expect_exit 0 "full recomputation fixed: MFU still counts the model's FLOPs only" "$LOOM" plan $M "${P[@]}" --mesh pp=1 --recompute full --top 2 --json
check "  MFU < HFU with recomputation" python3 -c "
import json; t = json.load(open('$OUT')); assert t and all(c['mfu'] < c['hfu'] * 0.9 for c in t), t"
# a GPU plan in fp32 because the spec names none: one line says so
expect_exit 0 "a spec without precision, planned for a GPU" "$LOOM" plan models/gpt2-tiny.json --gpus 2 --seq 32 --global-batch-tokens 256 --top 1
expect_stderr_contains "names no precision, so this plan is for fp32"
expect_exit 0 "  not with --precision" "$LOOM" plan models/gpt2-tiny.json --gpus 2 --seq 32 --global-batch-tokens 256 --top 1 --precision fp32
check "  no such line" bash -c "! grep -q 'names no precision' '$ERR'"

# the first rows of a plan: their memory against loom ir --memory's with the same flags
check_memory() {   # plan.json rows
  python3 - "$1" "$2" > "$TMP/layouts" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))[:int(sys.argv[2])]:
    print(int(c['memory_bytes']), f"--mesh dp={c['dp']},tp={c['tp']},cp={c['cp']} --zero {c['zero']} --sequence-parallel {str(c['sequence_parallel']).lower()} "
          f"--batch {c['batch']} --grad-accum {c['grad_accum']} --recompute {c['recompute']}")
PY
  while read -r want flags; do
    "$LOOM" ir $M --passes=train,lower --seq 32 --precision fp32 $flags --memory > "$TMP/mem" 2>&1
    got=$(awk '/^  (parameters|gradients|optimizer state|other state) / { gsub(/[()]/, "", $0); for (i = 1; i <= NF; i++) if ($(i+1) == "bytes") s += $i }
               /@(grad_step|optimizer_step) +peak/ { gsub(/[()]/, "", $0); for (i = 1; i <= NF; i++) if ($(i+1) == "bytes" && $i > a) a = $i }
               END { printf "%.0f", s + a }' "$TMP/mem")
    check "  memory of [$flags]: planner $want = memory-plan $got" test "$want" = "$got"
  done < "$TMP/layouts"
}
check_memory "$TMP/plan.json" 5

expect_exit 0 "--mesh tp=2 fixes tp" "$LOOM" plan $M "${P[@]}" --mesh tp=2,pp=1 --json
check "  every row has tp=2" python3 -c "
import json; t = json.load(open('$OUT')); assert t and all(c['tp'] == 2 for c in t)"
cp "$OUT" "$TMP/tp.json"
check_memory "$TMP/tp.json" 3
expect_exit 0 "--mesh cp=2 fixes cp (context parallelism, zigzag ring attention)" "$LOOM" plan $M "${P[@]}" --mesh cp=2,pp=1 --json
check "  every row has cp=2" python3 -c "
import json; t = json.load(open('$OUT')); assert t and all(c['cp'] == 2 and c['dp'] * c['tp'] * 2 == 4 for c in t)"
cp "$OUT" "$TMP/cp.json"
check_memory "$TMP/cp.json" 3
expect_exit 0 "--emit-spec of a cp layout" "$LOOM" plan $M "${P[@]}" --mesh cp=2,pp=1 --top 1 --emit-spec "$TMP/cp-best.json"
check "  the emitted spec has mesh.cp = 2" python3 -c "
import json; assert json.load(open('$TMP/cp-best.json'))['mesh']['cp'] == 2"
expect_exit 0 "  and trains as it is" "$LOOM" train "$TMP/cp-best.json" --data "$TMP/d.bin" --steps 1 -q
expect_exit 0 "ZeRO-3 fixed" "$LOOM" plan $M "${P[@]}" --mesh pp=1 --zero 3 --json
cp "$OUT" "$TMP/z3.json"
check_memory "$TMP/z3.json" 2
expect_exit 0 "--explain 1" "$LOOM" plan $M "${P[@]}" --top 3 --explain 1
expect_stdout_contains "predicted step on"
expect_exit 0 "--emit-spec" "$LOOM" plan $M "${P[@]}" --top 3 --emit-spec "$TMP/best.json"
expect_exit 0 "  the emitted spec trains as it is" "$LOOM" train "$TMP/best.json" --data "$TMP/d.bin" --steps 1 -q
# The two searches (driver/plan.h).  The exhaustive one prunes at a lower bound: candidates
# whose bound exceeds the 2 x top-th best screened step stop after their first compile; its
# table must be the unpruned search's, which LOOM_PLAN_CHECK=1 runs (no pruning, and it aborts
# if a bound exceeds its candidate's step).  The fast one estimates every candidate from its
# layer programs and screens only those that could win: LOOM_PLAN_CHECK=1 runs the exhaustive
# search beside it and fails unless the tables are the same, row for row.
for m in models/gpt2-tiny-4l.json models/llama-tiny-8l.json; do
  Q=(--gpus 8 --target cpu --precision fp32 --seq 32 --global-batch-tokens 2048 --top 3)
  LOOM_PLAN_EXHAUSTIVE=1 expect_exit 0 "$m on 8, exhaustive: pruned" "$LOOM" plan $m "${Q[@]}"
  grep -q 'candidates ([1-9][0-9]* stopped at a lower bound)' "$OUT" && grep -E '^  [0-9] ' "$OUT" > "$TMP/pruned.txt"
  check "  some candidates stopped at their lower bound" test -s "$TMP/pruned.txt"
  LOOM_PLAN_EXHAUSTIVE=1 LOOM_PLAN_CHECK=1 expect_exit 0 "  LOOM_PLAN_CHECK=1 (every bound checked, nothing pruned)" "$LOOM" plan $m "${Q[@]}"
  expect_stdout_contains "(0 stopped at a lower bound)"
  grep -E '^  [0-9] ' "$OUT" > "$TMP/unpruned.txt"
  check "  the same table, row for row" cmp "$TMP/pruned.txt" "$TMP/unpruned.txt"
  LOOM_PLAN_FAST=1 LOOM_PLAN_CHECK=1 expect_exit 0 "  the fast search, checked against the exhaustive one" "$LOOM" plan $m "${Q[@]}"
  expect_stderr_contains "gives the same table"
  expect_stdout_contains "layer programs"
  grep -E '^  [0-9] ' "$OUT" > "$TMP/fast.txt"
  check "  the fast search prints the exhaustive table" cmp "$TMP/fast.txt" "$TMP/unpruned.txt"
done
# the fast search is deterministic: the same candidates, stops and compiles on 1 thread and on 3
# (what a candidate's screening decides reads only final outcomes of those before it)
D=(models/llama-tiny-8l.json --gpus 16 --target cuda --precision bf16 --seq 64 --global-batch-tokens 8192 --top 3)
LOOM_THREADS=1 expect_exit 0 "the fast search on 1 thread" "$LOOM" plan "${D[@]}"
grep 'candidates (' "$OUT" | sed 's/ in [0-9.]* s;//' > "$TMP/t1.txt"
LOOM_THREADS=3 expect_exit 0 "  on 3 threads" "$LOOM" plan "${D[@]}"
grep 'candidates (' "$OUT" | sed 's/ in [0-9.]* s;//' > "$TMP/t3.txt"
check "  the same counts and compiles" sh -c "test -s '$TMP/t1.txt' && cmp '$TMP/t1.txt' '$TMP/t3.txt'"
# off a terminal (a pipe, tee) the progress is whole lines (every 10 s; here every screening)
LOOM_PLAN_PROGRESS_S=0 expect_exit 0 "progress lines under a pipe" "$LOOM" plan models/gpt2-tiny-4l.json --gpus 8 \
  --target cpu --precision fp32 --seq 32 --global-batch-tokens 2048 --top 3
expect_stderr_contains "loom plan: screened 1 of "
check "  whole lines, no carriage return" sh -c "! grep -q \"\$(printf '\\r')\" '$ERR'"
# on the CUDA target in bf16 the screening memo counts the bf16 weight copies of functions it
# did not lower (bare casts) as the whole lowering does
LOOM_PLAN_CHECK=1 expect_exit 0 "cuda bf16, checked (the weight copies of memo-figured functions)" "$LOOM" plan \
  models/gpt2-tiny-4l.json --gpus 8 --target cuda --precision bf16 --seq 32 --global-batch-tokens 2048 --top 3
expect_stderr_contains "gives the same table"
LOOM_PLAN_FAST=1 LOOM_PLAN_CHECK=1 expect_exit 0 "the fast search on 4, 10 rows, checked" "$LOOM" plan $M "${P[@]}" --mesh pp=1
expect_stderr_contains "gives the same table"
LOOM_PLAN_FAST=1 LOOM_PLAN_CHECK=1 expect_exit 0 "the fast search with ZeRO-3 and full recomputation fixed, checked" "$LOOM" plan $M "${P[@]}" --zero 3 --recompute full
expect_stderr_contains "gives the same table"
# a device of 30 MB: most pipelined layouts far out of memory, set aside at a lower bound on
# their memory from the stash the screening compiles (and the references) show, without a
# compile of their own; LOOM_PLAN_CHECK screens each one all the same and aborts if its bound
# is over its screened memory
sed 's/"memory_gb": 80/"memory_gb": 0.03/' models/hardware/h100-sxm.json > "$TMP/small.json"
LOOM_PLAN_DEBUG=1 LOOM_PLAN_CHECK=1 expect_exit 0 "the fast search's stash bounds, checked" "$LOOM" plan \
  models/llama-tiny-8l.json --gpus 8 --hw "$TMP/small.json" --target cuda --precision bf16 --seq 256 --global-batch-tokens 16384 --top 3
expect_stderr_contains "gives the same table"
expect_stderr_matches "set aside at their stash bound: [1-9]"
# dp = 1 with sequence parallelism: its stash bounds come from dp = 2's references (the shard
# pass partitions a batch of one as any batch); each is checked against its screened memory
LOOM_PLAN_DEBUG=4 LOOM_PLAN_CHECK=1 expect_exit 0 "dp=1 x tp=2+sp x pp=4: stash bounds from dp=2's references, checked" "$LOOM" plan \
  models/llama-tiny-8l.json --gpus 8 --mesh dp=1,tp=2,pp=4 --hw "$TMP/small.json" --target cuda --precision bf16 --seq 256 --global-batch-tokens 16384 --top 3
expect_stderr_contains "gives the same table"
expect_stderr_matches "stash bound dp=1 tp=2\+sp pp=4 [a-z0-9 =-]*: 0\.[0-9]*[1-9][0-9]* GiB"
sed 's/"memory_gb": 80/"memory_gb": 0.000001/' models/hardware/h100-sxm.json > "$TMP/tiny.json"
expect_exit 2 "nothing fits a 1 KB device" "$LOOM" plan $M "${P[@]}" --hw "$TMP/tiny.json"
expect_stderr_contains "no layout fits"
expect_stderr_contains "the closest"
check "  no stale hint (recomputation is searched with pp too)" bash -c "! grep -q 'without pp only' '$ERR'"
expect_exit 2 "  with --recompute none fixed: the hint to recompute" "$LOOM" plan $M "${P[@]}" --hw "$TMP/tiny.json" --mesh pp=1 --recompute none
expect_stderr_contains "or --recompute full (fixed here"
expect_exit 2 "a global batch that is not whole sequences" "$LOOM" plan $M --gpus 4 --seq 32 --global-batch-tokens 1000
expect_stderr_contains "use a multiple of 32"
expect_exit 2 "a fixed dp that does not divide" "$LOOM" plan $M --gpus 4 --mesh dp=3
expect_stderr_contains "does not divide --gpus 4"
expect_exit 2 "ep with a dense model" "$LOOM" plan $M --gpus 4 --mesh ep=2
expect_stderr_contains "expert parallelism splits a mixture of experts' experts"
expect_exit 2 "a misspelt flag of plan" "$LOOM" plan $M --gups 4
expect_stderr_contains "unknown option '--gups'; did you mean '--gpus'?"
expect_exit 2 "--gpus is required" "$LOOM" plan $M
expect_stderr_contains "--gpus N is required"
finish
