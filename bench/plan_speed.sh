#!/usr/bin/env bash
# bench/plan_speed.sh — the planner's own speed at the batches people train with (issue 34),
# bf16 on H100s: Llama-1B on 8 at 1M tokens (target 0.5 s), Llama-3-70B on 4,096 at 4M tokens
# (target 5 s), Llama-3.1-405B on 16,384 at 16M tokens (target 10 s), and the two mixtures of
# experts on 512 at 4M tokens.  Runs each RUNS times (default 3) and prints every wall time,
# their median, the median CPU time (user + system, all threads: on a machine shared with
# other work the wall time is mostly waiting), the load average before the runs (1 minute)
# and after them (1, 5 and 15 minutes: above the core count, the wall times wait for other work) and the plan's best
# layout (the first run also warms the page cache).
# usage: bash bench/plan_speed.sh [BUILD_DIR] [NAME...]   (NAME: 1B 70B 405B mixtral qwen3; default all)
#        LOOM_THREADS=1 for one core; RUNS=N; LOOM_PLAN_EXHAUSTIVE=1 for the exhaustive search (driver/plan.h)
BUILD=${1:-build}
shift
LOOM=$BUILD/loom
RUNS=${RUNS:-3}
declare -A PLANS=(
  [1B]="models/llama-1B.json --gpus 8 --global-batch-tokens 1048576"
  [70B]="models/llama3-70B.json --gpus 4096 --global-batch-tokens 4194304"
  [405B]="models/llama3-405B.json --gpus 16384 --global-batch-tokens 16777216"
  [mixtral]="models/mixtral-8x7B.json --gpus 512 --seq 4096 --global-batch-tokens 4194304"
  [qwen3]="models/qwen3-30B-A3B.json --gpus 512 --seq 4096 --global-batch-tokens 4194304"
)
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(1B 70B 405B mixtral qwen3)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $(date -u +%F)"
for name in "${NAMES[@]}"; do
  run=${PLANS[$name]}
  [ -z "$run" ] && { echo "unknown plan '$name' (1B 70B 405B mixtral qwen3)" >&2; exit 2; }
  times=() cpus=()
  load0=$(cut -d' ' -f1 /proc/loadavg)
  tf=$(mktemp)
  for k in $(seq "$RUNS"); do
    start=$(date +%s.%N)
    out=$(/usr/bin/time -f '%U %S' -o "$tf" "$LOOM" plan $run --hw h100 --precision bf16 --top 1 2> /dev/null)
    rc=$?
    times+=("$(echo "$(date +%s.%N) - $start" | bc)")
    cpus+=("$(awk 'END {print $1 + $2}' "$tf")")
  done
  rm -f "$tf"
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  cpu=$(printf '%s\n' "${cpus[@]}" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  best=$(echo "$out" | awk '$1 == "1" { $1 = ""; print }' | cut -c1-70)
  printf "%-8s %-62s median %7.2f s, CPU %6.2f s  (runs: %s; rc %d; load %s)  best: %s\n" "$name" "loom plan $run" \
    "$median" "$cpu" "$(printf '%.2f ' "${times[@]}" | sed 's/ $//')" $rc "$load0 -> $(cut -d' ' -f1-3 /proc/loadavg)" "$best"
done
