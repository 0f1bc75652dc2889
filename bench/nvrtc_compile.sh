#!/usr/bin/env bash
# bench/nvrtc_compile.sh — NVRTC compile of GPT-2 124M and the Llama-1B shape (bf16, sm_90a)
# with an empty cache (cold) and again (warm), through `loom compile --backend cuda --arch`
# (no GPU needed; NVRTC must be installed).  Issue 32's targets: cold under 2 s on a 2-core
# machine, warm under 0.1 s.
#
# For each model it prints the wall time loom reports (lowering + NVRTC), the CPU seconds
# the whole `loom compile` used (its model building, lowering and writing included), and
# from LOOM_NVRTC_REPORT the busiest NVRTC thread's.  On a machine shared with other work the
# wall time is inflated by the load (printed); the idle-machine estimate is loom's CPU time
# outside NVRTC plus the busiest NVRTC thread's: the wall time with the cores to itself.  BASELINE=1 also times the single program of before (LOOM_NVRTC_SPLIT=0).
# Variables: LOOM (default build/loom), ARCH (sm_90a), MODELS ("models/gpt2-124M.json:16:1024 ...").
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
ARCH=${ARCH:-sm_90a}
MODELS=${MODELS:-models/gpt2-124M.json:16:1024 models/llama-1B.json:4:2048}
[ -x "$LOOM" ] || { echo "bench/nvrtc_compile.sh: $LOOM is missing: build loom first"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
run() {   # label cache extra-env...
  local label=$1 cache=$2; shift 2
  env "$@" LOOM_CACHE_DIR="$cache" LOOM_NVRTC_REPORT=1 /usr/bin/time -f 'cpu %U %S' -o "$tmp/time" "$LOOM" compile "$spec" --backend cuda --arch "$ARCH" \
    --precision bf16 --batch "$B" --seq "$T" -o "$tmp/exe" > "$tmp/out" 2> "$tmp/err" || { echo "FAIL: $label"; cat "$tmp/out" "$tmp/err"; return 1; }
  local wall busy total progs cpu
  wall=$(sed -n 's/^cuda: .* in \([0-9.]*\) s (.*/\1/p' "$tmp/out")
  progs=$(sed -n 's/^cuda: .* s (\([0-9]*\) programs\{0,1\}).*/\1/p' "$tmp/out")
  busy=$(sed -n 's/.*the busiest thread \([0-9.]*\) CPU s/\1/p' "$tmp/err")
  total=$(sed -n 's/.*: \([0-9.]*\) CPU s in all.*/\1/p' "$tmp/err")
  cpu=$(awk '/^cpu/ {printf "%.2f", $2 + $3}' "$tmp/time")
  # on an idle machine: loom's own CPU time outside NVRTC, then the busiest thread's
  local idle
  idle=$(awk -v c="$cpu" -v t="${total:-}" -v b="${busy:-}" 'BEGIN { if (t == "") print "-"; else printf "%.2f", c - t + b }')
  printf '  %-40s %6s s wall  %2s program(s)  %5s CPU s  busiest NVRTC thread %5s CPU s  idle-machine estimate %5s s\n' \
    "$label" "$wall" "${progs:-1}" "$cpu" "${busy:--}" "$idle"
  [ -n "${VERBOSE:-}" ] && grep '^nvrtc: program' "$tmp/err" | sed 's/^/    /'
  return 0
}
for m in $MODELS; do
  IFS=: read -r spec B T <<< "$m"
  echo "$spec (bf16, batch $B x seq $T, $ARCH):"
  rm -rf "$tmp/c"
  run "cold (an empty cache)" "$tmp/c" || continue
  run "warm (the same again)" "$tmp/c"
  if [ -n "${BASELINE:-}" ]; then
    rm -rf "$tmp/c1"
    run "cold, one program (LOOM_NVRTC_SPLIT=0)" "$tmp/c1" LOOM_NVRTC_SPLIT=0
  fi
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
