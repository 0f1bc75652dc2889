#!/usr/bin/env bash
# One training step of models/bench-gpt2-small.json on the CPU: PyTorch vs loom, same
# shapes, same thread count.  Prints the ratio torch_ms / loom_ms (> 1: loom faster) for
# each PyTorch baseline:
#   - Debian's python3-torch (1.13 on OpenBLAS), eager: always (SYSTEM_PYTHON);
#   - a current PyTorch from a virtual environment, eager and torch.compile'd, when one is
#     given: PYTHON=/path/to/venv/bin/python bash bench/cpu_step.sh
#
#   bash bench/cpu_step.sh
#
# Environment (all optional):
#   THREADS      threads for both sides (default: CPUs available to this process)
#   STEPS        timed steps (default 10; torch runs WARMUP more first, loom's first step
#                is dropped).  With loom's reference executor (no --backend yet) the loom
#                side defaults to 3 steps instead, as its steps take tens of seconds.
#   LOOM_STEPS   loom's step count, overriding the above
#   LOOM_BACKEND loom's --backend (default cpu when loom has the flag; ref: the reference
#                executor, 3 steps by default)
#   WARMUP       torch's untimed steps (default 3)
#   LOOM         the loom binary (default build/loom)
#   SPEC         run spec (default models/bench-gpt2-small.json)
#   SYSTEM_PYTHON  python with Debian's torch (default /usr/bin/python3, python3-torch);
#                also runs the GEMM checks
#   PYTHON       a python with a current torch (e.g. a venv: pip install torch numpy), run
#                eager and with --compile (torch >= 2.0); unset: only Debian's torch
#   COMPILE_WARMUP  warmup steps of the compiled run, which compile the model (default 3)
#   TORCH_OMP_WAIT_POLICIES  space-separated OMP_WAIT_POLICY settings to run torch with
#                (default "default passive"); the fastest is the baseline (see README)
#   SKIP_BLAS=1  skip the GEMM checks
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

die() { echo "cpu_step.sh: $*" >&2; exit 1; }

ncpu() { nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1; }
THREADS=${THREADS:-$(ncpu)}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
LOOM=${LOOM:-build/loom}
SPEC=${SPEC:-models/bench-gpt2-small.json}
SYSTEM_PYTHON=${SYSTEM_PYTHON:-/usr/bin/python3}
PYTHON=${PYTHON:-}
COMPILE_WARMUP=${COMPILE_WARMUP:-3}
POLICIES=${TORCH_OMP_WAIT_POLICIES:-default passive}
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || die "THREADS must be a positive integer (got '$THREADS')"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "STEPS must be a positive integer (got '$STEPS')"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "WARMUP must be a non-negative integer (got '$WARMUP')"
[[ $COMPILE_WARMUP =~ ^[0-9]+$ ]] && (( COMPILE_WARMUP >= 2 )) || die "COMPILE_WARMUP must be an integer >= 2 (got '$COMPILE_WARMUP')"

# --- prerequisites -------------------------------------------------------------------
command -v "$SYSTEM_PYTHON" >/dev/null 2>&1 || die "no python at '$SYSTEM_PYTHON' (set SYSTEM_PYTHON=...)"
if ! "$SYSTEM_PYTHON" -c "import torch" >/dev/null 2>&1; then
  die "PyTorch is not installed for $SYSTEM_PYTHON, so there is no baseline to compare with.
  Debian 12: sudo apt-get install -y python3-torch libopenblas0   (or set SYSTEM_PYTHON= to a python with torch)"
fi
if [[ -n $PYTHON ]]; then
  command -v "$PYTHON" >/dev/null 2>&1 || die "no python at PYTHON='$PYTHON'"
  "$PYTHON" -c "import torch" >/dev/null 2>&1 || die "PyTorch is not installed for PYTHON=$PYTHON
  (python3 -m venv VENV && VENV/bin/pip install torch numpy)"
fi
[[ -f $SPEC ]] || die "no run spec at $SPEC"
[[ -x $LOOM ]] || die "no loom binary at '$LOOM' (build it: cmake -S . -B build && cmake --build build -j; or set LOOM=...)"
[[ -f data/shakespeare.txt ]] || die "data/shakespeare.txt is missing"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
# Parse KEY=VALUE out of a *_SUMMARY line.
kv() { sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" <<<"$2" | head -n1; }

echo "== machine: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), threads $THREADS, load average $(cut -d' ' -f1-3 /proc/loadavg)"
load1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load1" 'BEGIN { exit !(l > 0.5) }'; then
  echo "   note: the machine is not idle (load $load1); other work on these CPUs makes every timing below slower and noisier"
fi

# --- 1. GEMM throughput ------------------------------------------------------------------
TORCH_GF=na CBLAS_GF=na BLAS_KIND=na
if [[ ${SKIP_BLAS:-0} != 1 ]]; then
  echo
  echo "== 1. f32 GEMM throughput at this model's shapes (bench/blas_gflops.py, threads $THREADS)"
  out=$("$SYSTEM_PYTHON" bench/blas_gflops.py --threads "$THREADS" 2>&1) || { echo "$out"; die "blas_gflops.py failed"; }
  echo "$out" | grep -v '^BLAS_SUMMARY'
  line=$(grep '^BLAS_SUMMARY' <<<"$out")
  TORCH_GF=$(kv torch_model_gflops "$line"); BLAS_KIND=$(kv blas "$line")
  if command -v cc >/dev/null 2>&1 && pkg-config --exists openblas 2>/dev/null; then
    echo "-- OpenBLAS called directly (bench/sgemm_gflops.c):"
    # shellcheck disable=SC2046
    cc -O2 -std=c11 bench/sgemm_gflops.c $(pkg-config --cflags --libs openblas) -o "$TMP/sgemm_gflops" \
      || die "could not compile bench/sgemm_gflops.c"
    out=$("$TMP/sgemm_gflops" "$THREADS" 6)
    echo "$out" | grep -v '^CBLAS_SUMMARY'
    CBLAS_GF=$(kv cblas_model_gflops "$(grep '^CBLAS_SUMMARY' <<<"$out")")
    if awk -v t="$TORCH_GF" -v c="$CBLAS_GF" 'BEGIN { exit !(t < 0.7 * c) }'; then
      echo "WARNING: torch's matmul reaches $TORCH_GF GFLOP/s but OpenBLAS itself $CBLAS_GF GFLOP/s at the same shapes:"
      echo "         the torch baseline is handicapped by its GEMM, so the ratio below flatters loom."
    else
      echo "torch's matmul ($TORCH_GF GFLOP/s) is within 30% of OpenBLAS's own ($CBLAS_GF GFLOP/s): the GEMMs are comparable."
    fi
  else
    echo "(no cc or no OpenBLAS development files: skipped the direct cblas_sgemm check; apt-get install libopenblas-dev pkg-config)"
  fi
  if [[ $BLAS_KIND != openblas && $BLAS_KIND != mkl ]]; then
    echo "WARNING: torch does not use an optimized BLAS ($BLAS_KIND): the comparison is not fair."
  fi
fi

# --- 2. PyTorch ---------------------------------------------------------------------------
# torch_run LABEL PY ARGS...: runs torch_gpt2_step.py once per OMP_WAIT_POLICY setting and
# keeps the fastest; sets R_MS, R_LINE, R_SUM, R_POLICY.
torch_run() {
  local label=$1 py=$2 pol envs out sum ms
  shift 2
  echo
  echo "== 2. $label (bench/torch_gpt2_step.py $*, threads $THREADS, $STEPS timed steps)"
  R_MS="" R_LINE="" R_SUM="" R_POLICY=""
  for pol in $POLICIES; do
    if [[ $pol == default ]]; then
      envs=(env -u OMP_WAIT_POLICY)
    else
      envs=(env "OMP_WAIT_POLICY=$pol")
    fi
    echo "-- OMP_WAIT_POLICY=$pol"
    out=$("${envs[@]}" "$py" bench/torch_gpt2_step.py --spec "$SPEC" --threads "$THREADS" --steps "$STEPS" "$@" 2>&1) \
      || { echo "$out"; die "torch_gpt2_step.py failed ($label)"; }
    echo "$out" | grep -v -e '^TORCH_SUMMARY' -e 'Logging before InitGoogleLogging' -e 'CPUAllocator.cpp'
    sum=$(grep '^TORCH_SUMMARY' <<<"$out")
    ms=$(kv ms "$sum")
    if [[ -z $R_MS ]] || awk -v a="$ms" -v b="$R_MS" 'BEGIN { exit !(a < b) }'; then
      R_MS=$ms R_SUM=$sum R_POLICY=$pol
      R_LINE=$(grep '^torch [a-z]*:' <<<"$out")
    fi
  done
  [[ -n $R_MS ]] || die "no torch timing ($label)"
}

# Each baseline: label | ms | summary line | policy | TORCH_SUMMARY
BASE_LABELS=() BASE_MS=() BASE_LINES=() BASE_POLICIES=() BASE_SUMS=()
add_base() {
  BASE_LABELS+=("$1") BASE_MS+=("$R_MS") BASE_LINES+=("$R_LINE") BASE_POLICIES+=("$R_POLICY") BASE_SUMS+=("$R_SUM")
}
sysver=$("$SYSTEM_PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null)
torch_run "PyTorch $sysver eager ($SYSTEM_PYTHON)" "$SYSTEM_PYTHON" --warmup "$WARMUP"
add_base "torch $sysver eager ($SYSTEM_PYTHON)"
if [[ -n $PYTHON ]]; then
  ver=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null)
  if [[ $(realpath "$(command -v "$PYTHON")") != $(realpath "$(command -v "$SYSTEM_PYTHON")") ]]; then
    torch_run "PyTorch $ver eager ($PYTHON)" "$PYTHON" --warmup "$WARMUP"
    add_base "torch $ver eager ($PYTHON)"
  fi
  if "$PYTHON" -c "import torch, sys; sys.exit(not hasattr(torch, 'compile'))"; then
    torch_run "PyTorch $ver torch.compile ($PYTHON)" "$PYTHON" --compile --warmup "$COMPILE_WARMUP" --no-profile
    add_base "torch $ver compiled ($PYTHON)"
  else
    echo
    echo "== 2. torch.compile: SKIPPED (torch $ver at $PYTHON has no torch.compile; it needs >= 2.0)"
  fi
fi
TORCH_SUM=${BASE_SUMS[0]}

# --- 3. loom ------------------------------------------------------------------------------
echo
help=$("$LOOM" train --help 2>&1 || true)
LOOM_ARGS=()
if grep -q -- '--backend' <<<"$help"; then
  backend=${LOOM_BACKEND:-cpu}
  LOOM_ARGS+=(--backend "$backend")
  if [[ $backend == cpu ]]; then
    EXEC="CPU backend (--backend cpu)"
    LOOM_STEPS=${LOOM_STEPS:-$STEPS}
  else
    EXEC="--backend $backend (not loom's fast CPU backend)"
    LOOM_STEPS=${LOOM_STEPS:-3}
  fi
else
  [[ -z ${LOOM_BACKEND:-} ]] || die "LOOM_BACKEND=$LOOM_BACKEND given, but '$LOOM train --help' lists no --backend"
  EXEC="reference executor (this loom has no --backend: NOT loom's fast CPU backend)"
  LOOM_STEPS=${LOOM_STEPS:-3}
fi
[[ $LOOM_STEPS =~ ^[1-9][0-9]*$ ]] || die "LOOM_STEPS must be a positive integer (got '$LOOM_STEPS')"
if grep -q -- '--threads' <<<"$help"; then
  LOOM_ARGS+=(--threads "$THREADS")
fi
export LOOM_THREADS=$THREADS
echo "== 3. loom: $LOOM train $SPEC ${LOOM_ARGS[*]} --steps $LOOM_STEPS  [$EXEC]"
"$LOOM" data data/shakespeare.txt -o "$TMP/shakespeare.bin" >/dev/null || die "loom data failed"
# /usr/bin/time -f %M gives loom's peak RSS (kB) where GNU time is installed.
timecmd=()
if [[ -x /usr/bin/time ]] && /usr/bin/time -f %M true >/dev/null 2>&1; then
  timecmd=(/usr/bin/time -f "LOOM_MAXRSS_KB %M" -o "$TMP/loom.time")
fi
set +e
"${timecmd[@]}" "$LOOM" train "$SPEC" --data "$TMP/shakespeare.bin" --steps "$LOOM_STEPS" "${LOOM_ARGS[@]}" \
  2>&1 | tee "$TMP/loom.log"
rc=${PIPESTATUS[0]}
set -e
[[ $rc == 0 ]] || die "loom train failed (exit $rc)"
# step     1/10 | loss 5.5271 | lr 3.000e-04 | norm 4.103 |     37.7 ms |      1697 tok/s
mapfile -t LOOM_TIMES < <(awk -F'|' '/^step / { for (i = 1; i <= NF; i++) if ($i ~ / ms *$/) { v = $i; sub(/ ms */, "", v); gsub(/ /, "", v); print v } }' "$TMP/loom.log")
(( ${#LOOM_TIMES[@]} > 0 )) || die "found no per-step 'ms' column in loom's output (has its format changed?)"
if (( ${#LOOM_TIMES[@]} > 1 )); then
  times=("${LOOM_TIMES[@]:1}")
  skipped="first step dropped"
else
  times=("${LOOM_TIMES[@]}")
  skipped="only one step: it includes first-step costs"
fi
LOOM_MS=$(printf '%s\n' "${times[@]}" | sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) m = a[(NR + 1) / 2]; else m = (a[NR / 2] + a[NR / 2 + 1]) / 2; print m }')
LOOM_RSS=na
[[ -f $TMP/loom.time ]] && LOOM_RSS=$(awk '/LOOM_MAXRSS_KB/ { printf "%.0f", $2 / 1024 }' "$TMP/loom.time")

# --- summary ------------------------------------------------------------------------------
GFLOP=$(kv gflop_step "$TORCH_SUM")
TOK=$("$PYTHON" -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['batch']*s['seq'])" "$SPEC")
echo
echo "== summary (threads $THREADS, $GFLOP GFLOP per step, $TOK tokens per step)"
echo "GEMM:  torch matmul $TORCH_GF GFLOP/s, OpenBLAS cblas_sgemm $CBLAS_GF GFLOP/s (harmonic mean over the model's GEMM shapes; BLAS $BLAS_KIND)"
awk -v ms="$LOOM_MS" -v tok="$TOK" -v gf="$GFLOP" -v rss="$LOOM_RSS" -v n="${#times[@]}" -v sk="$skipped" -v ex="$EXEC" \
  'BEGIN { printf "loom:        %.1f ms/step, %.0f tok/s, %.2f GFLOP/s, peak RSS %s MB (median of %d step(s), %s; %s)\n", ms, tok / (ms / 1000), gf / (ms / 1000), rss, n, sk, ex }'
for k in "${!BASE_MS[@]}"; do
  echo "${BASE_LINES[$k]}  [OMP_WAIT_POLICY=${BASE_POLICIES[$k]}, $(kv gflops "${BASE_SUMS[$k]}") GFLOP/s]"
done
for k in "${!BASE_MS[@]}"; do
  awk -v t="${BASE_MS[$k]}" -v l="$LOOM_MS" -v what="${BASE_LABELS[$k]}" \
    'BEGIN { r = t / l
             if (r > 1) how = sprintf("loom is %.2fx faster", r); else how = sprintf("loom is %.2fx slower", 1 / r)
             printf "ratio torch_ms / loom_ms = %.4g  (%s; baseline %s, %.1f ms)\n", r, how, what, t }'
done
