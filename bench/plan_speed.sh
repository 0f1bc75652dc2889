#!/usr/bin/env bash
# bench/plan_speed.sh — the planner's own speed on the issue's two targets: Llama-1B on 8
# H100s (target 0.5 s) and Llama-3-70B on 4096 H100s (target 5 s), bf16, the specs' global
# batch (1B: 1M tokens).  Runs each RUNS times (default 3) and prints every wall time, their
# median and the plan's best layout (the first run also warms the page cache).
# usage: bash bench/plan_speed.sh [BUILD_DIR]      (LOOM_THREADS=1 for one core; RUNS=N)
BUILD=${1:-build}
LOOM=$BUILD/loom
RUNS=${RUNS:-3}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $(date -u +%F)"
for run in "models/llama-1B.json --gpus 8 --global-batch-tokens 1048576" "models/llama3-70B.json --gpus 4096"; do
  times=()
  for k in $(seq "$RUNS"); do
    start=$(date +%s.%N)
    out=$("$LOOM" plan $run --hw h100 --precision bf16 --top 1 2> /dev/null)
    rc=$?
    times+=("$(echo "$(date +%s.%N) - $start" | bc)")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  best=$(echo "$out" | awk '$1 == "1" { $1 = ""; print }' | cut -c1-70)
  printf "%-42s median %5.2f s  (runs: %s; rc %d)  best: %s\n" "loom plan $(echo $run | cut -d' ' -f1,3)" "$median" \
    "$(printf '%.2f ' "${times[@]}" | sed 's/ $//')" $rc "$best"
done
