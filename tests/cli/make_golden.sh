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

# A python that cannot import torch or transformers (no site-packages at all).
if command -v python3 > /dev/null; then
  printf '#!/bin/sh\nexec python3 -I -S "$@"\n' > "$TMP/bare-python"
  chmod +x "$TMP/bare-python"
  LOOM_PYTHON=$TMP/bare-python expect_exit 2 "a python without torch and transformers" "$LOOM" make-golden \
    models/gpt2-tiny.json -o "$TMP/g"
  expect_stderr_contains "pip install torch transformers numpy"
  expect_stderr_contains "LOOM_PYTHON="
fi
LOOM_PYTHON=$TMP/no-such-python expect_exit 2 "LOOM_PYTHON that does not exist" "$LOOM" make-golden \
  models/gpt2-tiny.json -o "$TMP/g"
expect_stderr_contains "cannot run $TMP/no-such-python"
LOOM_MAKE_GOLDEN=$TMP/none.py expect_exit 2 "LOOM_MAKE_GOLDEN that does not exist" "$LOOM" make-golden \
  models/gpt2-tiny.json -o "$TMP/g"
expect_stderr_contains "generator script $TMP/none.py is missing"

if [ -n "${LOOM_TEST_PYTHON:-}" ]; then
  for m in gpt2-tiny llama-tiny llama-tiny-tied; do
    LOOM_PYTHON=$LOOM_TEST_PYTHON expect_exit 0 "make-golden for $m's config, 2 steps" "$LOOM" make-golden \
      tests/golden/$m/train_spec.json -o "$TMP/$m" --steps 2
    check "  the folder holds config.json, weights.safetensors, tokens.bin, golden.json, expected.safetensors" \
      sh -c "cd '$TMP/$m' && ls config.json weights.safetensors tokens.bin golden.json expected.safetensors > /dev/null"
    expect_exit 0 "  loom check passes it on ref and cpu, one rank and dp=2" "$LOOM" check "$TMP/$m" --backend ref,cpu \
      --mesh dp=2
    sed 's/^/    | /' "$OUT"
  done
else
  echo "SKIP the full make-golden run: set LOOM_TEST_PYTHON to a python with torch, transformers and numpy"
fi
finish
