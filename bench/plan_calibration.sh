#!/usr/bin/env bash
# bench/plan_calibration.sh — the time model (passes/timing.c) against measured CPU steps.
# 1. `loom calibrate` describes this CPU from microbenchmarks (one device = one rank with one
#    thread); nothing is fitted to the runs below.
# 2. For each layout of the CPU bench model (models/bench-gpt2-small.json, f32, ranks as
#    threads, one thread a rank): the predicted step (`loom ir --passes=train,lower --time
#    --hw cpu.json`) and the measured one (`loom train --backend cpu`, median ms/step of the
#    steps after the first).
# 3. The relative error of each, its mean absolute value, and Spearman's rank correlation.
# usage: bash bench/plan_calibration.sh [BUILD_DIR] [STEPS]      (about 3 minutes on 2 cores)
BUILD=${1:-build}
STEPS=${2:-4}
LOOM=$BUILD/loom
SPEC=${SPEC:-models/bench-gpt2-small.json}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null
"$LOOM" calibrate -o "$tmp/cpu.json" || exit 1
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $SPEC, $STEPS steps a layout"
# name|flags (the same for loom ir and loom train)
layouts=(
  "1 rank, batch 8|--batch 8"
  "1 rank, batch 4|--batch 4"
  "1 rank, batch 4 x grad_accum 2|--batch 4 --grad-accum 2"
  "1 rank, seq 128|--batch 8 --seq 128"
  "dp=2|--batch 8 --mesh dp=2"
  "dp=2 ZeRO-1|--batch 8 --mesh dp=2 --zero 1"
  "dp=2 ZeRO-2|--batch 8 --mesh dp=2 --zero 2"
  "dp=2 ZeRO-3|--batch 8 --mesh dp=2 --zero 3"
  "tp=2|--batch 8 --mesh tp=2"
  "tp=2 sp|--batch 8 --mesh tp=2 --sequence-parallel true"
  "pp=2 1f1b, grad_accum 4|--batch 2 --grad-accum 4 --mesh pp=2 --pp-schedule 1f1b"
  "pp=2 afab, grad_accum 4|--batch 2 --grad-accum 4 --mesh pp=2 --pp-schedule afab"
  "pp=2 zb-h1, grad_accum 4|--batch 2 --grad-accum 4 --mesh pp=2 --pp-schedule zb-h1"
)
printf "%-30s %12s %12s %8s\n" layout predicted_ms measured_ms error
: > "$tmp/pairs"
for l in "${layouts[@]}"; do
  name=${l%%|*}; flags=${l#*|}
  world=1; [[ $flags == *--mesh* ]] && world=2
  pred=$("$LOOM" ir "$SPEC" --passes=train,lower --time --hw "$tmp/cpu.json" $flags 2>&1 | awk '$1 == "step" { print $2 }')
  "$LOOM" train "$SPEC" --data "$tmp/d.bin" --steps "$STEPS" --backend cpu --threads $world $flags > "$tmp/log" 2>&1 ||
    { echo "$name: loom train failed"; tail -3 "$tmp/log"; continue; }
  meas=$(grep '^step' "$tmp/log" | tail -n +2 | awk '{ for (i = 1; i < NF; i++) if ($(i+1) == "ms") { print $i; break } }' | sort -n |
         awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  [ -z "$pred" ] || [ -z "$meas" ] && { echo "$name: no figure (pred '$pred', measured '$meas')"; continue; }
  printf "%-30s %12.1f %12.1f %+7.1f%%\n" "$name" "$pred" "$meas" "$(echo "$pred $meas" | awk '{ print ($1 / $2 - 1) * 100 }')"
  echo "$pred $meas" >> "$tmp/pairs"
done
python3 - "$tmp/pairs" <<'PY'
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i]); r = [0.0] * len(xs); i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
p, m = [r[0] for r in rows], [r[1] for r in rows]
rp, rm = ranks(p), ranks(m)
n = len(rows); mp, mm = sum(rp) / n, sum(rm) / n
cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
sd = (sum((a - mp) ** 2 for a in rp) * sum((b - mm) ** 2 for b in rm)) ** 0.5
err = sum(abs(a / b - 1) for a, b in rows) / n
print(f"{n} layouts: mean |error| {err * 100:.1f}%, Spearman rank correlation {cov / sd if sd else float('nan'):.3f}")
PY
