#!/usr/bin/env bash
# tests/cli/cuda_memory.sh — the memory plan counts what the CUDA runtime allocates: on the
# emulated device (tests/cuda_emu, which logs every cuMemAlloc under LOOM_EMU_STATS=1), a
# training run's allocations are the plan's total (`loom ir --memory --target cuda`: the
# state, the weight copies and the largest function arena, the CUDA lowering's stats area and
# scratch included, passes/memory_cuda.c) plus the cuBLASLt workspace (32 MiB), and the arena
# allocated is the plan's largest.  Models that save each kind of statistics: gpt2-tiny in bf16
# (layer norms' mean and rstd, attention's log-sum-exp and O, the fused classifier's loss
# rows), llama-tiny in bf16 (RMS norms), and gpt2-tiny in fp32 with none (attention on CUDA
# cores saves none; the norms' and the classifier's switched off): the scratch alone.
LOOM=$1
. "$(dirname "$0")/lib.sh"

lib=$(dirname "$LOOM")
if [ ! -f "$lib/libloom_fake_cuda.so" ] || ! command -v "${LOOM_EMU_CXX:-g++}" > /dev/null; then
  echo "SKIPPED: the emulated device (tests/cuda_emu) is not built here, or no C++ compiler"
  finish
fi
export LOOM_LIBCUDA=$lib/libloom_fake_cuda.so LOOM_LIBNVRTC=$lib/libloom_fake_nvrtc.so
export LOOM_LIBCUBLASLT=$lib/libloom_fake_cublaslt.so LOOM_CACHE_DIR=${LOOM_CACHE_DIR:-$TMP/cache}

# one case: NAME, then env assignments, then the model and precision; a fifth argument
# "upper": the arena allocated may be below the plan's (the total then at most the plan's)
case_run() {
  local name=$1 model=$3 prec=$4 upper=${5:-}
  local -a envs
  read -r -a envs <<< "$2"
  env "${envs[@]}" "$LOOM" ir tests/golden/$model/train_spec.json --passes=train,lower --target cuda --precision $prec \
    --memory > "$TMP/plan" 2>&1 || { fail "$name: loom ir --memory" "$(cat "$TMP/plan")"; return; }
  # the step graph's staging copy (its inputs and outputs) is the runtime's, not the plan's
  env "${envs[@]}" LOOM_EMU_STATS=1 LOOM_CUDA_STEP_GRAPH=0 "$LOOM" train tests/golden/$model/train_spec.json \
    --backend cuda --precision $prec --steps 1 --out "$TMP/w.st" > "$TMP/train" 2>&1 ||
    { fail "$name: loom train on the emulated device" "$(tail -5 "$TMP/train")"; return; }
  local what="the allocations are the plan's total + the cuBLASLt workspace, the arena its largest"
  [ -n "$upper" ] && what="the state's regions are the plan's, the allocations at most its total + the workspace"
  check "$name: $what" \
    python3 - "$TMP/plan" "$TMP/train" "$name" "$upper" <<'PY'
import re, sys
plan, log, name, upper = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3], sys.argv[4] == "upper"
def part(label):
    m = re.search(r"^  " + label + r" .*\((\d+) bytes", plan, re.M)
    return int(m.group(1)) if m else 0
total = int(re.search(r"^  total .*\((\d+) bytes", plan, re.M).group(1))
arenas = [int(x) for x in re.findall(r"^  @(?:grad_step|optimizer_step|forward) +peak .*\((\d+) bytes\)", plan, re.M)]
stats = re.search(r"of which stats area ([\d.]+ \S+)", plan)
allocs = [int(x) for x in re.search(r"^loom-emu: cuMemAlloc bytes:(.*)$", log, re.M).group(1).split()]
workspace = 32 << 20
assert workspace in allocs, (allocs, "no cuBLASLt workspace")
rest = list(allocs)
rest.remove(workspace)
# the state's regions, allocated first (runtime/cuda/cuda_exec.c): the parameters with their
# bf16 copies, the gradients, the optimizer's moments with the other state; each global on a
# 64-byte boundary of its region
regions = [part("parameters") + part("weight copies"), part("gradients"), part("optimizer state") + part("other state")]
assert rest[:3] == regions, f"{name}: the state's regions allocated {rest[:3]}, planned {regions}"
if upper:
    assert sum(rest) <= total, f"{name}: allocated {sum(rest)} bytes besides the workspace ({rest}), planned {total}"
else:
    assert sum(rest) == total, f"{name}: allocated {sum(rest)} bytes besides the workspace ({rest}), planned {total}"
    assert max(arenas) in rest, f"{name}: the arena the runtime allocated is not the plan's largest {max(arenas)} ({rest})"
want_stats = name != "gpt2-tiny fp32 without norm statistics"
assert bool(stats) == want_stats, f"{name}: the plan's stats area line: {stats and stats.group(1)}"
PY
}
case_run "gpt2-tiny bf16" "" gpt2-tiny bf16
case_run "gpt2-tiny fp32 without norm statistics" "LOOM_CUDA_NO_NORM_STATS=1 LOOM_CUDA_NO_XENT_FUSION=1" gpt2-tiny fp32
case_run "llama-tiny bf16" "" llama-tiny bf16
case_run "mixtral-tiny bf16 (its arena planned 256 bytes above)" "" mixtral-tiny bf16 upper

# LOOM_CUDA_MOE_GEMM=batched (codegen/cuda/lower_moe.c) pads the expert matmuls' operands to
# [experts, capacity, ...] in scratch: what the plan adds for them over the grouped kernels is
# what the device allocates more (mixtral-tiny bf16 at capacity 2: 256 rows of 64 + 96).  A
# difference, since mixtral-tiny's arena is planned 256 bytes above what the lowering
# allocates either way (not the batched lowering's); its state is the plan's to the byte since
# the plan counts each global's 64-byte alignment (it was 96 bytes below, so the plan was not
# an upper bound there), and the plan is at least the allocations.
moe_bytes() {   # MODE: the planned total, then the bytes allocated besides the workspace
  local spec=tests/golden/mixtral-tiny/train_spec.json
  LOOM_CUDA_MOE_GEMM=$1 "$LOOM" ir $spec --passes=train,lower --target cuda --precision bf16 --capacity-factor 2 --memory |
    sed -n 's/^  total .*(\([0-9]*\) bytes.*/\1/p'
  LOOM_CUDA_MOE_GEMM=$1 LOOM_EMU_STATS=1 LOOM_CUDA_STEP_GRAPH=0 "$LOOM" train $spec --backend cuda --precision bf16 \
    --capacity-factor 2 --steps 1 --out "$TMP/w.st" 2>&1 | sed -n 's/^loom-emu: cuMemAlloc bytes://p' |
    tr ' ' '\n' | awk '$1 != "" && $1 != 33554432 { s += $1 } END { print s }'
}
read -r -d '' pg ag < <(moe_bytes grouped; printf '\0')
read -r -d '' pb ab < <(moe_bytes batched; printf '\0')
check "LOOM_CUDA_MOE_GEMM=batched: the plan's extra scratch ($((pb - pg)) bytes) is what the device allocates more ($((ab - ag)))" \
  test -n "$pg" -a -n "$ag" -a -n "$pb" -a -n "$ab" -a "$((pb - pg))" = "$((ab - ag))" -a "$((pb - pg))" -gt 0
check "mixtral-tiny: the plan ($pg, $pb bytes) is at least what the device allocates ($ag, $ab)" \
  test -n "$pg" -a -n "$ab" -a "$pg" -ge "$ag" -a "$pb" -ge "$ab"

# the stats area is the plan's for GPT-2 124M too (no device: the figure alone, checked above
# on the tiny models): its saved statistics are hundreds of MB at 16 x 1024
expect_exit 0 "GPT-2 124M's plan" "$LOOM" ir models/gpt2-124M.json --passes=train,lower --target cuda --precision bf16 \
  --batch 16 --seq 1024 --vocab-multiple 128 --memory
expect_stdout_contains "of which stats area 588.19 MiB"
finish
