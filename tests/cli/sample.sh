#!/usr/bin/env bash
# tests/cli/sample.sh — `loom sample` (tools/cmd_sample.c): generation with a KV cache.
#   - greedy decoding gives transformers' greedy `generate`, token for token, on gpt2-tiny,
#     llama-tiny, llama3-tiny, qwen2-tiny, qwen3-tiny and mistral-tiny for two prompts each (tests/golden/M/generate.json, made by
#     tests/golden/gen_generate.py; llama-tiny's "Hello" ends at its eos_token_id);
#   - sampling: the same seed gives the same text, top-k 1 is greedy at any temperature;
#   - weights from a folder loom train --out DIR/ wrote and from a --save-dir; a tokenizer's
#     text (the README's end-to-end path); a compiled executable sampling from its own
#     checkpoint gives loom sample's tokens;
#   - bad requests are refused with the fix.
LOOM=$1
. "$(dirname "$0")/lib.sh"

# (and the issue 33 families: llama3 RoPE, Qwen2, Qwen3, Mistral's sliding window of 8 over 40
# new tokens, from their config.json as make-golden wrote it)
for m in gpt2-tiny llama-tiny llama3-tiny qwen2-tiny qwen3-tiny mistral-tiny; do
  g=tests/golden/$m
  spec=$g/train_spec.json
  [ -f "$spec" ] || spec=$g/config.json
  n=$(python3 -c "import json; print(len(json.load(open('$g/generate.json'))['cases']))")
  for k in $(seq 0 $((n - 1))); do
    python3 -c "
import json; c = json.load(open('$g/generate.json'))['cases'][$k]
open('$TMP/prompt', 'w').write(c['prompt']); open('$TMP/want', 'w').write(' '.join(map(str, c['new_ids'])) + '\n')
print(c['max_new_tokens'])" > "$TMP/max"
    expect_exit 0 "$m greedy, prompt $k" "$LOOM" sample "$spec" --weights $g/weights.safetensors \
      --prompt "$(cat "$TMP/prompt")" --max-new-tokens "$(cat "$TMP/max")" --temperature 0 --ids
    check "  the ids of transformers' greedy generate ($(wc -w < "$TMP/want") tokens)" cmp -s "$OUT" "$TMP/want"
  done
done

g=tests/golden/gpt2-tiny
S=(sample $g/train_spec.json --weights $g/weights.safetensors --prompt "Hello" --max-new-tokens 30 --ids)
expect_exit 0 "sampling, seed 7" "$LOOM" "${S[@]}" --temperature 0.9 --top-k 50 --top-p 0.95 --seed 7
cp "$OUT" "$TMP/s7"
expect_exit 0 "  again with seed 7" "$LOOM" "${S[@]}" --temperature 0.9 --top-k 50 --top-p 0.95 --seed 7
check "  the same tokens" cmp -s "$OUT" "$TMP/s7"
expect_exit 0 "  seed 8" "$LOOM" "${S[@]}" --temperature 0.9 --top-k 50 --top-p 0.95 --seed 8
check "  other tokens" sh -c "! cmp -s '$OUT' '$TMP/s7'"
expect_exit 0 "greedy" "$LOOM" "${S[@]}" --temperature 0
cp "$OUT" "$TMP/greedy"
expect_exit 0 "top-k 1 at temperature 2" "$LOOM" "${S[@]}" --temperature 2 --top-k 1 --seed 3
check "  is greedy" cmp -s "$OUT" "$TMP/greedy"
expect_exit 0 "text output" "$LOOM" sample $g/train_spec.json --weights $g/weights.safetensors --prompt "Hello" \
  --max-new-tokens 5 --temperature 0
check "  starts with the prompt" sh -c "head -c 5 '$OUT' | grep -q '^Hello'"

# From what training writes: an HF folder (--out DIR/) and a checkpoint folder (--save-dir),
# with a tokenizer (the README's text -> tokenizer -> shards -> train -> sample path).
T=tests/tokenizer/llama3-style.json
expect_exit 0 "loom data with a tokenizer" "$LOOM" data data/shakespeare.txt --tokenizer $T --val-frac 0.05 -o "$TMP/shk"
expect_exit 0 "train 3 steps (HF folder and checkpoints)" "$LOOM" train models/gpt2-shakespeare-bpe.json \
  --data "$TMP/shk_train_000000.bin" --steps 3 --batch 2 -q --out "$TMP/hf/" --save-dir "$TMP/ck" --save-every 3
for w in "$TMP/hf" "$TMP/ck"; do
  expect_exit 0 "sample from $(basename "$w") with the tokenizer" "$LOOM" sample models/gpt2-shakespeare-bpe.json \
    --weights "$w" --tokenizer $T --prompt "ROMEO:" --max-new-tokens 8 --temperature 0
  cp "$OUT" "$TMP/from-$(basename "$w")"
  check "  text after the prompt" sh -c "grep -q '^ROMEO:' '$OUT' && [ \$(wc -c < '$OUT') -gt 8 ]"
done
check "the folder and the checkpoint give the same text" cmp -s "$TMP/from-hf" "$TMP/from-ck"

# A compiled executable samples from its own checkpoints (its decode program, compiled in).
G=tests/golden/llama-tiny
expect_exit 0 "loom compile with --save-dir" "$LOOM" compile $G/train_spec.json --save-dir "$TMP/eck" --save-every 2 -o "$TMP/exe"
run sh -c "cd $G && '$TMP/exe' --steps 2 -q"
check "  it trains 2 steps" test "$RC" -eq 0
expect_exit 0 "  EXE sample (its checkpoint)" "$TMP/exe" sample --prompt "Hello" --max-new-tokens 12 --temperature 0 --ids
cp "$OUT" "$TMP/exe-ids"
expect_exit 0 "  loom sample of the same checkpoint" "$LOOM" sample $G/train_spec.json --weights "$TMP/eck" --prompt "Hello" \
  --max-new-tokens 12 --temperature 0 --ids
check "  the same tokens" cmp -s "$OUT" "$TMP/exe-ids"
expect_exit 2 "  a prompt longer than the compiled cache" "$TMP/exe" sample --prompt "$(head -c 40 data/shakespeare.txt)"
expect_stderr_contains "the KV cache holds 32"

# Refusals
expect_exit 2 "no prompt" "$LOOM" sample $g/train_spec.json --weights $g/weights.safetensors
expect_stderr_contains "--prompt is required"
expect_exit 2 "a BPE model without its tokenizer" "$LOOM" sample models/gpt2-shakespeare-bpe.json --weights "$TMP/hf" --prompt x
expect_stderr_contains "give its tokenizer"
expect_exit 2 "more positions than GPT-2 learned" "$LOOM" "${S[@]}" --max-new-tokens 100
expect_stderr_contains "n_positions"
expect_exit 2 "weights that do not exist" "$LOOM" sample $g/train_spec.json --weights "$TMP/nope" --prompt x --max-new-tokens 5
expect_stderr_contains "no such file"
expect_exit 2 "another model's weights" "$LOOM" sample $g/train_spec.json --weights tests/golden/llama-tiny/weights.safetensors --prompt x --max-new-tokens 5
expect_exit 2 "--top-p 0" "$LOOM" "${S[@]}" --top-p 0
expect_stderr_contains "--top-p takes"
finish
