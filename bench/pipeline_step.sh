#!/usr/bin/env bash
# bench/pipeline_step.sh — pipeline schedules, measured against their prediction.
# Every schedule on pp=2 (interleaved with 2 chunks per rank) on the cpu backend (each rank
# a thread with its own share of the cores), GPT-2 small (124M) by default at batch 1 x 128
# tokens x grad_accum 8.  Prints, per schedule: ms per step (median of the steps after the
# first), the predicted bubble with equal unit costs, the measured idle / busy of each rank,
# and the predicted and measured stash peaks.
# usage: bash bench/pipeline_step.sh [BUILD_DIR] [STEPS]
#        MODEL=models/gpt2-tiny-4l.json BATCH=8 SEQ=64 BACKEND=ref bash bench/pipeline_step.sh
BUILD=${1:-build}
STEPS=${2:-3}
MODEL=${MODEL:-models/gpt2-124M.json}
BATCH=${BATCH:-1}
SEQ=${SEQ:-128}
GA=${GA:-8}
BACKEND=${BACKEND:-cpu}
LOOM=$BUILD/loom
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null
echo "$MODEL, batch $BATCH x seq $SEQ x grad_accum $GA, pp=2, $BACKEND backend, $STEPS steps"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
printf "%-12s %10s %10s %-22s %s\n" schedule ms/step bubble "measured idle/busy" "stash peak predicted / measured (bytes)"
for s in afab 1f1b interleaved zb-h1 dualpipev; do
  extra=(); [ $s = interleaved ] && extra=(--pp-virtual 2)
  "$LOOM" train "$MODEL" --data "$tmp/d.bin" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --grad-accum "$GA" \
    --backend "$BACKEND" --mesh pp=2 --pp-schedule $s "${extra[@]}" > "$tmp/log" 2>&1 || { echo "$s: failed"; cat "$tmp/log"; continue; }
  ms=$(grep '^step' "$tmp/log" | tail -n +2 | awk '{ for (i = 1; i <= NF; i++) if ($(i+1) == "ms") { print $i; break } }' | sort -n |
       awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  bub=$(grep -o 'predicted bubble [0-9.]*' "$tmp/log" | awk '{ print $3 }')
  idle=$(grep -o 'measured idle per rank: [0-9. ]*' "$tmp/log" | sed 's/measured idle per rank: //')
  stash=$(grep '^stash peak' "$tmp/log" | sed 's/.*(bytes): //')
  printf "%-12s %10s %10s %-22s %s\n" $s "$ms" "$bub" "$idle" "$stash"
done
