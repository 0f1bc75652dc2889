#!/usr/bin/env bash
# bench/overlap_step.sh — the overlap pass on the cpu backend: the bench model with
# --mesh dp=2 --zero 3 (two ranks, each a thread with one compute thread of its own, plus its
# communication thread when overlapped), with --overlap false and --overlap true.  Prints,
# for each: ms per step and the exposed communication (the time a rank's thread was blocked
# on collectives, mean over ranks), both the median of the steps after the first; and checks
# that the two runs' losses are the same bits.
# usage: bash bench/overlap_step.sh [BUILD_DIR] [STEPS]
#        MODEL=models/gpt2-tiny.json ZERO=1 THREADS=4 bash bench/overlap_step.sh build 10
BUILD=${1:-build}
STEPS=${2:-6}
MODEL=${MODEL:-models/bench-gpt2-small.json}
ZERO=${ZERO:-3}
THREADS=${THREADS:-2}
LOOM=$BUILD/loom
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null || exit 1
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "na"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "$MODEL, --mesh dp=2 --zero $ZERO, --threads $THREADS ($((THREADS / 2)) compute thread(s) a rank), cpu backend, $STEPS steps"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
printf "%-10s %12s %22s %10s\n" overlap ms/step "exposed comm ms/step" "% of step"
for o in false true; do
  "$LOOM" train "$MODEL" --data "$tmp/d.bin" --steps "$STEPS" --mesh dp=2 --zero "$ZERO" --threads "$THREADS" \
    --overlap $o > "$tmp/log-$o" 2>&1 || { echo "overlap $o: failed"; cat "$tmp/log-$o"; exit 1; }
  # step     2/6 | loss ... |   812.3 ms |  2521 tok/s | comm wait 120.4 ms (max 130.1)
  ms=$(grep '^step' "$tmp/log-$o" | tail -n +2 | awk -F'|' '{ v = $5; sub(/ms/, "", v); print v + 0 }' | median)
  cw=$(grep '^step' "$tmp/log-$o" | tail -n +2 | grep -o 'comm wait [0-9.]*' | awk '{ print $3 }' | median)
  pct=$(awk -v a="$cw" -v b="$ms" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "na" }')
  printf "%-10s %12s %22s %10s\n" $o "$ms" "$cw" "$pct"
  grep '^step' "$tmp/log-$o" | awk -F'|' '{ print $2 }' > "$tmp/loss-$o"
done
if cmp -s "$tmp/loss-false" "$tmp/loss-true"; then echo "losses: the same with and without overlap (printed digits)"
else echo "losses DIFFER between the runs:"; paste "$tmp/loss-false" "$tmp/loss-true"; exit 1; fi
