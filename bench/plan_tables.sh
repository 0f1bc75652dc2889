#!/usr/bin/env bash
# bench/plan_tables.sh — `loom plan` for the shipped models on N devices of every hardware
# description, with the planner's own time: what docs/planning.md shows.
# usage: bash bench/plan_tables.sh [BUILD_DIR] [GPUS...]   (default GPUS: 8 64; LIMIT=seconds a plan;
#        ONLY=REGEX: the specs whose line matches it, e.g. ONLY='mixtral|qwen3')
BUILD=${1:-build}; shift
GPUS=${*:-8 64}
LIMIT=${LIMIT:-300}
LOOM=$BUILD/loom
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $(date -u +%F)"
for spec in "models/gpt2-124M.json --seq 1024 --global-batch-tokens 524288" \
            "models/llama-1B.json --seq 2048 --global-batch-tokens 1048576" \
            "models/mixtral-8x7B.json --seq 4096 --global-batch-tokens 4194304" \
            "models/mixtral-8x7B.json --seq 4096 --global-batch-tokens 4194304 --capacity-factor 1.25" \
            "models/qwen3-30B-A3B.json --seq 4096 --global-batch-tokens 4194304"; do
  [ -n "${ONLY:-}" ] && ! echo "$spec" | grep -qE "$ONLY" && continue
  for n in $GPUS; do
    for hw in h100 h200 a100 b200; do
      echo
      echo "### $(echo $spec | cut -d' ' -f1)$(echo "$spec" | grep -o ' --capacity-factor [0-9.]*') on $n x $hw"
      echo '```'
      echo "\$ loom plan $spec --gpus $n --hw $hw --precision bf16 --top 5"
      start=$(date +%s.%N)
      timeout "$LIMIT" "$LOOM" plan $spec --gpus $n --hw $hw --precision bf16 --top 5 2> "${TMPDIR:-/tmp}/plan_tables.err"
      rc=$?
      grep '^loom: error' "${TMPDIR:-/tmp}/plan_tables.err"   # a plan that has no layout says why
      [ $rc = 124 ] && echo "(stopped after $LIMIT s: the planner is not fast enough for this yet)"
      echo "# planner wall time: $(echo "$(date +%s.%N) - $start" | bc) s"
      echo '```'
    done
  done
done
