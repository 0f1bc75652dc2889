# tests/cli/golden_eval.sh — `loom eval` against the PyTorch goldens (tests/golden/*):
# logits and loss within rtol 1e-5 for gpt2-tiny, llama-tiny and llama-tiny-tied, and
# GPT-2 weights whose names carry the "transformer." prefix.  Every whole batch of a shard:
# the default mean loss equals the mean of one-batch runs on slices of the file (and
# PyTorch's mean cross-entropy over the same positions with LOOM_TEST_PYTHON); --batches N;
# --weights a `loom train --out DIR/` folder.
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

# Every whole batch by default: gpt2-tiny's tokens.bin holds 300 tokens, 4 whole batches of 2 x 32.
G=tests/golden/gpt2-tiny
expect_exit 0 "loom eval scores every whole batch of the shard" "$LOOM" eval models/gpt2-tiny.json \
  --weights $G/weights.safetensors --tokens $G/tokens.bin
expect_stderr_contains "eval of 256 tokens (4 batches of 2 x 32)"
all=$(grep -o 'loss [0-9.]*' "$OUT" | cut -d' ' -f2)
# Each batch k alone: a shard of the 65 tokens [64k, 64k + 65) (the header's count rewritten).
python3 - "$G/tokens.bin" "$TMP/slice" <<'PY'
import struct, sys
b = open(sys.argv[1], 'rb').read(); hdr = bytearray(b[:1024]); toks = b[1024:]
for k in range(4):
    struct.pack_into('<i', hdr, 8, 65)
    open('%s%d.bin' % (sys.argv[2], k), 'wb').write(bytes(hdr) + toks[2 * 64 * k:2 * (64 * k + 65)])
PY
sum=0
for k in 0 1 2 3; do
  expect_exit 0 "  batch $k alone (a one-batch shard)" "$LOOM" eval models/gpt2-tiny.json --weights $G/weights.safetensors \
    --tokens "$TMP/slice$k.bin"
  expect_stderr_contains "eval of 64 tokens (1 batch of 2 x 32)"
  sum=$(awk -v s="$sum" -v l="$(grep -o 'loss [0-9.]*' "$OUT" | cut -d' ' -f2)" 'BEGIN { printf "%.9f", s + l }')
done
check "  the mean loss ($all) is the mean of the four batches' (sum $sum / 4), within 2e-6" \
  awk -v a="$all" -v s="$sum" 'BEGIN { d = a - s / 4; exit !(d < 2e-6 && d > -2e-6) }'
expect_exit 0 "--batches 2: the first two batches" "$LOOM" eval models/gpt2-tiny.json --weights $G/weights.safetensors \
  --tokens $G/tokens.bin --batches 2 --backend ref
expect_stderr_contains "eval of 128 tokens (2 batches of 2 x 32)"
two=$(grep -o 'loss [0-9.]*' "$OUT" | cut -d' ' -f2)
s2=0
for k in 0 1; do
  "$LOOM" eval models/gpt2-tiny.json --weights $G/weights.safetensors --tokens "$TMP/slice$k.bin" --batches 1 > "$TMP/one" 2>/dev/null
  s2=$(awk -v s="$s2" -v l="$(cut -d' ' -f2 "$TMP/one")" 'BEGIN { printf "%.9f", s + l }')
done
check "  its loss ($two, reference executor) is the mean of batches 0 and 1 (cpu, sum $s2), within 2e-6" \
  awk -v a="$two" -v s="$s2" 'BEGIN { d = a - s / 2; exit !(d < 2e-6 && d > -2e-6) }'
expect_exit 0 "--mesh dp=2,tp=2 over every batch" "$LOOM" eval models/gpt2-tiny.json --weights $G/weights.safetensors \
  --tokens $G/tokens.bin --mesh dp=2,tp=2
expect_stderr_contains "eval of 256 tokens (4 batches of 2 x 32) on 4 ranks"
check "  the same mean loss as one rank (to 2e-6)" awk -v a="$all" -v b="$(grep -o 'loss [0-9.]*' "$OUT" | cut -d' ' -f2)" \
  'BEGIN { d = a - b; exit !(d < 2e-6 && d > -2e-6) }'
expect_exit 0 "--batches 9 on a shard of 4 batches: the 4, with a note" "$LOOM" eval models/gpt2-tiny.json \
  --weights $G/weights.safetensors --tokens $G/tokens.bin --batches 9
expect_stderr_contains "holds 4 whole batches of 2 x 32: scored 4"
expect_stdout_contains "loss $all"
expect_exit 2 "--batches 0 is refused" "$LOOM" eval models/gpt2-tiny.json --weights $G/weights.safetensors \
  --tokens $G/tokens.bin --batches 0
expect_stderr_contains "--batches takes a whole number of batches >= 1, not '0'"
expect_exit 2 "--out with --batches 3 is refused (--out holds one batch's logits)" "$LOOM" eval models/gpt2-tiny.json \
  --weights $G/weights.safetensors --tokens $G/tokens.bin --batches 3 --out "$TMP/x.st"
expect_stderr_contains "--out writes the logits of one batch"
if [ -n "${LOOM_TEST_PYTHON:-}" ]; then
  check "  PyTorch's mean cross-entropy over the 4 batches equals loom's ($all) within 1e-5" "$LOOM_TEST_PYTHON" -c "
import json, numpy as np, torch
from transformers import GPT2Config, GPT2LMHeadModel
from safetensors.torch import load_file
model = GPT2LMHeadModel(GPT2Config(**json.load(open('$G/config.json')))).eval()
model.transformer.load_state_dict(load_file('$G/weights.safetensors'), strict=False)   # lm_head: tied to wte
t = torch.tensor(np.frombuffer(open('$G/tokens.bin', 'rb').read()[1024:], dtype=np.uint16).astype(np.int64))
with torch.no_grad(): ls = [model(t[64 * k:64 * k + 64].view(2, 32)).logits for k in range(4)]
ce = torch.stack([torch.nn.functional.cross_entropy(l.reshape(64, -1), t[64 * k + 1:64 * k + 65]) for k, l in enumerate(ls)])
assert abs(ce.mean().item() - $all) < 1e-5, (ce.mean().item(), $all)
"
else
  echo "SKIP PyTorch's mean over the batches: set LOOM_TEST_PYTHON to a python with torch and transformers"
fi

# A long run says where it is: a progress line every 2 s (500 batches on the reference executor).
expect_exit 0 "loom data: a byte-level shard (cut to 32,001 tokens below)" "$LOOM" data data/shakespeare.txt -o "$TMP/long.bin"
python3 -c "
import struct, sys
b = open('$TMP/long.bin', 'rb').read(); h = bytearray(b[:1024]); struct.pack_into('<i', h, 8, 32001)
open('$TMP/long500.bin', 'wb').write(bytes(h) + b[1024:1024 + 2 * 32001])"
expect_exit 0 "loom eval of 500 batches on the reference executor" "$LOOM" eval models/gpt2-tiny.json \
  --weights $G/weights.safetensors --tokens "$TMP/long500.bin" --backend ref
expect_stderr_contains "eval of 32000 tokens (500 batches of 2 x 32)"
took=$(grep -o 'took [0-9.]* s' "$ERR" | cut -d' ' -f2)
if awk -v t="$took" 'BEGIN { exit !(t >= 2.5) }'; then
  expect_stderr_matches "eval: batch [0-9]+ of 500, mean loss so far [0-9.]+, [0-9.]+ s"
else
  echo "SKIP the progress line: the run took $took s (< 2.5 s: no line is due)"
fi

# --weights a Hugging Face folder from loom train --out DIR/ (as loom sample takes it).
expect_exit 0 "loom train --out DIR/ (2 steps)" "$LOOM" train models/gpt2-tiny.json --data $G/tokens.bin --steps 2 -q \
  --init $G/weights.safetensors --out "$TMP/hf/"
expect_exit 0 "  loom eval --weights DIR/ (the folder)" "$LOOM" eval models/gpt2-tiny.json --weights "$TMP/hf" \
  --tokens $G/tokens.bin
dir_loss=$(grep -o 'loss [0-9.]*' "$OUT")
expect_exit 0 "  loom eval --weights DIR/model.safetensors" "$LOOM" eval models/gpt2-tiny.json \
  --weights "$TMP/hf/model.safetensors" --tokens $G/tokens.bin
expect_stdout_contains "$dir_loss"
check "  the trained weights score differently from the initial ones ($dir_loss vs loss $all)" [ "$dir_loss" != "loss $all" ]
expect_exit 2 "  a folder without model.safetensors nor checkpoints is refused" "$LOOM" eval models/gpt2-tiny.json \
  --weights "$TMP" --tokens $G/tokens.bin

finish
