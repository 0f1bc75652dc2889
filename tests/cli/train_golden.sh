#!/usr/bin/env bash
# Training against the PyTorch goldens (tests/golden): the gradient of every parameter for
# one batch within 1e-4, and parameters, losses, gradient norms and learning rates after 3
# AdamW steps (warmup, clipping that engages, grad_accum 2; two shards for llama-tiny)
# within 1e-5.  train_spec.json holds the golden run's settings as a loom run spec.
# Both backends: cpu (fused kernels, LLVM JIT, OpenBLAS; the default) and ref (reference).
# The mixture-of-experts models (mixtral-tiny, qwen3-moe-tiny: top-2 routing, GQA, the
# load-balancing loss on) are checked the same way; their golden grads file also holds
# ce_loss and aux_loss, so the comparison names the loss and the gradients.
LOOM=$1 ST_DIFF=$2
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for backend in cpu ref; do
for m in gpt2-tiny llama-tiny llama-tiny-tied mixtral-tiny qwen3-moe-tiny; do
  g=tests/golden/$m
  names=loss,$(grep -ao '"grad\.[^"]*"' $g/grads.safetensors | tr -d '"' | paste -sd,)
  if "$LOOM" eval models/$m.json --backend $backend --weights $g/weights.safetensors --tokens $g/tokens.bin --grads \
       --out "$tmp/$m.grads.safetensors" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/$m.grads.safetensors" $g/grads.safetensors --rtol 1e-4 --only "$names" > "$tmp/diff" 2>&1; then
    ok "$backend $m: loss and the gradients of all $(($(grep -c PASS "$tmp/diff") - 1)) parameters within 1e-4"
  else
    bad "$backend $m: gradients"; cat "$tmp/log" "$tmp/diff"
  fi
  if "$LOOM" train $g/train_spec.json -q --backend $backend --out "$tmp/$m.train.safetensors" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/$m.train.safetensors" $g/train.safetensors --rtol 1e-5 > "$tmp/diff" 2>&1; then
    ok "$backend $m: parameters, losses, grad norms and lrs after 3 AdamW steps within 1e-5"
  else
    bad "$backend $m: training"; cat "$tmp/log" "$tmp/diff"
  fi
  # The same run in bf16 (no golden: PyTorch's bf16 rounds differently); it must train and
  # stay near the f32 run.
  if "$LOOM" train $g/train_spec.json -q --backend $backend --precision bf16 --out "$tmp/$m.bf16.safetensors" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/$m.bf16.safetensors" $g/train.safetensors --rtol 5e-2 --only losses > "$tmp/diff" 2>&1; then
    ok "$backend $m: bf16 training runs and its losses stay within 5e-2 of f32"
  else
    bad "$backend $m: bf16 training"; cat "$tmp/log" "$tmp/diff"
  fi
done
done
# A padded vocabulary (--vocab-multiple 96: 256 -> 288 rows, the padded logits masked)
# trains exactly the same model: the checkpoint holds the real 256 rows, within 1e-5 of the
# golden.
for m in gpt2-tiny llama-tiny-tied; do
  g=tests/golden/$m
  if "$LOOM" train $g/train_spec.json -q --vocab-multiple 96 --out "$tmp/$m.vm.safetensors" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/$m.vm.safetensors" $g/train.safetensors --rtol 1e-5 > "$tmp/diff" 2>&1; then
    ok "cpu $m --vocab-multiple 96 (256 padded to 288): the golden's results within 1e-5"
  else
    bad "cpu $m --vocab-multiple 96"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
