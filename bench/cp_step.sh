#!/usr/bin/env bash
# bench/cp_step.sh — context parallelism on the cpu backend: llama-tiny (GQA) at sequence
# 1024 (SEQ), batch 2, with --mesh cp=1, cp=2 and cp=4 (ranks as threads sharing THREADS
# threads).  Prints, for each: ms per step, the exposed transfer time (a rank's thread
# blocked in the ring's send/recv and the other collectives, mean over ranks) and its share,
# tokens/s, and the step's planned peak per rank (loom ir --memory); each the median of the
# steps after the first 3.  Also zigzag against contiguous at cp=4.
# usage: bash bench/cp_step.sh [BUILD_DIR] [STEPS]      SEQ=2048 THREADS=2 bash bench/cp_step.sh build 12
BUILD=${1:-build}
STEPS=${2:-12}
SEQ=${SEQ:-1024}
THREADS=${THREADS:-2}
LOOM=$BUILD/loom
SPEC=tests/golden/llama-tiny/train_spec.json
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null || exit 1
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "na"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "llama-tiny, batch 2, sequence $SEQ, grad_accum 1, --threads $THREADS, cpu backend, $STEPS steps (median of steps 4..)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
printf "%-26s %10s %16s %8s %10s %14s\n" mesh ms/step "exposed ms/step" "%" "tok/s" "peak/rank MiB"
for run in "cp=1" "cp=2" "cp=4" "cp=4 contiguous"; do
  mesh=${run%% *} extra=()
  [ "$run" != "$mesh" ] && extra=(--cp-balance contiguous)
  "$LOOM" train $SPEC --data "$tmp/d.bin" --steps "$STEPS" --batch 2 --seq "$SEQ" --grad-accum 1 --mesh "$mesh" \
    --threads "$THREADS" "${extra[@]}" --log "$tmp/log.jsonl" > "$tmp/out" 2>&1 || { echo "$run: failed"; cat "$tmp/out"; exit 1; }
  ms=$(tail -n +4 "$tmp/log.jsonl" | grep -o '"step_ms": *[0-9.e+-]*' | awk -F: '{ print $2 + 0 }' | median)
  cw=$(tail -n +4 "$tmp/log.jsonl" | grep -o '"comm_wait_ms": *[0-9.e+-]*' | awk -F: '{ print $2 + 0 }' | median)
  [ -z "$cw" ] || [ "$cw" = na ] && cw=0
  tok=$(awk -v m="$ms" -v t="$SEQ" 'BEGIN { printf "%.0f", 2 * t / (m / 1000) }')
  pct=$(awk -v a="$cw" -v b="$ms" 'BEGIN { printf "%.1f", 100 * a / b }')
  peak=$("$LOOM" ir models/llama-tiny.json --passes=train,lower --seq="$SEQ" --grad-accum=1 --mesh="$mesh" $([ ${#extra[@]} -gt 0 ] && echo --cp-balance=contiguous) --memory 2>&1 |
         grep '@grad_step' | grep -o '([0-9]* bytes)' | tr -dc 0-9 | awk '{ printf "%.2f", $1 / 1048576 }')
  printf "%-26s %10.1f %16.2f %8s %10s %14s\n" "$run" "$ms" "$cw" "$pct" "$tok" "$peak"
done
