# tests/cli/golden_eval.sh — `loom eval` against the PyTorch goldens (tests/golden/*):
# logits and loss within rtol 1e-5 for gpt2-tiny, llama-tiny and llama-tiny-tied, and
# GPT-2 weights whose names carry the "transformer." prefix.
# usage: bash tests/cli/golden_eval.sh PATH-TO-LOOM PATH-TO-ST_DIFF   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

if [ -z "${ST_DIFF:-}" ] || [ ! -x "$ST_DIFF" ]; then
  fail "st_diff is needed as the second argument (build target st_diff); got '${ST_DIFF:-}'"
  finish
fi

# README numbers, to 4 decimals, as a cross-check of the printed line.
declare -A LOSS=([gpt2-tiny]=6.2578 [llama-tiny]=6.3527 [llama-tiny-tied]=6.2798 [mixtral-tiny]=6.5818
                 [qwen3-moe-tiny]=6.3778)

for model in gpt2-tiny llama-tiny llama-tiny-tied mixtral-tiny qwen3-moe-tiny; do
  G=tests/golden/$model
  expect_exit 0 "loom eval $model" "$LOOM" eval models/$model.json --weights $G/weights.safetensors \
    --tokens $G/tokens.bin --out "$TMP/$model.safetensors"
  expect_stdout_contains "loss ${LOSS[$model]}"
  expect_stderr_contains "eval of 64 tokens"
  expect_exit 0 "  $model logits and loss within rtol 1e-5 of PyTorch" "$ST_DIFF" "$TMP/$model.safetensors" \
    $G/expected.safetensors --rtol 1e-5 --only logits,loss
  sed 's/^/    | /' "$OUT"
done

# GPT-2 weights under "transformer.<name>", as some checkpoints store them: same results.
G=tests/golden/gpt2-tiny
st_edit_header $G/weights.safetensors "$TMP/prefixed.safetensors" 's/"\([a-z_][a-z0-9_.]*\)":{"dtype"/"transformer.\1":{"dtype"/g'
check "  the prefixed weights file names 'transformer.wte.weight'" grep -qa '"transformer.wte.weight"' "$TMP/prefixed.safetensors"
check "  and no unprefixed tensor" sh -c "! grep -qa '\"wte.weight\"' '$TMP/prefixed.safetensors'"
expect_exit 0 "st_diff reads the prefixed file (transformer.X vs X)" "$ST_DIFF" "$TMP/prefixed.safetensors" \
  $G/weights.safetensors --prefix transformer. --rtol 0
expect_exit 0 "loom eval gpt2-tiny with 'transformer.'-prefixed weights" "$LOOM" eval models/gpt2-tiny.json \
  --weights "$TMP/prefixed.safetensors" --tokens $G/tokens.bin --out "$TMP/prefixed_out.safetensors"
expect_stdout_contains "loss ${LOSS[gpt2-tiny]}"
expect_exit 0 "  prefixed weights: logits and loss within rtol 1e-5 of PyTorch" "$ST_DIFF" "$TMP/prefixed_out.safetensors" \
  $G/expected.safetensors --rtol 1e-5 logits loss
expect_exit 0 "  prefixed weights give bit-identical outputs" "$ST_DIFF" "$TMP/prefixed_out.safetensors" \
  "$TMP/gpt2-tiny.safetensors" --rtol 0

# Mixtral weights in transformers 5's fused layout (mlp.gate.weight, mlp.experts.gate_up_proj
# [E,2F,D], mlp.experts.down_proj [E,D,F]; tests/golden/README.md): the same model.
G=tests/golden/mixtral-tiny
check "  the fused file has no per-expert tensor" sh -c "! grep -qa 'experts.0.w1' $G/weights_fused.safetensors"
expect_exit 0 "loom eval mixtral-tiny from transformers 5's fused expert tensors" "$LOOM" eval models/mixtral-tiny.json \
  --weights $G/weights_fused.safetensors --tokens $G/tokens.bin --out "$TMP/fused.safetensors"
expect_stdout_contains "loss ${LOSS[mixtral-tiny]}"
expect_exit 0 "  fused layout: bit-identical outputs to the hub's per-expert layout" "$ST_DIFF" "$TMP/fused.safetensors" \
  "$TMP/mixtral-tiny.safetensors" --rtol 0
# A checkpoint with an expert missing is refused with the tensor's name.
st_edit_header $G/weights.safetensors "$TMP/noexpert.safetensors" 's/"model.layers.1.block_sparse_moe.experts.3.w2.weight"/"model.layers.1.block_sparse_moe.experts.3.w9.weight"/'
expect_exit 2 "a Mixtral checkpoint without expert 3's w2 is refused" "$LOOM" eval models/mixtral-tiny.json \
  --weights "$TMP/noexpert.safetensors" --tokens $G/tokens.bin
expect_stderr_contains "has no tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight'"

finish
