#!/usr/bin/env bash
# bench/pipeline_step.sh — pipeline schedules, measured against their prediction.
# Every schedule on pp=2 (interleaved with 2 chunks per rank), grad_accum 8, on the
# reference executor (pipelines do not run on the cpu backend yet, so GPT-2 small is out of
# reach: this uses the 4-layer tiny GPT-2 at batch 8 x 64 tokens).  Prints, per schedule:
# ms per step (median of the steps after the first), the predicted bubble with equal unit
# costs, the measured idle / busy of each rank, and the predicted and measured stash peaks.
# usage: bash bench/pipeline_step.sh [BUILD_DIR] [STEPS]
BUILD=${1:-build}
STEPS=${2:-6}
LOOM=$BUILD/loom
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
printf "%-12s %10s %10s %-22s %s\n" schedule ms/step bubble "measured idle/busy" "stash peak predicted / measured (bytes)"
for s in afab 1f1b interleaved zb-h1 dualpipev; do
  extra=(); [ $s = interleaved ] && extra=(--pp-virtual 2)
  "$LOOM" train models/gpt2-tiny-4l.json --data "$tmp/d.bin" --steps "$STEPS" --batch 8 --seq 64 --grad-accum 8 \
    --mesh pp=2 --pp-schedule $s "${extra[@]}" > "$tmp/log" 2>&1 || { echo "$s: failed"; cat "$tmp/log"; continue; }
  ms=$(grep '^step' "$tmp/log" | tail -n +2 | awk '{ for (i = 1; i <= NF; i++) if ($(i+1) == "ms") print $i }' | sort -n |
       awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  bub=$(grep -o 'predicted bubble [0-9.]*' "$tmp/log" | awk '{ print $3 }')
  idle=$(grep -o 'measured idle per rank: [0-9. ]*' "$tmp/log" | sed 's/measured idle per rank: //')
  stash=$(grep '^stash peak' "$tmp/log" | sed 's/.*(bytes): //')
  printf "%-12s %10s %10s %-22s %s\n" $s "$ms" "$bub" "$idle" "$stash"
done
