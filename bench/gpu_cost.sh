#!/usr/bin/env bash
# bench/gpu_cost.sh — a training step on the GPU, counted without one (issue 31): the totals of
# `loom ir --passes=train,lower --target cuda --cost` for GPT-2 124M (16 x 1024) and the
# Llama-1B shape (4 x 2048) in bf16, the vocabulary padded to a multiple of 128 as
# bench/gpu_step.sh runs them: launches a step, and per category launches, TFLOP, GB and the
# roofline bound on --hw (default h100, efficiencies as its file has them).
#
#   bash bench/gpu_cost.sh                 # both models
#   HW=h200 MODELS="models/gpt2-124M.json:16:1024" bash bench/gpu_cost.sh
#
# LOOM_CUDA_FUSE_BF16 (default 1, as in loom since 2026-11-28): the GEMM epilogues and
# accumulations that move a bf16 program's rounding points (codegen/cuda/lower_gemm.c); set 0
# to count the program that rounds where the CPU backend does.
# The targets (issue 31): GPT-2 at most 400 launches and at most 12 GB outside gemm and
# attention; Llama-1B at most 40 GB outside gemm and attention.
set -u
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
HW=${HW:-h100}
PREC=${PRECISION:-bf16}
VM=${VOCAB_MULTIPLE:-128}
[ -x "$LOOM" ] || { echo "bench/gpu_cost.sh: $LOOM is missing: build loom first"; exit 1; }
export LOOM_CUDA_FUSE_BF16=${LOOM_CUDA_FUSE_BF16:-1}
models=${MODELS:-"models/gpt2-124M.json:16:1024 models/llama-1B.json:4:2048"}
rc=0
for m in $models; do
  IFS=: read -r spec B T <<< "$m"
  echo "== $(basename "$spec" .json): batch $B x seq $T, $PREC, vocabulary a multiple of $VM, --hw $HW, LOOM_CUDA_FUSE_BF16=$LOOM_CUDA_FUSE_BF16"
  "$LOOM" ir "$spec" --passes=train,lower --target cuda --batch "$B" --seq "$T" --precision "$PREC" \
    --vocab-multiple "$VM" --hw "$HW" --cost > "${TMPDIR:-/tmp}/gpu_cost.$$" 2>&1 || { cat "${TMPDIR:-/tmp}/gpu_cost.$$"; rc=1; continue; }
  sed -n '/^category /,$p' "${TMPDIR:-/tmp}/gpu_cost.$$"
  rm -f "${TMPDIR:-/tmp}/gpu_cost.$$"
done
exit $rc
