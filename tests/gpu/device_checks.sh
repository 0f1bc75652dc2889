#!/usr/bin/env bash
# tests/gpu/device_checks.sh — OWED.md's checks in one short lease of a GPU machine.
#
#     bash tests/gpu/bundle.sh                               # here: .gpu/bundle.tar.xz
#     run: bash tests/gpu/device_checks.sh SECONDS [PHASES]   # there, carry [".gpu"]
#
# PHASES (default "correct,bench,sanitize"; a check's own name runs it alone: runtime,
# train, goldens, moe, misc; "owed" runs what the first session left: checks 4, 7 and 8's speed):
#   first     the next GPU session's first call (OWED.md's header): what decides most, in order.
#             In parallel, the correctness of issue 31's default path (goldens: checks 11a and
#             18b), of MoE (check 9) and of the step's graph and the late loss (checks 16a,
#             19a); then torch (check 11 b, c) and hwprofile (check 7). The second call is
#             "attention,wgmma" (checks 12 and 20);
#   correct   checks 1, 2, 5, 6, 8, 9 (correctness), in parallel: the tiny models are small
#             and the machine has 16 cores for NVRTC and the CPU backend's references;
#   bench     checks 3 and 9's speed, alone on the GPU: bench/gpu_step.sh for GPT-2 124M,
#             the Llama-1B shape and a mid-size Mixtral (STEPS, default 12);
#   sanitize  compute-sanitizer memcheck and racecheck of training steps (check 1's tail);
#   torch     check 11 (issue 31): bench/gpu_step.sh with PyTorch beside loom and loom's
#             LOOM_PROFILE table for GPT-2 124M and the Llama-1B shape ($OUT/profile/);
#   stepgraph check 16 (issue 31): one CUDA graph a step and the tied embedding's gradient,
#             bit for bit (within the rule) the programs without them, then GPT-2 124M's step
#             with and without the step's graph;
#   gemmtune  check 15 (issue 31): GPT-2 124M's step with the GEMM algorithms timed at
#             start-up (LOOM_CUDA_GEMM_TUNE=verbose: each shape's candidates in the log; an empty
#             tuning cache, so the first run's start-up shows the cost) and without (=0);
#   losslate  check 19 (issue 31 item 6): the loss read back one step late, bit for bit the
#             synchronous path (LOOM_CUDA_SYNC_STEP=1) on the tiny models, then GPT-2 124M's
#             step with and without it;
#   hwprofile check 7's per-category efficiencies from the torch phase's profiles (run after
#             torch): $OUT/hw-profile.json, and --time with it beside the measured step;
#   attention checks 12 and 20 (a) (issue 32): bench/attention_gpu.py, loom's attention kernels
#             beside SDPA flash, and on an sm_90 device the wgmma kernels beside the mma.sync
#             ones (.gpu/attn_tu.cu, which tests/gpu/bundle.sh writes);
#   wgmma     check 20 (b): GPT-2 124M trained 3 steps with LOOM_CUDA_WGMMA=1 and without,
#             the weights compared.
# Each check gets a timeout from what is left of SECONDS, so the script ends by itself inside
# the call's limit. Every finished check's log is appended to $OUT/all.log at once (what a
# killed run did finish still comes back); $OUT/summary.txt has one line a check.
set -u
cd "$(dirname "$0")/../.."
BUDGET=${1:-400}
PHASES=${2:-correct,bench,sanitize}
OUT=${OUT:-/tmp/loom-gpu-out}
mkdir -p "$OUT"
B=build-gpu
logs=$(mktemp -d)
: > "$OUT/all.log"; : > "$OUT/summary.txt"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
left() { echo $((BUDGET - SECONDS)); }

if [ -f .gpu/bundle.tar.xz ]; then
  mkdir -p $B && tar xJf .gpu/bundle.tar.xz -C $B
  export LD_LIBRARY_PATH=$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -x $B/loom ] || { say "no $B/loom: run tests/gpu/bundle.sh here and carry .gpu, or build $B there"; exit 1; }

# The CUDA libraries loom dlopens: the system's if the loader finds them, else the toolkit's
# or the Python packages' copies.
findlib() {   # VAR NAME...
  local var=$1; shift
  for n in "$@"; do ldconfig -p 2>/dev/null | grep -q "$n " && return; done
  local f
  f=$(find /usr/local /opt /usr/lib -name "$1" 2>/dev/null | head -1)
  [ -n "$f" ] && export "$var=$f"
}
findlib LOOM_LIBNVRTC libnvrtc.so.13 libnvrtc.so
findlib LOOM_LIBCUBLASLT libcublasLt.so.13 libcublasLt.so.12
findlib LOOM_LIBNCCL libnccl.so.2
export LOOM_CACHE_DIR=$PWD/.gpu-cache
{
  echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
  nproc; command -v nvcc && nvcc --version | tail -2
  echo "LOOM_LIBNVRTC=${LOOM_LIBNVRTC:-system} LOOM_LIBCUBLASLT=${LOOM_LIBCUBLASLT:-system} LOOM_LIBNCCL=${LOOM_LIBNCCL:-system}"
  $B/loom --version 2>&1 | head -2
} 2>&1 | tee -a "$OUT/all.log"

check() {   # NAME TIMEOUT COMMAND... : runs it, logs it, one summary line
  local name=$1 t=$2; shift 2
  local l; l=$(left)
  [ "$t" -gt "$l" ] && t=$l
  if [ "$t" -le 5 ]; then say "SKIP $name (no time left)"; return; fi
  local start=$SECONDS
  timeout "$t" bash -c "$*" > "$logs/$name.log" 2>&1
  local rc=$?
  { echo "======== $name (exit $rc, $((SECONDS - start)) s)"; tail -c 20000 "$logs/$name.log"; } >> "$OUT/all.log"
  case $rc in
    0) say "PASS $name ($((SECONDS - start)) s)" ;;
    124) say "TIME $name (killed after $t s)" ;;
    *) say "FAIL $name (exit $rc, $((SECONDS - start)) s)" ;;
  esac
}

g=tests/golden
if [[ ,$PHASES, == *,first,* ]]; then PHASES="$PHASES,goldens,moe,stepgraph-correct,losslate-correct,torch,hwprofile"; fi
want() { [[ ,$PHASES, == *,correct,* || ,$PHASES, == *,$1,* ]]; }
# the correctness halves of checks 16 and 19 (their phases run them before their speed halves)
sg_correct="set -e; for p in fp32 bf16; do for v in X=1 LOOM_CUDA_STEP_GRAPH=0 LOOM_CUDA_GRAPH=0 LOOM_CUDA_NO_TIED_GRAD=1 LOOM_CUDA_NO_EMBED_POS=1; do env \$v LOOM_CUDA_FUSE_BF16=1 $B/loom train $g/gpt2-tiny/train_spec.json --backend cuda --precision \$p --steps 3 -q --out /tmp/sg-\$p-\${v%%=*}.st; done; for k in LOOM_CUDA_STEP_GRAPH LOOM_CUDA_GRAPH LOOM_CUDA_NO_EMBED_POS; do $B/loom diff /tmp/sg-\$p-X.st /tmp/sg-\$p-\$k.st --rtol 0; done; t=1e-5; [ \$p = bf16 ] && t='2e-2 --atol 0.06'; $B/loom diff /tmp/sg-\$p-X.st /tmp/sg-\$p-LOOM_CUDA_NO_TIED_GRAD.st --rtol \$t; done"
ll_correct="set -e; for m in gpt2-tiny llama-tiny; do for p in fp32 bf16; do for v in X=1 LOOM_CUDA_SYNC_STEP=1; do env \$v $B/loom train $g/\$m/train_spec.json --backend cuda --precision \$p --steps 5 -q --out /tmp/ll-\$m-\$p-\${v%%=*}.st; done; cmp /tmp/ll-\$m-\$p-X.st /tmp/ll-\$m-\$p-LOOM_CUDA_SYNC_STEP.st; done; done"
if want runtime || want train || want goldens || want moe || want misc || want stepgraph-correct || want losslate-correct; then
  want runtime && check runtime 150 "$B/test_cuda_runtime --gpu" &
  want train && check train 300 "bash tests/gpu/test_train.sh $B" &
  want goldens && check goldens 300 "for m in gpt2-tiny llama-tiny llama-tiny-tied; do $B/loom check $g/\$m --backend cuda,cpu --precision fp32,bf16 || exit 1; done" &
  want moe && check moe 300 "set -e; m=$g/mixtral-tiny; $B/loom eval models/mixtral-tiny.json --backend cuda --weights \$m/weights.safetensors --tokens \$m/tokens.bin --out /tmp/moe.st; $B/loom diff /tmp/moe.st \$m/expected.safetensors --only logits,loss --rtol 1e-5; $B/loom train \$m/train_spec.json --backend cuda --out /tmp/moe-train.st -q; $B/loom diff /tmp/moe-train.st \$m/train.safetensors --rtol 1e-4; for b in cpu cuda; do $B/loom train \$m/train_spec.json --backend \$b --precision bf16 --out /tmp/moe16-\$b.st -q; done; $B/loom diff /tmp/moe16-cuda.st /tmp/moe16-cpu.st --only losses --rtol 2e-2; for x in mixtral-tiny qwen3-moe-tiny; do $B/loom check $g/\$x --backend cuda,cpu --precision fp32,bf16; done" &
  want misc && check misc 240 "set -e; for r in selective full; do for x in none \$r; do $B/loom train $g/gpt2-tiny/train_spec.json --backend cuda --steps 3 --recompute \$x --out /tmp/rc-\$x.st -q; done; $B/loom diff /tmp/rc-\$r.st /tmp/rc-none.st --rtol 0; done; echo '-- compiled executable'; $B/loom compile $g/gpt2-tiny/train_spec.json --backend cuda --arch sm_90a -o /tmp/t && LOOM_LIBNVRTC=/nonexistent /tmp/t --steps 3; echo '-- sampling'; for m in gpt2-tiny llama-tiny; do $B/loom sample $g/\$m/train_spec.json --weights $g/\$m/weights.safetensors --prompt Hello --max-new-tokens 40 --temperature 0 --ids --backend cuda; cat $g/\$m/generate.json; echo; done" &
  [[ ,$PHASES, == *,stepgraph-correct,* ]] && check stepgraph-correct 200 "$sg_correct" &
  [[ ,$PHASES, == *,losslate-correct,* ]] && check losslate-correct 120 "$ll_correct" &
  wait
fi
if [[ $PHASES == *bench* ]]; then
  check bench 200 "TORCH=0 STEPS=${STEPS:-12} LOOM=$B/loom bash bench/gpu_step.sh"
  check bench-moe 120 "python3 -c \"import json; s=json.load(open('models/mixtral-tiny.json')); s['model'].update(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8, num_local_experts=8, vocab_size=32000, max_position_embeddings=2048); json.dump(s, open('/tmp/mixtral-mid.json', 'w'))\" && TORCH=0 STEPS=${STEPS:-12} LOOM=$B/loom MODELS=/tmp/mixtral-mid.json:8:1024 bash bench/gpu_step.sh"
fi
if [[ $PHASES == *owed* ]]; then
  hwf=models/hardware/h200.json; nvidia-smi -L 2>/dev/null | grep -q H100 && hwf=models/hardware/h100-sxm.json
  check micro 120 "python3 tests/gpu/microbench.py $hwf $OUT/hw-measured.json"
  check attnround 150 "LOOM_CUDA_ATTN_ROUND=1 STEPS=${STEPS:-12} LOOM=$B/loom MODELS=models/gpt2-124M.json:16:1024 bash bench/gpu_step.sh"
  check sample 150 "set -e; $B/loom data data/shakespeare.txt -o /tmp/s.bin; $B/loom train models/gpt2-124M.json --backend cuda --steps 1 --batch 4 --seq 1024 --data /tmp/s.bin --out /tmp/w124.st -q; for b in cuda cpu; do $B/loom sample models/gpt2-124M.json --weights /tmp/w124.st --prompt x --max-new-tokens 256 --temperature 0 --backend \$b > /dev/null; done"
fi
if [[ $PHASES == *torch* ]]; then
  check torch 330 "LOOM_PROFILE=15 PROFILE_DIR=$OUT/profile STEPS=${STEPS:-10} LOOM=$B/loom bash bench/gpu_step.sh"
fi
if [[ ,$PHASES, == *,stepgraph,* ]]; then   # check 16 (branch cudabytes)
  check stepgraph-correct 200 "$sg_correct"
  check stepgraph-speed 300 "for v in X=1 LOOM_CUDA_STEP_GRAPH=0; do echo \"-- \$v\"; env \$v LOOM_CUDA_FUSE_BF16=1 TORCH=0 STEPS=${STEPS:-12} LOOM=$B/loom MODELS=models/gpt2-124M.json:16:1024 bash bench/gpu_step.sh; done"
fi
if [[ $PHASES == *gemmtune* ]]; then   # check 15
  check gemmtune 300 "for v in 0 verbose; do echo \"-- LOOM_CUDA_GEMM_TUNE=\$v\"; LOOM_CACHE_DIR=/tmp/gemmtune-cache LOOM_CUDA_GEMM_TUNE=\$v TORCH=0 STEPS=${STEPS:-12} LOOM=$B/loom MODELS=models/gpt2-124M.json:16:1024 bash bench/gpu_step.sh; done"
fi
if [[ ,$PHASES, == *,losslate,* ]]; then   # check 19 (branch losslate)
  check losslate-correct 120 "$ll_correct"
  check losslate-speed 300 "for v in X=1 LOOM_CUDA_SYNC_STEP=1; do echo \"-- \$v\"; env \$v TORCH=0 STEPS=${STEPS:-20} LOOM=$B/loom MODELS=models/gpt2-124M.json:16:1024 bash bench/gpu_step.sh; done"
fi
if [[ $PHASES == *hwprofile* ]]; then   # check 7's categories (after torch)
  hwf=models/hardware/h200.json; nvidia-smi -L 2>/dev/null | grep -q H100 && hwf=models/hardware/h100-sxm.json
  check hwprofile 60 "set -e; python3 bench/hw_from_profile.py $OUT/profile/gpt2-124M.txt $hwf $OUT/hw-profile.json $OUT/profile/llama-1B.txt; $B/loom ir models/gpt2-124M.json --passes=train,lower --target cuda --batch 16 --seq 1024 --precision bf16 --vocab-multiple 128 --time --hw $OUT/hw-profile.json"
fi
if [[ $PHASES == *attention* ]]; then   # checks 12 and 20 (a)
  check attention 240 "python3 bench/attention_gpu.py .gpu/attn_tu.cu"
fi
if [[ $PHASES == *wgmma* ]]; then   # check 20 (b)
  check wgmma 200 "set -e; $B/loom data data/shakespeare.txt -o /tmp/wg-d.bin; for v in 0 1; do LOOM_CUDA_WGMMA=\$v $B/loom train models/gpt2-124M.json --backend cuda --precision bf16 --batch 4 --seq 1024 --steps 3 --data /tmp/wg-d.bin -q --out /tmp/wg\$v.st; done; $B/st_diff /tmp/wg1.st /tmp/wg0.st --rtol 2e-2"
fi
if [[ $PHASES == *sanitize* ]]; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  check memcheck-runtime 120 "$san --tool memcheck --report-api-errors no --error-exitcode 99 $B/test_cuda_runtime --gpu --no-fault"
  for tool in memcheck racecheck; do
    for m in gpt2-tiny llama-tiny; do
      check "$tool-$m-bf16" 90 "$san --tool $tool --error-exitcode 99 $B/loom train $g/$m/train_spec.json -q --backend cuda --precision bf16 --steps 1"
    done
  done
fi
say "done in $SECONDS s"
