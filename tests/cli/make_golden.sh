#!/usr/bin/env bash
# tests/cli/make_golden.sh — `loom make-golden SPEC -o DIR`: usage errors, a clear exit 2 when
# the python it runs lacks torch / transformers (CI has neither), and, when LOOM_TEST_PYTHON
# names a python that has them, the whole path: a golden folder for each tiny model's config
# that `loom check` then passes on the reference executor and the cpu backend (transformers'
# own GPT2LMHeadModel / LlamaForCausalLM against loom).  Without LOOM_TEST_PYTHON that part
# says it is skipped.
# usage: bash tests/cli/make_golden.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
unset LOOM_LIBCUDA LOOM_LIBNVRTC LOOM_LIBCUBLASLT

expect_exit 0 "--help" "$LOOM" make-golden --help
expect_stdout_contains "usage: loom make-golden SPEC -o DIR"
expect_exit 2 "no -o" "$LOOM" make-golden models/gpt2-tiny.json
expect_stderr_contains "no output folder: give -o DIR"
expect_exit 2 "no spec" "$LOOM" make-golden -o "$TMP/g"
expect_exit 2 "a spec that does not exist" "$LOOM" make-golden "$TMP/none.json" -o "$TMP/g"
expect_stderr_contains "none.json: no such file"
expect_exit 2 "bad --steps" "$LOOM" make-golden models/gpt2-tiny.json -o "$TMP/g" --steps -1
expect_stderr_contains "--steps needs a whole number >= 0"

# A python that cannot import torch or transformers (no site-packages at all).  The spec is
# read before the packages are needed, so a bad spec is still reported as one.
if command -v python3 > /dev/null; then
  printf '#!/bin/sh\nexec python3 -I -S "$@"\n' > "$TMP/bare-python"
  chmod +x "$TMP/bare-python"
  LOOM_PYTHON=$TMP/bare-python expect_exit 2 "a python without torch and transformers" "$LOOM" make-golden \
    models/gpt2-tiny.json -o "$TMP/g"
  expect_stderr_contains "pip install torch transformers numpy"
  expect_stderr_contains "LOOM_PYTHON="
  check "  and it wrote nothing" test ! -e "$TMP/g"
  printf '{"model_type": "falcon", "vocab_size": 100}\n' > "$TMP/falcon.json"
  LOOM_PYTHON=$TMP/bare-python expect_exit 2 "a model_type make-golden does not write" "$LOOM" make-golden \
    "$TMP/falcon.json" -o "$TMP/g"
  expect_stderr_contains "falcon.json: model_type 'falcon': make-golden writes goldens for gpt2, llama, qwen2, qwen3 and mistral"
  printf '{"model_type": "gpt2",\n' > "$TMP/broken.json"
  LOOM_PYTHON=$TMP/bare-python expect_exit 2 "a spec that is not JSON" "$LOOM" make-golden "$TMP/broken.json" -o "$TMP/g"
  expect_stderr_contains "broken.json: not JSON"
  printf '{"model": "missing/config.json"}\n' > "$TMP/spec.json"
  LOOM_PYTHON=$TMP/bare-python expect_exit 2 "a run spec whose model file is missing" "$LOOM" make-golden \
    "$TMP/spec.json" -o "$TMP/g"
  expect_stderr_contains "spec.json: \"model\" names $TMP/missing/config.json, which cannot be read"
  printf '{"model": "%s/tests/golden/gpt2-tiny/config.json", "batch": "two"}\n' "$PWD" > "$TMP/spec.json"
  LOOM_PYTHON=$TMP/bare-python expect_exit 2 "a run spec with a bad batch" "$LOOM" make-golden "$TMP/spec.json" -o "$TMP/g"
  expect_stderr_contains 'spec.json: "batch" is "two": expected a whole number >= 1'
fi
# A python with torch but without transformers (Debian's python3-torch), when there is one.
for py in /usr/bin/python3 python3; do
  if "$py" -c 'import numpy, torch' 2> /dev/null && ! "$py" -c 'import transformers' 2> /dev/null; then
    LOOM_PYTHON=$py expect_exit 2 "$py: torch but no transformers" "$LOOM" make-golden models/gpt2-tiny.json -o "$TMP/g"
    expect_stderr_contains "has no Hugging Face transformers"
    expect_stderr_contains "pip install torch transformers numpy"
    break
  fi
done
LOOM_PYTHON=$TMP/no-such-python expect_exit 2 "LOOM_PYTHON that does not exist" "$LOOM" make-golden \
  models/gpt2-tiny.json -o "$TMP/g"
expect_stderr_contains "cannot run $TMP/no-such-python"
LOOM_MAKE_GOLDEN=$TMP/none.py expect_exit 2 "LOOM_MAKE_GOLDEN that does not exist" "$LOOM" make-golden \
  models/gpt2-tiny.json -o "$TMP/g"
expect_stderr_contains "generator script $TMP/none.py is missing"

if [ -n "${LOOM_TEST_PYTHON:-}" ]; then
  for m in gpt2-tiny llama-tiny llama-tiny-tied; do
    G=$TMP/$m
    LOOM_PYTHON=$LOOM_TEST_PYTHON expect_exit 0 "make-golden for $m's config, 2 steps" "$LOOM" make-golden \
      tests/golden/$m/train_spec.json -o "$G" --steps 2
    check "  the folder holds config.json, weights.safetensors, tokens.bin, golden.json, expected.safetensors" \
      sh -c "cd '$G' && ls config.json weights.safetensors tokens.bin golden.json expected.safetensors > /dev/null"
    check "  golden.json: batch 2, seq 32, 2 steps, grad_accum 2 (the run spec's)" \
      sh -c "tr -d ' \n' < '$G/golden.json' | grep -q '\"batch\":2,\"seq\":32,\"steps\":2,\"grad_accum\":2,'"
    if [ $m = gpt2-tiny ]; then
      expect_exit 0 "  expected.safetensors lists its tensors" "$LOOM" diff "$G/expected.safetensors" \
        "$G/expected.safetensors"
      for t in logits loss grad.wte.weight grad.h.1.attn.c_attn.bias wte.weight losses grad_norms lrs; do
        expect_stdout_contains "PASS  $t "
      done
      expect_exit 0 "  loom eval on the folder's config, weights and tokens" "$LOOM" eval "$G/config.json" \
        --weights "$G/weights.safetensors" --tokens "$G/tokens.bin" --batch 2 --seq 32 --grads --out "$TMP/eval.st"
      expect_exit 0 "  its logits and loss are transformers' within 1e-5" "$LOOM" diff "$TMP/eval.st" \
        "$G/expected.safetensors" logits loss --rtol 1e-5
      # (the other way round, so that every tensor of eval.st is compared: logits, loss, grad.*)
      expect_exit 0 "  and its gradients within 1e-4" "$LOOM" diff "$G/expected.safetensors" "$TMP/eval.st" --rtol 1e-4
      expect_stdout_contains "PASS  grad.h.0.attn.c_attn.weight "
    fi
    expect_exit 0 "  loom check passes it on ref and cpu, one rank and dp=2" "$LOOM" check "$G" --backend ref,cpu \
      --mesh dp=2
    sed 's/^/    | /' "$OUT"
  done
  # a spec with no training settings: loom's defaults but Adam's eps 1e-4 (make_golden.py's
  # DEFAULTS: with 1e-8 an f32 run's weights land up to 2 x steps x lr from the golden's)
  G=$TMP/defaults
  LOOM_PYTHON=$LOOM_TEST_PYTHON expect_exit 0 "make-golden for models/llama-tiny.json (no training settings)" \
    "$LOOM" make-golden models/llama-tiny.json -o "$G" --steps 3
  check "  golden.json: lr 3e-4 (loom's default), eps 1e-4" \
    sh -c "tr -d ' \n' < '$G/golden.json' | grep '\"lr\":0.0003,' | grep -q '\"eps\":0.0001,'"
  expect_exit 0 "  loom check passes it on cpu at the default tolerances" "$LOOM" check "$G" --backend cpu
  sed 's/^/    | /' "$OUT"
else
  echo "SKIP full make-golden run: set LOOM_TEST_PYTHON to a python with torch and transformers"
fi
finish
