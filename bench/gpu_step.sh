#!/usr/bin/env bash
# bench/gpu_step.sh — training speed on one NVIDIA GPU (the issue-6 benchmark).
#
#   bash bench/gpu_step.sh             # GPT-2 124M and the Llama-1B-shaped model, bf16
#   DRY=1 bash bench/gpu_step.sh       # no GPU needed: the predicted FLOPs and memory only
#
# For each model it prints: the model FLOPs of one step (`loom ir --flops`: 6N·tokens +
# 12·L·T·D·tokens, counted from the IR), the memory plan's prediction for the CUDA target,
# NVRTC compile time cold (an empty cache) and warm, then STEPS training steps with their
# median ms/step, tokens/s and MFU = FLOPs / step time / peak, and the device memory the
# runtime allocated and nvidia-smi's peak while it ran.
#
# Variables: LOOM (default build-gpu/loom, else build/loom), STEPS (20; the first 3 steps
# are dropped), PEAK_TFLOPS (989: H100/H200 SXM bf16 dense), GPT2_BATCH (16), LLAMA_BATCH
# (4), PRECISION (bf16), VOCAB_MULTIPLE (128: the vocabulary padded for aligned GEMMs,
# GPT-2's 50257 -> 50304, as llm.c does; MFU still counts the real vocabulary's FLOPs), MODELS (e.g. "models/gpt2-tiny.json:2:32", instead of the two),
# EMULATED=1 (run on the emulated device of tests/cuda_emu, LOOM_LIB* set: checks this
# script end to end without a GPU; its figures are the emulator's, not a GPU's).
# Published anchors: llm.c trains GPT-2 124M at ~470K tokens/s on one H100; ~1B Llama
# trainers report 45-50% MFU.
# PyTorch beside it (issue 31): after loom, each model runs in bench/torch_gpu_step.py (bf16
# autocast, scaled_dot_product_attention, fused AdamW, torch.compile; CUDA events) in the same
# run on the same GPU, and a second table gives loom's tokens/s over PyTorch's.  TORCH=0 skips
# it; PYTHON (default python3) must have torch with CUDA; TORCH_ARGS adds options (--no-compile).
# LOOM_PROFILE=N: after the timed run (which runs without it: events around every launch cost
# time), a 3-step run prints loom's per-kernel table (category and kernel times, TFLOP/s, GB/s,
# % of the roofline), kept in $PROFILE_DIR/<model>.txt (default: printed).
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-$( [ -x build-gpu/loom ] && echo build-gpu/loom || echo build/loom )}
STEPS=${STEPS:-20}
PEAK=${PEAK_TFLOPS:-989}
PREC=${PRECISION:-bf16}
VM=${VOCAB_MULTIPLE:-128}
[ -x "$LOOM" ] || { echo "bench/gpu_step.sh: $LOOM is missing: build loom first (cmake -B build-gpu && cmake --build build-gpu)"; exit 1; }
models=("models/gpt2-124M.json ${GPT2_BATCH:-16} 1024" "models/llama-1B.json ${LLAMA_BATCH:-4} 2048")
if [ -n "${MODELS:-}" ]; then
  models=()
  for m in $MODELS; do IFS=: read -r spec B T <<< "$m"; models+=("$spec $B $T"); done
fi

gpu=""
if [ -n "${EMULATED:-}" ] && [ -z "${DRY:-}" ]; then
  gpu="the emulated device (tests/cuda_emu; not a GPU: its figures measure the emulator)"
  echo "device: $gpu"
elif [ -z "${DRY:-}" ]; then
  if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "SKIPPED: no GPU (nvidia-smi finds none); DRY=1 prints the predictions without one"
    exit 0
  fi
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0)
  echo "device: $gpu; peak ${PEAK} TFLOP/s assumed for MFU"
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$LOOM" data data/shakespeare.txt -o "$tmp/data.bin" > /dev/null || { echo "loom data failed"; exit 1; }

rows=()
cmp_rows=()
PY=${PYTHON:-python3}
for m in "${models[@]}"; do
  read -r spec B T <<< "$m"
  name=$(basename "$spec" .json)
  shape=(--batch "$B" --seq "$T" --precision "$PREC")
  flops=$("$LOOM" ir "$spec" --passes=train "${shape[@]}" --flops | awk '$1 == "@grad_step" {print $2}')
  shape+=(--vocab-multiple "$VM")
  pred=$("$LOOM" ir "$spec" --passes=train,lower --target=cuda "${shape[@]}" --memory | awk '$1 == "total" {print $2, $3}')
  echo "== $name: batch $B x seq $T, $PREC: $flops FLOP per step; memory plan (cuda) $pred"
  if [ -n "${DRY:-}" ]; then
    rows+=("| $name | $B x $T | $(awk -v f="$flops" 'BEGIN {printf "%.3f", f / 1e12}') | | | | $pred | | | |")
    continue
  fi
  cache=$tmp/cache-$name
  # cold: an empty NVRTC cache; one step
  LOOM_CACHE_DIR=$cache env -u LOOM_PROFILE "$LOOM" train "$spec" "${shape[@]}" --backend cuda --steps 1 --data "$tmp/data.bin" 2>&1 |
    tee "$tmp/cold.log" | grep --line-buffered '^cuda: '   # live: compile, initialization, memory
  cold=$(sed -n 's/^cuda: .* kernels compiled for .* in \([0-9.]*\) s$/\1/p' "$tmp/cold.log" | head -1)
  # warm cache, timed steps; nvidia-smi samples the device's memory meanwhile
  ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; sleep 0.2; done ) > "$tmp/smi" 2>/dev/null &
  smi=$!
  LOOM_CACHE_DIR=$cache env -u LOOM_PROFILE "$LOOM" train "$spec" "${shape[@]}" --backend cuda --steps "$STEPS" --data "$tmp/data.bin" > "$tmp/run.log" 2>&1
  rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  if [ $rc -ne 0 ]; then
    echo "FAILED: $name (exit $rc):"; tail -5 "$tmp/run.log"
    rows+=("| $name | $B x $T | | failed (exit $rc) | | | $pred | | $cold | |")
    continue
  fi
  warm=$(sed -n 's/^cuda: .* kernels compiled for .* in \([0-9.]*\) s (from the cache)$/\1/p' "$tmp/run.log" | head -1)
  alloc=$(sed -n 's/^cuda: device memory \([0-9.]*\) MiB (\(.*\))$/\1 MiB (\2)/p' "$tmp/run.log" | head -1)
  peak_smi=$(sort -n "$tmp/smi" | tail -1)
  ms=$(awk -F'|' '/^step/ {n++; if (n > 3) {gsub(/ ms/, "", $5); print $5 + 0}}' "$tmp/run.log" | sort -n |
       awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}')
  [ -n "$ms" ] || { echo "FAILED: $name: no step lines (STEPS must be > 3)"; continue; }
  read -r toks mfu <<< "$(awk -v f="$flops" -v ms="$ms" -v b="$B" -v t="$T" -v p="$PEAK" \
    'BEGIN {printf "%.0f %.1f", b * t * 1000 / ms, 100 * f / (ms / 1000) / (p * 1e12)}')"
  grep -E '^(cuda|step +('"$STEPS"')/|done)' "$tmp/run.log"
  if [ -n "${LOOM_PROFILE:-}" ]; then
    LOOM_CACHE_DIR=$cache "$LOOM" train "$spec" "${shape[@]}" --backend cuda --steps 3 --data "$tmp/data.bin" > "$tmp/prof.log" 2>&1
    if [ -n "${PROFILE_DIR:-}" ]; then
      mkdir -p "$PROFILE_DIR" && sed -n '/^device: /,$p' "$tmp/prof.log" > "$PROFILE_DIR/$name.txt"
    else
      sed -n '/^device: /,$p' "$tmp/prof.log"
    fi
  fi
  if [ "${TORCH:-1}" != 0 ] && [ -z "${EMULATED:-}" ]; then
    # shellcheck disable=SC2086
    "$PY" bench/torch_gpu_step.py --spec "$spec" --batch "$B" --seq "$T" --steps "$STEPS" --vocab-multiple "$VM" \
      --peak-tflops "$PEAK" ${TORCH_ARGS:-} > "$tmp/torch.log" 2>&1
    cat "$tmp/torch.log" | grep -v '^torch: ' | tail -4
    read -r tms ttoks tmfu <<< "$(awk '$1 == "torch:" {print $5, $7, $9}' "$tmp/torch.log")"
    if [ -n "${ttoks:-}" ]; then
      cmp_rows+=("| $name | $B x $T | $ms | $toks | $mfu% | $tms | $ttoks | $tmfu% | $(awk -v a="$toks" -v b="$ttoks" 'BEGIN {printf "%.2f", a / b}') |")
    else
      echo "torch_gpu_step.py gave no figure:"; tail -5 "$tmp/torch.log"
      cmp_rows+=("| $name | $B x $T | $ms | $toks | $mfu% | failed | | | |")
    fi
  fi
  rows+=("| $name | $B x $T | $(awk -v f="$flops" 'BEGIN {printf "%.3f", f / 1e12}') | $ms | $toks | $mfu% | $pred | $alloc, nvidia-smi peak ${peak_smi:-?} MiB | $cold | $warm |")
done

echo
echo "| model | batch x seq | TFLOP/step | ms/step (median) | tokens/s | MFU | predicted memory | measured memory | compile cold (s) | compile warm (s) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
if [ ${#cmp_rows[@]} -gt 0 ]; then
  echo
  echo "| model | batch x seq | loom ms/step | loom tokens/s | loom MFU | PyTorch ms/step | PyTorch tokens/s | PyTorch MFU | loom / PyTorch |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in "${cmp_rows[@]}"; do echo "$r"; done
fi
[ -n "$gpu" ] && echo "device: $gpu; $PREC; vocabulary padded to a multiple of $VM; MFU against ${PEAK} TFLOP/s; FLOPs of the unpadded model from loom ir --flops"
exit 0
