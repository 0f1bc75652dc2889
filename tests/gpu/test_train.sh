#!/usr/bin/env bash
# GPU session: the CUDA backend end to end against the PyTorch goldens and the CPU backend.
#   - fp32: 3 AdamW steps of every tiny model within 1e-4 of the golden (cuBLASLt f32
#     compute, not TF32), and every gradient of one step (eval --grads) within 1e-4;
#   - bf16: one step's logits, loss and gradients of the program that rounds where the CPU
#     backend rounds (LOOM_CUDA_FUSE_BF16=0) within 2e-2 of the CPU's bf16 step; the default
#     program (its GEMM epilogues and accumulations move rounding points) as close to the fp32
#     golden's gradients as the CPU's bf16 step is (the mean and the largest error over the
#     tensors at most 1.25x the CPU's); 3 training steps' losses and gradient norms within
#     2e-2 of the CPU's (not the parameters: Adam's first updates are lr * sign(g), and a
#     gradient near zero whose sign bf16 rounding flips moves its parameter by 2 lr, on any
#     two backends);
#   - loom eval --backend cuda: logits and loss within 1e-4 of the golden;
#   - GPT-2 124M: 5 steps at batch 4, seq 1024 run and print their memory and speed.
# Run by tests/gpu/run.sh as `bash tests/gpu/test_train.sh BUILD_DIR`; exit 77 = skipped.
# With LOOM_EMULATED=1 (tests/cuda_emu/run.sh, `bash test_train.sh BUILD_DIR LOOM ST_DIFF`)
# the bf16 checks run on the emulated device, without the fp32 ones (tests/cuda_emu/run.sh's
# `loom check --backend cuda` runs each golden's forward, gradients and 3 steps there, at
# tighter tolerances) and without the GPT-2 124M run.
BUILD=${1:-build-gpu}
LOOM=${2:-$BUILD/loom} ST_DIFF=${3:-$BUILD/st_diff}
if [ "${LOOM_EMULATED:-0}" != 1 ]; then
  command -v nvidia-smi > /dev/null || { echo "SKIPPED: no GPU"; exit 77; }
fi
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for m in gpt2-tiny llama-tiny llama-tiny-tied; do
  g=tests/golden/$m
  if [ "${LOOM_EMULATED:-0}" != 1 ]; then
    if "$LOOM" train $g/train_spec.json -q --backend cuda --out "$tmp/cuda.st" > "$tmp/log" 2>&1 &&
       "$ST_DIFF" "$tmp/cuda.st" $g/train.safetensors --rtol 1e-4 > "$tmp/diff" 2>&1; then
      ok "$m fp32 on CUDA: parameters and losses after 3 steps within 1e-4 of PyTorch"
    else
      bad "$m fp32 on CUDA"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
    fi
    if "$LOOM" eval models/$m.json --weights $g/weights.safetensors --tokens $g/tokens.bin --backend cuda --grads \
         --out "$tmp/grads.st" > "$tmp/log" 2>&1 && "$ST_DIFF" "$tmp/grads.st" $g/grads.safetensors --rtol 1e-4 > "$tmp/diff" 2>&1; then
      ok "$m fp32 gradients on CUDA within 1e-4 of PyTorch"
    else
      bad "$m fp32 gradients on CUDA"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
    fi
  fi
  sed '0,/{/s/{/{"precision": "bf16", /' models/$m.json > "$tmp/bf16.json"   # the model's spec, in bf16
  "$LOOM" eval "$tmp/bf16.json" --weights $g/weights.safetensors --tokens $g/tokens.bin --backend cpu --grads \
    --out "$tmp/cpu16g.st" > /dev/null 2>&1
  if LOOM_CUDA_FUSE_BF16=0 "$LOOM" eval "$tmp/bf16.json" --weights $g/weights.safetensors --tokens $g/tokens.bin \
       --backend cuda --grads --out "$tmp/cuda16g.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda16g.st" "$tmp/cpu16g.st" --rtol 2e-2 > "$tmp/diff" 2>&1; then
    ok "$m bf16 step on CUDA (LOOM_CUDA_FUSE_BF16=0): logits, loss and every gradient within 2e-2 of the CPU backend"
  else
    bad "$m bf16 step on CUDA (LOOM_CUDA_FUSE_BF16=0)"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
  fi
  # the default bf16 program against the fp32 golden, beside the CPU's bf16 step: "mean largest"
  errs() { "$ST_DIFF" "$1" $g/grads.safetensors --rtol 1 2> /dev/null |
             awk '$1 == "PASS" || $1 == "FAIL" { s += $6; if ($6 > m) m = $6; n++ } END { if (n) printf "%.4f %.4f", s / n, m }'; }
  if "$LOOM" eval "$tmp/bf16.json" --weights $g/weights.safetensors --tokens $g/tokens.bin --backend cuda --grads \
       --out "$tmp/cuda16f.st" > "$tmp/log" 2>&1 && e_cpu=$(errs "$tmp/cpu16g.st") && e_cuda=$(errs "$tmp/cuda16f.st") &&
     [ -n "$e_cpu" ] && [ -n "$e_cuda" ] &&
     awk -v a="$e_cuda" -v b="$e_cpu" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[1] <= 1.25 * y[1] && x[2] <= 1.25 * y[2]) }'; then
    ok "$m bf16 step on CUDA (fused): errors against the fp32 golden $e_cuda (mean, largest), the CPU's bf16 $e_cpu"
  else
    bad "$m bf16 step on CUDA (fused) against the fp32 golden: errors ${e_cuda:-none} (mean, largest), the CPU's bf16 ${e_cpu:-none}"
    tail -3 "$tmp/log"
  fi
  "$LOOM" train $g/train_spec.json -q --backend cpu --precision bf16 --out "$tmp/cpu16.st" > /dev/null 2>&1
  if "$LOOM" train $g/train_spec.json -q --backend cuda --precision bf16 --out "$tmp/cuda16.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda16.st" "$tmp/cpu16.st" --rtol 2e-2 --only losses,grad_norms > "$tmp/diff" 2>&1; then
    ok "$m bf16 training on CUDA: 3 steps' losses and gradient norms within 2e-2 of the CPU backend"
  else
    bad "$m bf16 training on CUDA"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
  fi
  if [ "${LOOM_EMULATED:-0}" != 1 ]; then
    if "$LOOM" eval models/$m.json --weights $g/weights.safetensors --tokens $g/tokens.bin --backend cuda \
         --out "$tmp/eval.st" > "$tmp/log" 2>&1 && "$ST_DIFF" "$tmp/eval.st" $g/expected.safetensors --rtol 1e-4 logits loss > "$tmp/diff" 2>&1; then
      ok "$m eval on CUDA: logits and loss within 1e-4 of PyTorch"
    else
      bad "$m eval on CUDA"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
    fi
  fi
done
if [ "${LOOM_EMULATED:-0}" != 1 ]; then
  "$LOOM" data data/shakespeare.txt -o "$tmp/sh.bin" > /dev/null
  "$LOOM" train models/gpt2-124M.json --backend cuda --precision bf16 --batch 4 --seq 1024 --steps 5 --data "$tmp/sh.bin" 2>&1 | tail -8
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
